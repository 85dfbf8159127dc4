// visionipc._visionipc: thin bindings of the C++ VisionIPC server and client.
// Type conversion, GIL release around waits and large copies, exception
// mapping; the friendly API is in visionipc/ (Python).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/frame_copy.h"
#include "common/names.h"
#include "python/bindings.h"
#include "python/dlpack.h"
#include "python/fast_method.h"
#include "python/fastcall.h"
#include "python/frame_object.h"
#include "visionipc/client.h"
#include "visionipc/format.h"
#include "visionipc/server.h"

namespace py = pybind11;
using vipc::visionipc::Client;
using vipc::visionipc::Server;

namespace {

// Bytes of one buffer in a pool.
using View = vipc::python::MappedBytes<vipc::visionipc::Mapping>;

// (format, width, height, stride, uv_offset, size): visionipc.formats.Geometry's fields
py::tuple geometry_tuple(const vipc::visionipc::Geometry& g) {
  return py::make_tuple(vipc::visionipc::format_name(g.format), g.width, g.height, g.stride, g.uv_offset, g.size);
}

// A frame id or timestamp: an int in [0, 2**64) (anything with __index__ but bool);
// else InvalidArgumentError naming it (the API's error for a bad value, not a TypeError).
[[noreturn, gnu::cold, gnu::noinline]] void bad_stamp(PyObject* v, const char* what) {
  vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                     std::string(what) + " must be an int in [0, 2**64), got " + py::repr(v).cast<std::string>());
}

VIPC_HOT uint64_t stamp(PyObject* v, const char* what) {
  uint64_t n = 0;
  if (vipc::python::try_u64(v, n)) [[likely]]
    return n;
  bad_stamp(v, what);
}

// Server.send(stream, index, generation, frame_id, sof, eof) and Client.recv(timeout_ms=100):
// the per-frame calls, plain CPython methods (python/fastcall.h says why).
PyObject* server_send(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("send", nargs, 6, 6);
    Server& s = vp::self_of<Server>(self);
    s.send(vp::str_arg(args[0], "stream"), static_cast<uint32_t>(vp::int_arg(args[1], "index", 0, UINT32_MAX)),
           vp::u64_arg(args[2], "generation"), stamp(args[3], "frame_id"), stamp(args[4], "timestamp_sof"),
           stamp(args[5], "timestamp_eof"));
    Py_RETURN_NONE;
  });
}
PyMethodDef server_send_def = {"send", vipc::python::fastcall<server_send>(), METH_FASTCALL,
                               "send(stream, index, generation, frame_id, timestamp_sof, timestamp_eof)"};

// Client.recv_into(frame, cache, epoch, timeout_ms): waits for a frame (< 0: forever)
// and stores it into `frame` (a Frame, made before the wait) without running Python:
// its numbers, and its views and geometry from `cache` (the client's ViewCache of
// mapping `epoch`, or None). Returns None on timeout, else flags: kLeased (the client
// leases the frame), kNeedsViews (views not set: no cache, another mapping, or the
// buffer's views not made yet; the caller sets them).
constexpr long kLeased = 1, kNeedsViews = 2;

