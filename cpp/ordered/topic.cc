#include "ordered/topic.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"
#include "common/futex.h"

namespace vipc::ordered {

using common::ErrorKind;
using common::fail;

namespace {

// A sleep is cut into slices: the futex compares only the low 32 bits of the
// availability word, so a change confined to its high bits (last moving by a
// multiple of 65536 between our check and our sleep) is caught within one slice.
constexpr int64_t kSleepSliceNs = 100'000'000;
constexpr int kNewestScan = 64;  // how far below the newest available id a newest reader looks
// A waiter held up by one id checks this often whether its producer died.
constexpr int64_t kReclaimCheckNs = 50'000'000;
// A reserved id whose slot its producer never stamped is reclaimed after this
// long: a live producer stamps it nanoseconds after reserving (a producer
// stalled longer finds the id reclaimed, and its reserve raises).
constexpr int64_t kUnstampedPatienceNs = 1'000'000'000;

const void* low_word(const std::atomic<uint64_t>& w) { return &w; }  // little-endian (layout.h)
uint32_t low_bits(uint64_t w) { return static_cast<uint32_t>(w); }
uint32_t id_bit(uint64_t id) { return uint32_t{1} << (id % 32); }

}  // namespace

// ------------------------------------------------------------------ topic

std::shared_ptr<Topic> Topic::attach(const TopicSpec& spec) {
  common::check_basename(spec.basename);
  if (spec.capacity != 0) {  // 0: take the existing topic's sizes
    common::check_range<uint64_t>("capacity", spec.capacity, kMinCapacity, kMaxCapacity, " slots");
    common::check_range<uint64_t>("slot_bytes", spec.slot_bytes, 1, kMaxSlotBytes);
  }
  std::shared_ptr<Topic> t(new Topic());
  t->file_ = common::ShmFile::open_locked(spec.dir, spec.basename, spec.mode);
  const size_t size = t->file_.size_at_open();
  std::string problem = "no ordered topic of that name exists yet (create it with a capacity and slot_bytes)";
  if (size >= sizeof(TopicHeader)) {
    t->file_.map(size);
    problem = t->adopt(size);
  }
  if (problem.empty() && spec.capacity != 0 && (spec.capacity != t->capacity_ || spec.slot_bytes != t->slot_bytes_)) {
    if (!t->file_.alone_at_open()) {
      fail(ErrorKind::kInvalidArgument, t->path() + " exists with capacity " + std::to_string(t->capacity_) +
                                            " and slot_bytes " + std::to_string(t->slot_bytes_) + ", not " +
                                            std::to_string(spec.capacity) + " and " + std::to_string(spec.slot_bytes) +
                                            " (pass 0 to take the existing sizes)");
    }
    problem = "stale, of other sizes";  // a leftover nobody uses: start over
  }
  if (!problem.empty()) {
    if (spec.capacity == 0) fail(ErrorKind::kInvalidArgument, t->path() + ": " + problem);
    if (!t->file_.alone_at_open() && size >= sizeof(TopicHeader)) {
      fail(ErrorKind::kSegment, t->path() + ": " + problem + ". A process using it is still alive.");
    }
    t->capacity_ = spec.capacity;
    t->slot_bytes_ = spec.slot_bytes;
    t->stride_ = slot_stride_for(spec.slot_bytes);
    t->data_offset_ = data_offset_for(spec.capacity);
    t->file_.allocate(t->data_offset_ + t->stride_ * spec.capacity, spec.mode);
    TopicHeader& h = t->header();  // zero-filled
    h.layout_version = kLayoutVersion;
    h.capacity = t->capacity_;
    h.slot_bytes = t->slot_bytes_;
    h.slot_stride = t->stride_;
    h.data_offset = t->data_offset_;
    h.created_ns = static_cast<uint64_t>(common::realtime_ns());
    h.creator_uid = geteuid();
    h.availability.store(Availability::initial(0), std::memory_order_relaxed);
    // Published to attachers by the init lock; magic last.
    std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
  }
  t->file_.finish_attach();
  return t;
}

std::string Topic::adopt(size_t file_size) {
  const TopicHeader& h = header();
  if (h.magic != kMagic) return "not an ordered topic (no magic number: unfinished, or another program's file)";
  if (h.layout_version != kLayoutVersion) return "incompatible ordered topic layout version";
  if (h.capacity < kMinCapacity || h.capacity > kMaxCapacity || h.slot_bytes < 1 || h.slot_bytes > kMaxSlotBytes ||
      h.slot_stride != slot_stride_for(h.slot_bytes) || h.data_offset != data_offset_for(h.capacity) ||
      h.data_offset + h.slot_stride * h.capacity != file_size) {
    return "corrupt header (sizes do not match the file)";
  }
  capacity_ = h.capacity;
  slot_bytes_ = h.slot_bytes;
  stride_ = h.slot_stride;
  data_offset_ = h.data_offset;
  return {};
}

template <class Done>
common::WaitStatus Topic::wait(Done&& done, uint32_t bitset, int64_t deadline_ns, const common::UseGate& gate) {
  TopicHeader& h = header();
  for (;;) {
    if (gate.closing()) return common::WaitStatus::kClosed;
    // SYNC: announce the sleep (seq_cst) before the final check (seq_cst
    // load); a producer's seq_cst O3 CAS comes before its seq_cst load of
    // sleepers. Either it sees us and wakes us, or we see its id.
    h.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t w = h.availability.load(std::memory_order_seq_cst);
    if (done(Availability::unpack(w))) {
      h.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return common::WaitStatus::kReady;
    }
    if (is_shutdown() || gate.closing()) {
      h.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return gate.closing() ? common::WaitStatus::kClosed : common::WaitStatus::kShutdown;
    }
    const int64_t now = common::monotonic_ns();
    if (now >= deadline_ns) {
      h.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return common::WaitStatus::kTimeout;
    }
    const int64_t slice = std::min(deadline_ns - now, kSleepSliceNs);
    const common::FutexResult r = common::futex_wait_bitset(low_word(h.availability), low_bits(w), slice, bitset);
    h.sleepers.fetch_sub(1, std::memory_order_relaxed);
    if (r == common::FutexResult::kInterrupted) return common::WaitStatus::kInterrupted;
  }
}

void Topic::wake(uint32_t bitset) {
  // SYNC: seq_cst after the seq_cst CAS that changed availability (see wait()).
  if (header().sleepers.load(std::memory_order_seq_cst) != 0) {
    common::futex_wake_bitset(low_word(header().availability), INT_MAX, bitset);
  }
}

void Topic::wake_all_now() { common::futex_wake_bitset(low_word(header().availability), INT_MAX, ~0u); }

void Topic::shutdown() {
  header().shutdown.store(1, std::memory_order_seq_cst);
  wake_all_now();
}

bool Topic::producer_alive(uint64_t token) const {
  return common::ofd_is_locked(file_.fd(), producer_liveness_byte(token), true);
}

bool Topic::reclaim_if_dead(uint64_t id, StallWatch& watch) {
  if (id >= snapshot().last || snapshot().is_available(id)) return false;
  SlotMeta& m = meta(id);
  uint64_t s = m.stamp.load(std::memory_order_acquire);
  if (s != 0 && stamp_id(s) == id) {
    // Stamped: writing (or finished, and the producer died before O3). The
    // owner lock decides; a live producer is never reclaimed here.
    const uint64_t owner = m.owner.load(std::memory_order_relaxed);
    if (owner == 0 || producer_alive(owner)) return false;
    if (stamp_state(s) == kStateWriting &&
        !m.stamp.compare_exchange_strong(s, stamp(id, kStateReclaimed), std::memory_order_acq_rel)) {
      return false;  // it moved on after all
    }
  } else {
    // Reserved but never stamped: the producer died between O1/O2 and S1.
    const int64_t now = common::monotonic_ns();
    if (watch.id != id) {
      watch = StallWatch{id, now};
      return false;
    }
    if (now - watch.since < kUnstampedPatienceNs) return false;
    // SYNC: a stalled producer's S1 is a CAS too: exactly one of us wins.
    if (!m.stamp.compare_exchange_strong(s, stamp(id, kStateReclaimed), std::memory_order_acq_rel)) return false;
  }
  if (try_make_available(header().availability, id) == MakeAvailable::kOk) wake(id_bit(id));
  return true;
}

// ------------------------------------------------------------------ producer

Producer::Producer(const TopicSpec& spec) : topic_(Topic::attach(spec)) {
  // A token whose byte is free (one taken by another live producer is skipped).
  for (int attempt = 0;; attempt++) {
    if (getrandom(&token_, sizeof(token_), 0) != sizeof(token_)) token_ = common::monotonic_ns() ^ getpid();
    token_ = token_ % kProducerTokens + 1;  // never 0: 0 is "no owner"
    if (common::ofd_try_lock(topic_->fd(), producer_liveness_byte(token_), true)) break;
    if (attempt == 64) fail(ErrorKind::kIpc, topic_->path() + ": every producer liveness byte tried is locked");
  }
}

template <class Done, class Stuck>
common::WaitStatus Producer::wait_reclaiming(Done&& done, Stuck&& stuck, int64_t deadline_ns) {
  Topic::StallWatch watch;
  for (;;) {
    const int64_t slice_end = std::min(deadline_ns, common::monotonic_ns() + kReclaimCheckNs);
    const common::WaitStatus st = topic_->wait(done, id_bit(stuck()), slice_end, gate_);
    if (st != common::WaitStatus::kTimeout || slice_end == deadline_ns) return st;
    topic_->reclaim_if_dead(stuck(), watch);
  }
}

void Producer::close() {
  if (!topic_) return;
  gate_.begin_close();
  gate_.wait_idle([&] { topic_->wake_all_now(); });  // a reserve waiting on another thread: wake it
  std::set<uint64_t> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left.swap(pending_);
  }
  for (uint64_t id : left) {  // reservations never published: readers skip them instead of waiting forever
    SlotMeta& m = topic_->meta(id);
    m.stamp.store(stamp(id, kStateCancelled), std::memory_order_release);
    if (try_make_available(topic_->header().availability, id) == MakeAvailable::kOk) topic_->wake(id_bit(id));
  }
  common::ofd_unlock(topic_->fd(), producer_liveness_byte(token_));
  topic_.reset();
}

