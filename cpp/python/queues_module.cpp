// msgq._queues: thin bindings of the lossless broadcast queue
// (cpp/broadcast) and the ordered topic (cpp/ordered). Type conversion, GIL
// release around waits and large copies, signal checks, exception mapping;
// no logic (the Python side is msgq/broadcast.py and msgq/ordered.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "broadcast/queue.h"
#include "common/clock.h"
#include "ordered/topic.h"
#include "python/errors.h"

namespace py = pybind11;

namespace {

constexpr size_t kReleaseGilAbove = 64 * 1024;

int64_t deadline_from(std::optional<double> timeout_s) {
  if (!timeout_s) return ipc::kNever;
  const double s = *timeout_s < 0 ? 0 : *timeout_s;
  if (!(s < 1e9)) return ipc::kNever;  // 31 years, infinity or NaN: no limit (and no overflow)
  return ipc::monotonic_ns() + static_cast<int64_t>(s * 1e9);
}

// A Python timeout in seconds (None: no limit), checked as
// msgq.broadcast._deadline checks it: an int or float (not a bool, not NaN);
// a negative one means "do not wait" (deadline_from).
std::optional<double> timeout_from_py(const py::handle& t) {
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
    ipc::fail(ipc::ErrorKind::kInvalidArgument,
              "timeout must be a number of seconds or None, not " + py::repr(t).cast<std::string>());
  }
  return s;
}

py::object seconds_or_none(int64_t deadline_ns) {
  if (deadline_ns == ipc::kNever) return py::none();
  return py::float_(static_cast<double>(deadline_ns) / 1e9);
}

template <class S>
const char* status_name(S st) {
  switch (st) {
    case S::kReady: return "ready";
    case S::kTimeout: return "timeout";
    case S::kShutdown: return "shutdown";
    case S::kClosed: return "closed";
    case S::kInterrupted: return "interrupted";
  }
  return "?";
}

// Runs a blocking wait without the GIL; signals run Python's handlers
// (Ctrl-C raises) and the wait goes on.
template <class F>
auto blocking(F&& wait) {
  for (;;) {
    decltype(wait()) st;
    {
      py::gil_scoped_release nogil;
      st = wait();
    }
    if (st != decltype(st)::kInterrupted) return st;
    pyipc::check_signals();
  }
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
        throw py::type_error(std::string("message parts must be bytes-like, C-contiguous buffers, not ") +
                             Py_TYPE(o.ptr())->tp_name);
      }
      parts_.push_back(bcast::Part{views_[i].buf, static_cast<uint64_t>(views_[i].len)});
    }
  }
  ~Parts() { release(views_.size()); }
  const std::vector<bcast::Part>& parts() const { return parts_; }

 private:
  void release(size_t n) {
    for (size_t i = 0; i < n; i++) PyBuffer_Release(&views_[i]);
    views_.clear();
  }
  std::vector<Py_buffer> views_;
  std::vector<bcast::Part> parts_;
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
py::object status_sentinel(bcast::Status st) {
  switch (st) {
    case bcast::Status::kTimeout: return sentinels().timeout;
    case bcast::Status::kShutdown: return sentinels().shutdown;
    default: return sentinels().closed;
  }
}

// The message v (peeked from r), decoded, then handed back (BR3): raw bytes
// as bytes; a pickle stream unpickled in place from the chunk, its
// out-of-band buffers copied into bytearrays first (the chunk is reused once
// consumed); an overflow marker as OVERFLOW (the payload is on the side channel).
// One part copied out of a chunk: bytes (as_bytes) or a writable bytearray
// (out-of-band buffers); large copies run without the GIL.
py::object copy_out(const bcast::Part& part, bool as_bytes) {
  const auto n = static_cast<Py_ssize_t>(part.size);
  PyObject* o = as_bytes ? PyBytes_FromStringAndSize(nullptr, n) : PyByteArray_FromStringAndSize(nullptr, n);
  if (o == nullptr) throw py::error_already_set();
  char* dst = as_bytes ? PyBytes_AS_STRING(o) : PyByteArray_AS_STRING(o);
  if (part.size >= kReleaseGilAbove) {
    py::gil_scoped_release nogil;
    std::memcpy(dst, part.data, part.size);
  } else if (n != 0) {
    std::memcpy(dst, part.data, part.size);
  }
  return py::reinterpret_steal<py::object>(o);
}

// Write a message whose chunk wait_writable() freed; large copies run without the GIL.
void write_parts(bcast::Writer& w, uint32_t flags, const bcast::Part* parts, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += parts[i].size;
  if (total >= kReleaseGilAbove) {
    py::gil_scoped_release nogil;
    w.write(flags, parts, n);
  } else {
    w.write(flags, parts, n);
  }
}

