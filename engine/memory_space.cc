#include <map>
#include <mutex>

#include "core/modules.h"
#include "engine/memory_space.h"

namespace hsdp {
namespace {

struct SpaceRegistry {
  std::mutex mu;  // why: modules register on first use, from whichever thread that is
  std::map<Device, MemorySpaceFactory> factories;
};

SpaceRegistry& spaces() {
  static SpaceRegistry* r = new SpaceRegistry();  // never destroyed: see core/registry.cc
  return *r;
}

}  // namespace

void registerMemorySpace(Device device, MemorySpaceFactory factory) {
  SpaceRegistry& r = spaces();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[device] = std::move(factory);
}

namespace {
MemorySpaceFactory findFactory(Device device) {
  modules::ensureRegistered();
  SpaceRegistry& r = spaces();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.factories.find(device);
  return it != r.factories.end() ? it->second : MemorySpaceFactory();
}
}  // namespace

Status memorySpaceAvailable(Device device) {
  if (findFactory(device)) return okStatus();
  return failedPrecondition("Device::k", device == Device::kCuda ? "Cuda" : "Host", ": this hsdp "
                              "was built without CUDA (configured with HSDP_WITH_CUDA=OFF, or no "
                              "CUDA toolkit and NCCL were found); reconfigure with "
                            "-DHSDP_WITH_CUDA=ON");
}

StatusOr<std::unique_ptr<MemorySpace>> createMemorySpace(Device device, void* compute_stream) {
  MemorySpaceFactory factory = findFactory(device);
  if (!factory) return memorySpaceAvailable(device);
  return factory(compute_stream);
}

}  // namespace hsdp
