#include "core/api_check.h"

namespace hsdp {

Status apiCallError(std::string_view api, long long code, std::string_view text, const char* call,
                    const char* file, int line) {
  return internalError(api, " error ", code, " (", text, ") in ", call, " at ", file, ":", line);
}

}  // namespace hsdp
