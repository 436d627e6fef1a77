// Shared by the binding's files: hsdp's Status as a Python exception. A failing call throws
// StatusError; errors.cc translates it into the exception class of hsdp/_errors.py that matches
// its code (InvalidArgumentError is also a ValueError, NotFoundError a KeyError, ...), carrying
// hsdp's message unchanged. Nothing here aborts or exits the interpreter.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "hsdp/status.h"

namespace hsdp::py {

namespace nb = nanobind;

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const Status& s) : std::runtime_error(s.message()), code_(s.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

inline void check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T take(StatusOr<T>&& v) {
  if (!v.ok()) throw StatusError(v.status());
  return std::move(*v);
}

// A dict of the items given, in that order: dictOf(item("dir", r.dir), item("step", r.step)) is
// {"dir": r.dir, "step": r.step}.
template <typename V>
struct Item {
  const char* key;
  V value;
};
template <typename V>
Item<V> item(const char* key, V value) {
  return {key, std::move(value)};
}
template <typename... V>
nb::dict dictOf(const Item<V>&... items) {
  nb::dict d;
  ((d[items.key] = items.value), ...);
  return d;
}

// Python's json.loads of `text` (the library's JSON reports become dicts).
nb::object loadsJson(const std::string& text);

void registerErrors(nb::module_& m);
void bindPlan(nb::module_& m);
void bindTopology(nb::module_& m);
void bindCheckpoint(nb::module_& m);
void bindCollectives(nb::module_& m);
void bindShardedModel(nb::module_& m);
void bindCuda(nb::module_& m);

}  // namespace hsdp::py
