// The transport conformance suite: one set of tests that every implementation of the Comm
// contract (include/hsdp/transport.h) passes, against the MPI library's own collectives as the
// oracle. A backend is a type, derived from Contract (conformance_oracle.h), with
//
//   static const char* name();
//   static std::string unavailable();         // "" when it runs here, else why (tests skip)
//   static std::vector<Case>& cases();        // communicators under test, each with its oracle
//   static Memory& memory();                  // where its buffers live (host or device)
//
// and, redeclared where it differs from Contract's:
//
//   static constexpr bool kBroadcast;         // broadcast() and barrier() are part of it (true)
//   static constexpr bool kRejectsBadArguments;  // bad arguments are an error before anything
//                                             // starts (true; a schedule composed of others
//                                             // defers to its levels)
//   static constexpr bool kAllToAll;          // iallToAll is part of it (true)
//   static constexpr bool kRuns;              // ireduceScatterRuns is (false; host memory: the
//                                             // default packs on the host)
//
// and an instantiation, e.g. INSTANTIATE_TYPED_TEST_SUITE_P(Mpi, Conformance, MpiBackend):
// tests/collectives/conformance/host_backends_test.cc (MPI, UCX, hierarchical) and
// tests/collectives/nccl/nccl_comm_test.cc (NCCL, on device memory). Inputs are small integers
// where the comparison is exact (any summation order gives the exact sum, in float, bf16 and int32
// for up to 8 ranks), random floats where it is within rounding. Every result buffer has a guard
// element behind it that must stay untouched.
//
// The tests, one header per family: conformance_dense.h (all-gather, reduce-scatter, all-reduce),
// conformance_runs.h (the same over non-contiguous runs), conformance_rooted.h (all-to-all,
// broadcast), conformance_async.h (handles in flight, groups, bad arguments), conformance_bytes.h
// (the byte counters against the planner's closed forms); the fixture and the
// oracle they share: conformance_fixture.h, conformance_oracle.h.
#pragma once

#include "tests/collectives/conformance/conformance_async.h"
#include "tests/collectives/conformance/conformance_bytes.h"
#include "tests/collectives/conformance/conformance_dense.h"
#include "tests/collectives/conformance/conformance_rooted.h"
#include "tests/collectives/conformance/conformance_runs.h"

namespace hsdp::conformance {

REGISTER_TYPED_TEST_SUITE_P(Conformance, AllGatherMatchesMpiOutOfAndInPlace,
                            ReduceScatterSumIsExactOnIntegers, ReduceScatterOfRandomValuesSumAndAvg,
                            AllReduceSumIsExactAndAvgWithinRounding,
                            AllReduceOfRandomValuesIsBitwiseIdenticalOnEveryRank,
                            BroadcastFromEveryRootAndBarrier, AllToAllMatchesMpi,
                            ReduceScatterRunsMatchesMpiOfThePackedBlocks,
                            AllGatherRunsMatchesMpiAllgatherPlacedInRuns,
                            ManyOutstandingHandlesCompleteInAnyOrder,
                            GroupOfMixedOperationsMatchesMpi,
                            BadArgumentsAndDependentGroupsAreRejected, BytesSentAddUpToTheModel);

}  // namespace hsdp::conformance
