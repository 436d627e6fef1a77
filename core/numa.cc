// NUMA placement of host buffers through hwloc: NumaTopology and HostBuffer::allocateNuma.
#include <hwloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/host_buffer.h"
#include "hsdp/log.h"

namespace hsdp {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kColors = 16;
constexpr size_t kColorStride = 17 * kPage;  // 16 x 68 KiB < 2 MiB
std::atomic<unsigned> next_color{0};

// RAII owner of an hwloc bitmap.
class Bitmap {
 public:
  Bitmap() : b_(hwloc_bitmap_alloc()) {}
  ~Bitmap() { hwloc_bitmap_free(b_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  hwloc_bitmap_t get() const { return b_; }
  bool ok() const { return b_ != nullptr; }

 private:
  hwloc_bitmap_t b_;
};

std::vector<int> toVector(hwloc_const_bitmap_t b) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(b); i >= 0; i = hwloc_bitmap_next(b, i)) out.push_back(i);
  return out;
}

std::string listString(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += strCat(s.empty() ? "" : ",", x);
  return s.empty() ? "none" : s;
}

Status noTopology(const char* what) {
  return failedPrecondition(what, ": the NumaTopology is empty (use NumaTopology::load())");
}

Status bitmapAllocFailed() {
  return Status(StatusCode::kResourceExhausted, "hwloc_bitmap_alloc failed");
}

}  // namespace

// ---- NumaTopology ---------------------------------------------------------------------------

StatusOr<NumaTopology> NumaTopology::load() {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0)
    return internalError("hwloc_topology_init failed: ", std::strerror(errno));
  if (hwloc_topology_load(t) != 0) {
    const int err = errno;
    hwloc_topology_destroy(t);
    return internalError("hwloc_topology_load failed: ", std::strerror(err));
  }
  return NumaTopology(t);
}

NumaTopology::~NumaTopology() {
  if (topo_ != nullptr) hwloc_topology_destroy(topo_);
}

NumaTopology::NumaTopology(NumaTopology&& o) noexcept : topo_(std::exchange(o.topo_, nullptr)) {}

NumaTopology& NumaTopology::operator=(NumaTopology&& o) noexcept {
  if (this != &o) {
    if (topo_ != nullptr) hwloc_topology_destroy(topo_);
    topo_ = std::exchange(o.topo_, nullptr);
  }
  return *this;
}

int NumaTopology::numNodes() const {
  if (topo_ == nullptr) return 0;
  return hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE);
}

std::vector<int> NumaTopology::nodes() const {
  std::vector<int> out;
  if (topo_ == nullptr) return out;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, n))
    out.push_back(static_cast<int>(n->os_index));
  return out;
}

StatusOr<std::vector<int>> NumaTopology::callerCpus() const {
  if (topo_ == nullptr) return noTopology("callerCpus");
  Bitmap set;
  if (!set.ok()) return bitmapAllocFailed();
  if (hwloc_get_cpubind(topo_, set.get(), HWLOC_CPUBIND_THREAD) != 0 ||
      hwloc_bitmap_iszero(set.get())) {
    // No per-thread binding support: every CPU this process may use.
    hwloc_bitmap_copy(set.get(), hwloc_topology_get_allowed_cpuset(topo_));
  }
  return toVector(set.get());
}

StatusOr<std::vector<int>> NumaTopology::nodesNear(const std::vector<int>& cpus) const {
  if (topo_ == nullptr) return noTopology("nodesNear");
  if (cpus.empty()) return invalidArgument("nodesNear: empty CPU list");
  hwloc_const_cpuset_t machine = hwloc_topology_get_complete_cpuset(topo_);
  Bitmap want;
  if (!want.ok()) return bitmapAllocFailed();
  for (int cpu : cpus) {
    if (cpu < 0 || !hwloc_bitmap_isset(machine, static_cast<unsigned>(cpu)))
      return invalidArgument("CPU ", cpu, " is not in this machine (CPUs ",
                             listString(toVector(machine)), ")");
    hwloc_bitmap_set(want.get(), static_cast<unsigned>(cpu));
  }
  // A NUMA node's cpuset is the CPUs it is local to. Prefer ordinary memory: hwloc marks other
  // kinds with a subtype (HBM, NVM, GPUMemory, SPM, ...; "DRAM" when both kinds exist).
  std::vector<int> ordinary, special;
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, n)) {
    if (n->cpuset == nullptr || !hwloc_bitmap_intersects(n->cpuset, want.get())) continue;
    const bool plain = n->subtype == nullptr || std::strcmp(n->subtype, "DRAM") == 0;
    (plain ? ordinary : special).push_back(static_cast<int>(n->os_index));
  }
  if (!ordinary.empty()) return ordinary;
  if (!special.empty()) return special;
  return notFound("no NUMA node is local to CPUs ", listString(cpus));
}

StatusOr<std::vector<int>> NumaTopology::nodesHolding(const void* addr, size_t bytes) const {
  if (topo_ == nullptr) return noTopology("nodesHolding");
  Bitmap set;
  if (!set.ok()) return bitmapAllocFailed();
  if (hwloc_get_area_memlocation(topo_, addr, bytes, set.get(), HWLOC_MEMBIND_BYNODESET) != 0)
    return internalError("hwloc_get_area_memlocation(", bytes, " bytes): ", std::strerror(errno));
  return toVector(set.get());
}

// ---- HostBuffer::allocateNuma ---------------------------------------------------------------

