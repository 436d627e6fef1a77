#include "collectives/ucx/schedule.h"

#include <algorithm>
#include <cstring>

namespace hsdp::ucx {
namespace {

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

int largestPowerOfTwoAtMost(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }
const char* at(const void* base, size_t offset) { return static_cast<const char*>(base) + offset; }

template <typename T>
void addInto(void* dst, const void* src, size_t n) {
  auto* d = static_cast<T*>(dst);
  auto* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}

// In-place recursive-doubling all-reduce (sum) of `count` elements of `buf`, `tmp` receiving the
// partner's `count` elements. Non-powers of two: with p the largest power of two <= n and
// extra = n - p, ranks 2i and 2i+1 (i < extra) first fold into the odd one, the p remaining ranks
// run log2(p) pairwise exchanges, and the odd ranks hand the result back. Message ids:
// `msg` (fold), msg+1+k (round k), msg+1+log2(p) (unfold). Returns the next free id.
uint32_t appendRecursiveDoubling(Schedule& s, int rank, int size, void* buf, size_t count,
                                 DType dtype, void* tmp, uint32_t msg) {
  const size_t bytes = count * dtypeSize(dtype);
  const int p = largestPowerOfTwoAtMost(size);
  const int extra = size - p;
  int rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  const uint32_t fold_msg = msg, unfold_msg = msg + 1 + rounds;

  const bool folded = rank < 2 * extra;
  const bool idle = folded && rank % 2 == 0;  // hands its data over and waits for the result
  if (folded) {
    if (idle) {
      s.send(rank + 1, buf, bytes, fold_msg);
    } else {
      s.recv(rank - 1, tmp, bytes, fold_msg);
      s.accumulate(buf, tmp, count, dtype);
    }
    s.endStep();
  }
  if (!idle) {
    const int vrank = folded ? rank / 2 : rank - extra;
    for (int k = 0; k < rounds; ++k) {
      const int vpeer = vrank ^ (1 << k);
      const int peer = vpeer < extra ? 2 * vpeer + 1 : vpeer + extra;
      s.send(peer, buf, bytes, msg + 1 + k);
      s.recv(peer, tmp, bytes, msg + 1 + k);
      s.accumulate(buf, tmp, count, dtype);
      s.endStep();
    }
  }
  if (folded) {
    if (idle)
      s.recv(rank + 1, buf, bytes, unfold_msg);
    else
      s.send(rank - 1, buf, bytes, unfold_msg);
    s.endStep();
  }
  return unfold_msg + 1;
}

// Balanced partition of `count` elements into `size` blocks (sizes differ by at most one).
size_t blockBegin(size_t count, int size, int b) { return count * b / size; }

}  // namespace

void runLocalOp(const LocalOp& op) {
  switch (op.kind) {
    case LocalOp::kCopy:
      if (op.dst != op.src && op.n > 0) std::memcpy(op.dst, op.src, op.n);
      return;
    case LocalOp::kAccumulate:
      switch (op.dtype) {
        case DType::kFloat32:
          addInto<float>(op.dst, op.src, op.n);
          return;
        case DType::kInt32:
          addInto<int32_t>(op.dst, op.src, op.n);
          return;
        case DType::kInt64:
          addInto<int64_t>(op.dst, op.src, op.n);
          return;
        case DType::kUInt8:
          addInto<uint8_t>(op.dst, op.src, op.n);
          return;
        case DType::kBFloat16: {
          auto* d = static_cast<bf16*>(op.dst);
          auto* s = static_cast<const bf16*>(op.src);
          for (size_t i = 0; i < op.n; ++i) d[i] = toBf16(toFloat(d[i]) + toFloat(s[i]));
          return;
        }
      }
      return;
    case LocalOp::kScale:
      if (op.dtype == DType::kFloat32) {
        auto* d = static_cast<float*>(op.dst);
        for (size_t i = 0; i < op.n; ++i) d[i] *= op.factor;
      } else if (op.dtype == DType::kBFloat16) {
        auto* d = static_cast<bf16*>(op.dst);
        for (size_t i = 0; i < op.n; ++i) d[i] = toBf16(toFloat(d[i]) * op.factor);
      }
      return;
  }
}

void Schedule::clear() {
  steps_.clear();
  sends_.clear();
  recvs_.clear();
  ops_.clear();
  open_ = Step{0, 0, 0, 0, 0, 0};
  max_msg_ = 0;
}

void Schedule::send(int peer, const void* buf, size_t bytes, uint32_t msg) {
  // UCP sends take a const buffer; Transfer is shared with receives, hence the cast.
  sends_.push_back({peer, const_cast<void*>(buf), bytes, msg});
  max_msg_ = std::max(max_msg_, msg);
}

void Schedule::recv(int peer, void* buf, size_t bytes, uint32_t msg) {
  recvs_.push_back({peer, buf, bytes, msg});
  max_msg_ = std::max(max_msg_, msg);
}

void Schedule::copy(void* dst, const void* src, size_t bytes) {
  ops_.push_back({LocalOp::kCopy, dst, src, bytes, DType::kUInt8, 1.0f});
}

void Schedule::accumulate(void* dst, const void* src, size_t count, DType dtype) {
  ops_.push_back({LocalOp::kAccumulate, dst, src, count, dtype, 1.0f});
}

void Schedule::scale(void* buf, size_t count, DType dtype, float factor) {
  ops_.push_back({LocalOp::kScale, buf, nullptr, count, dtype, factor});
}

void Schedule::endStep() {
  if (open_.send_begin == sends_.size() && open_.recv_begin == recvs_.size() &&
      open_.op_begin == ops_.size())
    return;  // nothing was added: no step
  open_.send_end = static_cast<uint32_t>(sends_.size());
  open_.recv_end = static_cast<uint32_t>(recvs_.size());
  open_.op_end = static_cast<uint32_t>(ops_.size());
  steps_.push_back(open_);
  open_ = Step{open_.send_end, open_.send_end, open_.recv_end,
               open_.recv_end, open_.op_end,   open_.op_end};
}

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kLocal:
      return "local";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "recursive-doubling";
    case Algorithm::kBruck:
      return "bruck";
    case Algorithm::kBinomial:
      return "binomial";
    case Algorithm::kDissemination:
      return "dissemination";
    case Algorithm::kPairwise:
      return "pairwise";
  }
  return "?";
}

