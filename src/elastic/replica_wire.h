// The replica transport's wire constants and little-endian encoding (docs/elastic.md, "The
// replica transport"). Private to elastic/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hsdp::elastic::wire {

constexpr uint32_t kHelloMagic = 0x50525348;  // "HSRP" as little-endian bytes
constexpr uint32_t kDataMagic = 0x44525348;   // "HSRD"
constexpr uint32_t kAbortMagic = 0x41525348;  // "HSRA"
constexpr uint16_t kVersion = 1;
constexpr uint16_t kHello = 1, kAccept = 2, kRefuse = 3;
constexpr size_t kHelloBytes = 176;       // fixed part of a hello/answer (a refusal adds its text)
constexpr size_t kDataHeaderBytes = 16;   // magic, op sequence, payload bytes
constexpr size_t kAbortHeaderBytes = 16;  // magic, op sequence, suspect count, text bytes

inline void put16(std::string& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b += static_cast<char>(v >> (8 * i));
}
inline void put32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b += static_cast<char>(v >> (8 * i));
}
inline void put64(std::string& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b += static_cast<char>(v >> (8 * i));
}
inline uint64_t getN(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
inline uint16_t get16(const char* p) { return static_cast<uint16_t>(getN(p, 2)); }
inline uint32_t get32(const char* p) { return static_cast<uint32_t>(getN(p, 4)); }
inline uint64_t get64(const char* p) { return getN(p, 8); }

}  // namespace hsdp::elastic::wire
