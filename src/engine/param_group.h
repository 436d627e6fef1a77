// Internal to the engine: the parameter side of the units (FSDP2's FSDPParamGroup). Per unit it
// holds the parameters' memory (the fp32 master shard, zero1/zero2's whole copy, the bf16
// rounding, hpZ's node block, the encoded master) and their lifecycle (engine/unit_state.h:
// ParamLifecycle), and it owns the gathered blocks (the pools the gathered parameters and the
// full gradients live in, and the rate limiter's count of them) and the copy-out/copy-in scratch.
// Its verbs are FSDP2's: unshard (the all-gather, through UnitCollectives), waitForUnshard,
// reshard, the views into the gathered parameters, and the checked batched copies.
#pragma once

#include <deque>
#include <span>
#include <string_view>
#include <vector>

#include "core/memory_space.h"
#include "engine/buffer_pool.h"
#include "engine/unit.h"
#include "engine/unit_collectives.h"
#include "engine/unit_state.h"
#include "hsdp/sharded_model.h"

namespace hsdp::engine {

// One unit's parameter memory (finalize() allocates it, once) and where its parameters are.
struct UnitParams {
  // This rank's shard of the flat buffer: the fp32 master parameters. zero1/zero2 keep the
  // parameters whole instead (`whole`; the master shard is its slice k, or, with bf16
  // parameters, apart in `shard`).
  SpaceBuffer shard, whole;
  // Mixed precision: the bf16 rounding of the master shard (what the all-gather sends).
  SpaceBuffer shard16;
  // hpZ: this rank's intra-node block of the unit's parameters (J shards), kept from forward.
  SpaceBuffer node_block;
  // int8/int4 parameter wire: the fp32 master shard encoded for the gathers (hsdp/quantize.h),
  // refreshed wherever the master changes (finalize, every optimizer step, setParameter, load),
  // so that all gathers of a step (zero3: forward and backward) send and decode the same codes.
  SpaceBuffer encoded;
  ParamLifecycle life;
};

class ParamGroup {
 public:
  struct Options {
    int shards = 1;           // shard group size (1 in mode none: the shard is the whole)
    bool replicated = false;  // zero1/zero2 over a real shard group: parameters kept whole
    bool bf16 = false;        // bf16 parameters: 2 bytes on the wire, upcast for compute
    bool encoded = false;     // zero3 gathers of the encoded master (int8/int4 across nodes)
    bool hpz = false;         // keep the node block after forward
    int max_gathered = 0;     // EngineConfig::pipeline.max_gathered_units (0: no limit)
    int inter_shard = 1;      // J: shards in a node block
    int intra_idx = 0;        // this rank's node block in a gathered unit
  };

  // `units` (the model's, growing until finalize), the space and the collectives outlive this.
  ParamGroup(const std::vector<Unit>& units, MemorySpace& space, UnitCollectives& coll,
             const Options& options);

  // addUnit(): the new unit's (unallocated, Sharded) parameters.
  void addUnit() { params_.emplace_back(); }
  UnitParams& unit(int i) { return params_[i]; }
  const UnitParams& unit(int i) const { return params_[i]; }
  // The gathered blocks: fp32 (gathered parameters, full gradients) and bf16 (on the wire).
  BufferPool& pool() { return pool_; }
  BufferPool& pool16() { return pool16_; }
  const BufferPool& pool() const { return pool_; }

  // ---- the verbs (the caller checked the unit index) ----
  // unshard() needs the unit Sharded (its hpZ node block kept or not); checked before the
  // caller's waits, so that a wrong call changes nothing.
  [[nodiscard]] Status checkUnshard(int unit) const;
  // Sharded | NodeBlockKept -> Gathered (nothing to gather), Deferred (rate limited) or
  // Gathering (the all-gather in flight).
  [[nodiscard]] Status unshard(int unit);
  // Deferred | Gathering -> Gathered: issues a deferred gather, waits for (host) or orders
  // (device) the all-gather, upcasts bf16.
  [[nodiscard]] Status waitForUnshard(int unit);
  // -> Sharded, or NodeBlockKept with hpZ; the block returns to the pool and a deferred gather
  // may go out.
  [[nodiscard]] Status reshard(int unit);
  StatusOr<ParamView> param(int unit, std::string_view name) const;
  // copyOutParams: Gathered, then checkTensors and runCopies from the gathered parameters.
  [[nodiscard]] Status copyOut(int unit, std::span<const TensorRef> tensors);

  // copyOutParams / copyInGrads, in two steps so that copy-in can check everything before it
  // takes (and zeroes) the gradient buffer. checkTensors: every tensor against the unit's
  // layout and the memory space; runCopies: the planned copies between the tensors and the
  // flat buffer `flat` (which no tensor may lie inside), in one batch; into it, it adds.
  [[nodiscard]] Status checkTensors(int unit, std::span<const TensorRef> tensors, const char* verb,
                                    bool into_flat);
  [[nodiscard]] Status runCopies(int unit, std::span<const TensorRef> tensors, const char* verb,
                                 float* flat, bool into_flat);

 private:
  // One piece of copyOutParams / copyInGrads as checkTensors planned it.
  struct PlannedCopy {
    float* user;    // the caller's tensor
    size_t offset;  // of its parameter in the flat buffer
    size_t n;
    size_t k;  // index in the caller's list, for messages
  };

  // Issues the unit's all-gather into a pool block; `verb` names the caller in a state error.
  Status issueGather(int unit, std::string_view verb);
  // Issues deferred gathers, oldest first, while the limit allows.
  Status issueDeferred();
  // Waits (host) or orders the compute lane (device) for the unit's gather, counting host
  // waiting as exposed (and in the trace); the work is released.
  Status blockOn(int unit);

  const std::vector<Unit>& units_;
  MemorySpace& space_;
  UnitCollectives& coll_;
  Options opt_;
  std::vector<UnitParams> params_;  // per unit
  // The full-size blocks gathered parameters and full gradients live in while a unit is
  // unsharded or its gradient written, and the rate limiter's count of them.
  BufferPool pool_;           // fp32: gathered parameters, full gradients
  BufferPool pool16_;         // bf16: gathered parameters, gradients on the wire
  int gathered_alive_ = 0;    // zero3 units holding a gathered block
  std::deque<int> deferred_;  // rate-limited unshard() calls (Deferred units), in call order
  // copyOutParams / copyInGrads scratch, reused: no allocation once grown.
  std::vector<PlannedCopy> plan_;
  std::vector<CopyPiece> pieces_;
  std::vector<char> seen_;  // per parameter of the unit: named by a tensor already
};

}  // namespace hsdp::engine
