// Facts about the host this process runs on.
#pragma once

#include <string>

namespace hsdp {

// This host's name (gethostname), as logging, topology discovery and node grouping report it;
// "unknown" if the system will not say.
std::string hostName();

}  // namespace hsdp