PyObject* client_recv_into(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("recv_into", nargs, 4, 4);
    if (!PyObject_TypeCheck(args[0], vp::frame_type())) {
      vipc::python::type_error(std::string("recv_into() needs a visionipc Frame, not ") + Py_TYPE(args[0])->tp_name);
    }
    const int64_t timeout_ms = vp::int_arg(args[3], "timeout_ms", INT32_MIN, INT32_MAX);
    Client& c = vp::self_of<Client>(self);
    // The cache's parts are looked up before the wait (warm), and held across it.
    py::object made, geometry;
    uint64_t epoch = 0;
    const bool have_epoch = vp::try_u64(args[2], epoch);
    if (args[1] != Py_None) {
      made = py::reinterpret_borrow<py::object>(args[1]).attr("made");
      geometry = py::reinterpret_borrow<py::object>(args[1]).attr("geometry");
    }
    const int64_t deadline = vp::deadline_from_ms(timeout_ms);
    vipc::visionipc::Frame got;
    const vipc::common::WaitStatus st = vp::blocking([&] { return c.recv(deadline, got); });
    if (st == vipc::common::WaitStatus::kClosed)
      vipc::common::fail(vipc::common::ErrorKind::kClosed, "client was closed while waiting");
    if (st != vipc::common::WaitStatus::kReady) Py_RETURN_NONE;
    auto* f = reinterpret_cast<vp::FrameObject*>(args[0]);
    const bool stored = vp::set_field(f->idx, PyLong_FromUnsignedLong(got.index)) &&
                        vp::set_field(f->generation, PyLong_FromUnsignedLongLong(got.generation)) &&
                        vp::set_field(f->frame_id, PyLong_FromUnsignedLongLong(got.frame_id)) &&
                        vp::set_field(f->timestamp_sof, PyLong_FromUnsignedLongLong(got.timestamp_sof)) &&
                        vp::set_field(f->timestamp_eof, PyLong_FromUnsignedLongLong(got.timestamp_eof)) &&
                        vp::set_field(f->timestamp_publish, PyLong_FromUnsignedLongLong(got.publish_ns)) &&
                        vp::set_field(f->timestamp_recv, PyLong_FromUnsignedLongLong(got.receive_ns));
    if (!stored) throw py::error_already_set();
    long flags = got.valid ? kLeased : 0;
    PyObject* views = nullptr;
    if (made && have_epoch && epoch == c.epoch() && PyList_Check(made.ptr()) &&
        got.index < PyList_GET_SIZE(made.ptr())) {
      views = PyList_GET_ITEM(made.ptr(), got.index);
    }
    if (views != nullptr && views != Py_None) {
      vp::set_field(f->views, py::reinterpret_borrow<py::object>(views).release().ptr());
      vp::set_field(f->geometry, geometry.release().ptr());
    } else {
      flags |= kNeedsViews;
    }
    return PyLong_FromLong(flags);
  });
}
PyMethodDef client_recv_into_def = {"recv_into", vipc::python::fastcall<client_recv_into>(), METH_FASTCALL,
                                    "recv_into(frame, cache, epoch, timeout_ms) -> flags or None (timeout)"};

// Server.send_copy(stream, data, frame_id, sof, eof) -> index: the reference's copying
// send (data: bytes or a C-contiguous buffer of exactly the buffer size). `stream`: its
// name, or its handle (Server.handle(name): no name lookup).
VIPC_HOT PyObject* server_send_copy(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() VIPC_HOT -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("send_copy", nargs, 5, 5);
    Server& s = vp::self_of<Server>(self);
    const uint64_t frame_id = stamp(args[2], "frame_id"), sof = stamp(args[3], "timestamp_sof"),
                   eof = stamp(args[4], "timestamp_eof");
    vp::Payload data(args[1]);
    const size_t n = data.size();
    // One stream lookup: size check, checkout, copy, publish (a close() on another
    // thread waits for the copy, which may run without the GIL).
    const auto fill = [&](uint8_t* dst) {
      vp::copy_maybe_without_gil(n, [&] { vipc::common::copy_frame(dst, data.data(), n); });
    };
    const uint32_t index =
        PyLong_CheckExact(args[0])
            ? s.send_copy_at(static_cast<uint32_t>(vp::int_arg(args[0], "stream handle", 0, UINT32_MAX)), n, frame_id,
                             sof, eof, fill)
            : s.send_copy(vp::str_arg(args[0], "stream"), n, frame_id, sof, eof, fill);
    return PyLong_FromUnsignedLong(index);
  });
}
PyMethodDef server_send_copy_def = {"send_copy", vipc::python::fastcall<server_send_copy>(), METH_FASTCALL,
                                    "send_copy(stream, data, frame_id, timestamp_sof, timestamp_eof) -> index"};

// Server.acquire(stream) -> (index, generation) and Client.is_valid(index, generation):
// per frame too (a camera's get_buffer, a reader's frame.valid). `stream`: its name or
// its handle.
PyObject* server_acquire(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("acquire", nargs, 1, 1);
    Server& s = vp::self_of<Server>(self);
    const vipc::visionipc::Checkout a =
        PyLong_CheckExact(args[0])
            ? s.checkout(static_cast<uint32_t>(vp::int_arg(args[0], "stream handle", 0, UINT32_MAX)))
            : [&] {
                const vipc::visionipc::Acquired got = s.get_buffer(vp::str_arg(args[0], "stream"));
                return vipc::visionipc::Checkout{got.index, got.generation};
              }();
    return Py_BuildValue("(IK)", static_cast<unsigned>(a.index), static_cast<unsigned long long>(a.generation));
  });
}
PyMethodDef server_acquire_def = {"acquire", vipc::python::fastcall<server_acquire>(), METH_FASTCALL,
                                  "acquire(stream) -> (index, generation): get_buffer without the view"};

