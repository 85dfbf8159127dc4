// Per-message methods bound as plain CPython METH_FASTCALL methods rather than
// through pybind11's dispatcher.
//
// Why: at a camera's pace every send and receive runs cold (right after a
// sleep, with caches and TLBs emptied by whatever ran meanwhile), and cold, each
// distinct piece of code touched costs. pybind11's generic dispatcher (overload
// loop, argument loaders, return-value policies) costs ~15 µs per call cold on
// our 2-vCPU VM against ~9 µs for a plain C method (0.2-0.4 µs for both warm);
// BENCHMARKS.md, "cold path". Only the per-message calls are bound this way;
// everything else stays pybind11.
//
// Contract of a method here: it holds the GIL on entry and exit, raises by
// returning nullptr with a Python error set (C++ exceptions are translated as
// pybind11 would: vipc errors to msgq.errors classes), and reaches its object
// through self_of<T>() (the instance's type is checked by CPython's method
// descriptor before the call).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <new>
#include <string>

#include "common/errors.h"
#include "python/bindings.h"

// On a per-frame function (and its guarded body, a lambda: `[&]() VIPC_HOT -> PyObject*`):
// the compiler puts these together (.text.hot), so a cold frame's code sits on few pages.
#define VIPC_HOT __attribute__((hot))

namespace vipc::python {

namespace py = pybind11;

// The C++ object behind a pybind11 instance of T. Our classes have the simple
// layout (one value pointer, one holder); anything else takes pybind11's caster.
// An instance made by __new__ alone (its __init__ never ran) holds no object: TypeError.
template <class T>
VIPC_HOT T& self_of(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  if (!inst->simple_layout) return py::handle(self).cast<T&>();
  if (!inst->simple_holder_constructed || inst->simple_value_holder[0] == nullptr) {
    vipc::python::type_error(std::string(Py_TYPE(self)->tp_name) +
                             " object was not initialized (its __init__ never ran)");
  }
  return *static_cast<T*>(inst->simple_value_holder[0]);
}

// body() -> PyObject* (new reference, or nullptr with an error set), with C++
// exceptions turned into Python ones.
template <class F>
PyObject* guarded(F&& body) noexcept {
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const vipc::common::Error& e) {
    set_python_error(e);
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
  return nullptr;
}

// Argument checks of the fast methods (TypeError as pybind11 would raise).
inline void check_nargs(const char* name, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most) {
  if (nargs < least || nargs > most) {
    vipc::python::type_error(std::string(name) + "() takes " + std::to_string(least) +
                             (least == most ? "" : " to " + std::to_string(most)) + " arguments (" +
                             std::to_string(nargs) + " given)");
  }
}

// The argument errors of the per-frame functions, out of line (cold): their messages
// are built here, not in the hot code.
[[noreturn, gnu::cold, gnu::noinline]] inline void not_an_int(PyObject* v, const char* what, long long lo,
                                                              long long hi) {
  vipc::python::type_error(std::string(what) + " must be an int in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], got " + py::repr(v).cast<std::string>());
}

[[noreturn, gnu::cold, gnu::noinline]] inline void not_a_u64(PyObject* v, const char* what) {
  vipc::python::type_error(std::string(what) + " must be an int in [0, 2**64), got " + py::repr(v).cast<std::string>());
}

// An exact-or-__index__ int in [lo, hi] (bool refused); TypeError otherwise, as
// pybind11's integer casters raise.
VIPC_HOT inline long long int_arg(PyObject* v, const char* what, long long lo, long long hi) {
  if (!PyBool_Check(v) && PyIndex_Check(v)) {
    int overflow = 0;
    const long long n = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : [&] {
      py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v));
      if (!i) throw py::error_already_set();
      return PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    }();
    if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
    if (overflow == 0 && n >= lo && n <= hi) [[likely]]
      return n;
  }
  not_an_int(v, what, lo, hi);
}

// An int in [0, 2**64) (exact, or anything with __index__ but bool) into `out`;
// false, with no Python error set, for anything else.
VIPC_HOT inline bool try_u64(PyObject* v, uint64_t& out) {
  if (PyBool_Check(v) || !PyIndex_Check(v)) return false;
  py::object i = py::reinterpret_borrow<py::object>(v);
  if (!PyLong_CheckExact(v)) {
    i = py::reinterpret_steal<py::object>(PyNumber_Index(v));
    if (!i) {
      PyErr_Clear();
      return false;
    }
  }
  const unsigned long long n = PyLong_AsUnsignedLongLong(i.ptr());
  if (n == std::numeric_limits<unsigned long long>::max() && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  out = n;
  return true;
}

// An unsigned 64-bit argument (a generation); TypeError otherwise.
VIPC_HOT inline uint64_t u64_arg(PyObject* v, const char* what) {
  uint64_t n = 0;
  if (try_u64(v, n)) [[likely]]
    return n;
  not_a_u64(v, what);
}

// A str argument as UTF-8 (TypeError otherwise).
inline std::string str_arg(PyObject* v, const char* what) {
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(v) ? PyUnicode_AsUTF8AndSize(v, &n) : nullptr;
  if (s == nullptr) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) throw py::error_already_set();
    PyErr_Clear();
    vipc::python::type_error(std::string(what) + " must be a str, got " + Py_TYPE(v)->tp_name);
  }
  return std::string(s, static_cast<size_t>(n));
}

// The one optional argument of a METH_FASTCALL | METH_KEYWORDS method, given
// by position or as `name=`; nullptr when absent.
inline PyObject* one_optional_arg(const char* fn, const char* name, PyObject* const* args, Py_ssize_t nargs,
                                  PyObject* kwnames) {
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  check_nargs(fn, nargs + nkw, 0, 1);
  if (nkw == 0) return nargs ? args[0] : nullptr;
  PyObject* key = PyTuple_GET_ITEM(kwnames, 0);
  if (PyUnicode_CompareWithASCIIString(key, name) != 0) {
    vipc::python::type_error(std::string(fn) + "() got an unexpected keyword argument " +
                             py::repr(key).cast<std::string>());
  }
  return args[nargs];
}

// The bytes of a send: a bytes object, or any C-contiguous buffer (held until destroyed).
class Payload {
 public:
  VIPC_HOT explicit Payload(py::handle data) {
    if (PyBytes_Check(data.ptr())) {
      ptr_ = PyBytes_AS_STRING(data.ptr());
      size_ = static_cast<size_t>(PyBytes_GET_SIZE(data.ptr()));
      return;
    }
    if (PyObject_GetBuffer(data.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      vipc::python::type_error(
          std::string("send() takes bytes or a C-contiguous buffer (bytearray, memoryview, numpy), not ") +
          Py_TYPE(data.ptr())->tp_name);
    }
    has_view_ = true;
    ptr_ = view_.buf;
    size_ = static_cast<size_t>(view_.len);
  }
  ~Payload() {
    if (has_view_) PyBuffer_Release(&view_);
  }
  const void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  Py_buffer view_{};
  bool has_view_ = false;
  const void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Puts `def` (static storage) on class `cls` as a method, replacing any of that name.
inline void add_fast_method(py::handle cls, PyMethodDef* def) {
  PyObject* d = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def);
  if (d == nullptr) throw py::error_already_set();
  cls.attr(def->ml_name) = py::reinterpret_steal<py::object>(d);
}

// A PyMethodDef's function slot for a METH_FASTCALL function.
template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
PyCFunction fastcall() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*)>
PyCFunction fastcall_keywords() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

}  // namespace vipc::python
