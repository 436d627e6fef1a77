// The engine's way to a memory space by Device (engine/memory_space.h): core's registry
// (core/memory_space.h), keyed by the device's name.
#include "engine/memory_space.h"

namespace hsdp {

Status memorySpaceAvailable(Device device) {
  if (findMemorySpace(deviceName(device))) return okStatus();
  return failedPrecondition("Device::k", device == Device::kCuda ? "Cuda" : "Host",
                            ": this hsdp "
                            "was built without CUDA (configured with HSDP_WITH_CUDA=OFF, or no "
                            "CUDA toolkit and NCCL were found); reconfigure with "
                            "-DHSDP_WITH_CUDA=ON");
}

StatusOr<SpaceBundle> createMemorySpace(Device device, void* compute_stream) {
  MemorySpaceFactory factory = findMemorySpace(deviceName(device));
  if (!factory) return memorySpaceAvailable(device);
  return factory(compute_stream);
}

}  // namespace hsdp
