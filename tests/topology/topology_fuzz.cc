// libFuzzer target for the topology readers: every input goes to the hwloc XML loader, the NCCL
// topology XML reader and the NVML snapshot reader, and then, behind a prologue its first byte
// chooses (a DOCTYPE with an internal subset or entity declarations, an XML declaration naming
// an encoding), to both XML readers again: hwloc XML first, then NCCL XML, the order in which a
// bad encoding once crashed in a handler of hwloc's unloaded libxml2 plugin. They must return a
// Status, never crash, hang or read out of bounds (built with AddressSanitizer). Seed corpus:
// tests/topology/fixtures and tests/topology/fuzz_seeds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "topology/node_topology.h"

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
  if (size == 0) return 0;
  static const char* const kPrologues[] = {
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology [ ]>\n",
      "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\" [<!ENTITY a \"0x00000001\">]>\n",
      "<!DOCTYPE topology [<!ENTITY a \"xxxxxxxx\"><!ENTITY b \"&a;&a;&a;&a;\">]>\n",
      "<!DOCTYPE topology [<!ENTITY e SYSTEM \"file:///dev/zero\">]>\n",
      "<?xml version=\"1.0\" encoding=\"ISO-2022-JP\"?>\n",
      "<?xml version=\"1.0\" encoding=\"UTF-16\"?>\n",
      "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n",
      "<?xml version=\"1.0\" encoding=\"EBCDIC-US\"?>\n",
      "<?xml version=\"1.0\" encoding=\"x-no-such-encoding\"?>\n",
      "\xff\xfe",  // a UTF-16LE byte order mark
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n",
  };
  const size_t n = sizeof(kPrologues) / sizeof(kPrologues[0]);
  const std::string v = kPrologues[data[0] % n] + std::string(text.substr(1));
  (void)hsdp::nodeTopologyFromHwlocXml(v, "fuzz.prologue.xml");
  (void)hsdp::gpuLinksFromNcclXml(host(), v, "fuzz.prologue.nccl.xml");
  return 0;
}
