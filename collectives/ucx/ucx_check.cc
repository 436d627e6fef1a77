#include "collectives/ucx/ucx_check.h"

namespace hsdp::ucx {

Status ucxError(ucs_status_t st, const char* call, const char* file, int line) {
  return apiCallError("UCX", st, ucs_status_string(st), call, file, line);
}

}  // namespace hsdp::ucx
