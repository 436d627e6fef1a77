// Internal to the engine: the gradient path's owner (FSDP2's reduce side of FSDPParamGroup). Per
// unit it holds the gradient's memory and its lifecycle (engine/unit_state.h: GradLifecycle), and
// it owns the reductions in flight: ensure() hands out the unit's full gradient (zeroed at its
// first use in a step, so micro-steps add up), reduce() starts its reduce-scatter over the shard
// group, and poll() moves the reductions along: a landed scatter frees its block and starts the
// replica all-reduce (and, in elastic mode, the average over the replica groups); a landed
// all-reduce makes the gradient Reduced and tells the owner (an offloaded step may launch then).
// Every collective goes through UnitCollectives.
#pragma once

#include <deque>
#include <functional>
#include <string_view>
#include <vector>

#include "core/memory_space.h"
#include "engine/buffer_pool.h"
#include "engine/reduce_chain.h"
#include "engine/unit.h"
#include "engine/unit_collectives.h"
#include "engine/unit_state.h"

namespace hsdp::engine {

// One unit's gradient memory (finalize() allocates it, once) and where its gradient is.
struct UnitGrad {
  // This rank's fp32 gradient shard: what the reduce-scatter lands in and the optimizer steps.
  SpaceBuffer shard;
  // zero1 over a real shard group: the whole gradient, kept (zero2/zero3 take a pool block).
  SpaceBuffer whole;
  // bf16 reduction: the bf16 gradient shard the reduce-scatter lands in.
  SpaceBuffer shard16;
  // Error feedback of the encoded gradient wires: what this rank's encodings of the unit's
  // gradient dropped last step, added to what it sends next (zeros at first): the inter
  // reduce-scatter's (J-1 pieces of the shard) and the replica all-reduce's.
  SpaceBuffer residual, replica_residual;
  GradLifecycle life;  // Empty .. Reduced here; Stepping/Stepped: step.cc
};

class GradReducer {
 public:
  struct Options {
    int shards = 1;       // shard group size (1 in mode none: the full gradient is the shard)
    bool pooled = false;  // zero2/zero3: full gradients from the pool, returned after the scatter
    bool bf16 = false;    // reduce in bf16: round the full gradient, reduce 2-byte data
    // The shard's all-reduce over the replicas (false: semi-synchronous replicas, outer_step.h).
    bool replica_average = true;
  };
  // Called once a unit's reductions have landed (Reducing -> Reduced), in reduceGrad order.
  using OnReduced = std::function<Status(int unit)>;

  // `units` (the model's, growing until finalize), the space, the collectives and the pools
  // outlive this object.
  GradReducer(const std::vector<Unit>& units, MemorySpace& space, UnitCollectives& coll,
              BufferPool& pool, BufferPool& pool16, const Options& options, OnReduced on_reduced);

  // addUnit(): the new unit's (empty) gradient.
  void addUnit() { grads_.emplace_back(); }
  UnitGrad& unit(int i) { return grads_[i]; }
  const UnitGrad& unit(int i) const { return grads_[i]; }

  // The unit's full gradient for this step, zero-filled at its first use (grad(), copyInGrads()):
  // Empty | Reduced -> Accumulating. `verb` and `param` name the caller in the error
  // ("grad('u.w')", "copyInGrads('u')").
  [[nodiscard]] Status ensure(int unit, const char* verb, std::string_view param);
  // reduceGrad(): Accumulating -> Reducing; the reduce-scatter starts (mode none: the
  // all-reduce follows in poll()).
  [[nodiscard]] Status reduce(int unit);
  // Moves pending reductions along without blocking (or, with `block`, to the end).
  [[nodiscard]] Status poll(bool block);

 private:
  // A gradient on its way to the shard: reduce-scatter over the shard group, then all-reduce
  // over the replicas. Kept in reduce() order; the replica all-reduces are started in that
  // order too, so every rank issues them identically on the replica communicator.
  struct Pending {
    int unit = 0;
    WorkHandle scatter;    // full gradient -> shard (shard group), null in mode none
    WorkHandle replicate;  // shard all-reduce over the data-parallel replicas
    // Host fp32 with replicas (UnitCollectives::chainsReplica): the scatter and the replica
    // all-reduce as one chain the progress loop drives; `replicate` is its view, `scatter` null.
    std::unique_ptr<ReduceChain> chain;
    bool scatter_done = false;
    int64_t scatter_issued = 0, replicate_issued = 0;  // the trace's (Tracer::nowUs)
  };

  const std::vector<Unit>& units_;
  MemorySpace& space_;
  UnitCollectives& coll_;
  BufferPool& pool_;
  BufferPool& pool16_;
  Options opt_;
  OnReduced on_reduced_;
  std::vector<UnitGrad> grads_;  // per unit
  std::deque<Pending> pending_;

  // poll() of a chained reduction: its scatter's landing (the trace's event, the pool block
  // back), and with `block` the wait for the whole chain, split between the two kinds.
  [[nodiscard]] Status pollChain(Pending& p, bool block);
};

}  // namespace hsdp::engine
