// The few NVML types hsdp calls through dlopen (topology/gpu_links.cc), declared here rather than
// taken from nvml.h so that hsdp builds without the CUDA toolkit; layouts follow nvml.h of driver
// 535+. At global scope, with nvml.h's own names, as the library declares them: a function
// pointer of these types has the type of the function it points at, whoever defines it (the
// driver's library, or tests/topology/fake_nvml.cc, whose definitions Clang's UBSan checks
// against the caller's pointer type, -fsanitize=function).
#pragma once

extern "C" {
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlPciInfo_st {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct nvmlGpuFabricInfo_st {
  unsigned char clusterUuid[16];
  nvmlReturn_t status;
  unsigned int cliqueId;
  unsigned char state;  // 0 not supported, 1 not started, 2 in progress, 3 completed
} nvmlGpuFabricInfo_t;
}
