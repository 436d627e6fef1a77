#include "hsdp/stop.h"

#include <signal.h>

#include <array>
#include <atomic>
#include <cstring>

#include "hsdp/transport.h"

namespace hsdp {
namespace {

constexpr int kMaxSignal = 64;  // Linux: 1..64 (SIGRTMAX)
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

void onStopSignal(int signal) {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal, std::memory_order_relaxed);
}

}  // namespace

Status installStopSignals(std::initializer_list<int> signals) {
  for (int s : signals)
    if (s < 1 || s > kMaxSignal || s == SIGKILL || s == SIGSTOP)
      return invalidArgument("installStopSignals: signal ", s, " (", signalName(s),
                             ") cannot be caught");
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = &onStopSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : signals)
    if (sigaction(s, &sa, nullptr) != 0)
      return internalError("sigaction(", signalName(s), "): ", std::strerror(errno));
  return okStatus();
}

bool stopRequested() { return g_signal.load(std::memory_order_relaxed) != 0; }
int stopSignal() { return g_signal.load(std::memory_order_relaxed); }
void requestStop(int signal) { onStopSignal(signal); }
void clearStopRequest() { g_signal.store(0, std::memory_order_relaxed); }

StatusOr<int> agreeStop(Comm& comm) {
  // One slot per signal number: the sum says which signals any member got.
  std::array<int32_t, kMaxSignal + 1> got{};
  const int mine = stopSignal();
  if (mine > 0 && mine <= kMaxSignal) got[static_cast<size_t>(mine)] = 1;
  HSDP_RETURN_IF_ERROR(comm.allReduce(got.data(), got.size(), DType::kInt32, RedOp::kSum)
                           .withContext("agreeing on a stop request"));
  for (int s = 1; s <= kMaxSignal; ++s)
    if (got[static_cast<size_t>(s)] != 0) return s;
  return 0;
}

std::string signalName(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    case SIGKILL:
      return "SIGKILL";
    case SIGSTOP:
      return "SIGSTOP";
    default:
      return "signal " + std::to_string(signal);
  }
}

}  // namespace hsdp
