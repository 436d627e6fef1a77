// hsdp-env: prints every HSDP_* environment parameter with its type, default, current value and
// documentation (the registry in core/env.cc is the single source).
//   hsdp-env            all of them
//   hsdp-env NAME...    only these (an unknown name is an error naming it)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "hsdp/cli.h"
#include "hsdp/env.h"

namespace {

void print(const hsdp::env::Param& p) {
  const char* cur = std::getenv(p.name);
  std::printf("%-22s %-7s default=%-6s current=%s\n    %s\n", p.name, p.type,
              *p.default_value ? p.default_value : "(unset)", cur ? cur : "(unset)", p.doc);
  if (std::strcmp(p.type, "int") == 0)
    std::printf("    range: %lld to %lld\n", static_cast<long long>(p.min),
                static_cast<long long>(p.max));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hsdp-env: every HSDP_* environment parameter (type, default, current value, doc)"};
  std::vector<std::string> names;
  app.add_option("names", names, "only these parameters (e.g. HSDP_TIMEOUT_S)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "hsdp-env");
  }
  for (const std::string& n : names) {
    bool found = false;
    for (const hsdp::env::Param& p : hsdp::env::registry()) found |= n == p.name;
    if (!found) {
      std::fprintf(stderr, "hsdp-env: error: '%s' is not an hsdp environment parameter\n",
                   n.c_str());
      return 2;
    }
  }
  for (const hsdp::env::Param& p : hsdp::env::registry()) {
    bool wanted = names.empty();
    for (const std::string& n : names) wanted |= n == p.name;
    if (wanted) print(p);
  }
  return 0;
}
