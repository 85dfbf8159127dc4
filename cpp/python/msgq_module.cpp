// msgq._msgq: thin bindings of the C++ ring. Type conversion, GIL release
// around waits and large copies, signal checks, exception mapping; no logic.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/names.h"
#include "common/shm_file.h"
#include "msgq/layout.h"
#include "msgq/publisher.h"
#include "msgq/segment.h"
#include "msgq/stats.h"
#include "msgq/subscriber.h"
#include "python/bindings.h"
#include "python/fastcall.h"
#include "python/shm_file_bindings.h"

namespace py = pybind11;
using vipc::common::WaitStatus;
using vipc::msgq::Publisher;
using vipc::msgq::SegmentSpec;
using vipc::msgq::Subscriber;

namespace {

constexpr size_t kBatchBytes = 256 * 1024;  // receive_batch stops after this much
constexpr int64_t kMaxSpinUs = 1'000'000;   // msgq._shared.MAX_SPIN_US

SegmentSpec make_spec(const std::string& dir, const std::string& basename, size_t segment_size, unsigned mode,
                      std::vector<uid_t> trusted_uids) {
  SegmentSpec spec;
  spec.dir = dir;
  spec.basename = basename;
  spec.data_size = segment_size;
  spec.mode = static_cast<mode_t>(mode);
  spec.trusted_uids = std::move(trusted_uids);
  return spec;
}

// A message read straight into a new bytes object: one copy out of the ring.
struct BytesSink {
  PyObject* obj = nullptr;
  ~BytesSink() { Py_XDECREF(obj); }
  char* prepare(size_t n) {
    Py_XDECREF(obj);
    obj = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
    if (obj == nullptr) throw py::error_already_set();
    return PyBytes_AS_STRING(obj);
  }
  void discard() { Py_CLEAR(obj); }
  py::object take() {
    PyObject* o = obj;
    obj = nullptr;
    return py::reinterpret_steal<py::object>(o);
  }
};

// Writable view of a loaned ring area.
using LoanBuffer = vipc::python::MappedBytes<vipc::msgq::Segment>;

struct PySubscriber {
  std::shared_ptr<Subscriber> sub;
  int timeout_ms = -1;  // the reference's setTimeout(): -1 blocks until a message

  // Wait with the GIL released, in slices broken only by signals.
  bool wait_until(int64_t deadline) {
    const vipc::common::WaitStatus st = vipc::python::blocking([&] { return sub->wait(deadline); });
    if (st == vipc::common::WaitStatus::kClosed)
      vipc::common::fail(vipc::common::ErrorKind::kClosed, "subscriber was closed while waiting");
    return st == vipc::common::WaitStatus::kReady;
  }

  py::object receive_until(int64_t deadline) {
    BytesSink sink;
    for (;;) {
      if (sub->try_read(sink)) return sink.take();
      if (deadline != vipc::common::kNever && vipc::common::monotonic_ns() >= deadline) return py::none();
      if (!wait_until(deadline) && !sub->ready()) return py::none();
    }
  }

  py::object receive(bool non_blocking) {
    BytesSink sink;
    if (sub->try_read(sink)) return sink.take();
    if (non_blocking || timeout_ms == 0) return py::none();
    return receive_until(vipc::python::deadline_from_ms(timeout_ms));
  }

  // Up to max_messages, but stops once kBatchBytes have been received: holding
  // many large bytes objects at once and freeing them together makes malloc
  // return the memory to the OS, and the next batch faults every page back in.
  py::list receive_batch(size_t max_messages, int timeout) {
    py::list out;
    BytesSink sink;
    size_t bytes = 0;
    auto more = [&] {
      while (out.size() < max_messages && bytes < kBatchBytes && sub->try_read(sink)) {
        py::object msg = sink.take();
        bytes += static_cast<size_t>(PyBytes_GET_SIZE(msg.ptr()));
        out.append(std::move(msg));
      }
    };
    more();
    if (out.size() == 0 && timeout != 0) {
      py::object first = receive_until(vipc::python::deadline_from_ms(timeout));
      if (first.is_none()) return out;
      bytes += static_cast<size_t>(PyBytes_GET_SIZE(first.ptr()));
      out.append(first);
      more();
    }
    return out;
  }
};

// Publisher.send(data) and Subscriber.receive(non_blocking=False): the
// per-message calls, plain CPython methods (python/fastcall.h says why).
PyObject* publisher_send(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return vipc::python::guarded([&]() -> PyObject* {
    vipc::python::check_nargs("send", nargs, 1, 1);
    Publisher& p = vipc::python::self_of<Publisher>(self);
    vipc::python::Payload payload(args[0]);
    vipc::python::copy_maybe_without_gil(payload.size(), [&] { p.send(payload.data(), payload.size()); });
    Py_RETURN_NONE;
  });
}
PyMethodDef publisher_send_def = {"send", vipc::python::fastcall<publisher_send>(), METH_FASTCALL,
                                  "send(data): publish bytes or a C-contiguous buffer"};

PyObject* subscriber_receive(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return vipc::python::guarded([&]() -> PyObject* {
    PyObject* non_blocking = vipc::python::one_optional_arg("receive", "non_blocking", args, nargs, kwnames);
    int nb = 0;
    if (non_blocking != nullptr && (nb = PyObject_IsTrue(non_blocking)) < 0) throw py::error_already_set();
    return vipc::python::self_of<PySubscriber>(self).receive(nb != 0).release().ptr();
  });
}
PyMethodDef subscriber_receive_def = {"receive", vipc::python::fastcall_keywords<subscriber_receive>(),
                                      METH_FASTCALL | METH_KEYWORDS,
                                      "receive(non_blocking=False) -> bytes, or None (timeout / nothing waiting)"};

}  // namespace

