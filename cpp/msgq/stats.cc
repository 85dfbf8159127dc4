#include "msgq/stats.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "msgq/layout.h"
#include "msgq/segment.h"

namespace vipc::msgq {

using common::ErrorKind;
using common::fail;
using common::fail_errno;

namespace {

// An attacher holds the init lock for the length of a posix_fallocate at
// most; a stopped (SIGSTOP) attacher must not hang the tool.
constexpr int64_t kBusyPatienceNs = 200'000'000;

class HeaderMapping {
 public:
  HeaderMapping(int fd, const std::string& path) {
    void* p = mmap(nullptr, kHeaderSize, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail_errno("mmap " + path);
    header_ = static_cast<const SegmentHeader*>(p);
  }
  ~HeaderMapping() { munmap(const_cast<SegmentHeader*>(header_), kHeaderSize); }
  HeaderMapping(const HeaderMapping&) = delete;
  HeaderMapping& operator=(const HeaderMapping&) = delete;
  const SegmentHeader& operator*() const { return *header_; }

 private:
  const SegmentHeader* header_;
};

}  // namespace

SegmentStats read_segment_stats(const std::string& dir, const std::string& basename) {
  check_basename(basename);
  const std::string path = dir + "/" + basename;

  // Refuse anything but a regular file before opening it: opening a FIFO
  // would block, opening a device may have side effects.
  struct stat before{};
  if (lstat(path.c_str(), &before) != 0) fail_errno("cannot stat " + path);
  if (S_ISLNK(before.st_mode)) fail(ErrorKind::kPermission, path + " is a symbolic link: refusing it");
  if (!S_ISREG(before.st_mode)) fail(ErrorKind::kPermission, path + " is not a regular file: refusing it");
  if (before.st_uid != geteuid()) {
    fail(ErrorKind::kPermission, path + " belongs to uid " + std::to_string(before.st_uid) + ", not to us (uid " +
                                     std::to_string(geteuid()) + ")");
  }

  common::UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) {
    if (errno == ELOOP) fail(ErrorKind::kPermission, path + " is a symbolic link: refusing it");
    fail_errno("cannot open " + path);
  }

  // A shared init lock keeps attachers from re-initialising (truncating) the
  // file while its header is mapped here: reading a truncated mapping would
  // raise SIGBUS. It delays an attacher by the microseconds of the copy below.
  const int64_t give_up = common::monotonic_ns() + kBusyPatienceNs;
  if (!common::ofd_lock_until(fd.get(), kLockInit, false, give_up, true)) {
    fail(ErrorKind::kIpc,
         path + " stayed busy: its attach lock is held by " + common::lock_holders(fd.get(), kLockInit));
  }

  struct stat st{};
  if (fstat(fd.get(), &st) != 0) fail_errno("fstat " + path);
  if (st.st_dev != before.st_dev || st.st_ino != before.st_ino || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    fail(ErrorKind::kIpc, path + " was replaced while being read");
  }
  const auto file_size = static_cast<size_t>(st.st_size);
  if (file_size == 0) fail(ErrorKind::kSegment, path + " is empty (being created, or not a msgq segment)");
  if (file_size < kHeaderSize + kMinDataSize) fail(ErrorKind::kSegment, path + " is too small to be a msgq segment");

  const HeaderMapping mapping(fd.get(), path);
  const SegmentHeader& h = *mapping;
  if (const std::string problem = header_problem(h, file_size); !problem.empty())
    fail(ErrorKind::kSegment, path + ": " + problem);

  // Every live field is an informational relaxed load: the snapshot is not
  // one instant, and nothing here orders against the publisher or readers.
  SegmentStats s;
  char name[kNameCapacity];
  std::memcpy(name, h.name, kNameCapacity);
  s.name.assign(name, strnlen(name, kNameCapacity));
  s.data_size = h.data_size;
  s.created_ns = h.created_ns;
  s.write_pointer = h.write_pointer.load(std::memory_order_relaxed);
  s.messages_written = h.messages_written.load(std::memory_order_relaxed);
  s.bytes_written = h.bytes_written.load(std::memory_order_relaxed);
  s.publisher_pid = h.publisher_pid.load(std::memory_order_relaxed);
  s.superseded = h.state.load(std::memory_order_relaxed) == kStateSuperseded;
  const uint64_t token = h.publisher.load(std::memory_order_relaxed) >> 1;
  s.publisher_alive = token >= 2 && common::ofd_is_locked(fd.get(), publisher_liveness_byte(token), true);
  s.attached = common::ofd_is_locked(fd.get(), kLockPresence, true);

  const uint64_t mask = h.reader_mask.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < kMaxReaders; i++) {
    if ((mask & (uint64_t{1} << i)) == 0) continue;
    const ReaderSlot& slot = h.readers[i];
    ReaderStats r;
    r.slot = i;
    r.pid = slot.pid.load(std::memory_order_relaxed);
    r.conflate = slot.conflate.load(std::memory_order_relaxed) != 0;
    r.valid = slot.valid.load(std::memory_order_relaxed) != 0;
    r.alive = common::ofd_is_locked(fd.get(), kLockSlotBase + i, true);
    r.messages = slot.messages.load(std::memory_order_relaxed);
    r.bytes = slot.bytes.load(std::memory_order_relaxed);
    r.resets = slot.resets.load(std::memory_order_relaxed);
    r.read_pointer = slot.read_pointer.load(std::memory_order_relaxed);
    s.readers.push_back(r);
  }
  return s;  // closing fd drops the init lock
}

}  // namespace vipc::msgq
