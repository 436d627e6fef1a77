#include "collectives/ucx/ucx_check.h"

namespace hsdp::ucx {

Status ucxError(ucs_status_t st, const char* call, const char* file, int line) {
  return internalError("UCX error ", static_cast<int>(st), " (", ucs_status_string(st), ") in ",
                       call, " at ", file, ":", line);
}

}  // namespace hsdp::ucx