StatusOr<HostBuffer> HostBuffer::allocateNuma(size_t bytes, const NumaTopology& topology,
                                              const HostMemoryOptions& options) {
  HostBuffer b;
  if (bytes == 0) return b;
  if (topology.raw() == nullptr) return noTopology("HostBuffer::allocateNuma");

  // Where: settle the nodes before mapping anything, so that bad input costs nothing.
  std::vector<int> nodes;
  if (options.numa_node >= 0) {
    const std::vector<int> all = topology.nodes();
    if (std::find(all.begin(), all.end(), options.numa_node) == all.end())
      return invalidArgument("NUMA node ", options.numa_node,
                             " does not exist (nodes: ", listString(all), ")");
    nodes = {options.numa_node};
  } else {
    std::vector<int> cpus = options.near_cpus;
    if (cpus.empty()) {
      HSDP_ASSIGN_OR_RETURN(cpus, topology.callerCpus());
    }
    HSDP_ASSIGN_OR_RETURN(nodes, topology.nodesNear(cpus));
  }

  // mmap rather than malloc: the pages must not be touched before they are bound (malloc may
  // hand back recycled, already-placed pages), and huge pages want 2 MiB alignment.
  const bool huge = options.huge_pages && bytes >= kHugePage;
  const size_t align = huge ? kHugePage : kPage;
  // Cache colour: on huge pages, physical addresses agree with virtual ones in bits 0-20, so
  // separately allocated buffers that all start 2 MiB aligned put element i of every array in
  // the same L2 set and L3 slice. A kernel streaming 4-7 such arrays at once (Adam) then
  // thrashes: measured on this VM with 4 x 400 MB shards, the SSE/AVX2 steps ran 2-5x slower
  // than on 4 KiB pages (whose frames are scattered), and fine again with the arrays 64 KiB
  // apart. So successive buffers start at successive multiples of 68 KiB (17 pages: different
  // L2 sets and, through bits 12-20, L3 sets) into their first huge page.
  const size_t color =
      huge && options.cache_color ? (next_color.fetch_add(1) % kColors) * kColorStride : 0;
  const size_t len = (color + bytes + align - 1) / align * align;
  const size_t map_len = len + (huge ? align : 0);
  void* map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return Status(StatusCode::kResourceExhausted,
                  strCat("mmap of ", map_len, " bytes for a ", bytes,
                         "-byte host buffer: ", std::strerror(errno)));
  char* base = static_cast<char*>(map);
  char* p = base;
  if (huge) {
    p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + align - 1) / align * align);
    if (p > base) munmap(base, static_cast<size_t>(p - base));
    char* end = p + len;
    if (end < base + map_len) munmap(end, static_cast<size_t>(base + map_len - end));
    // Advice only: with THP off ("never") the kernel ignores it and 4 KiB pages are used.
    if (madvise(p, len, MADV_HUGEPAGE) != 0)
      HSDP_TRACE(kOffload, "madvise(MADV_HUGEPAGE) on ", len, " bytes: ", std::strerror(errno));
  }
  b.data_ = p + color;
  b.bytes_ = bytes;
  b.offset_ = color;
  b.mapped_ = len;  // from here on, b's destructor unmaps [data_ - offset_, + mapped_)

  Bitmap nodeset;
  if (!nodeset.ok()) return bitmapAllocFailed();
  for (int n : nodes) hwloc_bitmap_set(nodeset.get(), static_cast<unsigned>(n));
  const int flags = HWLOC_MEMBIND_BYNODESET | (options.strict ? HWLOC_MEMBIND_STRICT : 0);
  if (hwloc_set_area_membind(topology.raw(), p, len, nodeset.get(), HWLOC_MEMBIND_BIND, flags) ==
      0) {
    b.numa_nodes_ = nodes;
  } else {
    const int err = errno;
    if (options.strict)
      return internalError("binding a ", bytes, "-byte host buffer to NUMA nodes ",
                           listString(nodes), ": hwloc_set_area_membind: ", std::strerror(err));
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      HSDP_WARN(kOffload, "could not bind host memory to NUMA nodes ", listString(nodes),
                " (hwloc_set_area_membind: ", std::strerror(err),
                "); pages go where the allocating thread first touches them");
  }

  // Pre-fault: one write per 4 KiB page allocates it under the binding just set (a huge page
  // takes one fault for 512 of these). Fresh anonymous memory reads as zero already, so this
  // is the zero fill too. Not MAP_POPULATE: that would fault the pages before the binding.
  volatile char* touch = p;
  for (size_t off = 0; off < len; off += kPage) touch[off] = 0;

  // CUDA builds (HSDP_HAVE_CUDA): pin here with cudaHostRegister(p, len,
  // cudaHostRegisterPortable) so that H2D/D2H copies of optimizer shards run at full PCIe/NVLink
  // speed without a staging copy. Pin after binding and faulting, so the pinned pages are the
  // NUMA-local ones; record it in the buffer so release() calls cudaHostUnregister before
  // munmap; check with HSDP_CUDA_CHECK. (cudaHostAlloc is the alternative, but it places pages
  // by its own first touch and cannot be bound.)
  HSDP_TRACE(kOffload, "host buffer of ", bytes, " bytes at ", b.data_, " (colour offset ", color,
             ")",
             b.numa_nodes_.empty() ? " (unbound)" : strCat(" on NUMA nodes ", listString(nodes)),
             huge ? ", huge pages advised" : "");
  return b;
}

}  // namespace hsdp
