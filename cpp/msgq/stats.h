// A read-only snapshot of one segment's header, for msgq-top: who publishes,
// who reads, how far each reader is behind, how many times it was lapped.
// Reading never writes to the segment and never changes its lifecycle: the
// file is opened read-only, only the header is mapped (PROT_READ), and a
// corrupt, foreign or half-created file gives an common::Error, never an
// out-of-bounds read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vipc::msgq {

struct ReaderStats {
  uint32_t slot = 0;
  uint32_t pid = 0;  // last owner; meaningful only while `alive`
  bool conflate = false;
  bool valid = false;     // false: lapped by the writer, resets at its next read
  bool alive = false;     // a live process holds the slot's lock
  uint64_t messages = 0;  // delivered since the slot was claimed
  uint64_t bytes = 0;
  uint64_t resets = 0;        // times lapped and reset (drops)
  uint64_t read_pointer = 0;  // packed (cycle << 32 | offset)
};

struct SegmentStats {
  std::string name;            // basename recorded in the header at creation
  uint64_t data_size = 0;      // bytes of ring
  uint64_t write_pointer = 0;  // packed (cycle << 32 | offset)
  uint64_t messages_written = 0;
  uint64_t bytes_written = 0;
  uint32_t publisher_pid = 0;  // last publisher; meaningful only while `publisher_alive`
  bool publisher_alive = false;
  bool superseded = false;           // replaced by a segment of another size; readers are moving on
  bool attached = false;             // some live process holds the presence lock; false: a stale leftover
  uint64_t created_ns = 0;           // CLOCK_REALTIME
  std::vector<ReaderStats> readers;  // one per bit of reader_mask, by slot
};

// Snapshot of dir/basename. Throws common::Error: kPermission for a symlink, a
// non-regular file or another user's file; kSegment for a file that is not a
// valid segment of this layout (or is being created right now); kIpc when the
// segment stayed busy (being attached or initialised) for too long.
SegmentStats read_segment_stats(const std::string& dir, const std::string& basename);

}  // namespace vipc::msgq
