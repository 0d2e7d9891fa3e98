// The one table that maps the C++ error hierarchy to Python classes (defined in
// prestage/errors.py), each of which also inherits the builtin users expect (ConfigError is a
// ValueError, IoError an OSError, ...).

#include "bindings.hpp"
#include "prestage/error.hpp"

namespace py = pybind11;

namespace prestage::python {

namespace {
py::object error_class(const char* name) {
  return py::module_::import("prestage.errors").attr(name);
}

void raise(py::object exception) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
}
}  // namespace

void register_errors(py::module_&) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const IoError& e) {
      // OSError(errno, strerror, filename), with the C++ message (what was being done, and why it
      // failed: "it became shorter since ...") in place of the bare strerror text.
      raise(error_class("IoError")(e.error_code(), e.what(), e.path()));
    } catch (const DecodeError& e) {
      py::object exc = error_class("DecodeError")(e.what());
      exc.attr("path") = e.path();
      exc.attr("reason") = e.reason();
      raise(exc);
    } catch (const ConfigError& e) {
      raise(error_class("ConfigError")(e.what()));
    } catch (const Error& e) {
      raise(error_class("Error")(e.what()));
    }
  });
}

}  // namespace prestage::python
