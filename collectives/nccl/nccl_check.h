// HSDP_NCCL_CHECK: the one way hsdp calls NCCL. A failing call becomes an INTERNAL Status carrying
// NCCL's error string, its last error message (ncclGetLastError: the detail, e.g. which peer or
// socket failed), the call and file:line. ncclInProgress counts as failure here; the transport
// handles it itself where it uses nonblocking communicators (nccl_comm.cc).
#pragma once

#include <nccl.h>

#include "core/api_check.h"
#include "hsdp/dtype.h"
#include "hsdp/status.h"

namespace hsdp::nccl {

Status ncclFailure(ncclResult_t rc, const char* call, const char* file, int line,
                   ncclComm_t comm = nullptr);

// NCCL's error string plus its last error message, for messages built elsewhere.
std::string ncclMessage(ncclResult_t rc, ncclComm_t comm);

// The NCCL type that carries `t`.
ncclDataType_t ncclType(DType t);

}  // namespace hsdp::nccl

#define HSDP_NCCL_CHECK(call) HSDP_API_CHECK(call, #call, ncclSuccess, ::hsdp::nccl::ncclFailure)
