// hsdp-env: prints every HSDP_* environment parameter with its type, default, current value and
// documentation (the registry in core/env.cc is the single source).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hsdp/env.h"

int main() {
  for (const hsdp::env::Param& p : hsdp::env::registry()) {
    const char* cur = std::getenv(p.name);
    std::printf("%-22s %-7s default=%-6s current=%s\n    %s\n", p.name, p.type,
                *p.default_value ? p.default_value : "(unset)", cur ? cur : "(unset)", p.doc);
    if (std::strcmp(p.type, "int") == 0)
      std::printf("    range: %lld to %lld\n", static_cast<long long>(p.min),
                  static_cast<long long>(p.max));
  }
  return 0;
}
