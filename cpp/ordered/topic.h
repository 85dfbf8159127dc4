// An ordered topic (cpp/ordered/README.md): many producers (threads or processes) reserve
// consecutive message ids, fill their slots in any order, and make each id
// available; readers follow in `sequential` mode (every id in order: id N is
// never delivered before N is available, even if N+1 is) or `newest` mode
// (the newest available id). Steps O1..O5 / S1..S3 / R1..R4: README.md.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/shm_file.h"
#include "common/use_gate.h"
#include "common/wait_status.h"
#include "ordered/availability.h"
#include "ordered/layout.h"

namespace vipc::ordered {

struct TopicSpec : common::ShmFileSpec {
  // 0: take the existing topic's; required to create one. A non-zero value
  // that differs from an existing topic's is an error.
  uint32_t capacity = 0;
  uint64_t slot_bytes = 0;
};

// One attachment of a topic file, shared by the producers and readers of a process.
class Topic {
 public:
  static std::shared_ptr<Topic> attach(const TopicSpec& spec);
  TopicHeader& header() const { return *reinterpret_cast<TopicHeader*>(file_.data()); }
  SlotMeta& meta(uint64_t id) const {
    return reinterpret_cast<SlotMeta*>(file_.data() + sizeof(TopicHeader))[id % capacity_];
  }
  uint8_t* slot(uint64_t id) const { return file_.data() + data_offset_ + (id % capacity_) * stride_; }
  uint32_t capacity() const { return capacity_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  const std::string& path() const { return file_.path(); }
  Availability snapshot() const { return Availability::unpack(header().availability.load(std::memory_order_acquire)); }
  // Sleep until done(snapshot) is true, the deadline passes, a signal comes,
  // shutdown, or gate closes. bitset: the ids (bit id % 32) whose availability
  // may make done() true; ~0u for any change.
  template <class Done>
  common::WaitStatus wait(Done&& done, uint32_t bitset, int64_t deadline_ns, const common::UseGate& gate);
  // Wake sleepers waiting for ids in bitset (no syscall if nobody sleeps).
  void wake(uint32_t bitset);
  void wake_all_now();
  // Id `id` holds a waiter up: if the producer that reserved it is dead, give
  // the id up for it (stamp reclaimed, make it available: readers pass a gap)
  // and return true. A reserved id whose slot was never stamped (its producer
  // died between O1/O2 and S1, a window of nanoseconds for a live one) is
  // reclaimed once `watch` has seen it so for kUnstampedPatienceNs.
  struct StallWatch {
    uint64_t id = UINT64_MAX;
    int64_t since = 0;
  };
  bool reclaim_if_dead(uint64_t id, StallWatch& watch);
  bool producer_alive(uint64_t token) const;
  int fd() const { return file_.fd(); }
  void shutdown();
  bool is_shutdown() const { return header().shutdown.load(std::memory_order_seq_cst) != 0; }
  void forget() { file_.forget(); }

 private:
  Topic() = default;
  std::string adopt(size_t file_size);
  common::ShmFile file_;
  uint32_t capacity_ = 0;
  uint64_t slot_bytes_ = 0, stride_ = 0, data_offset_ = 0;
};

class Producer {
 public:
  explicit Producer(const TopicSpec& spec);
  ~Producer() { close(); }
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  // O1 (waiting while 16 ids are in flight) then S1. Thread-safe.
  common::WaitStatus reserve_next(int64_t deadline_ns, uint64_t* id);
  // O2: exactly `id`; kInvalidArgument if it was reserved already. Thread-safe.
  common::WaitStatus reserve_id(uint64_t id, int64_t deadline_ns);
  // The slot of a reserved id, slot_bytes() long, to fill in place.
  uint8_t* slot(uint64_t id);
  // S2 + O3 + wake: make a reserved id available with its first `size` bytes.
  void publish(uint64_t id, uint64_t size, uint64_t t0 = 0, uint64_t t1 = 0);
  // Give a reservation up: readers skip the id (a gap).
  void cancel(uint64_t id);
  // Convenience: reserve-next, copy, publish.
  common::WaitStatus send(const void* data, uint64_t size, int64_t deadline_ns, uint64_t* id);

  // The id reserve_next waits on (the oldest in flight), for error messages.
  uint64_t oldest_in_flight() const;
  const std::shared_ptr<Topic>& topic() const { return topic_; }
  void shutdown() {
    if (topic_) topic_->shutdown();
  }
  void close();
  bool closed() const { return topic_ == nullptr || gate_.closing(); }
  void forget_after_fork();

 private:
  void begin_fill(uint64_t id);
  void take(uint64_t id);  // remove from pending_, or kInvalidArgument
  // Waits in slices; between them, reclaims the id `stuck()` names if its producer died.
  template <class Done, class Stuck>
  common::WaitStatus wait_reclaiming(Done&& done, Stuck&& stuck, int64_t deadline_ns);
  std::shared_ptr<Topic> topic_;
  uint64_t token_ = 0;  // our liveness lock: producer_liveness_byte(token_)
  std::mutex mutex_;
  std::set<uint64_t> pending_;  // ids this producer reserved and has not published
  common::UseGate gate_;
};

enum class Mode { kSequential, kNewest };

// One message found by Reader::next(), still in its slot.
struct Message {
  uint64_t id = 0;
  uint64_t stamp = 0;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t t0 = 0, t1 = 0;
};

class Reader {
 public:
  Reader(const TopicSpec& spec, Mode mode);
  ~Reader() { close(); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // R1..R3: the next message of this reader's mode, left in its slot (copy
  // it, then check still_valid()), or false if none is deliverable now.
  bool next(Message* m);
  // R4: acquire fence, then the slot's stamp again: unchanged = the bytes
  // read since next() are the message's (a reader lapped by the ring counts a drop).
  bool still_valid(const Message& m);
  common::WaitStatus wait(int64_t deadline_ns);

  Mode mode() const { return mode_; }
  uint64_t cursor() const { return cursor_; }        // the lowest id this reader may still deliver
  uint64_t dropped() const { return dropped_; }      // ids overwritten before this reader got them
  uint64_t gaps() const { return gaps_; }            // ids skipped by reserve_id, cancelled or reclaimed
  uint64_t reclaimed() const { return reclaimed_; }  // of the gaps: ids whose producer died holding them
  const std::shared_ptr<Topic>& topic() const { return topic_; }
  void close();
  bool closed() const { return topic_ == nullptr || gate_.closing(); }
  void forget_after_fork();

 private:
  bool deliverable(const Availability& a) const;
  std::shared_ptr<Topic> topic_;
  Mode mode_;
  uint64_t cursor_ = 0;
  uint64_t dropped_ = 0, gaps_ = 0, reclaimed_ = 0;
  Topic::StallWatch watch_;
  common::UseGate gate_;
};

}  // namespace vipc::ordered
