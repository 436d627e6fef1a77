// What the check macros of the foreign APIs share. Each API keeps its own macro beside the module
// that calls it (HSDP_MPI_CHECK, HSDP_NCCL_CHECK, HSDP_CUDA_CHECK, HSDP_UCX_CHECK): the macro names
// the API's success value and its failure function, which turns the code into the API's own error
// text; this header is the test of the result and the one form of the message.
#pragma once

#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

// A failed call into a foreign API as an INTERNAL Status:
// "<api> error <code> (<text>) in <call> at <file>:<line>".
Status apiCallError(std::string_view api, long long code, std::string_view text, const char* call,
                    const char* file, int line);

}  // namespace hsdp

// Evaluates `call` once; unless it returned `ok`, returns failure(result, call_text, __FILE__,
// __LINE__) from the enclosing function. `call_text` is the call as written (the API's macro
// passes #call, so macros inside the call, such as MPI_COMM_WORLD, are not expanded in the
// message).
#define HSDP_API_CHECK(call, call_text, ok, failure)                                       \
  do {                                                                                     \
    const auto hsdp_api_rc_ = (call);                                                      \
    if (hsdp_api_rc_ != (ok)) return failure(hsdp_api_rc_, call_text, __FILE__, __LINE__); \
  } while (0)