// ---- all-gather --------------------------------------------------------------------------------

Algorithm chooseAllGather(int size, size_t count, DType dtype, size_t small_bytes) {
  if (size == 1) return Algorithm::kLocal;
  if (size * count * dtypeSize(dtype) <= small_bytes)
    return isPowerOfTwo(size) ? Algorithm::kRecursiveDoubling : Algorithm::kBruck;
  return Algorithm::kRing;
}

size_t allGatherScratchBytes(Algorithm a, int size, size_t count, DType dtype) {
  return a == Algorithm::kBruck ? size * count * dtypeSize(dtype) : 0;
}

void buildAllGather(Schedule& s, Algorithm a, int rank, int size, const void* send, void* recv,
                    size_t count, DType dtype, void* scratch) {
  const size_t B = count * dtypeSize(dtype);
  const int n = size, r = rank;
  if (a == Algorithm::kBruck) {
    // scratch block i ends up holding rank (r+i)'s block; in round k we pass our first
    // min(2^k, n-2^k) blocks to rank r-2^k and receive rank r+2^k's behind ours.
    s.copy(scratch, send, B);
    s.endStep();
    uint32_t msg = 0;
    for (int dist = 1; dist < n; dist *= 2, ++msg) {
      const size_t blocks = static_cast<size_t>(std::min(dist, n - dist));
      s.send(mod(r - dist, n), scratch, blocks * B, msg);
      s.recv(mod(r + dist, n), at(scratch, dist * B), blocks * B, msg);
      s.endStep();
    }
    // Rotate: scratch blocks [0, n-r) are ranks r..n-1, [n-r, n) are ranks 0..r-1.
    s.copy(at(recv, r * B), scratch, (n - r) * B);
    s.copy(recv, at(scratch, (n - r) * B), r * B);
    s.endStep();
    return;
  }
  // Every other algorithm works in place in `recv`, starting from our own block.
  s.copy(at(recv, r * B), send, B);  // a no-op copy (skipped) when in place
  s.endStep();
  if (a == Algorithm::kRecursiveDoubling) {
    // Power of two: after round k we hold the 2^(k+1) blocks of our aligned group.
    uint32_t msg = 0;
    for (int dist = 1; dist < n; dist *= 2, ++msg) {
      const int peer = r ^ dist;
      const int mine = r & ~(dist - 1), theirs = peer & ~(dist - 1);
      s.send(peer, at(recv, mine * B), dist * B, msg);
      s.recv(peer, at(recv, theirs * B), dist * B, msg);
      s.endStep();
    }
  } else if (a == Algorithm::kRing) {
    // Step t: pass on the block received in step t-1 (our own first), receive the next.
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (int t = 0; t < n - 1; ++t) {
      s.send(next, at(recv, mod(r - t, n) * B), B, t);
      s.recv(prev, at(recv, mod(r - t - 1, n) * B), B, t);
      s.endStep();
    }
  }
}

