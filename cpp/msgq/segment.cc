#include "msgq/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/futex.h"
#include "common/names.h"

namespace vipc::msgq {

using common::ErrorKind;
using common::fail;
using common::fail_errno;

void check_basename(const std::string& basename) { common::check_basename(basename, kNameCapacity); }

namespace {

constexpr int kAttachAttempts = 100;              // a segment superseded while we attach is attached again
constexpr const char* kResizeSuffix = "#resize";  // the temporary name of a replacement being made

size_t round_data_size(size_t requested) {
  const size_t n = requested == 0 ? kDefaultDataSize : requested;
  if (n < kMinDataSize || n > kMaxDataSize) {
    fail(ErrorKind::kInvalidArgument, "segment_size must be between " + std::to_string(kMinDataSize) + " and " +
                                          std::to_string(kMaxDataSize) + " bytes, got " + std::to_string(n));
  }
  return (n + kCacheLine - 1) & ~(kCacheLine - 1);
}

}  // namespace

std::string segment_basename(const std::string& prefix, const std::string& topic) {
  return common::run_segment_prefix(prefix) + topic;
}

std::shared_ptr<Segment> Segment::attach(const SegmentSpec& spec) {
  check_basename(spec.basename);
  const size_t wanted = spec.data_size == 0 ? 0 : round_data_size(spec.data_size);

  for (int attempt = 0; attempt < kAttachAttempts; attempt++) {
    std::shared_ptr<Segment> seg(new Segment());
    seg->file_ = common::ShmFile::open_locked(spec.dir, spec.basename, spec.mode, spec.trusted_uids);
    const bool nobody_else = seg->file_.alone_at_open();
    const size_t file_size = seg->file_.size_at_open();
    const std::string& path = seg->path();

    if (file_size == 0) {
      seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);
    } else {
      if (file_size < kHeaderSize + kMinDataSize) {
        if (!nobody_else) fail(ErrorKind::kSegment, path + " is too small to be a msgq segment");
        seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);
      } else {
        seg->file_.map(file_size);
        const std::string problem = seg->adopt_header(file_size);
        if (!problem.empty()) {
          if (!nobody_else) {
            fail(ErrorKind::kSegment,
                 path + ": " + problem + ". A process using it is still alive: stop it, or pick another name.");
          }
          seg->initialize(spec, wanted == 0 ? round_data_size(0) : wanted);  // stale leftover: start over
        } else if (wanted != 0 && spec.size_is_binding && seg->data_size_ != wanted) {
          return seg->replace(spec, wanted);
        }
      }
    }
    seg->file_.finish_attach();
    return seg;
  }
  fail(ErrorKind::kIpc,
       "could not attach " + spec.dir + "/" + spec.basename + ": it kept being replaced while we opened it");
}

std::shared_ptr<Segment> Segment::adopt(int fd, const SegmentSpec& spec) {
  check_basename(spec.basename);
  std::shared_ptr<Segment> seg(new Segment());
  seg->file_ = common::ShmFile::adopt(fd, spec.dir + "/" + spec.basename);
  const size_t file_size = seg->file_.size_at_open();
  if (file_size < kHeaderSize + kMinDataSize) {
    fail(ErrorKind::kSegment, seg->path() + ": the descriptor passed is too small to be a msgq segment");
  }
  seg->file_.map(file_size);
  if (const std::string problem = seg->adopt_header(file_size); !problem.empty()) {
    fail(ErrorKind::kSegment, seg->path() + " (passed by descriptor): " + problem);
  }
  seg->file_.finish_attach();
  return seg;
}

Segment::~Segment() = default;  // file_ detaches: see common/shm_file.h

