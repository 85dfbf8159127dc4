// Shared by the native modules (_msgq, _queues, _visionipc): vipc::common::Error turned
// into the Python exception classes of msgq/errors.py, waits without the GIL
// that stay interruptible, large copies without the GIL, timeouts, and the
// buffer objects that expose mapped memory to Python.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/wait_status.h"

namespace vipc::python {

namespace py = pybind11;

// Copies of at least this many bytes run with the GIL released (below it,
// releasing and taking the GIL back costs more than the copy).
inline constexpr size_t kReleaseGilAbove = 256 * 1024;

inline const char* python_error_name(vipc::common::ErrorKind kind) {
  switch (kind) {
    case vipc::common::ErrorKind::kMultiplePublishers:
      return "MultiplePublishersError";
    case vipc::common::ErrorKind::kMessageTooLarge:
      return "MessageTooLargeError";
    case vipc::common::ErrorKind::kSegment:
      return "SegmentError";
    case vipc::common::ErrorKind::kTooManyReaders:
      return "TooManyReadersError";
    case vipc::common::ErrorKind::kClosed:
      return "ClosedError";
    case vipc::common::ErrorKind::kPermission:
      return "IpcPermissionError";
    case vipc::common::ErrorKind::kInvalidArgument:
      return "InvalidArgumentError";
    case vipc::common::ErrorKind::kNoSpace:
      return "NoSpaceError";
    case vipc::common::ErrorKind::kTimeout:
      return "IpcTimeoutError";
    case vipc::common::ErrorKind::kIpc:
      break;
  }
  return "IpcError";
}

// Bounded lock waits (common/files.h) run this between their sleeps: on a
// thread holding the GIL, a signal handler's exception (Ctrl-C) ends the wait.
inline void interrupt_check() {
  if (PyGILState_Check() && PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Raises (sets) the msgq.errors class of `e` with its message.
inline void set_python_error(const vipc::common::Error& e) {
  try {
    py::object cls = py::module_::import("msgq.errors").attr(python_error_name(e.kind()));
    PyErr_SetString(cls.ptr(), e.what());
  } catch (py::error_already_set& failed) {
    failed.restore();  // msgq.errors could not be imported: that error is the one raised
  }
}

// A wrong argument type, raised as msgq.errors.IpcTypeError (an IpcError and a
// TypeError: every error of the library is an IpcError).
[[noreturn]] inline void type_error(const std::string& what) {
  py::object cls = py::module_::import("msgq.errors").attr("IpcTypeError");
  PyErr_SetString(cls.ptr(), what.c_str());
  throw py::error_already_set();
}

inline void register_error_translator() {
  vipc::common::set_interrupt_check(&interrupt_check);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const vipc::common::Error& e) {
      set_python_error(e);
    }
  });
}

// Raise KeyboardInterrupt (or whatever a Python signal handler raised) after
// an interrupted wait; otherwise the caller simply waits again.
inline void check_signals() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Runs a blocking wait (returning vipc::common::WaitStatus) without the GIL; signals
// run Python's handlers (Ctrl-C raises) and the wait goes on.
template <class F>
vipc::common::WaitStatus blocking(F&& wait) {
  for (;;) {
    vipc::common::WaitStatus st;
    {
      py::gil_scoped_release nogil;
      st = wait();
    }
    if (st != vipc::common::WaitStatus::kInterrupted) return st;
    check_signals();
  }
}

// Runs copy(), which moves `bytes` bytes, without the GIL if they are many.
template <class F>
void copy_maybe_without_gil(size_t bytes, F&& copy) {
  if (bytes >= kReleaseGilAbove) {
    py::gil_scoped_release nogil;
    copy();
  } else {
    copy();
  }
}

// The deadline of a timeout in milliseconds as the reference takes it
// (negative: no limit).
inline int64_t deadline_from_ms(int64_t timeout_ms) {
  return vipc::common::deadline_after(timeout_ms < 0 ? -1 : timeout_ms * 1'000'000);
}

// The deadline of a timeout in seconds (nullopt: no limit; negative: now).
inline int64_t deadline_from(std::optional<double> timeout_s) {
  if (!timeout_s) return vipc::common::kNever;
  const double s = *timeout_s < 0 ? 0 : *timeout_s;
  if (!(s < 1e9)) return vipc::common::kNever;  // 31 years, infinity or NaN: no limit (and no overflow)
  return vipc::common::monotonic_ns() + static_cast<int64_t>(s * 1e9);
}

// A Python timeout in seconds (None: no limit), checked as
// msgq._shared.deadline checks it: an int or float (not a bool, not NaN);
// a negative one means "do not wait" (deadline_from).
inline std::optional<double> timeout_from_py(const py::handle& t) {
  if (t.is_none()) return std::nullopt;
  PyObject* o = t.ptr();
  double s;
  if (PyFloat_Check(o)) {
    s = PyFloat_AS_DOUBLE(o);
  } else if (PyLong_Check(o) && !PyBool_Check(o)) {
    s = PyLong_AsDouble(o);
    if (s == -1.0 && PyErr_Occurred()) {  // too large for a double: sign decides
      PyErr_Clear();
      s = PyObject_RichCompareBool(o, py::int_(0).ptr(), Py_LT) == 1 ? 0.0 : HUGE_VAL;
    }
  } else {
    s = NAN;
  }
  if (s != s) {
    vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                       "timeout must be a number of seconds or None, not " + py::repr(t).cast<std::string>());
  }
  return s;
}

// Bytes of a mapping seen from Python (a ring loan, an ordered slot, a
// VisionIPC buffer): `owner` keeps the mapping alive while any memoryview
// or numpy array made from it exists (the .base chain).
template <class Owner>
struct MappedBytes {
  std::shared_ptr<Owner> owner;
  uint8_t* ptr;
  size_t size;
  bool readonly;
};

// Registers MappedBytes<Owner> as Python class `name`: the buffer protocol and len().
template <class Owner>
void bind_mapped_bytes(py::module_& m, const char* name) {
  py::class_<MappedBytes<Owner>>(m, name, py::buffer_protocol())
      .def_buffer([](MappedBytes<Owner>& b) {
        return py::buffer_info(b.ptr, 1, py::format_descriptor<uint8_t>::format(), 1, {b.size}, {1}, b.readonly);
      })
      .def("__len__", [](const MappedBytes<Owner>& b) { return b.size; });
}

}  // namespace vipc::python
