#include "collectives/mpi/mpi_exchange.h"

#include <algorithm>

#include "collectives/mpi/mpi_check.h"
#include "collectives/mpi/mpi_sum.h"

namespace hsdp::mpi {

size_t ExchangeReduceScatterWork::scratchBytes(size_t block_bytes, int size) {
  if (size < 2) return 0;
  const size_t slots = block_bytes > kSegmentBytes ? 2 : 1;
  return slots * static_cast<size_t>(size - 1) * std::min(block_bytes, kSegmentBytes);
}

ExchangeReduceScatterWork::ExchangeReduceScatterWork(const Args& a)
    : a_(a), es_(dtypeSize(a.dtype)) {
  const size_t block = a_.layout.blockCount();
  seg_ = std::max<size_t>(1, std::min(block, kSegmentBytes / es_));
  nseg_ = (block + seg_ - 1) / seg_;
  for (size_t s = 0; s < std::min<size_t>(2, nseg_); ++s) postRecvs(s);
  if (done()) return;
  // Every send at once, to r+1, r+2, ... (so that no peer is everyone's first target), each
  // segment's parts in order: the peer posts its receives from us in the same order, and MPI
  // matches messages of one source and tag in the order they were sent.
  const int n = a_.size, r = a_.rank;
  const auto* in = static_cast<const char*>(a_.send);
  for (int i = 1; i < n; ++i) {
    const int to = (r + i) % n;
    for (size_t s = 0; s < nseg_; ++s)
      for (const Part& p : parts(s)) {
        const int rc =
            MPI_Isend(in + (a_.layout.offset(to, p.run) + p.off) * es_, static_cast<int>(p.len),
                      mpiType(a_.dtype), to, a_.tag, a_.comm, sends_.add());
        if (rc != MPI_SUCCESS) {
          fail(mpiError(rc, "MPI_Isend", __FILE__, __LINE__));
          return;
        }
        if (a_.sent != nullptr) a_.sent->fetch_add(p.len * es_, std::memory_order_relaxed);
      }
  }
}

std::vector<ExchangeReduceScatterWork::Part> ExchangeReduceScatterWork::parts(size_t s) const {
  std::vector<Part> out;
  const size_t run = a_.layout.run;
  const size_t lo = s * seg_, hi = std::min(a_.layout.blockCount(), lo + seg_);
  for (size_t p = lo / run; p * run < hi; ++p) {
    const size_t b = std::max(lo, p * run), e = std::min(hi, (p + 1) * run);
    out.push_back({p, b - p * run, e - b, b - lo});
  }
  return out;
}

char* ExchangeReduceScatterWork::landing(size_t s, int from) const {
  const int n = a_.size;
  const size_t peer = static_cast<size_t>((from - a_.rank - 1 + n) % n);  // r+1, r+2, ...: 0..n-2
  return a_.slot->as<char>() + ((s % 2) * static_cast<size_t>(n - 1) + peer) * seg_ * es_;
}

void ExchangeReduceScatterWork::postRecvs(size_t s) {
  RequestSet& reqs = recvs_[s % 2];
  reqs.clear();
  const std::vector<Part> ps = parts(s);
  const int n = a_.size, r = a_.rank;
  for (int i = 1; i < n; ++i) {
    const int from = (r - i + n) % n;
    char* base = landing(s, from);
    for (const Part& p : ps) {
      const int rc = MPI_Irecv(base + p.pos * es_, static_cast<int>(p.len), mpiType(a_.dtype), from,
                               a_.tag, a_.comm, reqs.add());
      if (rc != MPI_SUCCESS) return fail(mpiError(rc, "MPI_Irecv", __FILE__, __LINE__));
    }
  }
}

void ExchangeReduceScatterWork::sumSegment(size_t s) {
  const int n = a_.size, r = a_.rank;
  const auto* in = static_cast<const char*>(a_.send);
  auto* out = static_cast<char*>(a_.recv);
  const bool avg = a_.op == RedOp::kAvg;
  const float scale = 1.0f / static_cast<float>(n);
  std::vector<const void*> src(static_cast<size_t>(n));
  for (const Part& p : parts(s)) {
    for (int q = 0; q < n; ++q)
      src[q] =
          q == r ? in + (a_.layout.offset(r, p.run) + p.off) * es_ : landing(s, q) + p.pos * es_;
    void* dst = out + (p.run * a_.layout.run + p.off) * es_;
    sumBlocks(a_.dtype, src.data(), n, p.len, avg ? scale : 1.0f, dst);
  }
}

void ExchangeReduceScatterWork::fail(Status s) {
  sends_.cancel();
  recvs_[0].cancel();
  recvs_[1].cancel();
  a_.pool->release(a_.slot);
  finish(std::move(s));
}

void ExchangeReduceScatterWork::advance() {
  while (next_ < nseg_) {
    StatusOr<bool> flag = recvs_[next_ % 2].test();
    if (!flag.ok()) return fail(flag.status());
    if (!*flag) return;
    sumSegment(next_);
    if (next_ + 2 < nseg_) {
      postRecvs(next_ + 2);
      if (done()) return;
    }
    ++next_;
  }
  StatusOr<bool> flag = sends_.test();
  if (!flag.ok()) return fail(flag.status());
  if (!*flag) return;
  a_.pool->release(a_.slot);
  finish(Status());
}

}  // namespace hsdp::mpi