void Producer::forget_after_fork() {
  if (topic_) topic_->forget();
  topic_.reset();
}

uint64_t Producer::oldest_in_flight() const {
  if (!topic_) return 0;
  const Availability a = topic_->snapshot();
  return a.available_end();
}

void Producer::begin_fill(uint64_t id) {
  // S1: mark the slot as being written (by us: owner) before any byte of it
  // changes. A CAS: a waiter may have reclaimed the id while we stalled
  // between O1/O2 and here (Topic::reclaim_if_dead).
  SlotMeta& m = topic_->meta(id);
  m.owner.store(token_, std::memory_order_relaxed);
  uint64_t s = m.stamp.load(std::memory_order_relaxed);
  do {
    if (s == stamp(id, kStateReclaimed)) {
      fail(ErrorKind::kIpc, topic_->path() + ": message id " + std::to_string(id) +
                                " was reclaimed (this producer stalled for over 1 s after reserving it)");
    }
  } while (!m.stamp.compare_exchange_weak(s, stamp(id, kStateWriting), std::memory_order_release,
                                          std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_release);
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.insert(id);
}

common::WaitStatus Producer::reserve_next(int64_t deadline_ns, uint64_t* id) {
  common::UseGuard use(gate_);
  if (!use.ok() || !topic_) return common::WaitStatus::kClosed;
  TopicHeader& h = topic_->header();
  for (;;) {
    if (topic_->is_shutdown()) return common::WaitStatus::kShutdown;
    const Reserve r = try_reserve_next(h.availability, id);  // O1
    if (r == Reserve::kOk) break;
    if (r == Reserve::kTooLarge) fail(ErrorKind::kInvalidArgument, "message ids are exhausted (2**48)");
    // 16 ids in flight: wait for the oldest of them (last - 16) to become
    // available, reclaiming it if its producer died.
    const common::WaitStatus st = wait_reclaiming([](const Availability& a) { return !a.window_full(); },
                                                  [this] { return topic_->snapshot().last - kWindow; }, deadline_ns);
    if (st != common::WaitStatus::kReady) return st;
  }
  begin_fill(*id);
  return common::WaitStatus::kReady;
}

common::WaitStatus Producer::reserve_id(uint64_t id, int64_t deadline_ns) {
  common::UseGuard use(gate_);
  if (!use.ok() || !topic_) return common::WaitStatus::kClosed;
  TopicHeader& h = topic_->header();
  for (;;) {
    if (topic_->is_shutdown()) return common::WaitStatus::kShutdown;
    const Reserve r = try_reserve_id(h.availability, id);  // O2
    if (r == Reserve::kOk) break;
    if (r == Reserve::kTooOld) {
      fail(ErrorKind::kInvalidArgument, "message id " + std::to_string(id) +
                                            " was reserved already (the next free id is " +
                                            std::to_string(topic_->snapshot().last) + ")");
    }
    if (r == Reserve::kTooLarge) fail(ErrorKind::kInvalidArgument, "message ids end at 2**48 - 1");
    const common::WaitStatus st = wait_reclaiming(
        [id](const Availability& a) {
          if (id < a.last) return true;  // someone else took it: try_reserve_id reports it
          const uint64_t shift = id + 1 - a.last;
          return a.available_end() + kWindow >= a.last + shift;  // everything leaving the window is available
        },
        [this] { return topic_->snapshot().available_end(); }, deadline_ns);
    if (st != common::WaitStatus::kReady) return st;
  }
  topic_->wake(~0u);  // ids skipped over became available (as gaps)
  begin_fill(id);
  return common::WaitStatus::kReady;
}

uint8_t* Producer::slot(uint64_t id) {
  if (closed()) fail(ErrorKind::kClosed, "ordered producer is closed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pending_.count(id) == 0) {
      fail(ErrorKind::kInvalidArgument, "message id " + std::to_string(id) + " is not reserved by this producer");
    }
  }
  return topic_->slot(id);
}

