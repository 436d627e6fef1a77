#include "collectives/nccl/nccl_check.h"

namespace hsdp::nccl {

std::string ncclMessage(ncclResult_t rc, ncclComm_t comm) {
  std::string msg = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += strCat(" (last NCCL error: ", last, ")");
  return msg;
}

Status ncclFailure(ncclResult_t rc, const char* call, const char* file, int line, ncclComm_t comm) {
  return apiCallError("NCCL", rc, ncclMessage(rc, comm), call, file, line);
}

ncclDataType_t ncclType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
  }
  return ncclUint8;
}

}  // namespace hsdp::nccl
