// A stand-in for libnvidia-ml.so.1 so that the dlopen path of hsdp's NVML reader runs without a
// driver. FAKE_NVML_MODE=init_fails makes nvmlInit_v2 fail as a host without a loaded driver
// does; otherwise it reports the 4 GPUs of fixtures/workstation_4gpu.xml with NVLink bridges
// pairing GPU0-GPU1 and GPU2-GPU3 (4 links each), no NVSwitch and no fabric.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "topology/nvml_abi.h"  // the types hsdp's caller uses (its function pointers' types)

extern "C" {
static const unsigned kBus[4] = {0x17, 0x31, 0x4b, 0x65};

int nvmlInit_v2() {
  const char* m = std::getenv("FAKE_NVML_MODE");
  return m && std::strcmp(m, "init_fails") == 0 ? 9 : 0;  // 9: NVML_ERROR_DRIVER_NOT_LOADED
}
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char* v, unsigned n) {
  std::snprintf(v, n, "fake-1.0");
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = 4;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
  if (i >= 4) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<size_t>(i + 1));
  return 0;
}
static unsigned idx(nvmlDevice_t d) {
  return static_cast<unsigned>(reinterpret_cast<size_t>(d) - 1);
}
static void fill(nvmlPciInfo_t* p, unsigned i) {
  std::memset(p, 0, sizeof(*p));
  p->bus = kBus[i];
  std::snprintf(p->busId, sizeof(p->busId), "00000000:%02X:00.0", kBus[i]);
}
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* p) {
  fill(p, idx(d));
  return 0;
}
int nvmlDeviceGetName(nvmlDevice_t, char* name, unsigned n) {
  std::snprintf(name, n, "NVIDIA RTX A6000");
  return 0;
}
int nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned link, int* active) {
  if (link >= 4) return 3;  // NVML_ERROR_NOT_SUPPORTED past the last link
  *active = 1;
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned, nvmlPciInfo_t* p) {
  fill(p, idx(d) ^ 1u);  // the bridge partner
  return 0;
}
}
