// Comm over an MPI communicator on host memory.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <vector>

#include "collectives/mpi/mpi_cma.h"
#include "collectives/mpi/mpi_work.h"
#include "core/host_buffer.h"
#include "hsdp/transport.h"

namespace hsdp::mpi {

// OK, or the error naming a value of HSDP_MPI_RS_ALGO that is not one of its choices (checked
// again where communicators are made; the session checks it before MPI_Init, with the rest).
[[nodiscard]] Status checkReduceScatterAlgo();

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed in the destructor, unless MPI is already finalized).
  // `traced`: the watchdog traces its collectives (collective: one all-gather); the watchdog's
  // own communicators are not.
  static StatusOr<std::unique_ptr<Comm>> adopt(MPI_Comm comm, bool traced = true);
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transportName() const override { return "mpi"; }

  StatusOr<std::unique_ptr<Comm>> split(int color, int key) override;
  StatusOr<std::unique_ptr<Comm>> splitByHost() override;
  Status reserveScratch(size_t bytes) override;
  size_t scratchBytes() const override { return scratch_.totalBytes(); }
  [[noreturn]] void abortJob(int code) override;

  MPI_Comm raw() const { return comm_; }

 protected:
  // A count that fits MPI's int, whatever the call.
  Status checkArgs(const CallArgs& args) const override;
  const char* waitName(const char* call) const override;
  // Every path counts: its own sends (ring, exchange, all-to-all), its cross-memory reads, and
  // the nominal bytes of MPI's collectives (hsdp/transport.h).
  bool countsOwnSends() const override { return true; }
  // Blocking all-gather and all-reduce go to MPI's own blocking collectives (no request to
  // track); the reduce-scatter is hsdp's own, nonblocking, waited for: the exchange on shared
  // memory and for bf16 (mpi_exchange.h), the ring between hosts (fewer bytes on each link).
  Status runAllGather(const void* send, void* recv, size_t count, DType dtype) override;
  Status runAllReduce(void* buf, size_t count, DType dtype, RedOp op) override;
  StatusOr<WorkHandle> startAllGather(const void* send, void* recv, size_t count,
                                      DType dtype) override;
  // On one host the cross-memory-attach all-gather (mpi_gather.h): every rank reads each peer's
  // block straight into its runs; between hosts MPI_Iallgather with a derived datatype that
  // places each block's runs (MPI unpacks as it receives). No staging either way.
  StatusOr<WorkHandle> startAllGatherRuns(const void* send, void* recv, const BlockRuns& layout,
                                          DType dtype, void* pack) override;
  StatusOr<WorkHandle> startReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) override;
  // On one host the cross-memory-attach reduce-scatter (mpi_cma.h), else for bf16 and on one
  // host without it the exchange (mpi_exchange.h), both reading the runs in place; float32
  // between hosts packs them and runs the ring.
  StatusOr<WorkHandle> startReduceScatterRuns(const void* send, void* recv, const BlockRuns& layout,
                                              DType dtype, RedOp op, void* pack) override;
  StatusOr<WorkHandle> startAllReduce(void* buf, size_t count, DType dtype, RedOp op) override;
  // Point-to-point exchange (Isend/Irecv to every peer, posted from r+1 on), no staging.
  StatusOr<WorkHandle> startAllToAll(const void* send, void* recv, size_t count,
                                     DType dtype) override;
  Status runBroadcast(void* buf, size_t count, DType dtype, int root) override;
  Status runBarrier() override;

 private:
  explicit MpiComm(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  // `w` as the Work of the collective just entered (named in the watchdog's reports).
  WorkHandle watched(std::unique_ptr<ProgressiveWork> w) const;
  // Whether a reduce-scatter of `dtype` takes the exchange (not the ring), and starting one.
  bool exchanges(DType dtype) const;
  StatusOr<WorkHandle> startExchange(const void* send, void* recv, const BlockRuns& layout,
                                     DType dtype, RedOp op);
  friend class RingReduceScatterWork;

  MPI_Comm comm_;
  int rank_;
  int size_;
  // The float32 reduce-scatter (bf16 never rings: it would round the partial sum at each hop).
  enum class ReduceScatter { kRing, kExchange, kCma };
  static StatusOr<ReduceScatter> chooseReduceScatter(MPI_Comm comm, int rank, int size,
                                                     CmaPeers* peers);
  ReduceScatter rs_ = ReduceScatter::kRing;
  CmaPeers peers_;  // the members' process ids and world ranks (kCma)
  // Each in-flight ring reduce-scatter holds one slot (two chunks of partial sums); slots are
  // made by reserveScratch, not per call.
  ScratchPool scratch_;
  // Sequence number of point-to-point schedules on this communicator: every rank starts them in
  // the same order, so (tag base + seq) keeps concurrent rings' messages apart.
  unsigned seq_ = 0;
};

}  // namespace hsdp::mpi
