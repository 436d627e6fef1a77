// UnitCollectives: every route a unit's parameters and gradients take (unit_collectives.h).
#include "engine/unit_collectives.h"

#include <algorithm>
#include <cstring>

#include "core/progress.h"
#include "engine/elastic_group.h"
#include "engine/reduce_chain.h"
#include "hsdp/env.h"
#include "hsdp/watchdog.h"

namespace hsdp::engine {

namespace {
const env::IntParam kReplicaChunkBytes{
    "HSDP_REPLICA_CHUNK_BYTES", 4 << 20, 0, int64_t{1} << 40,
    "bytes per chunk of a unit's replica all-reduce, which starts as soon as its reduce-scatter "
    "lands; chunks after the first wait while a cross-node gather is in flight (0: one piece)"};
}  // namespace

UnitCollectives::UnitCollectives(const Mesh& mesh, std::unique_ptr<SpaceCollectives> space,
                                 const Options& options)
    : mesh_(mesh), space_(std::move(space)), opt_(options) {}

StatusOr<std::unique_ptr<UnitCollectives>> UnitCollectives::create(
    const Mesh& mesh, std::unique_ptr<SpaceCollectives> space, const Options& options) {
  std::unique_ptr<UnitCollectives> c(new UnitCollectives(mesh, std::move(space), options));
  if (options.on_device) {
    SpaceCollectives& sc = *c->space_;
    // Collectives of the parameter path wait for the compute stream (the user wrote the
    // gradients, and a step updated the shards, there); the replica all-reduce of a reduced
    // shard waits for the engine's reduce lane.
    HSDP_RETURN_IF_ERROR(sc.bindComm(mesh.shardGroup(), Lane::kCompute, "shard-group"));
    // Reduce-scatters follow the backward kernels that wrote the gradient: the compute lane too.
    HSDP_RETURN_IF_ERROR(
        sc.bindComm(mesh.shardGroupReduce(), Lane::kCompute, "shard-group-reduce"));
    HSDP_RETURN_IF_ERROR(sc.bindComm(mesh.replica(), Lane::kReduce, "replica"));
    if (options.hpz)
      HSDP_RETURN_IF_ERROR(sc.bindComm(mesh.intraShard(), Lane::kCompute, "intra-shard"));
  }
  c->hier_ = std::make_unique<HierarchicalCollectives>(mesh.intraShard(), mesh.interShard());
  c->hier_reduce_ =
      std::make_unique<HierarchicalCollectives>(mesh.intraShardReduce(), mesh.interShardReduce());
  const bool intra = mesh.intraShard().size() > 1, inter = mesh.interShard().size() > 1;
  c->shard_level_ = intra && inter ? TraceLevel::kIntraInter
                    : inter        ? TraceLevel::kInter
                    : intra        ? TraceLevel::kIntra
                                   : TraceLevel::kNone;
  HSDP_RETURN_IF_ERROR(c->hier_->setOptions(options.gather));
  HSDP_RETURN_IF_ERROR(c->hier_reduce_->setOptions(options.reduce));
  return c;
}

Comm& UnitCollectives::dataParallel() const {
  return opt_.shards == 1 && !opt_.on_device ? mesh_.world() : mesh_.replica();
}

// The mesh is uniform, so every node holds as many replicas.
Status UnitCollectives::connectReplicas() {
  Comm& dp = dataParallel();
  if (opt_.replica_wire.wire == Wire::kFp32 || dp.size() < 2) return okStatus();
  const int node = mesh_.coords().node;
  HSDP_ASSIGN_OR_RETURN(replica_intra_, dp.split(node, dp.rank()));
  HSDP_ASSIGN_OR_RETURN(replica_inter_, dp.split(replica_intra_->rank(), node));
  HierOptions o;
  o.allreduce_wire = opt_.replica_wire;
  replica_ = std::make_unique<HierarchicalCollectives>(*replica_intra_, *replica_inter_);
  return replica_->setOptions(o);
}

Status UnitCollectives::reserve(size_t max_shard, bool bf16) {
  HSDP_ASSIGN_OR_RETURN(int64_t chunk, kReplicaChunkBytes.value());
  replica_chunk_ = static_cast<size_t>(chunk) / sizeof(float);
  if (opt_.shards > 1) {
    if (opt_.hierarchical) {
      for (DType t : {DType::kBFloat16, DType::kFloat32}) {
        if (t == DType::kBFloat16 && !bf16) continue;
        HSDP_RETURN_IF_ERROR(hier_->reserve(max_shard, t));
        HSDP_RETURN_IF_ERROR(hier_reduce_->reserve(max_shard, t));
      }
    } else {  // the reduce-scatter's ring scratch; the gathers need none
      HSDP_RETURN_IF_ERROR(mesh_.shardGroupReduce().reserveScratch(max_shard * sizeof(float)));
    }
  }
  if (replica_) HSDP_RETURN_IF_ERROR(replica_->reserve(max_shard, DType::kFloat32));
  return okStatus();
}

size_t UnitCollectives::gradResidualCount(size_t n) const {
  return opt_.shards > 1 && opt_.hierarchical ? hier_reduce_->residualCount(n) : 0;
}
size_t UnitCollectives::replicaResidualCount(size_t n) const {
  return replica_ ? replica_->allReduceResidualCount(n) : 0;
}

size_t UnitCollectives::scratchBytes() const {
  const Mesh& m = mesh_;
  return hier_->scratchBytes() + hier_reduce_->scratchBytes() + m.intraShard().scratchBytes() +
         m.interShard().scratchBytes() + m.intraShardReduce().scratchBytes() +
         m.interShardReduce().scratchBytes() + m.shardGroup().scratchBytes() +
         m.shardGroupReduce().scratchBytes() + m.replica().scratchBytes() +
         m.world().scratchBytes() + (replica_ ? replica_->scratchBytes() : 0);
}

StatusOr<WorkHandle> UnitCollectives::gather(const void* shard, void* full, size_t count, DType t) {
  if (opt_.hierarchical) return hier_->iallGather(shard, full, count, t);
  return space_->iallGather(mesh_.shardGroup(), shard, full, count, t);
}

StatusOr<WorkHandle> UnitCollectives::gatherExact(const float* master, void* full, size_t count) {
  if (gatherQuantizes())  // the int8/int4 parameter wire is bypassed: fp32 for this call
    return hier_->iallGather(master, full, count, DType::kFloat32, WireFormat{});
  return gather(master, full, count, DType::kFloat32);
}

StatusOr<WorkHandle> UnitCollectives::gatherEncoded(const void* codes, float* full, size_t count) {
  return hier_->iallGatherEncoded(codes, full, count);
}

StatusOr<WorkHandle> UnitCollectives::gatherNodeBlock(const void* block, float* full,
                                                      size_t count) {
  return space_->iallGather(mesh_.intraShard(), block, full, count, DType::kFloat32);
}

StatusOr<WorkHandle> UnitCollectives::replicaGather(const void* send, void* recv, size_t count) {
  return space_->iallGather(mesh_.replica(), send, recv, count, DType::kFloat32);
}

void UnitCollectives::Group::clear() {
  ops.clear();
  labels.clear();
  units.clear();
  blocks16.clear();
}

void UnitCollectives::Group::reserve(size_t n) {
  ops.reserve(n);
  labels.reserve(n);
  units.reserve(n);
  blocks16.reserve(n);
}

StatusOr<WorkHandle> UnitCollectives::gatherGroup() {
  const std::vector<CollectiveOp>& ops = group_.ops;
  if (!opt_.hierarchical) {
    watchdog::Label label("parameters after step", "shard group");
    return space_->igroup(mesh_.shardGroup(), ops);
  }
  std::vector<WorkHandle> works;
  works.reserve(ops.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    const CollectiveOp& o = ops[k];
    watchdog::Label label(group_.labels[k], "shard group");
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, hier_->iallGather(o.send, o.recv, o.count, o.dtype));
    works.push_back(std::move(w));
  }
  return allOf(std::move(works));
}

