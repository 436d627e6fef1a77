// StatusError -> the exception classes of hsdp/_errors.py, one per StatusCode, with hsdp's
// message as the text.
#include <nanobind/stl/string.h>

#include "hsdp/files.h"
#include "src/common.h"

namespace hsdp::py {

namespace {

const char* className(StatusCode c) {
  switch (c) {
    case StatusCode::kInvalidArgument:
      return "InvalidArgumentError";
    case StatusCode::kFailedPrecondition:
      return "FailedPreconditionError";
    case StatusCode::kNotFound:
      return "NotFoundError";
    case StatusCode::kOutOfRange:
      return "OutOfRangeError";
    case StatusCode::kUnimplemented:
      return "UnimplementedError";
    case StatusCode::kInternal:
      return "InternalError";
    case StatusCode::kResourceExhausted:
      return "ResourceExhaustedError";
    case StatusCode::kAborted:
      return "AbortedError";
    default:
      return "Error";
  }
}

}  // namespace

nb::object loadsJson(const std::string& text) {
  return nb::module_::import_("json").attr("loads")(text);
}

void registerErrors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      // The classes live in Python (hsdp/_errors.py) so that they carry proper __str__ and
      // multiple bases; a module imported alone (stub generation) falls back to RuntimeError.
      PyObject* type = PyExc_RuntimeError;
      nb::object cls;
      try {
        cls = nb::module_::import_("hsdp._errors").attr(className(e.code()));
        type = cls.ptr();
      } catch (const nb::python_error&) {
      }
      // Escaped: a message echoing a file never carries a control byte to the terminal.
      PyErr_SetString(type, files::printable(e.what()).c_str());
    }
  });
}

}  // namespace hsdp::py
