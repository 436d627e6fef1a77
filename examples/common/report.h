// What every example prints alike: the node map, the offload summary, and the per-rank memory
// table beside hsdp-plan's prediction. Each program's own header and per-step row are its own
// (mlp/options.h, gpt/report.h).
#pragma once

#include <cstdint>
#include <vector>

#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace examples {

// The header's first two lines (the caller prints them on rank 0 only):
//   hsdp <program>: <n> ranks on <k> [virtual ]nodes (<names>)
//   mesh: <Mesh::describe()>
void printNodeMap(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh);
// Semi-synchronous replicas (docs/semi_sync.md): the policy's header line, printed only when it
// is not sync (the default's output is unchanged). The caller prints on rank 0.
void printReplicaPolicy(const hsdp::EngineConfig& cfg);

// With CPU offload, rank 0 prints how much CPU Adam time per step the run spent and how much of
// it step() waited for (the totals of ShardedModel::takeOptimizerSeconds over `steps` steps).
void printOffloadSummary(const hsdp::Comm& world, const hsdp::EngineConfig& cfg, int steps,
                         double optim_total_s, double optim_exposed_s);

// Elastic mode (ShardedModel::beginStep), rank 0 only:
//   elastic: step <s> attempt <a>: groups <i,j,...> of <n> (this is group <g>)   [when they change]
//   elastic: group <g> healed to step <s> from group <d>: <bytes> bytes per rank in <t> s (<GB/s>)
// Without elastic mode nothing.
void printStepStart(const hsdp::Comm& world, const hsdp::StepStart& start);
//   elastic: step <s> attempt <a> not committed; running it again (<why>)
void printAbortedStep(const hsdp::Comm& world, const hsdp::StepStart& start,
                      const hsdp::Status& why);

// Collective over `world`: the per-rank memory table, hsdp-plan's prediction beside rank 0's
// measurement (fp32 policy), and the saving against replicated data parallel. unit_numels holds
// each unit's parameter count (the plan's units; their sum is the model's size), unit_uses the
// times each is used in one forward (empty: once each; train_gpt's tied wte: twice).
[[nodiscard]] hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh,
                                       const hsdp::ShardedModel& model,
                                       const std::vector<uint64_t>& unit_numels,
                                       const hsdp::EngineConfig& cfg,
                                       const std::vector<uint32_t>& unit_uses = {});

}  // namespace examples
