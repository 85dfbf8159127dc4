#include "msgq/publisher.h"

#include <sys/random.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <climits>

#include "common/clock.h"
#include "common/errors.h"
#include "common/futex.h"

namespace vipc::msgq {

using common::ErrorKind;
using common::fail;

namespace {

constexpr int64_t kTakeoverPatienceNs = 2'000'000'000;
constexpr int kFruitlessWakesBeforeReclaim = 64;

uint64_t random_token() {
  uint64_t t = 0;
  if (getrandom(&t, sizeof(t), 0) != sizeof(t)) t = static_cast<uint64_t>(common::monotonic_ns()) ^ getpid();
  t &= (uint64_t{1} << 62) - 1;
  return t < 2 ? t + 2 : t;  // tokens 0 (none) and 1 (retired segment) are reserved
}

// Each publisher holds an exclusive OFD lock on a byte derived from its token
// for as long as it is attached. The kernel drops it the moment the process
// dies (before it is reaped, unlike kill(pid, 0), and across pid namespaces).
off_t liveness_byte(uint64_t token) { return publisher_liveness_byte(token); }

}  // namespace

Publisher::Publisher(const SegmentSpec& spec) {
  SegmentSpec s = spec;
  s.size_is_binding = spec.data_size != 0;
  seg_ = Segment::attach(s);
  take_ownership();
  writer_.emplace(seg_->view());
}

Publisher::~Publisher() { close(); }

void Publisher::close() {
  if (!seg_) return;
  gate_.begin_close();
  gate_.wait_idle();            // a send on another thread finishes its copy
  if (loan_size_) drop_loan();  // a thread may still fill it: loaned_seg_ keeps it mapped
  common::ofd_unlock(seg_->fd(), liveness_byte_);
  // Leave the token in place: a publisher that restarts later continues at
  // the write pointer, and readers keep what is already in the ring.
  writer_.reset();
  seg_.reset();
}

void Publisher::forget_after_fork() {
  if (!seg_) return;
  seg_->forget_after_fork();
  writer_.reset();
  seg_.reset();
}

// The per-message functions are [[gnu::hot]]: placed together (.text.hot), a send made
// cold (a camera's, right after a sleep) touches fewer code pages (issue 36).
[[gnu::hot]] void Publisher::check_open() const {
  if (closed()) fail(ErrorKind::kClosed, "publisher is closed");
}

void Publisher::check_size(size_t n) const {
  if (n > max_message_size()) {
    fail(ErrorKind::kMessageTooLarge, "message of " + std::to_string(n) + " bytes does not fit in " + seg_->path() +
                                          " (at most " + std::to_string(max_message_size()) +
                                          " bytes with segment_size=" + std::to_string(seg_->data_size()) +
                                          "): publish with a larger segment_size");
  }
}

void Publisher::take_ownership() {
  SegmentHeader& h = header();
  // A byte someone holds already (another live publisher, or a hostile
  // peer) is skipped: draw another token instead of waiting on it.
  for (int attempt = 0;; attempt++) {
    token_ = random_token();
    liveness_byte_ = liveness_byte(token_);
    if (common::ofd_try_lock(seg_->fd(), liveness_byte_, true)) break;
    if (attempt == 64) fail(ErrorKind::kIpc, seg_->path() + ": every liveness byte tried is locked by another process");
  }
  const int64_t give_up = common::monotonic_ns() + kTakeoverPatienceNs;
  uint64_t cur = h.publisher.load(std::memory_order_acquire);
  for (;;) {
    if ((cur & 1) != 0) {  // the previous publisher is inside a send or holds a loan
      const uint32_t pid = h.publisher_pid.load(std::memory_order_relaxed);
      if (common::ofd_is_locked(seg_->fd(), liveness_byte(cur >> 1), true)) {
        if (common::monotonic_ns() > give_up) {
          fail(ErrorKind::kIpc, seg_->path() + ": its publisher (pid " + std::to_string(pid) +
                                    ") has been in the middle of a send for over 2 s; cannot take the topic over");
        }
        usleep(100);
        cur = h.publisher.load(std::memory_order_acquire);
        continue;
      }
      // It died mid-send: whatever it half-wrote lies beyond the committed
      // write pointer and is simply overwritten.
    }
    // SYNC: acquire pairs with the previous owner's release in end_write(), so
    // the write pointer read next is its last commit.
    if (h.publisher.compare_exchange_weak(cur, token_ << 1, std::memory_order_acq_rel)) break;
  }
  h.publisher_pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
}

void Publisher::begin_write() {
  uint64_t mine = token_ << 1;
  if (!header().publisher.compare_exchange_strong(mine, mine | 1, std::memory_order_acquire,
                                                  std::memory_order_relaxed)) {
    if (mine == ((token_ << 1) | 1)) {  // our own mark: another thread is inside send() on this publisher
      fail(ErrorKind::kIpc, "send() on " + seg_->path() +
                                " while another thread is inside a send() on the same publisher: a publisher is used "
                                "by one thread at a time (serialize the threads' sends, e.g. with a lock)");
    }
    const bool retired = (mine >> 1) == 1;
    fail(ErrorKind::kMultiplePublishers,
         retired ? seg_->path() +
                       " was replaced by a publisher asking for another segment_size; this one can no longer send"
                 : "another publisher (pid " + std::to_string(header().publisher_pid.load()) + ") took over " +
                       seg_->path() + "; this one can no longer send");
  }
}

[[gnu::hot]] void Publisher::end_write() {
  header().publisher.store(token_ << 1, std::memory_order_release);  // SYNC: pairs with take_ownership()
  messages_sent_++;
}

[[gnu::hot]] void Publisher::send(const void* data, size_t n) {
  common::UseGuard use(gate_);
  if (!use.ok()) fail(ErrorKind::kClosed, "publisher is closed");
  check_open();
  if (loan_size_) fail(ErrorKind::kIpc, "a loaned message is outstanding: commit() or cancel it before send()");
  check_size(n);
  begin_write();
  writer_->write(data, n);
  end_write();
  wake_readers();
}

uint8_t* Publisher::loan(size_t n) {
  common::UseGuard use(gate_);
  if (!use.ok()) fail(ErrorKind::kClosed, "publisher is closed");
  check_open();
  if (loan_size_) fail(ErrorKind::kIpc, "a loaned message is already outstanding: commit() or cancel it first");
  check_size(n);
  begin_write();
  uint8_t* p = writer_->reserve(n);
  loan_size_ = n;
  loaned_seg_ = seg_;
  return p;
}

void Publisher::commit(size_t n) {
  common::UseGuard use(gate_);
  if (!use.ok()) fail(ErrorKind::kClosed, "publisher is closed");
  check_open();
  if (!loan_size_) fail(ErrorKind::kIpc, "commit() without a loaned message");
  if (n > *loan_size_) {
    fail(ErrorKind::kInvalidArgument,
         "commit(" + std::to_string(n) + ") exceeds the " + std::to_string(*loan_size_) + " bytes loaned");
  }
  writer_->commit(n);
  loan_size_.reset();
  loaned_seg_.reset();
  end_write();
  wake_readers();
}

void Publisher::cancel_loan() {
  loaned_seg_.reset();  // after a close(): the bytes held for the loan's writer
  if (loan_size_) drop_loan();
}

void Publisher::drop_loan() {
  loan_size_.reset();
  header().publisher.store(token_ << 1, std::memory_order_release);
}

[[gnu::hot]] void Publisher::wake_readers() {
  SegmentHeader& h = header();
  // SYNC: seq_cst loads after the seq_cst commit store (W3): either we see a
  // reader's bit, or that reader's own seq_cst check sees our write pointer.
  const uint64_t sleeping = h.sleeping_mask.load(std::memory_order_seq_cst);
  if (sleeping != 0) {
    h.futex_seq.fetch_add(1, std::memory_order_release);
    int woken;
    if (wake_mode_ == WakeMode::kHandoff && (sleeping & (sleeping - 1)) != 0) {
      // SYNC (model/wake.pml): the flag goes up after the bump, so whoever
      // takes it wakes after the bump every reader that slept on the old value.
      h.handoff_pending.store(1, std::memory_order_release);
      woken = common::futex_wake(&h.futex_seq, 1);
    } else {
      woken = common::futex_wake(&h.futex_seq, INT_MAX);
    }
    if (woken > 0) {
      readers_woken_.fetch_add(static_cast<uint64_t>(woken), std::memory_order_relaxed);
      fruitless_wakes_ = 0;
    } else if (++fruitless_wakes_ >= kFruitlessWakesBeforeReclaim) {
      fruitless_wakes_ = 0;  // bits of readers killed in their sleep: clear them
      reclaim_dead_readers();
    }
  }
  if (h.armed_mask.load(std::memory_order_seq_cst) != 0) {
    uint64_t armed = h.armed_mask.exchange(0, std::memory_order_acq_rel);
    while (armed != 0) {
      const int i = std::countr_zero(armed);
      armed &= armed - 1;
      const ReaderSlot& slot = h.readers[i];
      char name[kWakeNameCapacity];
      const size_t len = std::min<size_t>(slot.wake_name_len, kWakeNameCapacity);
      std::memcpy(name, slot.wake_name, len);
      sender_.poke(name, len);
    }
  }
}

size_t Publisher::reclaim_dead_readers() {
  check_open();
  SegmentHeader& h = header();
  uint64_t mask = h.reader_mask.load(std::memory_order_acquire);
  size_t freed = 0;
  while (mask != 0) {
    const int i = std::countr_zero(mask);
    mask &= mask - 1;
    const off_t byte = kLockSlotBase + i;
    if (!common::ofd_try_lock(seg_->fd(), byte, true)) continue;  // its owner is alive
    const uint64_t bit = uint64_t{1} << i;
    h.reader_mask.fetch_and(~bit, std::memory_order_seq_cst);
    h.sleeping_mask.fetch_and(~bit, std::memory_order_relaxed);
    h.armed_mask.fetch_and(~bit, std::memory_order_relaxed);
    common::ofd_unlock(seg_->fd(), byte);
    freed++;
  }
  return freed;
}

uint32_t Publisher::num_readers() {
  reclaim_dead_readers();
  return static_cast<uint32_t>(std::popcount(header().reader_mask.load(std::memory_order_acquire)));
}

bool Publisher::all_readers_updated() {
  reclaim_dead_readers();
  SegmentHeader& h = header();
  const uint64_t wp = h.write_pointer.load(std::memory_order_acquire);
  uint64_t mask = h.reader_mask.load(std::memory_order_acquire);
  if (mask == 0) return false;
  while (mask != 0) {
    const int i = std::countr_zero(mask);
    mask &= mask - 1;
    const ReaderSlot& slot = h.readers[i];
    if (slot.valid.load(std::memory_order_acquire) != 0 && slot.read_pointer.load(std::memory_order_acquire) != wp) {
      return false;
    }
  }
  return true;
}

}  // namespace vipc::msgq
