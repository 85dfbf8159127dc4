// The one writer of a topic. Owns the ring's write side while it holds the
// header's publisher token ("last publisher wins": a newer publisher takes
// the token and this one's next send fails with kMultiplePublishers).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/use_gate.h"
#include "msgq/ring.h"
#include "msgq/segment.h"
#include "msgq/wake.h"

namespace vipc::msgq {

// How a send wakes readers asleep on the topic (cpp/msgq/README.md, "Waiting").
//  kAll:     one FUTEX_WAKE of every sleeper; each is woken by the kernel from
//            the publisher's system call (lowest latency for every reader; the
//            publisher's CPU per message grows with the number of sleepers).
//  kHandoff: with several sleepers the publisher wakes one, and that reader
//            wakes the rest: the publisher's cost is one wake-up whatever the
//            number of readers; the others wake one hop later.
enum class WakeMode : uint8_t { kAll, kHandoff };

class Publisher {
 public:
  explicit Publisher(const SegmentSpec& spec);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Copy n bytes into the ring and publish them.
  void send(const void* data, size_t n);

  // Zero-copy: reserve room for up to n bytes in the ring, fill it, then
  // commit(m <= n). Until commit() or cancel_loan(), no other send. The bytes
  // stay mapped until then even if close() comes first from another thread
  // (the loan is dropped, commit() throws kClosed; nothing is published).
  uint8_t* loan(size_t n);
  void commit(size_t n);
  void cancel_loan();
  bool has_loan() const { return loan_size_.has_value(); }

  uint32_t num_readers();
  bool all_readers_updated();
  size_t reclaim_dead_readers();  // returns how many slots were freed
  size_t max_message_size() const { return msgq::max_message_size(seg_->data_size()); }
  size_t segment_size() const { return seg_->data_size(); }
  const std::shared_ptr<Segment>& segment() const { return seg_; }
  uint64_t messages_sent() const { return messages_sent_; }
  void set_wake_mode(WakeMode mode) { wake_mode_ = mode; }
  WakeMode wake_mode() const { return wake_mode_; }
  // Readers the publisher's own FUTEX_WAKE calls dequeued, since it was made
  // (statistics: with kHandoff at most one per message).
  uint64_t readers_woken() const { return readers_woken_.load(std::memory_order_relaxed); }

  // Safe while another thread is inside send() (large sends run without the
  // GIL): waits for it to finish, then unmaps.
  void close();
  bool closed() const { return seg_ == nullptr || gate_.closing(); }
  void forget_after_fork();

 private:
  SegmentHeader& header() const { return *seg_->header(); }
  void check_open() const;
  void check_size(size_t n) const;
  void take_ownership();
  void begin_write();
  void end_write();
  void wake_readers();
  void drop_loan();  // the loan is over (loaned_seg_ untouched)

  std::shared_ptr<Segment> seg_;
  std::optional<RingWriter> writer_;
  uint64_t token_ = 0;
  std::optional<size_t> loan_size_;
  // The segment a loan's bytes live in, held from loan() to commit() or
  // cancel_loan() (not close(): a thread may still be filling them).
  std::shared_ptr<Segment> loaned_seg_;
  WakeSender sender_;
  uint64_t messages_sent_ = 0;
  WakeMode wake_mode_ = WakeMode::kAll;
  std::atomic<uint64_t> readers_woken_{0};  // relaxed: a statistic, read from any thread
  int fruitless_wakes_ = 0;                 // futex wakes that woke nobody: a sleeper died, reclaim
  common::UseGate gate_;                    // sends in flight on other threads
  off_t liveness_byte_ = 0;                 // our OFD lock: held while we live, so a successor can tell
};

}  // namespace vipc::msgq
