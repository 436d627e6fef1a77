// Status and StatusOr: how every fallible hsdp call reports failure. The library never exits or
// aborts on bad input; it returns a Status whose message names the offending values, and the
// program (examples, tools) decides how to exit.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace hsdp {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed a value that can never work (bad factor, bad flag)
  kFailedPrecondition,  // the call is valid, but not in the object's current state
  kNotFound,            // a named thing (parameter, unit, env var) does not exist
  kOutOfRange,          // a size or index beyond what the implementation supports
  kUnimplemented,       // valid request, not supported by this backend yet
  kInternal,            // a foreign library (MPI, NCCL, CUDA) failed
  kResourceExhausted,   // allocation failed
  kAborted,             // the operation was abandoned with nothing changed; repeat it (an
                        // elastic step whose quorum did not commit: ShardedModel::step)
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string toString() const;

  // Prepends context ("while building the mesh: ...") and keeps the code.
  Status withContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status okStatus() { return Status(); }

// Concatenates anything streamable; the building block for error messages.
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
Status invalidArgument(const Args&... args) {
  return Status(StatusCode::kInvalidArgument, strCat(args...));
}
template <typename... Args>
Status failedPrecondition(const Args&... args) {
  return Status(StatusCode::kFailedPrecondition, strCat(args...));
}
template <typename... Args>
Status notFound(const Args&... args) {
  return Status(StatusCode::kNotFound, strCat(args...));
}
template <typename... Args>
Status outOfRange(const Args&... args) {
  return Status(StatusCode::kOutOfRange, strCat(args...));
}
template <typename... Args>
Status unimplemented(const Args&... args) {
  return Status(StatusCode::kUnimplemented, strCat(args...));
}
template <typename... Args>
Status internalError(const Args&... args) {
  return Status(StatusCode::kInternal, strCat(args...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "StatusOr built from OK");
  }
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace hsdp

#define HSDP_CONCAT_INNER_(a, b) a##b
#define HSDP_CONCAT_(a, b) HSDP_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define HSDP_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::hsdp::Status hsdp_status_ = (expr);        \
    if (!hsdp_status_.ok()) return hsdp_status_; \
  } while (0)

// `HSDP_ASSIGN_OR_RETURN(auto x, f());` unwraps a StatusOr or returns its Status.
#define HSDP_ASSIGN_OR_RETURN(lhs, expr) \
  HSDP_ASSIGN_OR_RETURN_IMPL_(HSDP_CONCAT_(hsdp_statusor_, __LINE__), lhs, expr)
#define HSDP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
