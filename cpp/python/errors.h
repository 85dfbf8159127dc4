// Shared by the native modules: turn ipc::Error into the Python exception
// classes defined in msgq/errors.py, and wait loops that stay interruptible.
#pragma once

#include <pybind11/pybind11.h>

#include "common/errors.h"

namespace pyipc {

namespace py = pybind11;

inline const char* python_error_name(ipc::ErrorKind kind) {
  switch (kind) {
    case ipc::ErrorKind::kMultiplePublishers: return "MultiplePublishersError";
    case ipc::ErrorKind::kMessageTooLarge: return "MessageTooLargeError";
    case ipc::ErrorKind::kSegment: return "SegmentError";
    case ipc::ErrorKind::kTooManyReaders: return "TooManyReadersError";
    case ipc::ErrorKind::kClosed: return "ClosedError";
    case ipc::ErrorKind::kPermission: return "IpcPermissionError";
    case ipc::ErrorKind::kInvalidArgument: return "InvalidArgumentError";
    case ipc::ErrorKind::kNoSpace: return "NoSpaceError";
    case ipc::ErrorKind::kTimeout: return "IpcTimeoutError";
    case ipc::ErrorKind::kIpc: break;
  }
  return "IpcError";
}

inline void register_error_translator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ipc::Error& e) {
      py::object cls = py::module_::import("msgq.errors").attr(python_error_name(e.kind()));
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
}

// Raise KeyboardInterrupt (or whatever a Python signal handler raised) after
// an interrupted wait; otherwise the caller simply waits again.
inline void check_signals() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

}  // namespace pyipc