py::object take_message(bcast::Reader& r, const bcast::ChunkView& v) {
  struct ConsumeOnExit {  // BR3 even if unpickling raises: the message is spent either way
    bcast::Reader& r;
    ~ConsumeOnExit() {
      try {
        r.consume();
      } catch (const ipc::Error&) {  // closed meanwhile by another thread: nothing to hand back
      }
    }
  } consume{r};
  if (v.flags & bcast::kFlagOverflow) return sentinels().overflow;
  if (v.parts.empty()) ipc::fail(ipc::ErrorKind::kSegment, r.file()->path() + ": corrupt chunk (no parts)");
  if (v.flags & bcast::kFlagRaw) return copy_out(v.parts[0], true);
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

// A view into a mapped slot; keeps the mapping alive while any memoryview
// or numpy array of it exists.
struct SlotBuffer {
  std::shared_ptr<ordered::Topic> topic;
  uint8_t* ptr;
  size_t size;
  bool readonly;
};

ordered::TopicSpec topic_spec(const std::string& dir, const std::string& basename, uint32_t capacity,
                              uint64_t slot_bytes, unsigned mode) {
  ordered::TopicSpec s;
  s.dir = dir;
  s.basename = basename;
  s.capacity = capacity;
  s.slot_bytes = slot_bytes;
  s.mode = static_cast<mode_t>(mode);
  return s;
}

py::tuple availability_tuple(const ordered::Topic& t) {
  const ordered::Availability a = t.snapshot();
  return py::make_tuple(a.begin(t.capacity()), a.end(), a.available_end(), a.bitmap);
}

}  // namespace

