#include "msgq/subscriber.h"

#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/futex.h"

// epoll_pwait2 (Linux 5.11) is called as a system call: glibc wraps it only from 2.35,
// and wheels are built against an older glibc (manylinux_2_28) to run on older systems.
#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441  // the same number on every architecture
#endif

namespace vipc::msgq {

using common::ErrorKind;
using common::fail;

Subscriber::Subscriber(const SegmentSpec& spec, bool conflate) : spec_(spec), conflate_(conflate) {
  spec_.size_is_binding = false;  // the publisher decides the ring size
  seg_ = Segment::attach(spec_);
  claim_slot(false);
}

Subscriber::Subscriber(const SegmentSpec& spec, bool conflate, std::shared_ptr<Segment> segment, bool from_start)
    : spec_(spec), conflate_(conflate), seg_(std::move(segment)) {
  spec_.size_is_binding = false;
  claim_slot(from_start);
}

Subscriber::~Subscriber() { close(); }

void Subscriber::interrupt() {
  if (!seg_) return;
  gate_.begin_close();
  WakeSender sender;
  gate_.wait_idle([&] {  // a waiter may be between its check and its sleep: keep waking
    SegmentHeader& h = header();
    h.futex_seq.fetch_add(1, std::memory_order_release);
    common::futex_wake(&h.futex_seq, INT_MAX);
    if (wake_) sender.poke(wake_->name(), wake_->name_length());
  });
}

void Subscriber::close() {
  if (!seg_) return;
  interrupt();
  release_slot();
  reader_.reset();
  seg_.reset();
  wake_.reset();
}

void Subscriber::forget_after_fork() {
  if (!seg_) return;
  seg_->forget_after_fork();
  reader_.reset();
  seg_.reset();
  wake_.reset();  // closes only the child's copy of the descriptor
}

void Subscriber::check_open() const {
  if (closed()) fail(ErrorKind::kClosed, "subscriber is closed");
}

void Subscriber::claim_slot(bool from_start) {
  SegmentHeader& h = header();
  for (uint32_t i = 0; i < kMaxReaders; i++) {
    if (!common::ofd_try_lock(seg_->fd(), kLockSlotBase + i, true)) continue;
    // The slot is ours. If its bits are still set, its last owner died without
    // leaving: clear what it left behind.
    const uint64_t bit = uint64_t{1} << i;
    h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
    h.armed_mask.fetch_and(~bit, std::memory_order_relaxed);
    ReaderSlot& slot = h.readers[i];
    slot.pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
    slot.conflate.store(conflate_ ? 1 : 0, std::memory_order_relaxed);
    slot.messages.store(0, std::memory_order_relaxed);
    slot.bytes.store(0, std::memory_order_relaxed);
    slot.resets.store(0, std::memory_order_relaxed);
    slot.wake_name_len = 0;
    // SYNC: the writer only checks slots in reader_mask (W1); the reset that
    // follows publishes our position with seq_cst and rechecks the writer.
    h.reader_mask.fetch_or(bit, std::memory_order_seq_cst);
    reader_.emplace(seg_->view(), i);
    slot_ = i;
    if (from_start) {
      reader_->reset_to_start();
    } else {
      reader_->reset();
    }
    return;
  }
  fail(ErrorKind::kTooManyReaders, seg_->path() + " already has " + std::to_string(kMaxReaders) +
                                       " live readers (the most a topic takes): close subscribers you no longer use");
}

void Subscriber::release_slot() {
  if (slot_ >= kMaxReaders) return;
  SegmentHeader& h = header();
  const uint64_t bit = uint64_t{1} << slot_;
  h.reader_mask.fetch_and(~bit, std::memory_order_seq_cst);
  h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
  h.armed_mask.fetch_and(~bit, std::memory_order_relaxed);
  common::ofd_unlock(seg_->fd(), kLockSlotBase + slot_);
  resets_before_ += reader_->resets();
  slot_ = kMaxReaders;
}

void Subscriber::follow_publisher() {
  release_slot();
  reader_.reset();
  seg_.reset();
  seg_ = Segment::attach(spec_);
  claim_slot(true);  // from the start of the new ring: nothing its publisher sent is lost
}

bool Subscriber::has_data(std::memory_order order) const { return reader_->has_data(order) || seg_->superseded(); }

bool Subscriber::ready() const { return seg_ != nullptr && (gate_.closing() || has_data(std::memory_order_acquire)); }

int64_t Subscriber::spin_budget_ns() const {
  // Spinning pays only when the message is likely to come within the limit.
  if (spin_limit_ns_ == 0 || typical_wait_ns_ > spin_limit_ns_) return 0;
  return std::min(spin_limit_ns_, 2 * typical_wait_ns_ + 1'000);
}

void Subscriber::record_wait(int64_t ns) { typical_wait_ns_ = (3 * typical_wait_ns_ + ns) / 4; }

common::WaitStatus Subscriber::wait(int64_t deadline_ns) {
  common::UseGuard use(gate_);
  if (!use.ok() || !seg_) return common::WaitStatus::kClosed;
  if (has_data(std::memory_order_acquire)) return common::WaitStatus::kReady;
  const int64_t start = common::monotonic_ns();
  const int64_t spin_end = std::min(deadline_ns, start + spin_budget_ns());
  for (int64_t now = start; now < spin_end; now = common::monotonic_ns()) {
    for (int i = 0; i < 64; i++) {
      if (has_data(std::memory_order_acquire)) {
        record_wait(common::monotonic_ns() - start);
        return common::WaitStatus::kReady;
      }
      if (gate_.closing()) return common::WaitStatus::kClosed;
      common::cpu_relax();
    }
  }
  SegmentHeader& h = header();
  const uint64_t bit = uint64_t{1} << slot_;
  for (;;) {
    // SYNC: announce the sleep (seq_cst) before the final check (seq_cst load
    // of write_pointer); the writer stores write_pointer (seq_cst) before
    // loading sleeping_mask. Either it sees our bit and wakes us, or we see its data.
    h.sleeping_mask.fetch_or(bit, std::memory_order_seq_cst);
    const uint32_t seq = h.futex_seq.load(std::memory_order_acquire);
    if (has_data(std::memory_order_seq_cst)) {
      h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
      break;
    }
    if (gate_.closing()) {  // SYNC: after our seq load; close() bumps futex_seq after setting it
      h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
      return common::WaitStatus::kClosed;
    }
    const int64_t now = common::monotonic_ns();
    if (now >= deadline_ns) {
      h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
      return common::WaitStatus::kTimeout;
    }
    const common::FutexResult r =
        common::futex_wait(&h.futex_seq, seq, deadline_ns == common::kNever ? -1 : deadline_ns - now);
    h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
    if (has_data(std::memory_order_acquire)) {
      // SYNC: a publisher in WakeMode::kHandoff woke only one of us; whichever
      // reader comes out of its sleep with data first wakes the others (the
      // flag is only ever set by such a publisher: no syscall otherwise).
      if (h.handoff_pending.load(std::memory_order_acquire) != 0 &&
          h.handoff_pending.exchange(0, std::memory_order_acq_rel) != 0) {
        common::futex_wake(&h.futex_seq, INT_MAX);
      }
      break;
    }
    if (r == common::FutexResult::kInterrupted) return common::WaitStatus::kInterrupted;
  }
  record_wait(common::monotonic_ns() - start);
  return common::WaitStatus::kReady;
}

int Subscriber::fileno() {
  check_open();
  if (!wake_) wake_ = std::make_unique<WakeSocket>();
  return wake_->fd();
}

bool Subscriber::arm() {
  if (!seg_) return false;
  if (gate_.closing()) return true;
  fileno();
  SegmentHeader& h = header();
  ReaderSlot& slot = h.readers[slot_];
  std::memcpy(slot.wake_name, wake_->name(), wake_->name_length());
  slot.wake_name_len = static_cast<uint8_t>(wake_->name_length());
  // SYNC: the name is written before the bit (seq_cst RMW, release); the
  // writer reads the name after its acquiring exchange of armed_mask.
  h.armed_mask.fetch_or(uint64_t{1} << slot_, std::memory_order_seq_cst);
  if (has_data(std::memory_order_seq_cst)) {
    disarm();
    return true;
  }
  return false;
}

void Subscriber::disarm() {
  if (!seg_) return;
  header().armed_mask.fetch_and(~(uint64_t{1} << slot_), std::memory_order_relaxed);
  if (wake_) wake_->drain();
}

Poller::Poller() : epoll_(epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_) common::fail_errno("epoll_create1");
}

void Poller::add(std::shared_ptr<Subscriber> sub) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = subs_.size();
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, sub->fileno(), &ev) != 0) {
    if (errno == EEXIST) fail(ErrorKind::kInvalidArgument, "this subscriber is already registered with this Poller");
    common::fail_errno("epoll_ctl(ADD)");
  }
  subs_.push_back(std::move(sub));
}

