// Internal to the file layer: what files.cc and dir.cc share.
#pragma once

#include <sys/types.h>

#include <string>

#include "hsdp/files.h"
#include "hsdp/status.h"

namespace hsdp::files::detail {

Kind kindOfMode(mode_t m);
// `name` must be one path component: no '/', not empty, not . or ..
Status checkComponent(const std::string& dir, const std::string& name);

}  // namespace hsdp::files::detail