// Server.acquire_frame(ready, owner) -> frame: get_buffer's per-frame path, one call
// that checks a buffer out and returns it as a new frame without running Python.
// `ready` is the stream's (cls, stream, made, geometry, cache, handle, server): the frame
// class (a Frame subclass), the stream key, its ViewCache's `made` list, geometry, the
// cache itself (asked for a buffer's views the first time, when `made` has none), the
// stream's handle (Server.handle(stream)) and the Server (get_buffer_hook's).
// The frame's fields are get_buffer's: idx, generation, the views and geometry,
// owner, stream; frame_id, the timestamps 0.
enum ReadyField : Py_ssize_t {
  kReadyClass = 0,
  kReadyStream,
  kReadyMade,
  kReadyGeometry,
  kReadyCache,
  kReadyHandle,
  kReadyServer,
  kReadyFields
};

VIPC_HOT PyObject* server_acquire_frame(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() VIPC_HOT -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("acquire_frame", nargs, 2, 2);
    PyObject* ready = args[0];
    if (!PyTuple_CheckExact(ready) || PyTuple_GET_SIZE(ready) != kReadyFields ||
        !PyType_Check(PyTuple_GET_ITEM(ready, kReadyClass)) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(ready, kReadyClass)), vp::frame_type()) ||
        !PyList_CheckExact(PyTuple_GET_ITEM(ready, kReadyMade))) {
      vp::type_error("acquire_frame() needs (Frame subclass, stream, made list, geometry, cache, handle, server)");
    }
    auto* cls = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(ready, kReadyClass));
    PyObject* stream = PyTuple_GET_ITEM(ready, kReadyStream);
    PyObject* made = PyTuple_GET_ITEM(ready, kReadyMade);
    const auto handle =
        static_cast<uint32_t>(vp::int_arg(PyTuple_GET_ITEM(ready, kReadyHandle), "stream handle", 0, UINT32_MAX - 1));
    const vipc::visionipc::Checkout a = vp::self_of<Server>(self).checkout(handle);
    py::object views;
    if (a.index < PyList_GET_SIZE(made) && PyList_GET_ITEM(made, a.index) != Py_None) {
      views = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(made, a.index));
    } else {  // the buffer's first frame: the cache makes its views
      views = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(ready, kReadyCache)).attr("get")(a.index);
    }
    py::object frame = py::reinterpret_steal<py::object>(cls->tp_alloc(cls, 0));
    if (!frame) throw py::error_already_set();
    auto* f = reinterpret_cast<vp::FrameObject*>(frame.ptr());
    PyObject* zero = PyLong_FromLong(0);
    if (zero == nullptr) throw py::error_already_set();
    f->views = views.release().ptr();
    f->geometry = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(ready, kReadyGeometry)).release().ptr();
    f->owner = py::reinterpret_borrow<py::object>(args[1]).release().ptr();
    f->stream = py::reinterpret_borrow<py::object>(stream).release().ptr();
    f->server_handle = uint64_t{handle} + 1;
    for (PyObject** field :
         {&f->frame_id, &f->timestamp_sof, &f->timestamp_eof, &f->timestamp_publish, &f->timestamp_recv}) {
      Py_INCREF(zero);
      *field = zero;
    }
    Py_DECREF(zero);
    if (!vp::set_field(f->idx, PyLong_FromUnsignedLong(a.index)) ||
        !vp::set_field(f->generation, PyLong_FromUnsignedLongLong(a.generation))) {
      throw py::error_already_set();
    }
    return frame.release().ptr();
  });
}
PyMethodDef server_acquire_frame_def = {"acquire_frame", vipc::python::fastcall<server_acquire_frame>(), METH_FASTCALL,
                                        "acquire_frame(ready, owner) -> frame (get_buffer's)"};

