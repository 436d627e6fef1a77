// libFuzzer target for the checkpoint's readers of untrusted bytes: the manifest parser (JSON,
// every field checked, chunk lists tiling their tensors) and the safetensors header parser. The
// first input byte picks the reader (bit 0) and whether the document is amplified (bit 1: after
// the second byte, "prefix\x01open\x01close\x01suffix" with open and close repeated up to 2^20
// times each, up to 2 MiB: a dozen bytes make a document nested a million deep, beyond -max_len).
// Every input must give a value or an error, never a crash, a leak or memory beyond a constant
// times the input: the test runs with -rss_limit_mb=512, so a reader whose memory grows with depth
// (issue 41) fails it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/format.h"
#include "storage/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string amplified;
  if ((data[0] & 2) && size > 2) {
    // "prefix \x01 open \x01 close \x01 suffix": open and close repeated `times` times
    // each, suffix ({"x": [[[...]]]} from a dozen bytes).
    std::string_view part[4];
    std::string_view rest = text.substr(1);
    for (int i = 0; i < 3; ++i) {
      const size_t at = rest.find('\x01');
      part[i] = rest.substr(0, at);
      rest = at == std::string_view::npos ? std::string_view() : rest.substr(at + 1);
    }
    part[3] = rest;
    const size_t unit = std::max<size_t>(1, part[1].size() + part[2].size());
    const size_t times = std::min<size_t>((size_t{data[1]} << 12) + 1, (size_t{2} << 20) / unit);
    amplified.reserve(part[0].size() + unit * times + part[3].size());
    amplified.append(part[0]);
    for (size_t i = 0; i < times; ++i) amplified.append(part[1]);
    for (size_t i = 0; i < times; ++i) amplified.append(part[2]);
    amplified.append(part[3]);
    text = amplified;
  }
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
