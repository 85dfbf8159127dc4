// msgq._queues, part 2: the ordered topic (cpp/ordered; the Python side is
// msgq/ordered.py). Type conversion, GIL release around waits and large
// copies, signal checks; no logic.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "ordered/topic.h"
#include "python/bindings.h"
#include "python/queues_bindings.h"

namespace py = pybind11;

namespace {

// A view into a mapped slot.
using SlotBuffer = vipc::python::MappedBytes<vipc::ordered::Topic>;

vipc::ordered::TopicSpec topic_spec(const std::string& dir, const std::string& basename, uint32_t capacity,
                                    uint64_t slot_bytes, unsigned mode) {
  vipc::ordered::TopicSpec s;
  s.dir = dir;
  s.basename = basename;
  s.capacity = capacity;
  s.slot_bytes = slot_bytes;
  s.mode = static_cast<mode_t>(mode);
  return s;
}

py::tuple availability_tuple(const vipc::ordered::Topic& t) {
  const vipc::ordered::Availability a = t.snapshot();
  return py::make_tuple(a.begin(t.capacity()), a.end(), a.available_end(), a.bitmap);
}

}  // namespace

namespace vipc::python {

void bind_ordered(py::module_& m) {
  m.attr("WINDOW") = vipc::ordered::kWindow;
  vipc::python::bind_mapped_bytes<vipc::ordered::Topic>(m, "SlotBuffer");

  py::class_<vipc::ordered::Producer, std::shared_ptr<vipc::ordered::Producer>>(m, "OrderedProducer")
      .def(py::init([](const std::string& dir, const std::string& basename, uint32_t capacity, uint64_t slot_bytes,
                       unsigned mode) {
             return std::make_shared<vipc::ordered::Producer>(topic_spec(dir, basename, capacity, slot_bytes, mode));
           }),
           py::arg("dir"), py::arg("basename"), py::arg("capacity") = 0, py::arg("slot_bytes") = 0,
           py::arg("mode") = 0600)
      .def(
          "reserve",
          [](vipc::ordered::Producer& p, std::optional<uint64_t> id, std::optional<double> timeout_s) -> py::object {
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            uint64_t got = id.value_or(0);
            const vipc::common::WaitStatus st = vipc::python::blocking(
                [&] { return id ? p.reserve_id(*id, deadline) : p.reserve_next(deadline, &got); });
            if (st != vipc::common::WaitStatus::kReady) return py::str(vipc::common::wait_status_name(st));
            return py::int_(got);
          },
          py::arg("id"), py::arg("timeout_s"), "The reserved id (int), or the wait's status (str).")
      .def("slot",
           [](vipc::ordered::Producer& p, uint64_t id) {
             uint8_t* ptr = p.slot(id);
             return SlotBuffer{p.topic(), ptr, p.topic()->slot_bytes(), false};
           })
      .def("publish", &vipc::ordered::Producer::publish, py::arg("id"), py::arg("size"), py::arg("t0") = 0,
           py::arg("t1") = 0)
      .def("cancel", &vipc::ordered::Producer::cancel)
      .def(
          "send",
          [](vipc::ordered::Producer& p, py::buffer data, std::optional<double> timeout_s, uint64_t t0,
             uint64_t t1) -> py::object {
            py::buffer_info info = data.request();
            if (!PyBuffer_IsContiguous(info.view(), 'C'))
              vipc::python::type_error("send() needs a C-contiguous buffer");
            const auto size = static_cast<uint64_t>(info.size * info.itemsize);
            if (size > p.topic()->slot_bytes()) {
              vipc::common::fail(vipc::common::ErrorKind::kMessageTooLarge,
                                 "message of " + std::to_string(size) + " bytes does not fit in a " +
                                     std::to_string(p.topic()->slot_bytes()) + "-byte slot");
            }
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            uint64_t id = 0;
            const vipc::common::WaitStatus st = vipc::python::blocking([&] { return p.reserve_next(deadline, &id); });
            if (st != vipc::common::WaitStatus::kReady) return py::str(vipc::common::wait_status_name(st));
            if (size != 0) std::memcpy(p.slot(id), info.ptr, size);
            p.publish(id, size, t0, t1);
            return py::int_(id);
          },
          py::arg("data"), py::arg("timeout_s"), py::arg("t0") = 0, py::arg("t1") = 0)
      .def("availability", [](const vipc::ordered::Producer& p) { return availability_tuple(*p.topic()); })
      .def("is_available",
           [](const vipc::ordered::Producer& p, uint64_t id) { return p.topic()->snapshot().is_available(id); })
      .def_property_readonly("oldest_in_flight", &vipc::ordered::Producer::oldest_in_flight)
      .def_property_readonly("capacity", [](const vipc::ordered::Producer& p) { return p.topic()->capacity(); })
      .def_property_readonly("slot_bytes", [](const vipc::ordered::Producer& p) { return p.topic()->slot_bytes(); })
      .def_property_readonly(
          "path", [](const vipc::ordered::Producer& p) { return p.closed() ? std::string() : p.topic()->path(); })
      .def("shutdown", &vipc::ordered::Producer::shutdown)
      .def_property_readonly("closed", &vipc::ordered::Producer::closed)
      .def("close", &vipc::ordered::Producer::close)
      .def("_forget_after_fork", &vipc::ordered::Producer::forget_after_fork);

  py::class_<vipc::ordered::Reader, std::shared_ptr<vipc::ordered::Reader>>(m, "OrderedReader")
      .def(py::init(
               [](const std::string& dir, const std::string& basename, const std::string& mode_name, unsigned mode) {
                 vipc::ordered::Mode md;
                 if (mode_name == "sequential") {
                   md = vipc::ordered::Mode::kSequential;
                 } else if (mode_name == "newest") {
                   md = vipc::ordered::Mode::kNewest;
                 } else {
                   vipc::common::fail(vipc::common::ErrorKind::kInvalidArgument,
                                      "mode must be 'sequential' or 'newest', not '" + mode_name + "'");
                 }
                 return std::make_shared<vipc::ordered::Reader>(topic_spec(dir, basename, 0, 0, mode), md);
               }),
           py::arg("dir"), py::arg("basename"), py::arg("mode_name"), py::arg("mode") = 0600)
      .def(
          "recv",
          [](vipc::ordered::Reader& r, std::optional<double> timeout_s, bool zero_copy) -> py::object {
            // (id, data, t0, t1[, stamp]) of the next message; data is bytes
            // (copied and checked), or with zero_copy a read-only view into the
            // slot plus its stamp for is_valid(). A str: the wait's status.
            const int64_t deadline = vipc::python::deadline_from(timeout_s);
            for (;;) {
              vipc::ordered::Message msg;
              while (r.next(&msg)) {
                if (zero_copy) {
                  SlotBuffer view{r.topic(), const_cast<uint8_t*>(msg.data), msg.size, true};
                  return py::make_tuple(msg.id, view, msg.t0, msg.t1, msg.stamp);
                }
                PyObject* o = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(msg.size));
                if (o == nullptr) throw py::error_already_set();
                py::object data = py::reinterpret_steal<py::object>(o);
                if (msg.size != 0) {
                  // A close() on another thread may come during a copy without the GIL: the slot stays mapped
                  // (still_valid() then says false, and the next call raises ClosedError).
                  const std::shared_ptr<vipc::ordered::Topic> mapped = r.topic();
                  vipc::python::copy_maybe_without_gil(msg.size,
                                                       [&] { std::memcpy(PyBytes_AS_STRING(o), msg.data, msg.size); });
                }
                if (r.still_valid(msg)) return py::make_tuple(msg.id, data, msg.t0, msg.t1);
              }
              const vipc::common::WaitStatus st = vipc::python::blocking([&] { return r.wait(deadline); });
              if (st != vipc::common::WaitStatus::kReady) return py::str(vipc::common::wait_status_name(st));
            }
          },
          py::arg("timeout_s"), py::arg("zero_copy") = false)
      .def("is_valid",
           [](const vipc::ordered::Reader& r, uint64_t id, uint64_t stamp) {
             if (r.closed()) return false;
             std::atomic_thread_fence(std::memory_order_acquire);
             return r.topic()->meta(id).stamp.load(std::memory_order_relaxed) == stamp;
           })
      .def("availability", [](const vipc::ordered::Reader& r) { return availability_tuple(*r.topic()); })
      .def_property_readonly("cursor", &vipc::ordered::Reader::cursor)
      .def_property_readonly("dropped", &vipc::ordered::Reader::dropped)
      .def_property_readonly("gaps", &vipc::ordered::Reader::gaps)
      .def_property_readonly("reclaimed", &vipc::ordered::Reader::reclaimed)
      .def_property_readonly("capacity", [](const vipc::ordered::Reader& r) { return r.topic()->capacity(); })
      .def_property_readonly("slot_bytes", [](const vipc::ordered::Reader& r) { return r.topic()->slot_bytes(); })
      .def("shutdown",
           [](vipc::ordered::Reader& r) {
             if (!r.closed()) r.topic()->shutdown();
           })
      .def_property_readonly("closed", &vipc::ordered::Reader::closed)
      .def("close", &vipc::ordered::Reader::close)
      .def("_forget_after_fork", &vipc::ordered::Reader::forget_after_fork);
}

}  // namespace vipc::python
