#include "core/comm_observer.h"

#include <atomic>

namespace hsdp {
namespace {
// Atomic: installed on the main thread while the progress thread (or a copier) may be waiting.
std::atomic<CommObserver*> g_observer{nullptr};
}  // namespace

void setCommObserver(CommObserver* observer) {
  g_observer.store(observer, std::memory_order_release);
}

CommObserver* commObserver() { return g_observer.load(std::memory_order_acquire); }

}  // namespace hsdp
