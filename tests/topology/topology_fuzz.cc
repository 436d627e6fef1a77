// libFuzzer target for the topology readers: every input goes to the hwloc XML loader, the NCCL
// topology XML reader and the NVML snapshot reader. They must return a Status, never crash, hang
// or read out of bounds (built with AddressSanitizer). Seed corpus: tests/topology/fixtures.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hsdp/node_topology.h"

namespace {
// A host with two GPUs for the link readers to match against (built once, no file I/O).
const hsdp::NodeTopology& host() {
  static const hsdp::NodeTopology t = [] {
    hsdp::NodeTopology n;
    n.source = "fuzz";
    for (int i = 0; i < 2; ++i) {
      hsdp::GpuDevice g;
      g.index = i;
      g.pci = {0, static_cast<uint32_t>(0x19 + i), 0, 0};
      n.gpus.push_back(g);
    }
    n.links.direct.assign(2, std::vector<int>(2, 0));
    n.links.to_switch.assign(2, 0);
    n.links.fabric.assign(2, hsdp::GpuFabric());
    return n;
  }();
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)hsdp::nodeTopologyFromHwlocXml(text, "fuzz.xml");
  (void)hsdp::gpuLinksFromNcclXml(host(), text, "fuzz.nccl.xml");
  (void)hsdp::gpuLinksFromNvmlSnapshot(host(), text, "fuzz.nvml.json");
  return 0;
}