void Producer::take(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_.erase(id) == 0) {
    fail(ErrorKind::kInvalidArgument,
         "message id " + std::to_string(id) + " is not reserved by this producer (published or cancelled already?)");
  }
}

void Producer::publish(uint64_t id, uint64_t size, uint64_t t0, uint64_t t1) {
  common::UseGuard use(gate_);
  if (!use.ok() || !topic_) fail(ErrorKind::kClosed, "ordered producer is closed");
  if (size > topic_->slot_bytes()) {
    fail(ErrorKind::kMessageTooLarge, "message of " + std::to_string(size) + " bytes does not fit in a " +
                                          std::to_string(topic_->slot_bytes()) + "-byte slot");
  }
  take(id);
  SlotMeta& m = topic_->meta(id);
  m.size.store(size, std::memory_order_relaxed);
  m.t0.store(t0, std::memory_order_relaxed);
  m.t1.store(t1, std::memory_order_relaxed);
  m.stamp.store(stamp(id, kStateDone), std::memory_order_release);                    // S2
  if (try_make_available(topic_->header().availability, id) != MakeAvailable::kOk) {  // O3
    fail(ErrorKind::kSegment, topic_->path() + ": id " + std::to_string(id) + " was made available by someone else");
  }
  topic_->wake(id_bit(id));  // O4
}