StatusOr<WorkHandle> UnitCollectives::reduceScatter(const void* full, void* shard, size_t count,
                                                    DType t, float* residual) {
  if (opt_.hierarchical)  // an int8/int4 inter wire with error feedback carries the residual
    return hier_reduce_->ireduceScatter(full, shard, count, t, RedOp::kAvg, residual);
  return space_->ireduceScatter(mesh_.shardGroupReduce(), full, shard, count, t, RedOp::kAvg);
}

StatusOr<WorkHandle> UnitCollectives::replicaReduce(void* shard, size_t count, float* residual) {
  if (replica_) return replica_->iallReduce(shard, count, DType::kFloat32, RedOp::kAvg, residual);
  return space_->iallReduce(dataParallel(), shard, count, DType::kFloat32, RedOp::kAvg);
}

StatusOr<std::unique_ptr<ReduceChain>> UnitCollectives::reduceThenReplicate(
    const float* full, float* shard, size_t count, float* residual, float* replica_residual,
    std::string_view label) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle scatter,
                        reduceScatter(full, shard, count, DType::kFloat32, residual));
  auto lock = progressLock();  // the progress thread may advance the chain at once
  return std::make_unique<ReduceChain>(*this, std::move(scatter), shard, count, replica_chunk_,
                                       replica_residual, std::string(label), replica_next_++);
}

