// msgq._msgq.ShmFile and open_fifo: thin bindings of common/shm_file.h, so a
// layout written in Python (msgq.events) opens, checks, locks and unlinks its
// files as the C++ layouts do, with no second copy of those rules. Python maps
// the file itself (mmap of `fd`).
#include "python/shm_file_bindings.h"

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/process.h"
#include "common/shm_file.h"
#include "python/bindings.h"

namespace py = pybind11;
using vipc::common::ShmFile;

namespace vipc::python {

namespace {

// A ShmFile and the process that opened it: in a forked child, closing (or
// collecting) it only drops the inherited descriptor, as the parent still
// owns the locks (OFD locks belong to the shared open file description).
struct PyShmFile {
  ShmFile file;
  pid_t opener = common::current_pid();

  explicit PyShmFile(ShmFile f) : file(std::move(f)) {}
  PyShmFile(const PyShmFile&) = delete;
  PyShmFile& operator=(const PyShmFile&) = delete;
  ~PyShmFile() { close(); }

  bool opened_here() const { return common::current_pid() == opener; }
  void close() {
    if (!opened_here()) file.forget();
    file = ShmFile();  // detach: the last one out unlinks the file
  }
  int fd() const {
    if (file.fd() < 0) common::fail(common::ErrorKind::kClosed, "shared-memory file " + file.path() + " is closed");
    return file.fd();
  }

  // The attach lock, as ofd_lock_bounded takes it, but waiting without the GIL: the
  // holder may be a thread of this process that runs Python under the lock (msgq.events
  // does). Signals are checked between slices of the wait (Ctrl-C raises).
  void lock() const {
    const int f = fd();
    if (common::ofd_try_lock(f, common::kLockInit, true)) return;
    const int64_t patience = common::lock_patience_ns();
    const int64_t deadline = common::monotonic_ns() + patience;
    for (;;) {
      bool got = false;
      {
        py::gil_scoped_release nogil;
        got = common::ofd_lock_until(f, common::kLockInit, true,
                                     std::min(deadline, common::monotonic_ns() + kSignalCheckNs), false);
      }
      if (got) return;
      check_signals();
      if (common::monotonic_ns() >= deadline)
        common::fail_lock_timeout(f, common::kLockInit, "locking " + file.path(), patience);
    }
  }

 private:
  static constexpr int64_t kSignalCheckNs = 50'000'000;
};

}  // namespace

void bind_shm_files(py::module_& m) {
  py::class_<PyShmFile>(m, "ShmFile")
      .def(py::init([](const std::string& dir, const std::string& basename, unsigned mode) {
             common::check_basename(basename);
             ShmFile file;
             {
               // Without the GIL, for the reason PyShmFile::lock gives (a stuck peer
               // process still ends the wait after MSGQ_LOCK_TIMEOUT_S).
               py::gil_scoped_release nogil;
               file = ShmFile::open_locked(dir, basename, static_cast<mode_t>(mode));
             }
             return std::make_unique<PyShmFile>(std::move(file));
           }),
           py::arg("dir"), py::arg("basename"), py::arg("mode") = 0600)
      .def_property_readonly("fd", [](const PyShmFile& f) { return f.file.fd(); })
      .def_property_readonly("path", [](const PyShmFile& f) { return f.file.path(); })
      .def_property_readonly("size_at_open", [](const PyShmFile& f) { return f.file.size_at_open(); })
      .def_property_readonly("alone_at_open", [](const PyShmFile& f) { return f.file.alone_at_open(); })
      .def_property_readonly("opened_here", &PyShmFile::opened_here)
      .def_property_readonly("closed", [](const PyShmFile& f) { return f.file.fd() < 0; })
      .def("finish_attach",
           [](PyShmFile& f) {
             f.fd();
             f.file.finish_attach();
           })
      .def("lock", &PyShmFile::lock)
      .def("unlock", [](const PyShmFile& f) { common::ofd_unlock(f.fd(), common::kLockInit); })
      .def("close", &PyShmFile::close);

  m.def(
      "open_fifo", [](const std::string& path, int flags) { return common::open_fifo(path, flags).release(); },
      py::arg("path"), py::arg("flags"));
}

}  // namespace vipc::python