void Producer::cancel(uint64_t id) {
  common::UseGuard use(gate_);
  if (!use.ok() || !topic_) fail(ErrorKind::kClosed, "ordered producer is closed");
  take(id);
  topic_->meta(id).stamp.store(stamp(id, kStateCancelled), std::memory_order_release);
  if (try_make_available(topic_->header().availability, id) == MakeAvailable::kOk) topic_->wake(id_bit(id));
}

common::WaitStatus Producer::send(const void* data, uint64_t size, int64_t deadline_ns, uint64_t* id) {
  if (topic_ && size > topic_->slot_bytes()) {
    fail(ErrorKind::kMessageTooLarge, "message of " + std::to_string(size) + " bytes does not fit in a " +
                                          std::to_string(topic_->slot_bytes()) + "-byte slot");
  }
  const common::WaitStatus st = reserve_next(deadline_ns, id);
  if (st != common::WaitStatus::kReady) return st;
  if (size != 0) std::memcpy(slot(*id), data, size);
  publish(*id, size);
  return common::WaitStatus::kReady;
}

// ------------------------------------------------------------------ reader

Reader::Reader(const TopicSpec& spec, Mode mode) : topic_(Topic::attach(spec)), mode_(mode) {
  // Start at the frontier: every id from the first one still in flight on.
  cursor_ = topic_->snapshot().available_end();
}

