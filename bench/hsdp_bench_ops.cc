#include "bench/hsdp_bench_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/watchdog/watchdog.h"

namespace hsdp_bench {

using hsdp::DType;
using hsdp::RedOp;

float value(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 9); }

bool isOff(const std::string& name) {
  return name.size() > 4 && name.compare(name.size() - 4, 4, "-off") == 0;
}

std::string baseAlgo(const std::string& name) {
  return isOff(name) ? name.substr(0, name.size() - 4) : name;
}

void Bench::fill(void* buf, size_t n, int rank) {
  for (size_t i = 0; i < n; ++i) {
    float v = value(rank, i);
    if (dtype == DType::kFloat32)
      static_cast<float*>(buf)[i] = v;
    else
      static_cast<hsdp::bf16*>(buf)[i] = hsdp::toBf16(v);
  }
}

const HierCase* Bench::hierOf(const std::string& name) const {
  const std::string algo = baseAlgo(name);
  const std::vector<HierCase>& v = isOff(name) ? hiers_off : hiers;
  for (size_t k = 0; k < hiers.size(); ++k)
    if (hiers[k].name == algo) return &v[k];
  return nullptr;
}

hsdp::Status Bench::run(const std::string& op, const std::string& name, size_t count) {
  std::optional<hsdp::watchdog::Untraced> untraced;
  if (isOff(name)) untraced.emplace();
  const std::string algo = baseAlgo(name);
  hsdp::Comm& world = isOff(name) ? world_off : this->world;
  const int n = world.size();
  const HierCase* h = hierOf(name);
  const size_t per = count / n;
  MPI_Datatype mt = dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
  if (op == "allgather") {
    void* mine = send.data();
    if (h) return h->hier->allGather(mine, recv.data(), per, dtype);
    if (algo == "flat") return world.allGather(mine, recv.data(), per, dtype);
    MPI_Allgather(mine, int(per), mt, recv.data(), int(per), mt, raw);
    return hsdp::okStatus();
  }
  if (op == "reducescatter") {
    if (h) return h->hier->reduceScatter(send.data(), recv.data(), per, dtype, RedOp::kSum);
    if (algo == "flat")
      return world.reduceScatter(send.data(), recv.data(), per, dtype, RedOp::kSum);
    if (dtype != DType::kFloat32) return hsdp::unimplemented("MPI has no bf16 reduce-scatter");
    MPI_Reduce_scatter_block(send.data(), recv.data(), int(per), MPI_FLOAT, MPI_SUM, raw);
    return hsdp::okStatus();
  }
  std::memcpy(recv.data(), send.data(), count * es);  // all-reduce is in place
  if (h) return h->hier->allReduce(recv.data(), count, dtype, RedOp::kSum);
  if (algo == "flat") return world.allReduce(recv.data(), count, dtype, RedOp::kSum);
  if (dtype != DType::kFloat32) return hsdp::unimplemented("MPI has no bf16 all-reduce");
  MPI_Allreduce(MPI_IN_PLACE, recv.data(), int(count), MPI_FLOAT, MPI_SUM, raw);
  return hsdp::okStatus();
}

long Bench::wrong(const std::string& op, const std::string& algo, size_t count) {
  const int n = world.size(), r = world.rank();
  const HierCase* h = hierOf(algo);
  MPI_Comm raw = h ? shard_order : this->raw;
  const size_t per = count / n;
  std::vector<float> in(op == "allgather" ? per : count);
  for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
  std::vector<float> want(op == "reducescatter" ? per : count);
  if (op == "allgather")
    MPI_Allgather(in.data(), int(per), MPI_FLOAT, want.data(), int(per), MPI_FLOAT, raw);
  else if (op == "reducescatter")
    MPI_Reduce_scatter_block(in.data(), want.data(), int(per), MPI_FLOAT, MPI_SUM, raw);
  else
    MPI_Allreduce(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw);
  std::vector<double> tolerance;
  if (h && h->hier->gatherQuantizes() && dtype == DType::kFloat32) {
    if (op == "allgather") quantizedShards(h->wire, want, per);
    if (op == "reducescatter") tolerance = reduceTolerance(h->wire, in, per);
  }
  long bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    float got =
        dtype == DType::kFloat32 ? recv.as<float>()[i] : hsdp::toFloat(recv.as<hsdp::bf16>()[i]);
    if (tolerance.empty() ? got != want[i] : !(std::fabs(double(got) - want[i]) <= tolerance[i]))
      ++bad;
  }
  return bad;
}

void Bench::quantizedShards(const hsdp::WireFormat& wire, std::vector<float>& full, size_t per) {
  std::vector<unsigned char> enc(hsdp::encodedBytes(wire, per));
  for (size_t k = 0; k * per < full.size(); ++k) {
    hsdp::wireEncode(wire, full.data() + k * per, per, enc.data());
    hsdp::wireDecode(wire, enc.data(), per, full.data() + k * per);
  }
}

std::vector<double> Bench::reduceTolerance(const hsdp::WireFormat& wire,
                                           const std::vector<float>& in, size_t per) const {
  MPI_Comm intra = intra_raw, inter = inter_raw;
  const int J = mesh.interShard().size(), me = mesh.interShard().rank();
  const size_t k = static_cast<size_t>(mesh.shardGroup().rank()), n = in.size();
  std::vector<float> node(n), nodes(J * n);
  MPI_Allreduce(in.data(), node.data(), int(n), MPI_FLOAT, MPI_SUM, intra);
  MPI_Allgather(node.data(), int(n), MPI_FLOAT, nodes.data(), int(n), MPI_FLOAT, inter);
  const double levels = wire.wire == hsdp::Wire::kInt8 ? 127 : 7;
  std::vector<double> tol(per);
  for (size_t b0 = 0; b0 < per; b0 += wire.block) {
    const size_t b1 = std::min(per, b0 + wire.block);
    double quant = 0;
    for (int j = 0; j < J; ++j) {
      double amax = 0;
      for (size_t i = b0; i < b1; ++i) amax = std::max<double>(amax, nodes[j * n + k * per + i]);
      if (j != me) quant += (0.5 + std::ldexp(1.0, -12)) * amax * (1 + 1e-6) / levels;
    }
    for (size_t i = b0; i < b1; ++i) {
      double total = 0;
      for (int j = 0; j < J; ++j) total += nodes[j * n + k * per + i];
      tol[i] = quant + 4.0 * world.size() * std::ldexp(1.0, -24) * total;
    }
  }
  return tol;
}

}  // namespace hsdp_bench