// Server.send_frame(frame, frame_id, sof, eof): send(buf, ...)'s per-frame path, one
// call: publishes the frame's buffer (its stream, idx, generation), then stores the
// frame id and timestamps as given into the frame and steps its generation, as
// the buffer's next checkout would see it.
VIPC_HOT PyObject* server_send_frame(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() VIPC_HOT -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("send_frame", nargs, 4, 4);
    if (!PyObject_TypeCheck(args[0], vp::frame_type())) {
      vp::type_error(std::string("send_frame() needs a visionipc Frame, not ") + Py_TYPE(args[0])->tp_name);
    }
    auto* f = reinterpret_cast<vp::FrameObject*>(args[0]);
    if (f->stream == nullptr || f->idx == nullptr || f->generation == nullptr) {
      vp::type_error("send_frame() needs a frame of get_buffer() (stream, idx, generation set)");
    }
    const auto index = static_cast<uint32_t>(vp::int_arg(f->idx, "index", 0, UINT32_MAX));
    const uint64_t generation = vp::u64_arg(f->generation, "generation");
    const uint64_t frame_id = stamp(args[1], "frame_id"), sof = stamp(args[2], "timestamp_sof"),
                   eof = stamp(args[3], "timestamp_eof");
    Server& s = vp::self_of<Server>(self);
    if (f->server_handle != 0) {  // acquire_frame's: by handle
      s.send_at(static_cast<uint32_t>(f->server_handle - 1), index, generation, frame_id, sof, eof);
    } else {
      s.send(vp::str_arg(f->stream, "stream"), index, generation, frame_id, sof, eof);
    }
    if (!vp::set_field(f->generation, PyLong_FromUnsignedLongLong(generation + 1))) throw py::error_already_set();
    Py_INCREF(args[1]);
    Py_XSETREF(f->frame_id, args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(f->timestamp_sof, args[2]);
    Py_INCREF(args[3]);
    Py_XSETREF(f->timestamp_eof, args[3]);
    Py_RETURN_NONE;
  });
}
PyMethodDef server_send_frame_def = {"send_frame", vipc::python::fastcall<server_send_frame>(), METH_FASTCALL,
                                     "send_frame(frame, frame_id, timestamp_sof, timestamp_eof)"};

// VisionIpcServer.get_buffer and .send fronted natively (python/fast_method.h): the
// per-frame forms go to acquire_frame / send_frame / send_copy without a Python frame;
// every other form, and any state the Python method would check first (closed,
// inherited across fork, cuda=True, a stream not served yet), runs the Python method.
PyTypeObject* server_type = nullptr;  // _visionipc.Server (set at import)

// The VisionIpcServer's attribute `name` (a new reference), or nullptr without an error.
VIPC_HOT PyObject* attr_or_null(PyObject* self, PyObject* name) {
  PyObject* v = PyObject_GetAttr(self, name);
  if (v == nullptr) PyErr_Clear();
  return v;
}

// get_buffer(stream), stream an exact str or int already served: its `_ready` entry.
VIPC_HOT PyObject* get_buffer_hook(PyObject*, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                   PyObject* kwnames) {
  static PyObject* const ready_name = PyUnicode_InternFromString("_ready");
  if (nargs != 1 || kwnames != nullptr || (!PyUnicode_CheckExact(args[0]) && !PyLong_CheckExact(args[0]))) {
    return nullptr;
  }
  PyObject* table = attr_or_null(self, ready_name);
  if (table == nullptr) return nullptr;
  PyObject* ready = PyDict_CheckExact(table) ? PyDict_GetItemWithError(table, args[0]) : nullptr;
  Py_XINCREF(ready);  // held: making the views may run Python, which may clear the table
  Py_DECREF(table);
  PyObject* got = nullptr;
  if (ready != nullptr && PyTuple_CheckExact(ready) && PyTuple_GET_SIZE(ready) == kReadyFields &&
      Py_TYPE(PyTuple_GET_ITEM(ready, kReadyServer)) == server_type) {
    PyObject* const argv[2] = {ready, self};
    got = server_acquire_frame(PyTuple_GET_ITEM(ready, kReadyServer), argv, 2);
  }
  Py_XDECREF(ready);
  return got;
}

// send's parameters, as VisionIpcServer.send names them.
enum SendParam : Py_ssize_t { kBuf = 0, kData, kFrameId, kSof, kEof, kSendParams };