void Reader::close() {
  if (!topic_) return;
  gate_.begin_close();
  gate_.wait_idle([&] { topic_->wake_all_now(); });
  topic_.reset();
}

void Reader::forget_after_fork() {
  if (topic_) topic_->forget();
  topic_.reset();
}

bool Reader::deliverable(const Availability& a) const {
  if (mode_ == Mode::kSequential) return a.is_available(cursor_) || cursor_ < a.begin(topic_->capacity());
  uint64_t newest = 0;
  return a.newest_available(&newest) && newest >= cursor_;
}

bool Reader::next(Message* m) {
  if (closed()) fail(ErrorKind::kClosed, "ordered reader is closed");
  const uint32_t cap = topic_->capacity();
  for (;;) {
    const Availability a = topic_->snapshot();  // R1 (acquire: pairs with O3)
    uint64_t id = cursor_;
    if (mode_ == Mode::kSequential) {
      if (cursor_ < a.begin(cap)) {  // the ring has moved past ids we never read
        dropped_ += a.begin(cap) - cursor_;
        cursor_ = a.begin(cap);
        continue;
      }
      if (!a.is_available(cursor_)) return false;
    } else {
      uint64_t newest = 0;
      if (!a.newest_available(&newest) || newest < cursor_) return false;
      // The newest available id that holds a message (not a gap).
      const uint64_t floor = std::max({cursor_, a.begin(cap), newest >= kNewestScan ? newest - kNewestScan : 0});
      if (newest < floor) {  // its slot is being reused already: wait for a newer one
        cursor_ = newest + 1;
        return false;
      }
      id = newest;
      for (;;) {
        const uint64_t s = topic_->meta(id).stamp.load(std::memory_order_acquire);
        if (a.is_available(id) && s == stamp(id, kStateDone)) break;
        if (id == floor) {
          cursor_ = newest + 1;
          return false;
        }
        id--;
      }
    }
    const SlotMeta& meta = topic_->meta(id);
    const uint64_t s = meta.stamp.load(std::memory_order_acquire);  // R2
    cursor_ = id + 1;
    if (s == stamp(id, kStateDone)) {
      m->id = id;
      m->stamp = s;
      m->size = std::min(meta.size.load(std::memory_order_relaxed), topic_->slot_bytes());
      m->t0 = meta.t0.load(std::memory_order_relaxed);
      m->t1 = meta.t1.load(std::memory_order_relaxed);
      m->data = topic_->slot(id);
      return true;  // R3 (the copy) is the caller's, then still_valid() (R4)
    }
    if (s != 0 && stamp_id(s) > id) {
      dropped_++;  // overwritten by a newer id already
    } else {
      gaps_++;  // skipped by reserve_id, cancelled, or reclaimed from a dead producer
      if (s == stamp(id, kStateReclaimed)) reclaimed_++;
    }
  }
}

bool Reader::still_valid(const Message& m) {
  if (closed()) return false;
  std::atomic_thread_fence(std::memory_order_acquire);  // R4: the copy happens before this load
  if (topic_->meta(m.id).stamp.load(std::memory_order_relaxed) == m.stamp) return true;
  dropped_++;
  return false;
}

common::WaitStatus Reader::wait(int64_t deadline_ns) {
  common::UseGuard use(gate_);
  if (!use.ok() || !topic_) return common::WaitStatus::kClosed;
  const uint32_t bits = mode_ == Mode::kSequential ? id_bit(cursor_) : ~0u;
  for (;;) {  // in slices: a sequential reader reclaims the id it waits on if its producer died
    const int64_t slice_end = std::min(deadline_ns, common::monotonic_ns() + kReclaimCheckNs);
    const common::WaitStatus st =
        topic_->wait([this](const Availability& a) { return deliverable(a); }, bits, slice_end, gate_);
    if (st != common::WaitStatus::kTimeout || slice_end == deadline_ns) return st;
    if (mode_ == Mode::kSequential) topic_->reclaim_if_dead(cursor_, watch_);
  }
}

}  // namespace vipc::ordered