PYBIND11_MODULE(_queues, m) {
  m.doc() = "Native broadcast queue and ordered topic (private: use msgq.broadcast / msgq.ordered)";
  pyipc::register_error_translator();
  m.attr("FLAG_RAW") = bcast::kFlagRaw;
  m.attr("FLAG_OVERFLOW") = bcast::kFlagOverflow;
  m.attr("MAX_READERS") = bcast::kMaxReaders;
  m.attr("WINDOW") = ordered::kWindow;
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

  // ---------------------------------------------------------------- broadcast
  py::class_<bcast::Writer, std::shared_ptr<bcast::Writer>>(m, "BroadcastWriter")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t n_readers, uint32_t n_chunks,
                       uint64_t chunk_bytes, unsigned mode) {
             bcast::QueueSpec s;
             s.dir = dir;
             s.basename = basename;
             s.mode = static_cast<mode_t>(mode);
             s.n_readers = n_readers;
             s.n_chunks = n_chunks;
             s.chunk_bytes = chunk_bytes;
             return std::make_shared<bcast::Writer>(s);
           }),
           py::arg("dir"), py::arg("basename"), py::arg("n_readers"), py::arg("n_chunks"), py::arg("chunk_bytes"),
           py::arg("mode") = 0600)
      .def("fits",
           [](const bcast::Writer& w, const py::sequence& parts) {
             Parts p(parts);
             return w.fits(p.parts().data(), p.parts().size());
           })
      .def(
          "write",
          [](bcast::Writer& w, uint32_t flags, const py::sequence& parts, std::optional<double> timeout_s) {
            Parts p(parts);
            if (!w.fits(p.parts().data(), p.parts().size())) return "too_large";
            const int64_t deadline = deadline_from(timeout_s);
            const bcast::Status st = blocking([&] { return w.wait_writable(deadline); });
            if (st != bcast::Status::kReady) return status_name(st);
            write_parts(w, flags, p.parts().data(), p.parts().size());
            return "ready";
          },
          py::arg("flags"), py::arg("parts"), py::arg("timeout_s"),
          "Wait for a free chunk (up to timeout_s; None: no limit), then write; returns the wait's status, or too_large.")
      .def(
          "put",
          [](bcast::Writer& w, const py::handle& obj, bool raw, const py::handle& timeout, double cap_s) -> py::object {
            const int64_t deadline = deadline_from(timeout_from_py(timeout));  // checked before pickling
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
            bcast::Part one{};
            const bcast::Part* data = &one;
            size_t n = 1;
            if (!raw && PyList_GET_SIZE(parts.ptr()) == 1 && PyBytes_CheckExact(PyList_GET_ITEM(parts.ptr(), 0))) {
              PyObject* stream = PyList_GET_ITEM(parts.ptr(), 0);
              one = bcast::Part{PyBytes_AS_STRING(stream), static_cast<uint64_t>(PyBytes_GET_SIZE(stream))};
            } else {
              views.emplace(parts);
              data = views->parts().data();
              n = views->parts().size();
            }
            if (!w.fits(data, n)) return slow_path("too_large", ipc::monotonic_ns());
            if (!w.writable_now()) {
              // Up to cap_s (the caller's warning interval), then the caller's
              // slow path warns and waits on until the deadline.
              const int64_t started = ipc::monotonic_ns();
              const int64_t until = std::min(deadline, deadline_from(cap_s));
              const bcast::Status st = blocking([&] { return w.wait_writable(until); });
              if (st != bcast::Status::kReady) return slow_path(status_name(st), started);
            }
            write_parts(w, raw ? bcast::kFlagRaw : 0, data, n);
            return py::none();
          },
          py::arg("obj"), py::arg("raw"), py::arg("timeout"), py::arg("cap_s"),
          "The hot path in one call: pickle obj (protocol 5, contiguous buffers out of band; raw: obj is the\n"
          "bytes-like message), wait for a free chunk (up to timeout s, None: no limit, and at most cap_s),\n"
          "write it. None once written; else (status, parts, deadline, started) for the caller's slow path:\n"
          "status too_large, timeout, shutdown or closed; deadline and started in time.monotonic() seconds\n"
          "(deadline None: no limit). A bad timeout raises InvalidArgumentError before anything is pickled.")
      .def("pending_readers",
           [](const bcast::Writer& w) {
             std::vector<uint32_t> ranks;
             const uint64_t mask = w.pending_readers();
             for (uint32_t r = 0; r < 64; r++) {
               if (mask >> r & 1) ranks.push_back(r);
             }
             return ranks;
           })
      .def("reader_attached", [](const bcast::Writer& w, uint32_t r) {
        if (w.closed() || r >= w.file()->n_readers()) return false;
        return w.file()->reader_attached(r);
      })
      .def("reader_pid", [](const bcast::Writer& w, uint32_t r) {
        if (w.closed() || r >= w.file()->n_readers()) return uint32_t{0};
        return w.file()->header().readers[r].pid.load(std::memory_order_relaxed);
      })
      .def("reader_consumed", [](const bcast::Writer& w, uint32_t r) {
        if (w.closed() || r >= w.file()->n_readers()) return uint64_t{0};
        return w.file()->header().readers[r].consumed.load(std::memory_order_relaxed);
      })
      .def("shutdown", &bcast::Writer::shutdown)
      .def_property_readonly("written", &bcast::Writer::written)
      .def_property_readonly("chunk_bytes", [](const bcast::Writer& w) { return w.closed() ? 0 : w.file()->chunk_bytes(); })
      .def_property_readonly("n_chunks", [](const bcast::Writer& w) { return w.closed() ? 0 : w.file()->n_chunks(); })
      .def_property_readonly("n_readers", [](const bcast::Writer& w) { return w.closed() ? 0 : w.file()->n_readers(); })
      .def_property_readonly("path", [](const bcast::Writer& w) { return w.closed() ? std::string() : w.file()->path(); })
      .def_property_readonly("closed", &bcast::Writer::closed)
      .def("close", &bcast::Writer::close)
      .def("_forget_after_fork", &bcast::Writer::forget_after_fork);

  py::class_<bcast::Reader, std::shared_ptr<bcast::Reader>>(m, "BroadcastReader")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t rank, unsigned mode) {
             bcast::QueueSpec s;
             s.dir = dir;
             s.basename = basename;
             s.mode = static_cast<mode_t>(mode);
             return std::make_shared<bcast::Reader>(s, rank);
           }),
           py::arg("dir"), py::arg("basename"), py::arg("rank"), py::arg("mode") = 0600)
      .def(
          "wait",
          [](bcast::Reader& r, std::optional<double> timeout_s) {
            const int64_t deadline = deadline_from(timeout_s);
            return status_name(blocking([&] { return r.wait_readable(deadline); }));
          },
          py::arg("timeout_s"))
      .def("peek_flags",
           [](bcast::Reader& r) -> std::optional<uint32_t> {
             bcast::ChunkView v;
             if (!r.peek(v)) return std::nullopt;
             return v.flags;
           })
      .def(
          "take",
          [](bcast::Reader& r, const py::handle& timeout) -> py::object {
            thread_local bcast::ChunkView v;  // keeps its capacity: no allocation per message
            const std::optional<double> timeout_s = timeout_from_py(timeout);  // checked even when a message waits
            if (r.peek(v)) return take_message(r, v);
            const int64_t deadline = deadline_from(timeout_s);
            for (;;) {
              const bcast::Status st = blocking([&] { return r.wait_readable(deadline); });
              if (st != bcast::Status::kReady) return status_sentinel(st);
              if (r.peek(v)) return take_message(r, v);
            }
          },
          py::arg("timeout"),
          "The hot path in one call: wait up to timeout s (None: no limit; a bad one raises\n"
          "InvalidArgumentError) for the next message, decode it (unpickled in place, or bytes if raw),\n"
          "consume it. OVERFLOW for a message on the side channel; TIMEOUT, SHUTDOWN or CLOSED when there is none.")
      .def("read",
           [](bcast::Reader& r) -> py::object {
             // The next message, copied out: (flags, [first part as bytes,
             // further parts as writable bytearrays]); then BR3. None if there is none.
             bcast::ChunkView v;
             if (!r.peek(v)) return py::none();
             py::list parts;
             for (size_t i = 0; i < v.parts.size(); i++) parts.append(copy_out(v.parts[i], i == 0));
             r.consume();
             return py::make_tuple(v.flags, parts);
           })
      .def("consume", &bcast::Reader::consume)
      .def("shutdown", &bcast::Reader::shutdown)
      .def_property_readonly("rank", &bcast::Reader::rank)
      .def_property_readonly("consumed", &bcast::Reader::consumed)
      .def_property_readonly("closed", &bcast::Reader::closed)
      .def("close", &bcast::Reader::close)
      .def("_forget_after_fork", &bcast::Reader::forget_after_fork);

  // ---------------------------------------------------------------- ordered
  py::class_<SlotBuffer>(m, "SlotBuffer", py::buffer_protocol())
      .def_buffer([](SlotBuffer& b) {
        return py::buffer_info(b.ptr, 1, py::format_descriptor<uint8_t>::format(), 1, {b.size}, {1}, b.readonly);
      })
      .def("__len__", [](const SlotBuffer& b) { return b.size; });

  py::class_<ordered::Producer, std::shared_ptr<ordered::Producer>>(m, "OrderedProducer")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t capacity, uint64_t slot_bytes,
                       unsigned mode) {
             return std::make_shared<ordered::Producer>(topic_spec(dir, basename, capacity, slot_bytes, mode));
           }),
           py::arg("dir"), py::arg("basename"), py::arg("capacity") = 0, py::arg("slot_bytes") = 0,
           py::arg("mode") = 0600)
      .def(
          "reserve",
          [](ordered::Producer& p, std::optional<uint64_t> id, std::optional<double> timeout_s) -> py::object {
            const int64_t deadline = deadline_from(timeout_s);
            uint64_t got = id.value_or(0);
            const ordered::Status st =
                blocking([&] { return id ? p.reserve_id(*id, deadline) : p.reserve_next(deadline, &got); });
            if (st != ordered::Status::kReady) return py::str(status_name(st));
            return py::int_(got);
          },
          py::arg("id"), py::arg("timeout_s"), "The reserved id (int), or the wait's status (str).")
      .def("slot",
           [](ordered::Producer& p, uint64_t id) {
             uint8_t* ptr = p.slot(id);
             return SlotBuffer{p.topic(), ptr, p.topic()->slot_bytes(), false};
           })
      .def("publish", &ordered::Producer::publish, py::arg("id"), py::arg("size"), py::arg("t0") = 0,
           py::arg("t1") = 0)
      .def("cancel", &ordered::Producer::cancel)
      .def(
          "send",
          [](ordered::Producer& p, py::buffer data, std::optional<double> timeout_s, uint64_t t0,
             uint64_t t1) -> py::object {
            py::buffer_info info = data.request();
            if (!PyBuffer_IsContiguous(info.view(), 'C')) throw py::type_error("send() needs a C-contiguous buffer");
            const auto size = static_cast<uint64_t>(info.size * info.itemsize);
            if (size > p.topic()->slot_bytes()) {
              ipc::fail(ipc::ErrorKind::kMessageTooLarge, "message of " + std::to_string(size) +
                                                              " bytes does not fit in a " +
                                                              std::to_string(p.topic()->slot_bytes()) + "-byte slot");
            }
            const int64_t deadline = deadline_from(timeout_s);
            uint64_t id = 0;
            const ordered::Status st = blocking([&] { return p.reserve_next(deadline, &id); });
            if (st != ordered::Status::kReady) return py::str(status_name(st));
            if (size != 0) std::memcpy(p.slot(id), info.ptr, size);
            p.publish(id, size, t0, t1);
            return py::int_(id);
          },
          py::arg("data"), py::arg("timeout_s"), py::arg("t0") = 0, py::arg("t1") = 0)
      .def("availability", [](const ordered::Producer& p) { return availability_tuple(*p.topic()); })
      .def("is_available", [](const ordered::Producer& p, uint64_t id) { return p.topic()->snapshot().is_available(id); })
      .def_property_readonly("oldest_in_flight", &ordered::Producer::oldest_in_flight)
      .def_property_readonly("capacity", [](const ordered::Producer& p) { return p.topic()->capacity(); })
      .def_property_readonly("slot_bytes", [](const ordered::Producer& p) { return p.topic()->slot_bytes(); })
      .def_property_readonly("path", [](const ordered::Producer& p) { return p.closed() ? std::string() : p.topic()->path(); })
      .def("shutdown", &ordered::Producer::shutdown)
      .def_property_readonly("closed", &ordered::Producer::closed)
      .def("close", &ordered::Producer::close)
      .def("_forget_after_fork", &ordered::Producer::forget_after_fork);

  py::class_<ordered::Reader, std::shared_ptr<ordered::Reader>>(m, "OrderedReader")
      .def(py::init([](const std::string& dir, const std::string& basename, const std::string& mode_name,
                       unsigned mode) {
             ordered::Mode md;
             if (mode_name == "sequential") {
               md = ordered::Mode::kSequential;
             } else if (mode_name == "newest") {
               md = ordered::Mode::kNewest;
             } else {
               ipc::fail(ipc::ErrorKind::kInvalidArgument,
                         "mode must be 'sequential' or 'newest', not '" + mode_name + "'");
             }
             return std::make_shared<ordered::Reader>(topic_spec(dir, basename, 0, 0, mode), md);
           }),
           py::arg("dir"), py::arg("basename"), py::arg("mode_name"), py::arg("mode") = 0600)
      .def(
          "recv",
          [](ordered::Reader& r, std::optional<double> timeout_s, bool zero_copy) -> py::object {
            // (id, data, t0, t1[, stamp]) of the next message; data is bytes
            // (copied and checked), or with zero_copy a read-only view into the
            // slot plus its stamp for is_valid(). A str: the wait's status.
            const int64_t deadline = deadline_from(timeout_s);
            for (;;) {
              ordered::Message msg;
              while (r.next(&msg)) {
                if (zero_copy) {
                  SlotBuffer view{r.topic(), const_cast<uint8_t*>(msg.data), msg.size, true};
                  return py::make_tuple(msg.id, view, msg.t0, msg.t1, msg.stamp);
                }
                PyObject* o = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(msg.size));
                if (o == nullptr) throw py::error_already_set();
                py::object data = py::reinterpret_steal<py::object>(o);
                if (msg.size >= kReleaseGilAbove) {
                  py::gil_scoped_release nogil;
                  std::memcpy(PyBytes_AS_STRING(o), msg.data, msg.size);
                } else if (msg.size != 0) {
                  std::memcpy(PyBytes_AS_STRING(o), msg.data, msg.size);
                }
                if (r.still_valid(msg)) return py::make_tuple(msg.id, data, msg.t0, msg.t1);
              }
              const ordered::Status st = blocking([&] { return r.wait(deadline); });
              if (st != ordered::Status::kReady) return py::str(status_name(st));
            }
          },
          py::arg("timeout_s"), py::arg("zero_copy") = false)
      .def("is_valid",
           [](const ordered::Reader& r, uint64_t id, uint64_t stamp) {
             if (r.closed()) return false;
             std::atomic_thread_fence(std::memory_order_acquire);
             return r.topic()->meta(id).stamp.load(std::memory_order_relaxed) == stamp;
           })
      .def("availability", [](const ordered::Reader& r) { return availability_tuple(*r.topic()); })
      .def_property_readonly("cursor", &ordered::Reader::cursor)
      .def_property_readonly("dropped", &ordered::Reader::dropped)
      .def_property_readonly("gaps", &ordered::Reader::gaps)
      .def_property_readonly("capacity", [](const ordered::Reader& r) { return r.topic()->capacity(); })
      .def_property_readonly("slot_bytes", [](const ordered::Reader& r) { return r.topic()->slot_bytes(); })
      .def("shutdown", [](ordered::Reader& r) { if (!r.closed()) r.topic()->shutdown(); })
      .def_property_readonly("closed", &ordered::Reader::closed)
      .def("close", &ordered::Reader::close)
      .def("_forget_after_fork", &ordered::Reader::forget_after_fork);
}
