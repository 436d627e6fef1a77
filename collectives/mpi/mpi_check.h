// HSDP_MPI_CHECK: the one way hsdp calls MPI. A failing call becomes an INTERNAL Status carrying
// MPI's own error string, the call and file:line (communicators use MPI_ERRORS_RETURN).
#pragma once

#include <mpi.h>

#include "core/api_check.h"
#include "hsdp/dtype.h"
#include "hsdp/status.h"

namespace hsdp::mpi {

Status mpiError(int rc, const char* call, const char* file, int line);

// MPI datatype that carries `t` (bf16 travels as its 16 bits).
MPI_Datatype mpiType(DType t);

// Sum of bf16 values (user-defined MPI_Op created by the Session; MPI_OP_NULL before init).
MPI_Op bf16SumOp();

}  // namespace hsdp::mpi

#define HSDP_MPI_CHECK(call) HSDP_API_CHECK(call, #call, MPI_SUCCESS, ::hsdp::mpi::mpiError)
