// msgq._queues, part 1: the lossless broadcast queue (cpp/broadcast; the
// Python side is msgq/broadcast.py). Type conversion, GIL release around
// waits and large copies, signal checks; no logic.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "broadcast/queue.h"
#include "common/clock.h"
#include "python/bindings.h"
#include "python/queues_bindings.h"

namespace py = pybind11;

namespace {

py::object seconds_or_none(int64_t deadline_ns) {
  if (deadline_ns == vipc::common::kNever) return py::none();
  return py::float_(static_cast<double>(deadline_ns) / 1e9);
}

// Holds buffers (bytes, bytearray, memoryview, numpy...) for the duration of a write.
class Parts {
 public:
  explicit Parts(const py::sequence& seq) {
    views_.resize(seq.size());
    for (size_t i = 0; i < seq.size(); i++) {
      py::object o = seq[i];
      if (PyObject_GetBuffer(o.ptr(), &views_[i], PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        release(i);
        vipc::python::type_error(std::string("message parts must be bytes-like, C-contiguous buffers, not ") +
                                 Py_TYPE(o.ptr())->tp_name);
      }
      parts_.push_back(vipc::broadcast::Part{views_[i].buf, static_cast<uint64_t>(views_[i].len)});
    }
  }
  ~Parts() { release(views_.size()); }
  const std::vector<vipc::broadcast::Part>& parts() const { return parts_; }

 private:
  void release(size_t n) {
    for (size_t i = 0; i < n; i++) PyBuffer_Release(&views_[i]);
    views_.clear();
  }
  std::vector<Py_buffer> views_;
  std::vector<vipc::broadcast::Part> parts_;
};

// Pickle protocol 5, looked up once (never destroyed: no decref may run
// after the interpreter is finalized). Called through vectorcall: this is
// the per-message path.
struct Pickler {
  py::object dumps, loads, protocol, callback_kw, buffers_kw;
};
const Pickler& pickler() {
  static const Pickler* p = [] {
    py::module_ pickle = py::module_::import("pickle");
    return new Pickler{pickle.attr("dumps"), pickle.attr("loads"), py::int_(5), py::make_tuple("buffer_callback"),
                       py::make_tuple("buffers")};
  }();
  return *p;
}

py::object call(const py::object& fn, PyObject* const* args, size_t nargs, const py::object& kwnames = {}) {
  PyObject* r = PyObject_Vectorcall(fn.ptr(), args, nargs, kwnames ? kwnames.ptr() : nullptr);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

// obj pickled (protocol 5): [stream, out-of-band buffers...]. Contiguous
// buffers (numpy arrays, PickleBuffer) go out of band, uncopied; if one is
// not contiguous, everything is pickled again in band.
py::list serialize(const py::handle& obj) {
  const Pickler& p = pickler();
  py::list buffers;
  py::object append = buffers.attr("append");  // returns None: "out of band"
  PyObject* args[] = {obj.ptr(), p.protocol.ptr(), append.ptr()};
  py::object stream = call(p.dumps, args, 2, p.callback_kw);
  py::list parts;
  parts.append(stream);
  for (const py::handle b : buffers) {
    const Py_buffer* view = PyPickleBuffer_GetBuffer(b.ptr());
    if (view == nullptr) throw py::error_already_set();
    if (!PyBuffer_IsContiguous(view, 'A')) {
      py::list in_band;
      in_band.append(call(p.dumps, args, 2));
      return in_band;
    }
    parts.append(b.attr("raw")());
  }
  return parts;
}

// Sentinels that take() / put() return instead of a message (never equal to one).
struct Sentinels {
  py::object overflow, timeout, shutdown, closed;
};
const Sentinels* g_sentinels = nullptr;  // set once at module init
const Sentinels& sentinels() { return *g_sentinels; }
py::object status_sentinel(vipc::common::WaitStatus st) {
  switch (st) {
    case vipc::common::WaitStatus::kTimeout:
      return sentinels().timeout;
    case vipc::common::WaitStatus::kShutdown:
      return sentinels().shutdown;
    default:
      return sentinels().closed;
  }
}

// The message v (peeked from r), decoded, then handed back (BR3; the steps are in cpp/broadcast/README.md): raw bytes
// as bytes; a pickle stream unpickled in place from the chunk, its
// out-of-band buffers copied into bytearrays first (the chunk is reused once
// consumed); an overflow marker as OVERFLOW, not consumed (the payload is in
// an overflow file: msgq/_overflow.py; the caller consumes once it has it).
// One part copied out of a chunk: bytes (as_bytes) or a writable bytearray
// (out-of-band buffers); large copies run without the GIL.
py::object copy_out(const vipc::broadcast::Part& part, bool as_bytes) {
  const auto n = static_cast<Py_ssize_t>(part.size);
  PyObject* o = as_bytes ? PyBytes_FromStringAndSize(nullptr, n) : PyByteArray_FromStringAndSize(nullptr, n);
  if (o == nullptr) throw py::error_already_set();
  char* dst = as_bytes ? PyBytes_AS_STRING(o) : PyByteArray_AS_STRING(o);
  if (n != 0) vipc::python::copy_maybe_without_gil(part.size, [&] { std::memcpy(dst, part.data, part.size); });
  return py::reinterpret_steal<py::object>(o);
}

// BR3, or false when another thread closed the reader first.
bool consume_unless_closed(vipc::broadcast::Reader& r) {
  try {
    r.consume();
    return true;
  } catch (const vipc::common::Error& e) {
    if (e.kind() != vipc::common::ErrorKind::kClosed) throw;
    return false;
  }
}

// Write a message whose chunk wait_writable() freed; large copies run without the GIL.
void write_parts(vipc::broadcast::Writer& w, uint32_t flags, const vipc::broadcast::Part* parts, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += parts[i].size;
  vipc::python::copy_maybe_without_gil(total, [&] { w.write(flags, parts, n); });
}

// The message of a (non-overflow) chunk, decoded: see take_message.
py::object decode_message(vipc::broadcast::Reader& r, const vipc::broadcast::ChunkView& v) {
  if (v.parts.empty())
    vipc::common::fail(vipc::common::ErrorKind::kSegment, r.file()->path() + ": corrupt chunk (no parts)");
  if (v.flags & vipc::broadcast::kFlagRaw) return copy_out(v.parts[0], true);
  py::object buffers;  // out-of-band buffers, if any (most messages have none)
  if (v.parts.size() > 1) {
    py::list list;
    for (size_t i = 1; i < v.parts.size(); i++) list.append(copy_out(v.parts[i], false));
    buffers = std::move(list);
  }
  auto stream = py::reinterpret_steal<py::object>(PyMemoryView_FromMemory(
      static_cast<char*>(const_cast<void*>(v.parts[0].data)), static_cast<Py_ssize_t>(v.parts[0].size), PyBUF_READ));
  if (!stream) throw py::error_already_set();
  struct ReleaseOnExit {  // nothing may keep a view of the chunk past BR3
    py::object& view;
    ~ReleaseOnExit() {
      static PyObject* const name = PyUnicode_InternFromString("release");
      PyObject *type, *value, *tb;
      const bool failing = PyErr_Occurred() != nullptr;
      if (failing) PyErr_Fetch(&type, &value, &tb);
      if (PyObject* res = PyObject_CallMethodNoArgs(view.ptr(), name)) Py_DECREF(res);
      PyErr_Clear();  // a view still exported: nothing we can do here, and unpickling never keeps one
      if (failing) PyErr_Restore(type, value, tb);
    }
  } release{stream};
  PyObject* args[] = {stream.ptr(), buffers.ptr()};
  return buffers ? call(pickler().loads, args, 1, pickler().buffers_kw) : call(pickler().loads, args, 1);
}

py::object take_message(vipc::broadcast::Reader& r, const vipc::broadcast::ChunkView& v) {
  // An overflow marker stays unconsumed until the caller has read the
  // payload's file: a reader that dies before then finds it again.
  if (v.flags & vipc::broadcast::kFlagOverflow) return sentinels().overflow;
  py::object out;
  {
    struct ConsumeOnError {  // BR3 even if unpickling raises: the message is spent either way
      vipc::broadcast::Reader& r;
      bool armed = true;
      ~ConsumeOnError() {
        if (!armed) return;
        try {
          r.consume();
        } catch (const vipc::common::Error&) {  // closed meanwhile by another thread
        }
      }
    } on_error{r};
    out = decode_message(r, v);
    on_error.armed = false;
  }
  // Closed by another thread while we decoded (it waits for us: gate): not
  // consumed, so not delivered either; the rank's next reader gets it.
  if (!consume_unless_closed(r)) return sentinels().closed;
  return out;
}

// The next message if one is there (take_message), else a null object;
// CLOSED once another thread closes r. Under r's gate: the close() waits
// until the chunk is copied out or unpickled (its GIL is released meanwhile).
py::object take_if_ready(vipc::broadcast::Reader& r, vipc::broadcast::ChunkView& v) {
  const vipc::common::UseGuard use(r.gate());
  if (!use.ok()) return sentinels().closed;
  if (!r.peek(v)) return py::object();
  return take_message(r, v);
}

}  // namespace

namespace vipc::python {

void bind_broadcast(py::module_& m) {
  m.attr("FLAG_RAW") = vipc::broadcast::kFlagRaw;
  m.attr("FLAG_OVERFLOW") = vipc::broadcast::kFlagOverflow;
  m.attr("MAX_READERS") = vipc::broadcast::kMaxReaders;
  {
    py::object object = py::module_::import("builtins").attr("object");
    g_sentinels = new Sentinels{object(), object(), object(), object()};
    m.attr("OVERFLOW") = g_sentinels->overflow;
    m.attr("TIMEOUT") = g_sentinels->timeout;
    m.attr("SHUTDOWN") = g_sentinels->shutdown;
    m.attr("CLOSED") = g_sentinels->closed;
  }
  m.def("serialize", &serialize, py::arg("obj"),
        "obj pickled (protocol 5) as [stream, out-of-band buffers...], as put() pickles it: contiguous buffers\n"
        "(numpy arrays) out of band, uncopied; everything in band if one is not contiguous.");

  py::class_<vipc::broadcast::Writer, std::shared_ptr<vipc::broadcast::Writer>>(m, "BroadcastWriter")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t n_readers, uint32_t n_chunks,
                       uint64_t chunk_bytes, unsigned mode) {
             vipc::broadcast::QueueSpec s;
             s.dir = dir;
             s.basename = basename;
             s.mode = static_cast<mode_t>(mode);
             s.n_readers = n_readers;
             s.n_chunks = n_chunks;
             s.chunk_bytes = chunk_bytes;
             return std::make_shared<vipc::broadcast::Writer>(s);
           }),
           py::arg("dir"), py::arg("basename"), py::arg("n_readers"), py::arg("n_chunks"), py::arg("chunk_bytes"),
           py::arg("mode") = 0600)
      .def("fits",
           [](const vipc::broadcast::Writer& w, const py::sequence& parts) {
             Parts p(parts);
             return w.fits(p.parts().data(), p.parts().size());
           })
      .def(
          "write",
          [](vipc::broadcast::Writer& w, uint32_t flags, const py::sequence& parts, std::optional<double> timeout_s) {
            Parts p(parts);
            if (!w.fits(p.parts().data(), p.parts().size())) return "too_large";
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            const vipc::common::WaitStatus st = vipc::python::blocking([&] { return w.wait_writable(deadline); });
            if (st != vipc::common::WaitStatus::kReady) return vipc::common::wait_status_name(st);
            write_parts(w, flags, p.parts().data(), p.parts().size());
            return "ready";
          },
          py::arg("flags"), py::arg("parts"), py::arg("timeout_s"),
          "Wait for a free chunk (up to timeout_s; None: no limit), then write; returns the wait's status, or "
          "too_large.")
      .def(
          "put",
          [](vipc::broadcast::Writer& w, const py::handle& obj, bool raw, const py::handle& timeout,
             double cap_s) -> py::object {
            const int64_t deadline =
                vipc::python::deadline_from(vipc::python::timeout_from_py(timeout));  // checked before pickling
            py::list parts;
            if (raw) {
              parts.append(obj);
            } else {
              parts = serialize(obj);
            }
            auto slow_path = [&](const char* status, int64_t started_ns) {
              return py::make_tuple(status, parts, seconds_or_none(deadline), static_cast<double>(started_ns) / 1e9);
            };
            // A lone pickle stream (no out-of-band buffer) is a bytes object:
            // written straight from it, with no buffer requests.
            std::optional<Parts> views;
            vipc::broadcast::Part one{};
            const vipc::broadcast::Part* data = &one;
            size_t n = 1;
            if (!raw && PyList_GET_SIZE(parts.ptr()) == 1 && PyBytes_CheckExact(PyList_GET_ITEM(parts.ptr(), 0))) {
              PyObject* stream = PyList_GET_ITEM(parts.ptr(), 0);
              one = vipc::broadcast::Part{PyBytes_AS_STRING(stream), static_cast<uint64_t>(PyBytes_GET_SIZE(stream))};
            } else {
              views.emplace(parts);
              data = views->parts().data();
              n = views->parts().size();
            }
            if (!w.fits(data, n)) return slow_path("too_large", vipc::common::monotonic_ns());
            if (!w.writable_now()) {
              // Up to cap_s (the caller's warning interval), then the caller's
              // slow path warns and waits on until the deadline.
              const int64_t started = vipc::common::monotonic_ns();
              const int64_t until = std::min(deadline, vipc::python::deadline_from(cap_s));
              const vipc::common::WaitStatus st = vipc::python::blocking([&] { return w.wait_writable(until); });
              if (st != vipc::common::WaitStatus::kReady) return slow_path(vipc::common::wait_status_name(st), started);
            }
            write_parts(w, raw ? vipc::broadcast::kFlagRaw : 0, data, n);
            return py::none();
          },
          py::arg("obj"), py::arg("raw"), py::arg("timeout"), py::arg("cap_s"),
          "The hot path in one call: pickle obj (protocol 5, contiguous buffers out of band; raw: obj is the\n"
          "bytes-like message), wait for a free chunk (up to timeout s, None: no limit, and at most cap_s),\n"
          "write it. None once written; else (status, parts, deadline, started) for the caller's slow path:\n"
          "status too_large, timeout, shutdown or closed; deadline and started in time.monotonic() seconds\n"
          "(deadline None: no limit). A bad timeout raises InvalidArgumentError before anything is pickled.")
      .def("pending_readers",
           [](const vipc::broadcast::Writer& w) {
             std::vector<uint32_t> ranks;
             const uint64_t mask = w.pending_readers();
             for (uint32_t r = 0; r < 64; r++) {
               if (mask >> r & 1) ranks.push_back(r);
             }
             return ranks;
           })
      .def("reader_attached",
           [](const vipc::broadcast::Writer& w, uint32_t r) {
             if (w.closed() || r >= w.file()->n_readers()) return false;
             return w.file()->reader_attached(r);
           })
      .def("reader_pid",
           [](const vipc::broadcast::Writer& w, uint32_t r) {
             if (w.closed() || r >= w.file()->n_readers()) return uint32_t{0};
             return w.file()->header().readers[r].pid.load(std::memory_order_relaxed);
           })
      .def("reader_consumed",
           [](const vipc::broadcast::Writer& w, uint32_t r) {
             if (w.closed() || r >= w.file()->n_readers()) return uint64_t{0};
             return w.file()->header().readers[r].consumed.load(std::memory_order_relaxed);
           })
      .def("consumed_by_all", &vipc::broadcast::Writer::consumed_by_all, py::arg("seq"),
           "Every reader consumed message seq (its chunk is free, or holds a later message).")
      .def("shutdown", &vipc::broadcast::Writer::shutdown)
      .def_property_readonly("written", &vipc::broadcast::Writer::written)
      .def_property_readonly("chunk_bytes",
                             [](const vipc::broadcast::Writer& w) { return w.closed() ? 0 : w.file()->chunk_bytes(); })
      .def_property_readonly("n_chunks",
                             [](const vipc::broadcast::Writer& w) { return w.closed() ? 0 : w.file()->n_chunks(); })
      .def_property_readonly("n_readers",
                             [](const vipc::broadcast::Writer& w) { return w.closed() ? 0 : w.file()->n_readers(); })
      .def_property_readonly(
          "path", [](const vipc::broadcast::Writer& w) { return w.closed() ? std::string() : w.file()->path(); })
      .def_property_readonly("closed", &vipc::broadcast::Writer::closed)
      .def("close", &vipc::broadcast::Writer::close)
      .def("_forget_after_fork", &vipc::broadcast::Writer::forget_after_fork);

