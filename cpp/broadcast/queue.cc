#include "broadcast/queue.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "common/errors.h"

namespace vipc::broadcast {

using common::ErrorKind;
using common::fail;

namespace {

// How long the writer's waits poll (yielding) before they sleep on the futex:
// a steady stream of messages then costs no sleep / wake-up per message.
constexpr int64_t kPollNs = 100'000;
// A reader's waits poll adaptively (Reader::poll_budget_ns), never longer than
// this: messages up to 1 ms apart are caught polling, as a busy reader would
// (no wake-up latency), and a reader whose queue went quiet sleeps after 1 ms.
constexpr int64_t kMaxPollNs = 1'000'000;

void check_sizes(const QueueSpec& s) {
  if (s.n_readers < 1 || s.n_readers > kMaxReaders) {
    fail(ErrorKind::kInvalidArgument, "a broadcast queue has 1 to " + std::to_string(kMaxReaders) +
                                          " local readers, not " + std::to_string(s.n_readers));
  }
  common::check_range<uint64_t>("max_chunks", s.n_chunks, 1, kMaxChunks);
  common::check_range<uint64_t>("chunk_bytes", s.chunk_bytes, kMinChunkBytes, kMaxChunkBytes);
}

}  // namespace

std::shared_ptr<QueueFile> QueueFile::create(const QueueSpec& spec) {
  common::check_basename(spec.basename);
  check_sizes(spec);
  std::shared_ptr<QueueFile> q(new QueueFile());
  q->file_ = common::ShmFile::open_locked(spec.dir, spec.basename, spec.mode);
  if (!q->file_.alone_at_open()) {
    fail(ErrorKind::kInvalidArgument, q->path() +
                                          " is in use by another broadcast queue (or another program): "
                                          "pick another name, or close that queue first");
  }
  q->n_readers_ = spec.n_readers;
  q->n_chunks_ = spec.n_chunks;
  q->chunk_bytes_ = (spec.chunk_bytes + kCacheLine - 1) & ~uint64_t{kCacheLine - 1};
  q->header_bytes_ = header_bytes(spec.n_chunks);
  q->file_.allocate(q->header_bytes_ + q->n_chunks_ * q->chunk_bytes_, spec.mode);
  QueueHeader& h = q->header();  // zero-filled by allocate
  h.layout_version = kLayoutVersion;
  h.n_readers = q->n_readers_;
  h.n_chunks = q->n_chunks_;
  h.chunk_bytes = q->chunk_bytes_;
  h.header_bytes = q->header_bytes_;
  h.creator_uid = geteuid();
  h.created_ns = static_cast<uint64_t>(common::realtime_ns());
  // Published to attachers by the init lock; magic last so an interrupted
  // creation is recognised as unfinished.
  std::atomic_ref<uint64_t>(h.magic).store(kMagic, std::memory_order_release);
  q->file_.finish_attach();
  return q;
}

std::shared_ptr<QueueFile> QueueFile::open(const QueueSpec& spec) {
  common::check_basename(spec.basename);
  std::shared_ptr<QueueFile> q(new QueueFile());
  q->file_ = common::ShmFile::open_locked(spec.dir, spec.basename, spec.mode);
  const size_t size = q->file_.size_at_open();
  if (size < sizeof(QueueHeader)) {
    fail(ErrorKind::kInvalidArgument, q->path() +
                                          ": no broadcast queue of that name (its writer is gone, "
                                          "or was never created)");
  }
  q->file_.map(size);
  if (const std::string problem = q->header_problem(size); !problem.empty()) {
    fail(ErrorKind::kSegment, q->path() + ": " + problem);
  }
  q->file_.finish_attach();
  return q;
}

std::string QueueFile::header_problem(size_t file_size) const {
  const QueueHeader& h = header();
  if (h.magic != kMagic) return "not a broadcast queue (no magic number: unfinished, or another program's file)";
  if (h.layout_version != kLayoutVersion) {
    return "created by an incompatible broadcast queue layout version " + std::to_string(h.layout_version);
  }
  if (h.n_readers < 1 || h.n_readers > kMaxReaders || h.n_chunks < 1 || h.n_chunks > kMaxChunks ||
      h.chunk_bytes < kMinChunkBytes || h.chunk_bytes > kMaxChunkBytes || h.chunk_bytes % kCacheLine != 0 ||
      h.header_bytes != header_bytes(h.n_chunks) || h.header_bytes + h.n_chunks * h.chunk_bytes != file_size) {
    return "corrupt header (sizes do not match the file)";
  }
  // Immutable from here on: copied, never re-read.
  auto* self = const_cast<QueueFile*>(this);
  self->n_readers_ = h.n_readers;
  self->n_chunks_ = h.n_chunks;
  self->chunk_bytes_ = h.chunk_bytes;
  self->header_bytes_ = h.header_bytes;
  return {};
}

bool QueueFile::reader_attached(uint32_t rank) const {
  return common::ofd_is_locked(fd(), kLockReaderBase + rank, true);
}

// ------------------------------------------------------------------ writer

Writer::Writer(const QueueSpec& spec) : file_(QueueFile::create(spec)) {
  common::ofd_lock(file_->fd(), kLockWriter, true);
  file_->header().writer_pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
}

void Writer::close() {
  if (!file_) return;
  gate_.begin_close();
  QueueHeader& h = file_->header();
  gate_.wait_idle([&] { common::wake_all_now(h.space_free); });  // a wait on another thread: wake it, let it leave
  // Only now, so that a call on another thread ends with kClosed, not kShutdown.
  shutdown_queue(h);
  file_.reset();
}

void Writer::forget_after_fork() {
  if (file_) file_->forget();
  file_.reset();
}

bool Writer::writable() const {
  // BW1: the chunk is free if it was never written, or every reader consumed it.
  const ChunkMeta& m = file_->meta(static_cast<uint32_t>(seq_ % file_->n_chunks()));
  if (m.written.load(std::memory_order_relaxed) == 0) return true;
  // SYNC: acquire pairs with each reader's release fetch_or at BR3: their
  // copies out of the chunk happen before we overwrite it.
  return m.read_mask.load(std::memory_order_acquire) == file_->all_readers();
}

bool Writer::writable_now() const {
  return !closed() && writable() && file_->header().shutdown.load(std::memory_order_seq_cst) == 0;
}

uint64_t Writer::pending_readers() const {
  if (closed()) return 0;
  const ChunkMeta& m = file_->meta(static_cast<uint32_t>(seq_ % file_->n_chunks()));
  if (m.written.load(std::memory_order_relaxed) == 0) return 0;
  return file_->all_readers() & ~m.read_mask.load(std::memory_order_acquire);
}

bool Writer::consumed_by_all(uint64_t seq) const {
  if (closed()) return false;
  // Message seq's chunk now holds a later message, or every reader's bit.
  const ChunkMeta& m = file_->meta(static_cast<uint32_t>(seq % file_->n_chunks()));
  if (m.written.load(std::memory_order_relaxed) != seq + 1) return true;
  return m.read_mask.load(std::memory_order_acquire) == file_->all_readers();  // SYNC: as in writable()
}

common::WaitStatus Writer::wait_writable(int64_t deadline_ns) {
  common::UseGuard use(gate_);
  if (!use.ok() || !file_) return common::WaitStatus::kClosed;
  QueueHeader& h = file_->header();
  auto stop = [&] { return h.shutdown.load(std::memory_order_seq_cst) != 0 || gate_.closing(); };
  auto ready = [&] { return writable() || stop(); };
  // Readers a short while behind: poll for the one chunk (no sleep, no wake-up).
  common::WaitStatus r =
      common::wait_until(h.space_free, ready, std::min(deadline_ns, common::monotonic_ns() + kPollNs), kPollNs);
  if (r == common::WaitStatus::kTimeout && !ready() && common::monotonic_ns() < deadline_ns) {
    // BW1's hysteresis: the ring is full and the readers are far behind.
    // Sleep until a quarter of the ring is free, not one chunk: a writer
    // ahead of slow readers is then woken once per n_chunks / 4 messages
    // rather than once per message (a system call and two context switches
    // each). The chunk of message seq_ was written (the ring is full), so
    // seq_ >= n_chunks and the message awaited, below, exists.
    const uint64_t n = file_->n_chunks();
    const uint64_t batch = std::max<uint64_t>(1, n / 4);
    const uint64_t last_needed = seq_ + batch - 1 - n;  // frees chunks seq_ .. seq_ + batch - 1
    h.space_wanted.store(last_needed + 1, std::memory_order_relaxed);
    auto batch_ready = [&] { return consumed_by_all(last_needed) || stop(); };
    r = common::wait_until(h.space_free, batch_ready, deadline_ns);  // at the deadline, one free chunk will do
  }
  if (gate_.closing()) return common::WaitStatus::kClosed;
  if (h.shutdown.load(std::memory_order_seq_cst) != 0) return common::WaitStatus::kShutdown;
  // The chunk may have been freed after the short poll timed out (before the
  // batch wait's check): that is success, not a timeout. Otherwise r == kReady
  // meant stop(), answered above.
  if (writable()) return common::WaitStatus::kReady;
  return r == common::WaitStatus::kInterrupted ? common::WaitStatus::kInterrupted : common::WaitStatus::kTimeout;
}

bool Writer::fits(const Part* parts, size_t n) const {
  if (n > kMaxParts) return false;
  size_t total = sizeof(ChunkFrame) + 8 * n;
  for (size_t i = 0; i < n; i++) total += align8(parts[i].size);
  return total <= file_->chunk_bytes();
}

void Writer::write(uint32_t flags, const Part* parts, size_t n) {
  common::UseGuard use(gate_);
  if (!use.ok() || !file_) fail(ErrorKind::kClosed, "broadcast queue writer is closed");
  QueueHeader& h = file_->header();
  if (h.shutdown.load(std::memory_order_acquire) != 0) fail(ErrorKind::kClosed, "broadcast queue was shut down");
  if (!fits(parts, n)) {
    fail(ErrorKind::kMessageTooLarge, "message does not fit in a " + std::to_string(file_->chunk_bytes()) +
                                          "-byte chunk (send it with the overflow flag)");
  }
  if (!writable()) fail(ErrorKind::kIpc, "write() before wait_writable() said the chunk is free");
  const uint32_t c = static_cast<uint32_t>(seq_ % file_->n_chunks());
  ChunkMeta& m = file_->meta(c);
  uint8_t* chunk = file_->chunk(c);
  // BW2: clear the read flags, then fill the chunk. Nobody reads it now: every
  // reader consumed its previous message and waits for written == seq + 1.
  m.read_mask.store(0, std::memory_order_relaxed);
  auto* lens = reinterpret_cast<uint64_t*>(chunk + sizeof(ChunkFrame));
  size_t at = sizeof(ChunkFrame) + 8 * n;
  for (size_t i = 0; i < n; i++) {
    lens[i] = parts[i].size;
    if (parts[i].size != 0) std::memcpy(chunk + at, parts[i].data, parts[i].size);
    at += align8(parts[i].size);
  }
  ChunkFrame frame{flags, static_cast<uint32_t>(n), at};
  std::memcpy(chunk, &frame, sizeof(frame));
  // BW3: publish. SYNC: release pairs with the reader's acquire load at BR1.
  m.written.store(seq_ + 1, std::memory_order_release);
  seq_++;
  h.written.store(seq_, std::memory_order_release);
  common::notify_all(h.data_ready);
}

void shutdown_queue(QueueHeader& h) {
  h.shutdown.store(1, std::memory_order_seq_cst);
  common::notify_all(h.data_ready);
  common::notify_all(h.space_free);
}

void Writer::shutdown() {
  if (file_) shutdown_queue(file_->header());
}

void Reader::shutdown() {
  const common::UseGuard use(gate_);
  if (use.ok() && file_) shutdown_queue(file_->header());
}

// ------------------------------------------------------------------ reader

Reader::Reader(const QueueSpec& spec, uint32_t rank) : file_(QueueFile::open(spec)), rank_(rank) {
  if (rank >= file_->n_readers()) {
    const uint32_t n = file_->n_readers();
    file_.reset();
    fail(ErrorKind::kInvalidArgument, "reader rank " + std::to_string(rank) + " does not exist: the queue has " +
                                          std::to_string(n) + " local readers (ranks 0.." + std::to_string(n - 1) +
                                          ")");
  }
  if (!common::ofd_try_lock(file_->fd(), kLockReaderBase + rank, true)) {
    const uint32_t pid = file_->header().readers[rank].pid.load(std::memory_order_relaxed);
    file_.reset();
    fail(ErrorKind::kInvalidArgument,
         "reader " + std::to_string(rank) + " is already attached (pid " + std::to_string(pid) + ")");
  }
  ReaderSlot& slot = file_->header().readers[rank];
  // A reader that comes back under the same rank continues where its
  // predecessor stopped: the writer has kept every message since for it.
  seq_ = slot.consumed.load(std::memory_order_relaxed);
  // Killed between BR3's fetch_or and its store of `consumed`: the writer may
  // already have reused that chunk for a later message, which proves we had
  // consumed it.
  if (file_->meta(static_cast<uint32_t>(seq_ % file_->n_chunks())).written.load(std::memory_order_acquire) > seq_ + 1) {
    seq_++;
  }
  slot.pid.store(static_cast<uint32_t>(getpid()), std::memory_order_relaxed);
}

void Reader::close() {
  if (!file_) return;
  gate_.begin_close();
  QueueHeader& h = file_->header();
  gate_.wait_idle([&] { common::wake_all_now(h.data_ready); });
  common::ofd_unlock(file_->fd(), kLockReaderBase + rank_);
  file_.reset();
}

void Reader::forget_after_fork() {
  if (file_) file_->forget();
  file_.reset();
}

bool Reader::readable() const {
  // BR1. SYNC: acquire pairs with the writer's release store at BW3.
  const ChunkMeta& m = file_->meta(static_cast<uint32_t>(seq_ % file_->n_chunks()));
  return m.written.load(std::memory_order_acquire) == seq_ + 1;
}

int64_t Reader::poll_budget_ns() const {
  // Polling pays when the next message is likely within the limit.
  return typical_wait_ns_ > kMaxPollNs ? 0 : std::min(kMaxPollNs, 2 * typical_wait_ns_ + 10'000);
}

common::WaitStatus Reader::wait_readable(int64_t deadline_ns) {
  common::UseGuard use(gate_);
  if (!use.ok() || !file_) return common::WaitStatus::kClosed;
  QueueHeader& h = file_->header();
  auto ready = [&] { return readable() || h.shutdown.load(std::memory_order_seq_cst) != 0 || gate_.closing(); };
  const int64_t start = common::monotonic_ns();
  const common::WaitStatus r = common::wait_until(h.data_ready, ready, deadline_ns, poll_budget_ns());
  if (r == common::WaitStatus::kReady) {
    const int64_t waited = std::min(common::monotonic_ns() - start, 4 * kMaxPollNs);  // a long pause counts once
    typical_wait_ns_ = (3 * typical_wait_ns_ + waited) / 4;
  }
  if (gate_.closing()) return common::WaitStatus::kClosed;
  if (readable()) return common::WaitStatus::kReady;  // messages written before a shutdown are still delivered
  if (h.shutdown.load(std::memory_order_seq_cst) != 0) return common::WaitStatus::kShutdown;
  return r;  // kReady, kTimeout or kInterrupted
}

bool Reader::closed() const {
  const common::UseGuard use(gate_);
  return !use.ok() || file_ == nullptr;
}

bool Reader::peek(ChunkView& view) {
  const common::UseGuard use(gate_);
  if (!use.ok() || !file_) fail(ErrorKind::kClosed, "broadcast queue reader is closed");
  if (!readable()) return false;
  // BR2: the chunk is ours to read until BR3. Every size read from it is
  // bounds-checked: a corrupt peer cannot make us read outside the chunk.
  const uint8_t* chunk = file_->chunk(static_cast<uint32_t>(seq_ % file_->n_chunks()));
  const uint64_t cap = file_->chunk_bytes();
  ChunkFrame frame;
  std::memcpy(&frame, chunk, sizeof(frame));
  if (frame.n_parts > kMaxParts || sizeof(ChunkFrame) + 8 * uint64_t{frame.n_parts} > cap) {
    fail(ErrorKind::kSegment, file_->path() + ": corrupt chunk (part table larger than the chunk)");
  }
  view.flags = frame.flags;
  view.parts.clear();
  uint64_t at = sizeof(ChunkFrame) + 8 * uint64_t{frame.n_parts};
  for (uint32_t i = 0; i < frame.n_parts; i++) {
    uint64_t len;
    std::memcpy(&len, chunk + sizeof(ChunkFrame) + 8 * i, 8);
    if (len > cap || at + len > cap) fail(ErrorKind::kSegment, file_->path() + ": corrupt chunk (part past its end)");
    view.parts.push_back(Part{chunk + at, len});
    at += align8(len);
  }
  return true;
}

bool Reader::consume() {
  const common::UseGuard use(gate_);
  if (!use.ok() || !file_) fail(ErrorKind::kClosed, "broadcast queue reader is closed");
  if (!readable()) return false;
  QueueHeader& h = file_->header();
  ChunkMeta& m = file_->meta(static_cast<uint32_t>(seq_ % file_->n_chunks()));
  // BR3. SYNC: release orders our copy out of the chunk before the writer's
  // acquire load of read_mask (BW1) lets it overwrite the chunk.
  const uint64_t bit = uint64_t{1} << rank_;
  const uint64_t before = m.read_mask.fetch_or(bit, std::memory_order_release);
  seq_++;
  h.readers[rank_].consumed.store(seq_, std::memory_order_relaxed);
  // The writer waits for chunks every reader consumed (BW1), a batch of
  // them when it sleeps: only the last reader of a chunk can complete one,
  // and it wakes the writer only once the last message the writer needs is
  // consumed (the others would wake it for nothing, a system call each).
  // The seq_cst fence in notify_all_if pairs with the writer's sleeper
  // registration, which follows its store of space_wanted.
  if ((before | bit) != file_->all_readers()) return false;
  const uint64_t done = seq_;  // messages 0 .. seq_ - 1 consumed by this reader
  common::notify_all_if(h.space_free, [&] { return done >= h.space_wanted.load(std::memory_order_relaxed); });
  return true;
}

}  // namespace vipc::broadcast
