// One topic's shared-memory segment file: create or validate, map, attach,
// detach, and unlink when the last participant leaves. The protocol is in
// cpp/msgq/README.md ("Segment lifecycle").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/names.h"
#include "common/shm_file.h"
#include "msgq/layout.h"
#include "msgq/ring.h"

namespace vipc::msgq {

// File name of a topic's segment: "msgq@TOPIC", or "msgq@PREFIX@TOPIC" under
// a run prefix (cpp/msgq/README.md, first paragraph; the rule is
// common::run_segment_prefix, which msgq/names.py calls too).
std::string segment_basename(const std::string& prefix, const std::string& topic);

struct SegmentSpec {
  std::string dir{common::kSegmentDir};
  std::string basename;             // e.g. "msgq@topic"; validated again here
  size_t data_size = 0;             // 0: keep an existing segment's size, or the default when creating
  bool size_is_binding = false;     // a publisher's explicit size replaces a segment of another size
  mode_t mode = 0600;               // permissions of a segment we create
  std::vector<uid_t> trusted_uids;  // owners besides us whose segment files we accept (sharing between users)
};

class Segment {
 public:
  static std::shared_ptr<Segment> attach(const SegmentSpec& spec);
  // Attach through a descriptor another process opened for us (a VisionIPC
  // server passes its topic's segment to the clients it admitted, so an
  // allowed user needs no file permission). `fd` must be an open file
  // description of its own (not shared with the sender: OFD locks are per
  // description); it is duplicated. The file is never initialised or resized
  // through it (a header that is not a valid segment is an error), and only
  // unlinked on detach if it is our own file at spec's path.
  static std::shared_ptr<Segment> adopt(int fd, const SegmentSpec& spec);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(file_.data()); }
  uint8_t* data() const { return file_.data() + kHeaderSize; }
  uint32_t data_size() const { return data_size_; }
  RingView view() const { return RingView{header(), data(), data_size_}; }
  int fd() const { return file_.fd(); }
  const std::string& path() const { return file_.path(); }
  bool superseded() const { return header()->state.load(std::memory_order_acquire) == kStateSuperseded; }

  // In a forked child: drop the inherited fd and mapping without touching any
  // shared state (the parent still owns its locks and slots).
  void forget_after_fork() { file_.forget(); }

 private:
  Segment() = default;
  void initialize(const SegmentSpec& spec, size_t data_size);
  // Checks the mapped header and takes its sizes; returns why it is unusable, or "".
  std::string adopt_header(size_t file_size);
  std::shared_ptr<Segment> replace(const SegmentSpec& spec, size_t data_size);
  void supersede();

  common::ShmFile file_;  // open, owner-checked, mapped; detaching may unlink it
  uint32_t data_size_ = 0;
};

// Unlink segment files in `dir` whose names start with `name_prefix` and that
// no live process is attached to (left behind when every participant was
// killed). Returns the basenames removed.
std::vector<std::string> remove_stale_segments(const std::string& dir, const std::string& name_prefix);

void check_basename(const std::string& basename);

// Why a mapped header of a file of file_size bytes is unusable, or "" if it is
// a valid segment of our layout. Reads only the immutable identity fields.
std::string header_problem(const SegmentHeader& h, size_t file_size);

}  // namespace vipc::msgq
