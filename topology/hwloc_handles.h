// Internal to the topology module: the hwloc owners node_topology.cc and binding.cc share.
#pragma once

#include <hwloc.h>

#include <memory>
#include <string>

#include "hsdp/status.h"

namespace hsdp::hwloc_detail {

// RAII owners: a topology and a bitmap are destroyed on every return path.
struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;
struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

// An initialised, not yet loaded topology that keeps every PCI device and bridge and skips
// hwloc's OpenCL and GL plugins.
StatusOr<TopologyPtr> newTopology();

// `set` in list syntax ("0-3,8"); "" for an empty or null set.
std::string listString(hwloc_const_bitmap_t set);

}  // namespace hsdp::hwloc_detail
