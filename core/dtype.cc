#include "hsdp/dtype.h"

namespace hsdp {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 0;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float";
    case DType::kBFloat16:
      return "bf16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

const char* redOpName(RedOp op) { return op == RedOp::kSum ? "sum" : "avg"; }

StatusOr<DType> parseDType(std::string_view name) {
  if (name == "float" || name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  return invalidArgument("unknown dtype '", name, "' (expected float or bf16)");
}

}  // namespace hsdp
