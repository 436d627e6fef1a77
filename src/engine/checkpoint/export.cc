// ShardedModel::exportSafetensors: the full parameters, one unit at a time (gatherFullParameters,
// collective), written by rank 0 with the writer exportCheckpoint uses, so a model and a
// checkpoint of it export to the same bytes.
#include "engine/sharded_model_impl.h"
#include "storage/safetensors.h"

namespace hsdp {

StatusOr<std::vector<std::string>> ShardedModel::exportSafetensors(const std::string& out,
                                                                   const ExportOptions& options) {
  Impl& m = *impl_;
  Status local = m.checkIdle("exportSafetensors");
  std::vector<ckpt::SafetensorsWriter::Tensor> list;
  for (const engine::Unit& u : m.units)
    for (const ParamSpec& p : u.layout.params())
      list.push_back({ckpt::joinedName(u.name, p.name), p.shape});
  StatusOr<ckpt::SafetensorsWriter> w =
      ckpt::SafetensorsWriter::create(out, std::move(list), options.dtype, options.max_shard_bytes);
  if (local.ok()) local = w.status();
  // Rank 0 writes: its view of the target decides (not a link, device, FIFO or directory).
  if (local.ok() && m.mesh->world().rank() == 0) local = w->checkTargets({});
  HSDP_RETURN_IF_ERROR(m.agree(local));
  const bool writer = m.mesh->world().rank() == 0;
  std::vector<float> full;
  for (int u = 0; u < numUnits(); ++u) {
    // Every rank takes part in every gather, whatever rank 0's file does.
    HSDP_RETURN_IF_ERROR(gatherFullParameters(u, &full));
    if (writer && local.ok()) local = w->append(full.data(), full.size());
  }
  std::vector<std::string> files = w->plannedFiles();
  if (writer && local.ok()) local = w->finish().status();
  HSDP_RETURN_IF_ERROR(m.agree(local));
  return files;
}

}  // namespace hsdp