// The call's arguments into send's parameters (unset: nullptr); false for anything
// else (too many, an unknown or repeated name): the Python method says so.
VIPC_HOT bool bind_send(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** p) {
  static const char* const names[kSendParams] = {"buf", "data", "frame_id", "timestamp_sof", "timestamp_eof"};
  if (nargs > kSendParams) return false;
  for (Py_ssize_t i = 0; i < nargs; i++) p[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t j = 0; j < nkw; j++) {
    Py_ssize_t k = 0;
    while (k < kSendParams && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, j), names[k]) != 0) k++;
    if (k == kSendParams || p[k] != nullptr) return false;
    p[k] = args[nargs + j];
  }
  return p[kBuf] != nullptr;
}

// A CudaLink with no copy in flight (its `inflight` an empty dict): send(buf) has
// nothing to wait for (VisionIpcServer._send_buf's finish() would return at once).
VIPC_HOT bool no_copies_in_flight(PyObject* link) {
  static PyObject* const inflight_name = PyUnicode_InternFromString("inflight");
  PyObject* inflight = attr_or_null(link, inflight_name);
  const bool none = inflight != nullptr && PyDict_CheckExact(inflight) && PyDict_GET_SIZE(inflight) == 0;
  Py_XDECREF(inflight);
  return none;
}

// send(buf, ...) with a VisionBuf of this server's get_buffer (no copy from the GPU in
// flight): send_frame;
// send(stream, data, ...) with bytes, for a stream already sent to: send_copy by handle.
// `data` is VisionBuf (the class).
VIPC_HOT PyObject* send_hook(PyObject* data, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                             PyObject* kwnames) {
  static PyObject* const native_name = PyUnicode_InternFromString("_native");
  static PyObject* const cuda_name = PyUnicode_InternFromString("_cuda");
  static PyObject* const handles_name = PyUnicode_InternFromString("_handles");
  static PyObject* const zero = PyLong_FromLong(0);
  PyObject* p[kSendParams] = {};
  if (!bind_send(args, nargs, kwnames, p)) return nullptr;
  for (Py_ssize_t k = kFrameId; k < kSendParams; k++) p[k] = p[k] == nullptr ? zero : p[k];
  PyObject* const buf = p[kBuf];
  const bool frame = Py_TYPE(buf) == reinterpret_cast<PyTypeObject*>(data);
  const bool no_data = p[kData] == nullptr || p[kData] == Py_None;
  if (frame ? reinterpret_cast<vipc::python::FrameObject*>(buf)->owner != self
            : (no_data || !PyBytes_CheckExact(p[kData]) || (!PyUnicode_CheckExact(buf) && !PyLong_CheckExact(buf)))) {
    return nullptr;
  }
  PyObject* native = attr_or_null(self, native_name);
  if (native == nullptr) return nullptr;
  PyObject* got = nullptr;
  if (Py_TYPE(native) == server_type && frame) {
    PyObject* cuda = attr_or_null(self, cuda_name);
    if (cuda == Py_None || no_copies_in_flight(cuda)) {
      // the reference's positional send(buf, frame_id, sof, eof) in `data`'s place
      PyObject* const argv[4] = {buf, no_data ? p[kFrameId] : p[kData], no_data ? p[kSof] : p[kFrameId],
                                 no_data ? p[kEof] : p[kSof]};
      got = server_send_frame(native, argv, 4);
    }
    Py_XDECREF(cuda);
  } else if (Py_TYPE(native) == server_type) {
    PyObject* handles = attr_or_null(self, handles_name);
    PyObject* handle =
        handles != nullptr && PyDict_CheckExact(handles) ? PyDict_GetItemWithError(handles, buf) : nullptr;
    if (handle != nullptr) {
      Py_INCREF(handle);  // borrowed from a dict that close() on another thread may clear
      PyObject* const argv[5] = {handle, p[kData], p[kFrameId], p[kSof], p[kEof]};
      PyObject* index = server_send_copy(native, argv, 5);
      got = index == nullptr ? nullptr : Py_NewRef(Py_None);
      Py_XDECREF(index);
      Py_DECREF(handle);
    }
    Py_XDECREF(handles);
  }
  Py_DECREF(native);
  return got;
}

