// The summation of the MPI transport's reduce-scatters that receive whole blocks (the exchange,
// mpi_exchange.h, and the cross-memory-attach one, mpi_cma.h): n sources added element by element
// in float, in source order (rank order, so every rank's result is reproducible and both paths
// give the same bits), scaled, rounded to the data type once.
#pragma once

#include <algorithm>
#include <cstddef>

#include "hsdp/dtype.h"

namespace hsdp::mpi {
namespace sum_detail {

inline float load(float x) { return x; }
inline float load(bf16 x) { return toFloat(x); }
inline void store(float v, float* d) { *d = v; }
inline void store(float v, bf16* d) { *d = toBf16(v); }

// The passes over one tile, each a loop the compiler vectorizes (restrict: no aliasing checks;
// not inlined, so that GCC does not fuse two passes into one scalar loop).
template <typename T>
[[gnu::noinline]] void first(float* __restrict acc, const T* __restrict a, const T* __restrict b,
                             size_t m) {
  for (size_t i = 0; i < m; ++i) acc[i] = load(a[i]) + load(b[i]);
}
template <typename T>
[[gnu::noinline]] void add(float* __restrict acc, const T* __restrict s, size_t m) {
  for (size_t i = 0; i < m; ++i) acc[i] += load(s[i]);
}
template <typename T>
[[gnu::noinline]] void put(T* __restrict out, const float* __restrict acc, size_t m, float scale) {
  if (scale != 1.0f)
    for (size_t i = 0; i < m; ++i) store(acc[i] * scale, out + i);
  else
    for (size_t i = 0; i < m; ++i) store(acc[i], out + i);
}

// Tiles of the accumulator stay in L1: each source is read once and `out` written once. n >= 2.
template <typename T>
void sum(const void* const* src, int n, size_t len, float scale, void* out) {
  constexpr size_t kTile = 1024;
  alignas(64) float acc[kTile];
  auto at = [src](int q, size_t t) { return static_cast<const T*>(src[q]) + t; };
  for (size_t t = 0; t < len; t += kTile) {
    const size_t m = std::min(kTile, len - t);
    first(acc, at(0, t), at(1, t), m);
    for (int q = 2; q < n; ++q) add(acc, at(q, t), m);
    put(static_cast<T*>(out) + t, acc, m, scale);
  }
}

}  // namespace sum_detail

// out[i] = (src[0][i] + ... + src[n-1][i]) * scale for i < len; float32 or bf16 data; n >= 2.
inline void sumBlocks(DType dtype, const void* const* src, int n, size_t len, float scale,
                      void* out) {
  if (dtype == DType::kBFloat16)
    sum_detail::sum<bf16>(src, n, len, scale, out);
  else
    sum_detail::sum<float>(src, n, len, scale, out);
}

}  // namespace hsdp::mpi
