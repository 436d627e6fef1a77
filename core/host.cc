#include "core/host.h"

#include <unistd.h>

namespace hsdp {

std::string hostName() {
  char host[256] = {0};
  // A name longer than the buffer is truncated without a terminator on some systems: the last
  // byte stays 0.
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  return host;
}

}  // namespace hsdp