// visionipc._visionipc.server_method(kind, func, data=None): func fronted by the hook
// of that kind ("get_buffer" or "send"; data: send's VisionBuf class).
PyObject* server_method(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2 || nargs > 3 || !PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "server_method(kind, func, data=None)");
    return nullptr;
  }
  const bool send = PyUnicode_CompareWithASCIIString(args[0], "send") == 0;
  if (!send && PyUnicode_CompareWithASCIIString(args[0], "get_buffer") != 0) {
    PyErr_Format(PyExc_ValueError, "server_method(): no native front for %R (get_buffer, send)", args[0]);
    return nullptr;
  }
  PyObject* data = nargs == 3 ? args[2] : Py_None;
  if (send && !PyType_Check(data)) {
    PyErr_SetString(PyExc_TypeError, "server_method('send', func, data): data is the VisionBuf class");
    return nullptr;
  }
  return vipc::python::fast_method_new(send ? send_hook : get_buffer_hook, args[1], data);
}
PyMethodDef server_method_def = {"server_method", vipc::python::fastcall<server_method>(), METH_FASTCALL,
                                 "server_method(kind, func, data=None): func with a native front for its per-frame "
                                 "calls (VisionIpcServer.get_buffer and .send)"};

PyObject* client_is_valid(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() -> PyObject* {
    namespace vp = vipc::python;
    vp::check_nargs("is_valid", nargs, 2, 2);
    const bool ok = vp::self_of<Client>(self).is_valid(
        static_cast<uint32_t>(vp::int_arg(args[0], "index", 0, UINT32_MAX)), vp::u64_arg(args[1], "generation"));
    return PyBool_FromLong(ok);
  });
}
PyMethodDef client_is_valid_def = {"is_valid", vipc::python::fastcall<client_is_valid>(), METH_FASTCALL,
                                   "is_valid(index, generation) -> bool"};

vipc::visionipc::Format parse(const std::string& name) {
  vipc::visionipc::Format f;
  if (!vipc::visionipc::parse_format(name, f) || f == vipc::visionipc::Format::kCustom) {
    std::string names;
    for (const vipc::visionipc::FormatInfo& info : vipc::visionipc::kFormats) {
      if (info.format != vipc::visionipc::Format::kCustom) names += std::string(names.empty() ? "" : ", ") + info.name;
    }
    vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                       "unknown pixel format '" + name + "' (" + names + ")");
  }
  return f;
}

// (address, length) of the whole pages from the first buffer's start to the
// last buffer's end, within `pool`'s mapping (what visionipc.cuda registers).
py::tuple buffers_span(const std::shared_ptr<vipc::visionipc::Mapping>& pool, const uint8_t* first, const uint8_t* last,
                       uint64_t size) {
  if (!pool) vipc::common::fail(vipc::common::ErrorKind::kClosed, "no pool is mapped (not connected)");
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<uintptr_t>(pool->data());
  const uintptr_t begin = reinterpret_cast<uintptr_t>(first) & ~(page - 1);
  const uintptr_t end =
      std::min((reinterpret_cast<uintptr_t>(last) + size + page - 1) & ~(page - 1), base + pool->size());
  return py::make_tuple(begin, end - begin);
}

}  // namespace