  py::class_<vipc::broadcast::Reader, std::shared_ptr<vipc::broadcast::Reader>>(m, "BroadcastReader")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t rank, unsigned mode) {
             vipc::broadcast::QueueSpec s;
             s.dir = dir;
             s.basename = basename;
             s.mode = static_cast<mode_t>(mode);
             return std::make_shared<vipc::broadcast::Reader>(s, rank);
           }),
           py::arg("dir"), py::arg("basename"), py::arg("rank"), py::arg("mode") = 0600)
      .def(
          "wait",
          [](vipc::broadcast::Reader& r, std::optional<double> timeout_s) {
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            return vipc::common::wait_status_name(vipc::python::blocking([&] { return r.wait_readable(deadline); }));
          },
          py::arg("timeout_s"))
      .def("peek_flags",
           [](vipc::broadcast::Reader& r) -> std::optional<uint32_t> {
             vipc::broadcast::ChunkView v;
             if (!r.peek(v)) return std::nullopt;
             return v.flags;
           })
      .def(
          "take",
          [](vipc::broadcast::Reader& r, const py::handle& timeout) -> py::object {
            thread_local vipc::broadcast::ChunkView v;  // keeps its capacity: no allocation per message
            const std::optional<double> timeout_s =
                vipc::python::timeout_from_py(timeout);  // checked even when a message waits
            if (py::object got = take_if_ready(r, v)) return got;
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            for (;;) {
              const vipc::common::WaitStatus st = vipc::python::blocking([&] { return r.wait_readable(deadline); });
              if (st != vipc::common::WaitStatus::kReady) return status_sentinel(st);
              if (py::object got = take_if_ready(r, v)) return got;
            }
          },
          py::arg("timeout"),
          "The hot path in one call: wait up to timeout s (None: no limit; a bad one raises\n"
          "InvalidArgumentError) for the next message, decode it (unpickled in place, or bytes if raw),\n"
          "consume it. OVERFLOW (not consumed) for a message in an overflow file; TIMEOUT, SHUTDOWN or CLOSED when "
          "there is none.")
      .def("read",
           [](vipc::broadcast::Reader& r) -> py::object {
             // The next message, copied out: (flags, [first part as bytes,
             // further parts as writable bytearrays]); then BR3. None if there is none.
             // An overflow marker: (flags, []), not consumed (see take_message).
             const vipc::common::UseGuard use(r.gate());  // a close() on another thread waits for the copy
             if (!use.ok()) vipc::common::fail(vipc::common::ErrorKind::kClosed, "broadcast queue reader is closed");
             vipc::broadcast::ChunkView v;
             if (!r.peek(v)) return py::none();
             if (v.flags & vipc::broadcast::kFlagOverflow) return py::make_tuple(v.flags, py::list());
             py::list parts;
             for (size_t i = 0; i < v.parts.size(); i++) parts.append(copy_out(v.parts[i], i == 0));
             if (!consume_unless_closed(r)) {  // closed by another thread meanwhile: not consumed, not delivered
               vipc::common::fail(vipc::common::ErrorKind::kClosed, "broadcast queue reader is closed");
             }
             return py::make_tuple(v.flags, parts);
           })
      .def("consume", &vipc::broadcast::Reader::consume,
           "BR3 for the message peeked; True if every reader has now consumed it.")
      .def("shutdown", &vipc::broadcast::Reader::shutdown)
      .def_property_readonly("rank", &vipc::broadcast::Reader::rank)
      .def_property_readonly("consumed", &vipc::broadcast::Reader::consumed)
      .def_property_readonly("closed", &vipc::broadcast::Reader::closed)
      .def("close",
           [](vipc::broadcast::Reader& r) {
             py::gil_scoped_release nogil;  // a take() on another thread may need the GIL to finish
             r.close();
           })
      .def("_forget_after_fork", &vipc::broadcast::Reader::forget_after_fork);
}

}  // namespace vipc::python