bool allGatherRunsFits(int size, const BlockRuns& layout) {
  return static_cast<uint64_t>(size - 1) * layout.runs <= kMaxRunMessages;
}

void buildAllGatherRuns(Schedule& s, int rank, int size, const void* send, void* recv,
                        const BlockRuns& layout, DType dtype) {
  const size_t es = dtypeSize(dtype), R = layout.run * es;
  const int n = size, r = rank;
  auto run = [&](int block, size_t p) {
    return at(recv, layout.offset(static_cast<size_t>(block), p) * es);
  };
  // Our own block to its runs (no copies when it lies there already).
  if (send != run(r, 0))
    for (size_t p = 0; p < layout.runs; ++p)
      s.copy(run(r, p), at(const_cast<void*>(send), p * R), R);
  s.endStep();
  // The ring of buildAllGather, each block as its runs: step t passes on the runs of the block
  // received in step t-1 (our own first) and receives the next block's, each run one message.
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int t = 0; t < n - 1; ++t) {
    for (size_t p = 0; p < layout.runs; ++p) {
      const uint32_t msg = static_cast<uint32_t>(t * layout.runs + p);
      s.send(next, run(mod(r - t, n), p), R, msg);
      s.recv(prev, run(mod(r - t - 1, n), p), R, msg);
    }
    s.endStep();
  }
}

// ---- reduce-scatter ----------------------------------------------------------------------------

Algorithm chooseReduceScatter(int size, size_t count, DType dtype, size_t small_bytes) {
  if (size == 1) return Algorithm::kLocal;
  if (size * count * dtypeSize(dtype) <= small_bytes) return Algorithm::kRecursiveDoubling;
  return Algorithm::kRing;
}

size_t reduceScatterScratchBytes(Algorithm a, int size, size_t count, DType dtype) {
  const size_t B = count * dtypeSize(dtype);
  if (a == Algorithm::kRing) return 2 * B;                      // two partial sums in flight
  if (a == Algorithm::kRecursiveDoubling) return 2 * size * B;  // working copy + partner's
  return 0;
}

void buildReduceScatter(Schedule& s, Algorithm a, int rank, int size, const void* send, void* recv,
                        size_t count, DType dtype, RedOp op, void* scratch) {
  const size_t B = count * dtypeSize(dtype);
  const int n = size, r = rank;
  if (a == Algorithm::kLocal) {
    s.copy(recv, send, B);
    s.endStep();
    return;
  }
  if (a == Algorithm::kRecursiveDoubling) {
    void* work = scratch;
    void* tmp = at(scratch, n * B);
    s.copy(work, send, n * B);
    s.endStep();
    appendRecursiveDoubling(s, r, n, work, n * count, dtype, tmp, 0);
    s.copy(recv, at(work, r * B), B);
  } else {
    // The ring of the MPI transport: in step t we send our partial sum of block (r-t-1), receive
    // the partial of block (r-t-2) from the left and add our own contribution; after n-1 steps
    // the partial in hand is the full sum of block r, received straight into `recv`.
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    void* partial[2] = {scratch, at(scratch, B)};
    const void* out = at(send, mod(r - 1, n) * B);
    for (int t = 0; t < n - 1; ++t) {
      void* in = t == n - 2 ? recv : partial[t % 2];
      s.send(next, out, B, t);
      s.recv(prev, in, B, t);
      s.accumulate(in, at(send, mod(r - t - 2, n) * B), count, dtype);
      s.endStep();
      out = in;
    }
  }
  if (op == RedOp::kAvg) s.scale(recv, count, dtype, 1.0f / static_cast<float>(n));
  s.endStep();
}

