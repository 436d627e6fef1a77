// Host memory the engine and transports allocate once and reuse. On these machines the first
// touch of fresh memory costs ~11 us per 4 KiB page (0.37 GB/s), so every buffer is page aligned
// and pre-faulted (zero-filled) at allocation: hot paths never take page faults.
//
// Two ways to allocate:
//  - HostBuffer::allocate(bytes): heap memory, pages placed by first touch (the allocating
//    thread's NUMA node). For communication scratch, pools, small shards.
//  - HostBuffer::allocateNuma(bytes, topology, options): for optimizer shards on the host (CPU
//    offload), which the CPU Adam step streams at memory bandwidth: mapped memory bound through
//    hwloc to the NUMA node(s) nearest the cores (or, later, the GPU) that will use it, then
//    pre-faulted, optionally on transparent huge pages. On a machine with one NUMA node the
//    binding is trivially that node.
#pragma once

#include <cstddef>
#include <vector>

#include "hsdp/status.h"

struct hwloc_topology;  // hwloc's opaque topology (hwloc_topology_t); only offload/ includes hwloc

namespace hsdp {

// RAII owner of a loaded hwloc topology of this machine: loaded once (it takes milliseconds),
// destroyed with the object. Movable, not copyable. Used for NUMA placement of host buffers.
class NumaTopology {
 public:
  // Errors name the hwloc call that failed and errno.
  static StatusOr<NumaTopology> load();
  NumaTopology() = default;  // empty: every query fails with FailedPrecondition
  ~NumaTopology();
  NumaTopology(NumaTopology&& o) noexcept;
  NumaTopology& operator=(NumaTopology&& o) noexcept;
  NumaTopology(const NumaTopology&) = delete;
  NumaTopology& operator=(const NumaTopology&) = delete;

  // NUMA nodes of the machine (>= 1 once loaded), and their OS indices.
  int numNodes() const;
  std::vector<int> nodes() const;
  // OS indices of the CPUs the calling thread is bound to (all allowed CPUs when unbound).
  StatusOr<std::vector<int>> callerCpus() const;
  // The ordinary-memory (DRAM) NUMA nodes local to `cpus` (OS indices): the nodes whose CPUs
  // intersect them. Special-purpose nodes (HBM, NVM, GPU memory, ...) are chosen only when no
  // ordinary node is local. Errors: an empty list, a CPU not in this machine (named).
  StatusOr<std::vector<int>> nodesNear(const std::vector<int>& cpus) const;
  // The NUMA nodes holding the (faulted) pages of [addr, addr + bytes).
  StatusOr<std::vector<int>> nodesHolding(const void* addr, size_t bytes) const;

  ::hwloc_topology* raw() const { return topo_; }

 private:
  explicit NumaTopology(::hwloc_topology* t) : topo_(t) {}
  ::hwloc_topology* topo_ = nullptr;
};

struct HostMemoryOptions {
  // Bind to the NUMA nodes local to these CPUs (OS indices; NumaTopology::nodesNear). Empty:
  // the calling thread's CPUs, i.e. the rank's cores when the launcher binds ranks.
  std::vector<int> near_cpus;
  // >= 0: bind to this NUMA node (OS index) instead, e.g. the node nearest the rank's GPU.
  int numa_node = -1;
  // madvise(MADV_HUGEPAGE) for buffers of at least 2 MiB, mapped 2 MiB aligned: fewer TLB
  // misses while streaming, and 512x fewer page faults when pre-faulting.
  bool huge_pages = true;
  // With huge pages: start successive buffers at successive offsets (0, 68 KiB, ..., 15 x 68
  // KiB) into their mapping, so that arrays streamed together (param, grad, moments) do not
  // all map element i to the same cache set (numa.cc says what this cost). Page aligned still.
  bool cache_color = true;
  // When the kernel refuses the binding (e.g. mbind blocked in a container): false = warn once
  // and fall back to first touch by the calling thread; true = fail with the error.
  bool strict = false;
};

class HostBuffer {
 public:
  HostBuffer() = default;
  // Page aligned, zero-filled and pre-faulted; pages placed by first touch.
  static StatusOr<HostBuffer> allocate(size_t bytes);
  // Page aligned (with huge pages: in a 2 MiB-aligned mapping, at its cache-colour offset),
  // zero-filled, bound to NUMA nodes as `options` say, then pre-faulted. Errors name the size,
  // the node or CPU, and the failing call.
  static StatusOr<HostBuffer> allocateNuma(size_t bytes, const NumaTopology& topology,
                                           const HostMemoryOptions& options = {});
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return bytes_; }
  // The NUMA nodes (OS indices) the pages are bound to; empty when not bound (allocate(), or a
  // binding the kernel refused).
  const std::vector<int>& numaNodes() const { return numa_nodes_; }

 private:
  void release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // > 0: an mmap of this many bytes at data_ - offset_; 0: heap
  size_t offset_ = 0;  // allocateNuma's cache-colour offset of data_ into the mapping
  std::vector<int> numa_nodes_;
};

}  // namespace hsdp