PYBIND11_MODULE(_msgq, m) {
  m.doc() = "Native MSGQ ring (private: use the msgq package)";
  vipc::python::register_error_translator();

  m.attr("MAX_READERS") = vipc::msgq::kMaxReaders;
  m.attr("DEFAULT_SEGMENT_SIZE") = vipc::msgq::kDefaultDataSize;
  m.attr("MIN_SEGMENT_SIZE") = vipc::msgq::kMinDataSize;
  m.attr("MAX_SEGMENT_SIZE") = vipc::msgq::kMaxDataSize;
  m.attr("HEADER_SIZE") = vipc::msgq::kHeaderSize;
  m.attr("LAYOUT_VERSION") = vipc::msgq::kLayoutVersion;
  m.def("max_message_size", [](size_t segment_size) { return vipc::msgq::max_message_size(segment_size); });
  // The one name rule (common/names.h); msgq.names calls it with the name's UTF-8 bytes.
  m.def(
      "check_name",
      [](const std::string& kind, py::bytes name, size_t max_length) {
        vipc::common::check_name(kind, std::string(name), max_length);
      },
      py::arg("kind"), py::arg("name"), py::arg("max_length"));
  m.attr("MAX_TOPIC_NAME_LENGTH") = vipc::common::kMaxTopicNameLength;
  m.attr("MAX_PREFIX_LENGTH") = vipc::common::kMaxPrefixLength;
  m.attr("NAME_CHARACTERS") = std::string(vipc::common::kNameCharacters);
  m.attr("SEGMENT_PREFIX") = std::string(vipc::common::kSegmentPrefix);
  m.attr("SEGMENT_DIR") = std::string(vipc::common::kSegmentDir);
  m.attr("MAX_FILE_NAME_LENGTH") = vipc::common::kBasenameCapacity - 1;
  m.def(
      "run_segment_prefix", [](const std::string& prefix) { return vipc::common::run_segment_prefix(prefix); },
      py::arg("prefix"));
  m.def("segment_basename", &vipc::msgq::segment_basename, py::arg("prefix"), py::arg("topic"));
  vipc::python::bind_shm_files(m);

  vipc::python::bind_mapped_bytes<vipc::msgq::Segment>(m, "LoanBuffer");

  py::class_<Publisher, std::shared_ptr<Publisher>>(m, "Publisher")
      .def(py::init([](const std::string& dir, const std::string& basename, size_t segment_size, unsigned mode,
                       std::vector<uid_t> trusted_uids) {
             return std::make_shared<Publisher>(make_spec(dir, basename, segment_size, mode, std::move(trusted_uids)));
           }),
           py::arg("dir"), py::arg("basename"), py::arg("segment_size") = 0, py::arg("mode") = 0600,
           py::arg("trusted_uids") = std::vector<uid_t>{})
      .def("loan",
           [](Publisher& p, size_t n) {
             uint8_t* ptr = p.loan(n);
             return LoanBuffer{p.segment(), ptr, n, false};
           })
      .def("commit", &Publisher::commit, py::arg("size"))
      .def("cancel_loan", &Publisher::cancel_loan)
      .def_property_readonly("has_loan", &Publisher::has_loan)
      .def("num_readers", &Publisher::num_readers)
      .def("all_readers_updated", &Publisher::all_readers_updated)
      .def("reclaim_dead_readers", &Publisher::reclaim_dead_readers)
      .def_property_readonly("max_message_size", &Publisher::max_message_size)
      .def_property_readonly("segment_size", &Publisher::segment_size)
      .def_property_readonly("messages_sent", &Publisher::messages_sent)
      .def_property(
          "handoff_wakes", [](const Publisher& p) { return p.wake_mode() == vipc::msgq::WakeMode::kHandoff; },
          [](Publisher& p, bool on) {
            p.set_wake_mode(on ? vipc::msgq::WakeMode::kHandoff : vipc::msgq::WakeMode::kAll);
          })
      .def_property_readonly("readers_woken", &Publisher::readers_woken)
      .def_property_readonly("path",
                             [](const Publisher& p) { return p.closed() ? std::string() : p.segment()->path(); })
      .def_property_readonly("closed", &Publisher::closed)
      .def("close", &Publisher::close)
      .def("_forget_after_fork", &Publisher::forget_after_fork);

  py::class_<PySubscriber>(m, "Subscriber")
      .def(py::init([](const std::string& dir, const std::string& basename, size_t segment_size, bool conflate,
                       unsigned mode, std::vector<uid_t> trusted_uids) {
             return PySubscriber{std::make_shared<Subscriber>(
                 make_spec(dir, basename, segment_size, mode, std::move(trusted_uids)), conflate)};
           }),
           py::arg("dir"), py::arg("basename"), py::arg("segment_size") = 0, py::arg("conflate") = false,
           py::arg("mode") = 0600, py::arg("trusted_uids") = std::vector<uid_t>{})
      .def("receive_batch", &PySubscriber::receive_batch, py::arg("max_messages") = 1024, py::arg("timeout_ms") = 0)
      .def("set_timeout",
           [](PySubscriber& s, int64_t ms) {
             vipc::common::check_range<int64_t>("timeout", ms, INT64_MIN, INT32_MAX, " ms (negative: forever)");
             s.timeout_ms = ms < 0 ? -1 : static_cast<int>(ms);
           })
      .def_property_readonly("timeout_ms", [](const PySubscriber& s) { return s.timeout_ms; })
      .def("ready", [](const PySubscriber& s) { return s.sub->ready(); })
      .def("fileno", [](PySubscriber& s) { return s.sub->fileno(); })
      .def("arm", [](PySubscriber& s) { return s.sub->arm(); })
      .def("disarm", [](PySubscriber& s) { s.sub->disarm(); })
      .def_property(
          "spin_us", [](const PySubscriber& s) { return s.sub->spin_limit_ns() / 1000; },
          [](PySubscriber& s, int64_t us) {
            vipc::common::check_range<int64_t>("spin_us", us, 0, kMaxSpinUs, " us");
            s.sub->set_spin_limit_ns(us * 1000);
          })
      .def_property_readonly("resets", [](const PySubscriber& s) { return s.sub->resets(); })
      .def_property_readonly("slot", [](const PySubscriber& s) { return s.sub->slot(); })
      .def_property_readonly("conflate", [](const PySubscriber& s) { return s.sub->conflate(); })
      .def_property_readonly("segment_size", [](const PySubscriber& s) { return s.sub->segment_size(); })
      .def_property_readonly("closed", [](const PySubscriber& s) { return s.sub->closed(); })
      .def("close", [](PySubscriber& s) { s.sub->close(); })
      .def("_forget_after_fork", [](PySubscriber& s) { s.sub->forget_after_fork(); });

  py::class_<vipc::msgq::Poller>(m, "Poller")
      .def(py::init<>())
      .def("add", [](vipc::msgq::Poller& p, PySubscriber& s) { p.add(s.sub); })
      .def(
          "poll",
          [](vipc::msgq::Poller& p, int timeout_ms) {
            std::vector<size_t> ready;
            const int64_t deadline = vipc::python::deadline_from_ms(timeout_ms);
            vipc::python::blocking([&] {
              const int64_t left =
                  deadline == vipc::common::kNever ? -1 : std::max<int64_t>(0, deadline - vipc::common::monotonic_ns());
              return p.poll(left, ready);
            });
            return ready;
          },
          py::arg("timeout_ms"))
      .def("fileno", &vipc::msgq::Poller::fileno)
      .def("__len__", &vipc::msgq::Poller::size);

  m.def("remove_stale_segments", &vipc::msgq::remove_stale_segments, py::arg("dir"), py::arg("name_prefix"));
  m.def("stale_file", &vipc::common::stale_file, py::arg("dir"), py::arg("name"), py::arg("remove") = false,
        "Whether DIR/NAME is this user's segment file with no live process attached (remove=True: unlink it then).");
  m.def(
      "segment_stats",
      [](const std::string& dir, const std::string& basename) {
        vipc::msgq::SegmentStats s;
        {
          py::gil_scoped_release nogil;  // may wait briefly for an attacher
          s = vipc::msgq::read_segment_stats(dir, basename);
        }
        py::list readers;
        for (const vipc::msgq::ReaderStats& r : s.readers) {
          readers.append(py::dict(py::arg("slot") = r.slot, py::arg("pid") = r.pid, py::arg("conflate") = r.conflate,
                                  py::arg("valid") = r.valid, py::arg("alive") = r.alive,
                                  py::arg("messages") = r.messages, py::arg("bytes") = r.bytes,
                                  py::arg("resets") = r.resets, py::arg("read_pointer") = r.read_pointer));
        }
        return py::dict(py::arg("name") = s.name, py::arg("data_size") = s.data_size,
                        py::arg("write_pointer") = s.write_pointer, py::arg("messages_written") = s.messages_written,
                        py::arg("bytes_written") = s.bytes_written, py::arg("publisher_pid") = s.publisher_pid,
                        py::arg("publisher_alive") = s.publisher_alive, py::arg("superseded") = s.superseded,
                        py::arg("attached") = s.attached, py::arg("created_ns") = s.created_ns,
                        py::arg("readers") = readers);
      },
      py::arg("dir"), py::arg("basename"));

  vipc::python::add_fast_method(m.attr("Publisher"), &publisher_send_def);
  vipc::python::add_fast_method(m.attr("Subscriber"), &subscriber_receive_def);
}