// ---- all-reduce --------------------------------------------------------------------------------

Algorithm chooseAllReduce(int size, size_t count, DType dtype, size_t small_bytes) {
  if (size == 1) return Algorithm::kLocal;
  if (count * dtypeSize(dtype) <= small_bytes || count < static_cast<size_t>(size))
    return Algorithm::kRecursiveDoubling;
  return Algorithm::kRing;
}

size_t allReduceScratchBytes(Algorithm a, int size, size_t count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  if (a == Algorithm::kRecursiveDoubling) return count * es;
  if (a == Algorithm::kRing) return (count + size - 1) / size * es;  // the largest block
  return 0;
}

void buildAllReduce(Schedule& s, Algorithm a, int rank, int size, void* buf, size_t count,
                    DType dtype, RedOp op, void* scratch) {
  const size_t es = dtypeSize(dtype);
  const int n = size, r = rank;
  const float inv_n = 1.0f / static_cast<float>(n);
  if (a == Algorithm::kLocal) return;  // the sum (and the average) over one rank is the input
  if (a == Algorithm::kRecursiveDoubling) {
    appendRecursiveDoubling(s, r, n, buf, count, dtype, scratch, 0);
    if (op == RedOp::kAvg) {
      s.scale(buf, count, dtype, inv_n);
      s.endStep();
    }
    return;
  }
  // Ring = ring reduce-scatter of n balanced blocks in place, then ring all-gather. After the
  // first phase rank r owns the full sum of block r+1; the owner alone averages it, so every rank
  // receives the same bits.
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  auto off = [&](int b) { return blockBegin(count, n, b) * es; };
  auto len = [&](int b) { return blockBegin(count, n, b + 1) - blockBegin(count, n, b); };
  for (int t = 0; t < n - 1; ++t) {
    const int out = mod(r - t, n), in = mod(r - t - 1, n);
    s.send(next, at(buf, off(out)), len(out) * es, t);
    s.recv(prev, scratch, len(in) * es, t);
    s.accumulate(at(buf, off(in)), scratch, len(in), dtype);
    s.endStep();
  }
  if (op == RedOp::kAvg) {
    const int own = mod(r + 1, n);
    s.scale(at(buf, off(own)), len(own), dtype, inv_n);
    s.endStep();
  }
  for (int t = 0; t < n - 1; ++t) {
    const int out = mod(r + 1 - t, n), in = mod(r - t, n);
    s.send(next, at(buf, off(out)), len(out) * es, n - 1 + t);
    s.recv(prev, at(buf, off(in)), len(in) * es, n - 1 + t);
    s.endStep();
  }
}

// ---- all-to-all ---------------------------------------------------------------------------------

void buildAllToAll(Schedule& s, int rank, int size, const void* send, void* recv, size_t count,
                   DType dtype) {
  const size_t b = count * dtypeSize(dtype);
  for (int i = 1; i < size; ++i) {
    const int to = mod(rank + i, size), from = mod(rank - i, size);
    s.send(to, at(send, to * b), b, 0);
    s.recv(from, at(recv, from * b), b, 0);
  }
  s.copy(at(recv, rank * b), at(send, rank * b), b);
  s.endStep();
}

// ---- broadcast, barrier ------------------------------------------------------------------------

void buildBroadcast(Schedule& s, int rank, int size, void* buf, size_t bytes, int root) {
  // Relative rank v: in round k ranks v < 2^k send to v + 2^k, which receive.
  const int v = mod(rank - root, size);
  uint32_t msg = 0;
  for (int dist = 1; dist < size; dist *= 2, ++msg) {
    if (v < dist && v + dist < size) {
      s.send(mod(v + dist + root, size), buf, bytes, msg);
      s.endStep();
    } else if (v >= dist && v < 2 * dist) {
      s.recv(mod(v - dist + root, size), buf, bytes, msg);
      s.endStep();
    }
  }
}

void buildBarrier(Schedule& s, int rank, int size, void* token) {
  uint32_t msg = 0;
  for (int dist = 1; dist < size; dist *= 2, ++msg) {
    s.send(mod(rank + dist, size), token, 0, msg);
    s.recv(mod(rank - dist, size), token, 0, msg);
    s.endStep();
  }
}

}  // namespace hsdp::ucx