void Poller::collect(std::vector<size_t>& ready) const {
  ready.clear();
  for (size_t i = 0; i < subs_.size(); i++) {
    if (subs_[i]->ready()) ready.push_back(i);
  }
}

common::WaitStatus Poller::poll(int64_t timeout_ns, std::vector<size_t>& ready) {
  // Keep each subscriber from being unmapped by a close() on another thread
  // while we use it; a closing one reports ready, and we return at once.
  std::vector<std::unique_ptr<common::UseGuard>> uses;
  uses.reserve(subs_.size());
  ready.clear();
  for (size_t i = 0; i < subs_.size(); i++) {
    uses.push_back(std::make_unique<common::UseGuard>(subs_[i]->gate()));
    if (!uses.back()->ok() || subs_[i]->closed()) ready.push_back(i);
  }
  if (!ready.empty()) return common::WaitStatus::kReady;
  collect(ready);
  if (!ready.empty() || timeout_ns == 0) return common::WaitStatus::kReady;
  const int64_t deadline = common::deadline_after(timeout_ns);
  for (;;) {
    bool any = false;
    for (auto& s : subs_) any = s->arm() || any;
    common::WaitStatus status = common::WaitStatus::kReady;
    if (!any) {
      const int64_t now = common::monotonic_ns();
      timespec ts{};
      timespec* tsp = nullptr;
      if (deadline != common::kNever) {
        const int64_t left = std::max<int64_t>(0, deadline - now);
        ts.tv_sec = left / 1'000'000'000;
        ts.tv_nsec = left % 1'000'000'000;
        tsp = &ts;
      }
      epoll_event events[16];
      int n = static_cast<int>(
          syscall(SYS_epoll_pwait2, long{epoll_.get()}, events, long{16}, tsp, static_cast<void*>(nullptr), 0L));
      if (n < 0 && errno == ENOSYS) {  // kernels before 5.11: millisecond timeouts, rounded up
        const int ms = tsp == nullptr
                           ? -1
                           : static_cast<int>(std::min<int64_t>((deadline - now + 999'999) / 1'000'000, INT32_MAX));
        n = epoll_wait(epoll_.get(), events, 16, ms);
      }
      if (n < 0) {
        if (errno != EINTR) common::fail_errno("epoll_wait");
        status = common::WaitStatus::kInterrupted;
      }
    }
    for (auto& s : subs_) s->disarm();
    collect(ready);
    if (!ready.empty() || status == common::WaitStatus::kInterrupted) return status;
    if (common::monotonic_ns() >= deadline) return common::WaitStatus::kTimeout;
  }
}

}  // namespace vipc::msgq
