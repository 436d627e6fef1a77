// The memory-space registry (core/memory_space.h): device name -> factory, filled by the modules
// built into libhsdp on first use (core/modules.h), like the transport registry.
#include "core/memory_space.h"

#include <map>
#include <mutex>
#include <string>

#include "core/modules.h"

namespace hsdp {
namespace {

struct SpaceRegistry {
  std::mutex mu;  // why: modules register on first use, from whichever thread that is
  std::map<std::string, MemorySpaceFactory, std::less<>> factories;
};

SpaceRegistry& spaces() {
  static SpaceRegistry* r = new SpaceRegistry();  // never destroyed: see core/registry.cc
  return *r;
}

struct HostOwner final : SpaceBuffer::Owner {
  explicit HostOwner(HostBuffer b) : buffer(std::move(b)) {}
  HostBuffer buffer;
};

}  // namespace

SpaceBuffer SpaceBuffer::wrap(HostBuffer buffer) {
  void* data = buffer.data();
  const size_t size = buffer.size();
  return SpaceBuffer(data, size, std::make_unique<HostOwner>(std::move(buffer)));
}

void registerMemorySpace(std::string_view device, MemorySpaceFactory factory) {
  SpaceRegistry& r = spaces();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[std::string(device)] = std::move(factory);
}

MemorySpaceFactory findMemorySpace(std::string_view device) {
  modules::ensureRegistered();
  SpaceRegistry& r = spaces();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.factories.find(device);
  return it != r.factories.end() ? it->second : MemorySpaceFactory();
}

}  // namespace hsdp
