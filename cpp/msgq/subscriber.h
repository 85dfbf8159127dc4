// One reader of a topic: a claimed reader slot, the read protocol, and the
// ways to wait for data (bounded adaptive spin, then a futex sleep; or an
// armed file descriptor for select/epoll/asyncio).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/use_gate.h"
#include "common/wait_status.h"
#include "msgq/ring.h"
#include "msgq/segment.h"
#include "msgq/wake.h"

namespace vipc::msgq {

class Subscriber {
 public:
  Subscriber(const SegmentSpec& spec, bool conflate);
  // On a segment already attached (Segment::adopt); `spec` names it for
  // messages and for following a publisher that replaces it. from_start: read
  // what the ring already holds (a VisionIPC client moving to the ring of a
  // restarted server), instead of only what is written from now on.
  Subscriber(const SegmentSpec& spec, bool conflate, std::shared_ptr<Segment> segment, bool from_start = false);
  ~Subscriber();
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // One message into the sink (see RingReader::read), or false if none is
  // waiting. Follows a publisher that replaced the segment, after draining it.
  template <class Sink>
  bool try_read(Sink& sink) {
    check_open();
    if (reader_->read(sink, conflate_) == ReadStatus::kMessage) return true;
    if (!seg_->superseded()) return false;
    follow_publisher();
    return reader_->read(sink, conflate_) == ReadStatus::kMessage;
  }

  // Wait until data may be there, the deadline (monotonic ns, common::kNever)
  // passes, a signal interrupts the sleep, or close() is called from another
  // thread. Spins first only while recent waits were shorter than the spin
  // limit, then sleeps on the futex.
  common::WaitStatus wait(int64_t deadline_ns);
  // A receive would not wait: data, a pending reset, or a close in progress
  // (so that pollers return and the receive reports the close).
  bool ready() const;

  // File-descriptor readiness: arm() asks the writer to poke fileno() at the
  // next message and returns true (without arming) if data is already there.
  int fileno();
  bool arm();
  void disarm();

  void set_spin_limit_ns(int64_t ns) { spin_limit_ns_ = ns < 0 ? 0 : ns; }
  int64_t spin_limit_ns() const { return spin_limit_ns_; }
  bool conflate() const { return conflate_; }
  uint32_t slot() const { return slot_; }
  uint64_t resets() const { return reader_ ? reader_->resets() + resets_before_ : resets_before_; }
  size_t segment_size() const { return seg_ ? seg_->data_size() : 0; }

  // Safe while another thread waits on this subscriber (in wait() or a
  // Poller): wakes it, waits for it to leave, then unmaps. Not while another
  // thread is in try_read() (a caller that allows that gates it itself and
  // calls interrupt() first, as visionipc::Client::close does).
  void close();
  // The first half of close(): from here on wait() returns kClosed; wakes the
  // waiters and waits for them to leave, but keeps the mapping (a try_read()
  // running on another thread finishes on it).
  void interrupt();
  bool closed() const { return seg_ == nullptr || gate_.closing(); }
  void forget_after_fork();
  common::UseGate& gate() { return gate_; }

 private:
  SegmentHeader& header() const { return *seg_->header(); }
  void check_open() const;
  void claim_slot(bool from_start);
  void release_slot();
  void follow_publisher();
  bool has_data(std::memory_order order) const;
  int64_t spin_budget_ns() const;
  void record_wait(int64_t ns);

  SegmentSpec spec_;
  bool conflate_;
  std::shared_ptr<Segment> seg_;
  std::optional<RingReader> reader_;
  uint32_t slot_ = kMaxReaders;
  uint64_t resets_before_ = 0;  // resets counted in segments we have left
  std::unique_ptr<WakeSocket> wake_;
  int64_t spin_limit_ns_ = 50'000;
  int64_t typical_wait_ns_ = 25'000;  // moving average of recent waits
  common::UseGate gate_;              // calls running without the GIL: wait(), Poller::poll()
};

// Waits on many subscribers at once through their wake sockets (epoll).
class Poller {
 public:
  Poller();
  void add(std::shared_ptr<Subscriber> sub);
  size_t size() const { return subs_.size(); }
  // Fills `ready` with the indices (in add() order) of subscribers with data.
  common::WaitStatus poll(int64_t timeout_ns, std::vector<size_t>& ready);
  int fileno() const { return epoll_.get(); }

 private:
  void collect(std::vector<size_t>& ready) const;
  std::vector<std::shared_ptr<Subscriber>> subs_;
  common::UniqueFd epoll_;
};

}  // namespace vipc::msgq
