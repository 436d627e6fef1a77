// HSDP_UCX_CHECK: the one way hsdp calls UCX. A failing call becomes an INTERNAL Status carrying
// UCX's own error string (ucs_status_string), the status code, the call and file:line.
#pragma once

#include <ucs/type/status.h>

#include "core/api_check.h"
#include "hsdp/status.h"

namespace hsdp::ucx {

Status ucxError(ucs_status_t st, const char* call, const char* file, int line);

}  // namespace hsdp::ucx

// For calls that return ucs_status_t.
#define HSDP_UCX_CHECK(call) HSDP_API_CHECK(call, #call, UCS_OK, ::hsdp::ucx::ucxError)