void Segment::initialize(const SegmentSpec& spec, size_t data_size) {
  file_.allocate(kHeaderSize + data_size, spec.mode, "segment_size");  // its errors say which resource ran out
  std::memset(static_cast<void*>(header()), 0, kHeaderSize);
  SegmentHeader& h = *header();
  h.layout_version = kLayoutVersion;
  h.header_size = kHeaderSize;
  h.data_size = data_size;
  h.max_readers = kMaxReaders;
  h.creator_uid = geteuid();
  h.created_ns = static_cast<uint64_t>(common::realtime_ns());
  std::strncpy(h.name, spec.basename.c_str(), kNameCapacity - 1);
  h.state.store(kStateReady, std::memory_order_relaxed);
  // Published to attachers by the init lock; magic last so a crash before
  // this line leaves a file the next attacher recognises as unfinished.
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
  data_size_ = static_cast<uint32_t>(data_size);
}

std::string header_problem(const SegmentHeader& h, size_t file_size) {
  if (h.magic != kMagic) return "not a msgq segment (no magic number: unfinished, or another program's file)";
  if (h.layout_version != kLayoutVersion) {
    return "created by an incompatible msgq layout version " + std::to_string(h.layout_version) +
           " (this library speaks version " + std::to_string(kLayoutVersion) + ")";
  }
  if (h.header_size != kHeaderSize || h.max_readers != kMaxReaders || h.data_size < kMinDataSize ||
      h.data_size > kMaxDataSize || h.data_size % kCacheLine != 0 || kHeaderSize + h.data_size != file_size) {
    return "corrupt header (sizes do not match the file)";
  }
  return {};
}

std::string Segment::adopt_header(size_t file_size) {
  std::string problem = header_problem(*header(), file_size);
  if (problem.empty()) data_size_ = static_cast<uint32_t>(header()->data_size);
  return problem;
}

// A publisher wants another ring size (we hold this segment's init lock).
// The new segment is made whole under a temporary name, then renamed over
// this one's: a failure (no space) leaves the topic as it was, and attachers
// waiting on our init lock find the name replaced and open it again. Then
// this one is retired (supersede).
std::shared_ptr<Segment> Segment::replace(const SegmentSpec& spec, size_t data_size) {
  std::shared_ptr<Segment> next(new Segment());
  const std::string temp = spec.basename.substr(0, kNameCapacity - 1 - std::strlen(kResizeSuffix)) + kResizeSuffix;
  next->file_ = common::ShmFile::open_locked(spec.dir, temp, spec.mode, spec.trusted_uids);
  try {
    next->initialize(spec, data_size);
    next->file_.rename_to(path());
  } catch (...) {
    next->file_.unlink_name();  // nothing half-made left behind; this segment is untouched
    throw;
  }
  supersede();
  next->file_.finish_attach();
  return next;
}

// Retire this segment (replaced by one of another size). Its old publisher
// fails on its next send, and its readers reattach by name after draining it.
void Segment::supersede() {
  SegmentHeader& h = *header();
  constexpr uint64_t kRetiredToken = 1 << 1;  // token 1 is never handed to a publisher
  uint64_t cur = h.publisher.load(std::memory_order_acquire);
  const int64_t give_up = common::monotonic_ns() + 2'000'000'000;
  for (;;) {
    const bool owner_alive = common::ofd_is_locked(fd(), publisher_liveness_byte(cur >> 1), true);
    if ((cur & 1) != 0 && owner_alive && common::monotonic_ns() < give_up) {  // a send is in flight: let it finish
      usleep(100);
      cur = h.publisher.load(std::memory_order_acquire);
      continue;
    }
    if (h.publisher.compare_exchange_weak(cur, kRetiredToken, std::memory_order_acq_rel)) break;
  }
  h.state.store(kStateSuperseded, std::memory_order_release);
  h.futex_seq.fetch_add(1, std::memory_order_release);
  common::futex_wake(&h.futex_seq, INT32_MAX);
}

std::vector<std::string> remove_stale_segments(const std::string& dir, const std::string& name_prefix) {
  return common::remove_stale_files(dir, name_prefix);
}

}  // namespace vipc::msgq