namespace {
// A gather, listed in UnitCollectives::gathers_ while it lives.
class TrackedGather final : public Work {
 public:
  TrackedGather(UnitCollectives& coll, WorkHandle w) : coll_(coll), w_(std::move(w)) {}
  ~TrackedGather() override { coll_.untrackGather(w_.get()); }
  Status wait() override { return w_->wait(); }
  StatusOr<bool> test() override { return w_->test(); }

 private:
  UnitCollectives& coll_;
  WorkHandle w_;
};
}  // namespace

void UnitCollectives::trackGather(WorkHandle& w, bool cross_node) {
  if (w == nullptr || !cross_node || !chainsReplica()) return;
  auto lock = progressLock();
  gathers_.push_back(w.get());
  w = std::make_unique<TrackedGather>(*this, std::move(w));
}

void UnitCollectives::untrackGather(Work* w) {
  auto lock = progressLock();
  gathers_.erase(std::remove(gathers_.begin(), gathers_.end(), w), gathers_.end());
}

bool UnitCollectives::crossNodeGatherInFlight() {
  auto lock = progressLock();
  for (Work* w : gathers_) {
    StatusOr<bool> done = ProgressiveWork::isComplete(*w);
    if (done.ok() && !*done) return true;  // a failed one is its waiter's to report
  }
  return false;
}

Status UnitCollectives::startGroupAverage(float* shard, size_t count) {
  if (groups_ == nullptr) return okStatus();
  return groups_->startAverage({shard, count});
}

UnitCollectives::LevelBytes UnitCollectives::levelBytes() const {
  const Mesh& m = mesh_;
  LevelBytes b;
  b.intra = m.intraShard().bytesSent() + m.intraShardReduce().bytesSent();
  b.inter = m.interShard().bytesSent() + m.interShardReduce().bytesSent();
  b.replica = dataParallel().bytesSent();
  for (const std::unique_ptr<Comm>* c : {&replica_intra_, &replica_inter_})
    if (*c) b.replica += (*c)->bytesSent();
  b.shard = m.shardGroup().bytesSent() + m.shardGroupReduce().bytesSent();
  return b;
}

void UnitCollectives::takeLevelBytes(StepAccounting* a) {
  const LevelBytes now = levelBytes();
  a->bytes_intra = now.intra - level_base_.intra;
  a->bytes_inter = now.inter - level_base_.inter;
  a->bytes_replica = now.replica - level_base_.replica;
  a->bytes_shard = now.shard - level_base_.shard;
  level_base_ = now;
}

