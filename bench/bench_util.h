// What the single-process benchmarks share: medians over rounds and the machine's load, printed
// beside the tables (the machine may be shared).
#pragma once

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "hsdp/cpu_isa.h"

namespace hsdp::bench {

// --isa avx512,avx2: the ISAs named, each supported by this CPU (else the error names it); none
// named: every one this CPU supports, best first.
inline StatusOr<std::vector<CpuIsa>> parseIsas(const std::vector<std::string>& names) {
  std::vector<CpuIsa> isas;
  for (const std::string& name : names) {
    HSDP_ASSIGN_OR_RETURN(CpuIsa isa, parseCpuIsa(name));
    if (!cpuIsaSupported(isa))
      return failedPrecondition("ISA ", name, " is not supported on this CPU");
    isas.push_back(isa);
  }
  if (isas.empty()) isas = supportedCpuIsas();
  return isas;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

// /proc/loadavg's three figures, e.g. "1.02 0.97 0.80".
inline std::string loadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace hsdp::bench
