// hsdp-bench's operations under test and their oracle: one collective by algorithm name (hier,
// hier/<wire>, flat, mpi and their -off twins) and the elements of its result that differ from
// the MPI library's answer (the quantized wires' closed forms: the top of hsdp_bench.cc).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/quantize.h"
#include "hsdp/transport.h"

namespace hsdp_bench {

// Small integers: exact in float and bf16 whatever the summation order, so #wrong is exact.
float value(int rank, size_t i);

// One hierarchical schedule under test and its inter wire ("hier", or "hier/<wire>").
struct HierCase {
  std::string name;
  std::unique_ptr<hsdp::HierarchicalCollectives> hier;
  hsdp::WireFormat wire;
  hsdp::HierOptions options;
};

// "<algo>-off": the algorithm over the untraced communicators.
bool isOff(const std::string& name);
std::string baseAlgo(const std::string& name);

struct Bench {
  hsdp::Comm& world;
  MPI_Comm raw;
  MPI_Comm shard_order;  // the world ordered by shard index k: hier's result layout
  // MPI's own communicators of the mesh's two levels (same members and ranks), whatever
  // transport the mesh runs on (HSDP_TRANSPORT_INTRA/INTER): the reference's collectives.
  MPI_Comm intra_raw, inter_raw;
  std::vector<HierCase>& hiers;
  hsdp::Comm& world_off;             // the same, untraced (the -off algorithms)
  std::vector<HierCase>& hiers_off;  // hiers over world_off, in the same order
  hsdp::Mesh& mesh;
  hsdp::DType dtype;
  size_t es;
  hsdp::HostBuffer send, recv, expect;

  void fill(void* buf, size_t n, int rank);
  const HierCase* hierOf(const std::string& name) const;
  // Runs one operation; `count` is the whole buffer's element count.
  hsdp::Status run(const std::string& op, const std::string& name, size_t count);
  // Elements of this rank's result that differ from the MPI library's float answer.
  // (hier lays shards out by shard index k, so its oracle runs on the k-ordered communicator.)
  long wrong(const std::string& op, const std::string& algo, size_t count);
  // The gathered fp32 shards as the quantized wire delivers them: decode(encode(shard)).
  static void quantizedShards(const hsdp::WireFormat& wire, std::vector<float>& full, size_t per);
  // Per element of our block: the quantized reduce-scatter's bound (see the top of
  // hsdp_bench.cc). The values are >= 0, so a node's partial sum is its ranks' sum, from MPI.
  std::vector<double> reduceTolerance(const hsdp::WireFormat& wire, const std::vector<float>& in,
                                      size_t per) const;
};

}  // namespace hsdp_bench