void UnitCollectives::traceLevelBytes() {
  const LevelBytes now = levelBytes();
  tracer_.sent(TraceLevel::kIntra, now.intra - trace_base_.intra);
  tracer_.sent(TraceLevel::kInter, now.inter - trace_base_.inter);
  tracer_.sent(TraceLevel::kReplica, now.replica - trace_base_.replica);
  tracer_.sent(TraceLevel::kIntraInter, now.shard - trace_base_.shard);
  trace_base_ = now;
}

StatusOr<WorkHandle> UnitCollectives::peerAverage(Comm& peers, float* shard, size_t count) {
  return peers.iallReduce(shard, count, DType::kFloat32, RedOp::kAvg);
}

StatusOr<size_t> UnitCollectives::peerBroadcast(Comm& peers,
                                                std::span<const std::span<char>> buffers, int root,
                                                size_t piece_bytes) {
  if (piece_bytes == 0) return invalidArgument("peerBroadcast: pieces of 0 bytes");
  size_t total = 0;
  for (std::span<char> b : buffers) {
    for (size_t at = 0; at < b.size(); at += piece_bytes) {
      const size_t n = std::min(piece_bytes, b.size() - at);
      HSDP_RETURN_IF_ERROR(peers.broadcast(b.data() + at, n, DType::kUInt8, root));
    }
    total += b.size();
  }
  return total;
}

Status UnitCollectives::startTrace(const std::string& dir) {
  Comm& world = mesh_.control();
  const int n = world.size(), me = world.rank();
  int64_t offset = 0;
  if (!dir.empty() && n > 1) {
    // Every rank leaves an all-gather within a hop of the last one's arrival: the exit times of
    // a few rounds, exchanged, give each rank's offset to rank 0 (median against outliers).
    constexpr int kRounds = 7;
    int64_t mine[kRounds];
    uint8_t token = 0;
    std::vector<uint8_t> tokens(n);
    for (int k = 0; k < kRounds; ++k) {
      HSDP_RETURN_IF_ERROR(world.allGather(&token, tokens.data(), 1, DType::kUInt8));
      mine[k] = Tracer::nowUs();
    }
    std::vector<int64_t> all(static_cast<size_t>(n) * kRounds);
    HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), kRounds, DType::kInt64));
    int64_t d[kRounds];
    for (int k = 0; k < kRounds; ++k) d[k] = all[me * kRounds + k] - all[k];
    std::sort(d, d + kRounds);
    offset = d[kRounds / 2];
  }
  level_base_ = trace_base_ = levelBytes();  // the steps' bytes, not finalize's
  return tracer_.start(dir, me, mesh_.coords().node, n, offset);
}

Status UnitCollectives::agree(const Status& local, bool secondary) {
  Comm& world = mesh_.control();
  constexpr size_t kMsg = 1024;  // [code, secondary, message..., 0]
  std::vector<char> mine(kMsg, 0), all(kMsg * world.size());
  if (!local.ok()) {
    mine[0] = static_cast<char>(static_cast<int>(local.code()));
    mine[1] = secondary ? 1 : 0;
    std::strncpy(mine.data() + 2, local.message().c_str(), kMsg - 3);
  }
  HSDP_RETURN_IF_ERROR(world.allGather(mine.data(), all.data(), kMsg, DType::kUInt8));
  int first = -1;
  for (int r = world.size() - 1; r >= 0; --r)
    if (all[r * kMsg] != 0 && (first < 0 || all[r * kMsg + 1] == 0 || all[first * kMsg + 1] != 0))
      first = r;
  if (first < 0) return okStatus();
  return Status(static_cast<StatusCode>(all[first * kMsg]), std::string(&all[first * kMsg + 2]));
}

Status UnitCollectives::controlAllGather(const void* mine, void* all, size_t count, DType t) {
  return mesh_.control().allGather(mine, all, count, t);
}

Status UnitCollectives::controlBroadcast(void* buf, size_t count, DType t, int root) {
  return mesh_.control().broadcast(buf, count, t, root);
}

Status UnitCollectives::controlSum(int64_t* values, size_t count) {
  return mesh_.control().allReduce(values, count, DType::kInt64, RedOp::kSum);
}

}  // namespace hsdp::engine
