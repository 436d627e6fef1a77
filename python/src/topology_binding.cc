// hsdp.topology: what hsdp-topo prints (hsdp/topology_report.h), as a dict that
// python/hsdp/topology.py wraps.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "hsdp/topology_report.h"
#include "src/common.h"

namespace hsdp::py {

void bindTopology(nb::module_& m) {
  m.def(
      "_topology_report",
      [](std::vector<std::string> hwloc_xml, std::vector<std::string> nvml,
         std::vector<std::string> nccl, int ranks_per_host, int intra_shard, int inter_shard,
         std::string bind) {
        TopologyQuery q{std::move(hwloc_xml), std::move(nvml), std::move(nccl), ranks_per_host,
                        intra_shard,          inter_shard,     std::move(bind)};
        StatusOr<std::string> j = [&] {
          nb::gil_scoped_release unlocked;
          return topologyReportJson(q);
        }();
        return loadsJson(take(std::move(j)));
      },
      nb::arg("hwloc_xml"), nb::arg("nvml"), nb::arg("nccl"), nb::arg("ranks_per_host"),
      nb::arg("intra_shard"), nb::arg("inter_shard"), nb::arg("bind"));
}

}  // namespace hsdp::py