PYBIND11_MODULE(_visionipc, m) {
  m.doc() = "Native VisionIPC server and client (private: use the visionipc package)";
  vipc::python::register_error_translator();
  m.attr("STRIDE_ALIGN") = vipc::visionipc::kStrideAlign;
  m.attr("BUFFER_ALIGN") = vipc::visionipc::kBufferAlign;
  m.attr("MAX_BUFFERS") = vipc::visionipc::kMaxBuffers;
  m.attr("MAX_CLIENTS") = vipc::visionipc::kMaxClients;
  m.attr("MAX_CLIENTS_PER_PEER") = vipc::visionipc::kMaxClientsPerPeer;
  m.attr("MAX_NAME_LENGTH") = vipc::visionipc::kMaxNameLength;
  m.attr("POOL_IN_DEVICE_MEMORY") = vipc::visionipc::kPoolInDeviceMemory;  // Client.pool_flags
  // The format table, in enum order: (name, code, aliases, bytes_per_pixel, channels, yuv420, selectable,
  // planes, cv_to_bgr, cv_from_bgr, av_format); `selectable`: create_buffers takes it by name (custom comes
  // from create_buffers_with_sizes).
  py::list formats;
  for (const vipc::visionipc::FormatInfo& info : vipc::visionipc::kFormats) {
    formats.append(py::make_tuple(info.name, static_cast<uint32_t>(info.format), info.aliases, info.bytes_per_pixel,
                                  info.channels, info.yuv420, info.format != vipc::visionipc::Format::kCustom,
                                  info.planes, info.cv_to_bgr, info.cv_from_bgr, info.av_format));
  }
  m.attr("FORMAT_TABLE") = py::tuple(formats);
  m.def("geometry", [](const std::string& format, uint32_t w, uint32_t h) {
    return geometry_tuple(vipc::visionipc::make_geometry(parse(format), w, h));
  });
  m.def("endpoint_name", &vipc::visionipc::endpoint_name);
  m.def("dlpack_capsule", &vipc::python::dlpack_capsule, py::arg("owner"), py::arg("data"), py::arg("shape"),
        py::arg("strides"), py::arg("type_code"), py::arg("bits"), py::arg("device_type"), py::arg("device_id"),
        "A DLPack 'dltensor' capsule over memory `owner` keeps alive (strides in elements).");

  vipc::python::bind_mapped_bytes<vipc::visionipc::Mapping>(m, "View");

  py::class_<Server>(m, "Server")
      .def(py::init([](const std::string& name, const std::string& prefix, const std::string& shm_dir,
                       std::vector<uid_t> uids, bool handoff) {
             vipc::visionipc::ServerOptions o{prefix, shm_dir, std::move(uids)};
             o.wake = handoff ? vipc::msgq::WakeMode::kHandoff : vipc::msgq::WakeMode::kAll;
             return std::make_unique<Server>(name, std::move(o));
           }),
           py::arg("name"), py::arg("prefix") = "", py::arg("shm_dir") = std::string(vipc::common::kSegmentDir),
           py::arg("allowed_uids") = std::vector<uid_t>{}, py::arg("handoff_wakes") = false)
      .def(
          "create_buffers",
          [](Server& s, const std::string& stream, uint32_t count, uint32_t w, uint32_t h, const std::string& format,
             uint32_t pool_flags) {
            s.create_buffers(stream, count, vipc::visionipc::make_geometry(parse(format), w, h), pool_flags);
          },
          py::arg("stream"), py::arg("count"), py::arg("width"), py::arg("height"), py::arg("format"),
          py::arg("pool_flags") = 0)
      .def(
          "create_buffers_with_sizes",
          [](Server& s, const std::string& stream, uint32_t count, uint32_t w, uint32_t h, uint64_t size,
             uint32_t stride, uint32_t uv_offset, uint32_t pool_flags) {
            s.create_buffers(stream, count, vipc::visionipc::custom_geometry(w, h, size, stride, uv_offset),
                             pool_flags);
          },
          py::arg("stream"), py::arg("count"), py::arg("width"), py::arg("height"), py::arg("size"), py::arg("stride"),
          py::arg("uv_offset"), py::arg("pool_flags") = 0)
      .def("get_buffer",
           [](Server& s, const std::string& stream) {
             const vipc::visionipc::Acquired a = s.get_buffer(stream);
             return py::make_tuple(a.index, a.generation, View{a.pool, a.data, s.geometry(stream).size, false});
           })
      .def("view",
           [](const Server& s, const std::string& stream, uint32_t index) {
             return View{s.pool(stream), s.buffer(stream, index), s.geometry(stream).size, false};
           })
      .def("buffers_span",
           [](const Server& s, const std::string& stream) {
             return buffers_span(s.pool(stream), s.buffer(stream, 0), s.buffer(stream, s.count(stream) - 1),
                                 s.geometry(stream).size);
           })
      .def("start_listener", &Server::start_listener)
      .def("close",
           [](Server& s) {
             py::gil_scoped_release nogil;  // joins the listener thread
             s.close();
           })
      .def("streams", &Server::streams)
      .def("geometry", [](const Server& s, const std::string& stream) { return geometry_tuple(s.geometry(stream)); })
      .def("count", &Server::count)
      .def("handle", &Server::handle)
      .def("clients", &Server::clients)
      .def("readers_woken", &Server::readers_woken)
      .def("generation", &Server::generation)
      .def_property_readonly("id", &Server::id)
      .def("_forget_after_fork", &Server::forget_after_fork);

  PyObject* frame = vipc::python::make_frame_type();
  if (frame == nullptr) throw py::error_already_set();
  m.attr("Frame") = py::reinterpret_steal<py::object>(frame);  // the module keeps it
  m.attr("RECV_LEASED") = kLeased;
  m.attr("RECV_NEEDS_VIEWS") = kNeedsViews;

  py::class_<Client>(m, "Client")
      .def(py::init([](const std::string& name, const std::string& stream, bool conflate, const std::string& prefix,
                       const std::string& shm_dir, std::vector<uid_t> trusted_uids) {
             return std::make_unique<Client>(name, stream, conflate,
                                             vipc::visionipc::ClientOptions{prefix, shm_dir, std::move(trusted_uids)});
           }),
           py::arg("name"), py::arg("stream"), py::arg("conflate") = false, py::arg("prefix") = "",
           py::arg("shm_dir") = std::string(vipc::common::kSegmentDir), py::arg("trusted_uids") = std::vector<uid_t>{})
      .def("connect",
           [](Client& c) {
             py::gil_scoped_release nogil;
             return c.connect();
           })
      .def_property_readonly("last_error", &Client::last_error)
      .def_property_readonly("last_refusal",
                             [](const Client& c) {
                               static const char* const names[] = {"", "no server", "unknown stream", "full",
                                                                   "peer limit"};
                               return std::string(names[static_cast<int>(c.last_refusal())]);
                             })
      .def("connected", &Client::connected)
      .def("take_lease", &Client::take_lease)
      .def("release_lease", &Client::release_lease)
      .def("view",
           [](const Client& c, uint32_t index) {
             return View{c.pool(), const_cast<uint8_t*>(c.buffer(index)), c.geometry().size, false};
           })
      .def("geometry", [](const Client& c) { return geometry_tuple(c.geometry()); })
      .def(
          "buffers_span",
          [](const Client& c) {
            if (c.count() == 0)
              vipc::common::fail(vipc::common::ErrorKind::kClosed, "no pool is mapped (not connected)");
            return buffers_span(c.pool(), c.buffer(0), c.buffer(c.count() - 1), c.geometry().size);
          },
          "(address, length): the whole pages holding every buffer of the mapped pool (to register with CUDA)")
      .def_property_readonly("count", &Client::count)
      .def_property_readonly("pool_flags", &Client::pool_flags,
                             "the mapped pool's flags (POOL_IN_DEVICE_MEMORY: its frames are in GPU memory)")
      .def_property_readonly("server_id", &Client::server_id)
      .def_property_readonly("epoch", &Client::epoch)
      .def_property_readonly("dropped", &Client::dropped)
      .def("close",
           [](Client& c) {
             py::gil_scoped_release nogil;  // waits for a recv() of another thread to leave
             c.close();
           })
      .def("_forget_after_fork", &Client::forget_after_fork);

  vipc::python::add_fast_method(m.attr("Server"), &server_send_def);
  vipc::python::add_fast_method(m.attr("Server"), &server_acquire_def);
  vipc::python::add_fast_method(m.attr("Server"), &server_send_copy_def);
  vipc::python::add_fast_method(m.attr("Server"), &server_acquire_frame_def);
  vipc::python::add_fast_method(m.attr("Server"), &server_send_frame_def);
  vipc::python::add_fast_method(m.attr("Client"), &client_recv_into_def);
  vipc::python::add_fast_method(m.attr("Client"), &client_is_valid_def);
  server_type = reinterpret_cast<PyTypeObject*>(m.attr("Server").ptr());  // the module keeps it
  PyObject* front = PyCFunction_New(&server_method_def, nullptr);
  if (front == nullptr) throw py::error_already_set();
  m.attr("server_method") = py::reinterpret_steal<py::object>(front);

  m.def(
      "list_streams",
      [](const std::string& name, const std::string& prefix, const std::string& shm_dir,
         std::vector<uid_t> trusted_uids) {
        std::optional<std::vector<std::string>> r;
        {
          py::gil_scoped_release nogil;
          r = Client::list_streams(name, vipc::visionipc::ClientOptions{prefix, shm_dir, std::move(trusted_uids)});
        }
        return r;
      },
      py::arg("name"), py::arg("prefix"), py::arg("shm_dir"), py::arg("trusted_uids") = std::vector<uid_t>{});
}
