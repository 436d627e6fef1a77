// libFuzzer target for the checkpoint's readers of untrusted bytes: the manifest parser (JSON,
// every field checked, chunk lists tiling their tensors) and the safetensors header parser. The
// first input byte picks the reader; the rest is the document. Every input must give a value or
// an error, never a crash, a leak or unbounded memory.
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/format.h"
#include "storage/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    auto m = hsdp::ckpt::parseManifest(text, "fuzz/manifest.json");
    if (m.ok()) {
      // What readers do next with a manifest that parsed: look tensors up, plan files.
      for (size_t u = 0; u < m->units.size(); ++u)
        for (size_t p = 0; p < m->units[u].params.size(); ++p)
          (void)m->tensorIndex(static_cast<int>(u), static_cast<int>(p), hsdp::ckpt::State::kParam);
      (void)hsdp::ckpt::serializeManifest(*m);
    }
  } else {
    (void)hsdp::ckpt::parseSafetensorsHeader(text, data[0] * uint64_t{4096}, "fuzz.safetensors");
  }
  return 0;
}
