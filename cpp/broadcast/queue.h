// The lossless broadcast queue (cpp/broadcast/README.md): one Writer, n Readers known at
// creation, a ring of chunks. The writer reuses a chunk only after every
// reader consumed it, so no reader ever loses a message; a slow reader slows
// the writer down instead (the caller warns, naming it: pending_readers()).
// Steps BW1..BW3 / BR1..BR3 are in cpp/broadcast/README.md.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "broadcast/layout.h"
#include "common/shm_file.h"
#include "common/use_gate.h"
#include "common/wait_status.h"

namespace vipc::broadcast {

struct QueueSpec : common::ShmFileSpec {
  // Creation only (the writer); readers take them from the header.
  uint32_t n_readers = 0;
  uint32_t n_chunks = 0;
  uint64_t chunk_bytes = 0;
};

// One attached queue file: mapped, validated, its immutable sizes copied.
class QueueFile {
 public:
  static std::shared_ptr<QueueFile> create(const QueueSpec& spec);
  static std::shared_ptr<QueueFile> open(const QueueSpec& spec);
  QueueHeader& header() const { return *reinterpret_cast<QueueHeader*>(file_.data()); }
  ChunkMeta& meta(uint32_t i) const { return reinterpret_cast<ChunkMeta*>(file_.data() + sizeof(QueueHeader))[i]; }
  uint8_t* chunk(uint32_t i) const { return file_.data() + header_bytes_ + size_t{i} * chunk_bytes_; }
  uint32_t n_readers() const { return n_readers_; }
  uint32_t n_chunks() const { return n_chunks_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t all_readers() const { return n_readers_ == 64 ? ~uint64_t{0} : (uint64_t{1} << n_readers_) - 1; }
  int fd() const { return file_.fd(); }
  const std::string& path() const { return file_.path(); }
  bool reader_attached(uint32_t rank) const;
  void forget() { file_.forget(); }

 private:
  QueueFile() = default;
  std::string header_problem(size_t file_size) const;
  common::ShmFile file_;
  uint32_t n_readers_ = 0, n_chunks_ = 0;
  uint64_t chunk_bytes_ = 0, header_bytes_ = 0;
};

// Set the shared shutdown flag and wake every waiter, reader or writer.
void shutdown_queue(QueueHeader& h);

struct Part {
  const void* data;
  uint64_t size;
};

class Writer {
 public:
  explicit Writer(const QueueSpec& spec);
  ~Writer() { close(); }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Wait until the chunk of the next message is free (BW1), the deadline
  // (monotonic ns, common::kNever) passes, a signal arrives, or the queue is
  // shut down / closed.
  common::WaitStatus wait_writable(int64_t deadline_ns);
  // wait_writable() would return kReady at once: the bindings skip the GIL release.
  bool writable_now() const;
  // Readers (bit r) that have not yet consumed the chunk the next message needs.
  uint64_t pending_readers() const;
  // Bytes a message of these parts takes; fits() if it is at most chunk_bytes().
  bool fits(const Part* parts, size_t n) const;
  // BW2 + BW3: copy the parts into the next chunk and publish it. Call after
  // wait_writable() returned kReady. kMessageTooLarge if it does not fit.
  void write(uint32_t flags, const Part* parts, size_t n);
  // Every reader consumed message seq (or its chunk already holds a later
  // one): the writer may drop what it keeps for it (an overflow file).
  bool consumed_by_all(uint64_t seq) const;

  void shutdown();
  uint64_t written() const { return seq_; }
  const std::shared_ptr<QueueFile>& file() const { return file_; }
  // Calls in flight on other threads end (kClosed / Error(closed)); then the
  // queue is shut down: readers drain what was written, then see kShutdown.
  void close();
  bool closed() const { return file_ == nullptr || gate_.closing(); }
  void forget_after_fork();

 private:
  bool writable() const;
  std::shared_ptr<QueueFile> file_;
  uint64_t seq_ = 0;  // sequence number of the next message
  common::UseGate gate_;
};

// What peek() found: flags and the parts, pointing into the chunk.
struct ChunkView {
  uint32_t flags = 0;
  std::vector<Part> parts;
};

class Reader {
 public:
  Reader(const QueueSpec& spec, uint32_t rank);
  ~Reader() { close(); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Wait until the next message is written (BR1), or the deadline / a signal /
  // shutdown (only once every message written before it was consumed) / close.
  common::WaitStatus wait_readable(int64_t deadline_ns);
  // BR1 + BR2: the next message, in place (valid until consume()), or false.
  // A frame that does not fit its chunk (a corrupt peer) throws kSegment.
  bool peek(ChunkView& view);
  // BR3: hand the chunk back to the writer and move on. True if this
  // reader's bit completed the chunk's mask (every reader has consumed it).
  bool consume();
  // Readers may shut the queue down too (the flag is shared).
  void shutdown();

  uint32_t rank() const { return rank_; }
  uint64_t consumed() const { return seq_; }
  const std::shared_ptr<QueueFile>& file() const { return file_; }
  // May come from another thread: waits for calls in flight (wait, peek,
  // consume, and whatever a caller holds the gate() across, such as a copy out
  // of the chunk peek() found), then unmaps. Later calls throw kClosed.
  void close();
  bool closed() const;
  void forget_after_fork();
  // Held across peek() .. consume() by a caller that reads the chunk in
  // between without other protection (the Python binding, which copies and
  // unpickles there): close() waits for it.
  common::UseGate& gate() { return gate_; }

 private:
  bool readable() const;
  int64_t poll_budget_ns() const;
  std::shared_ptr<QueueFile> file_;
  uint32_t rank_;
  uint64_t seq_ = 0;  // sequence number of the next message to read
  // Moving average of this reader's recent waits (one thread: the reader's).
  // A wait polls (yielding) for about twice that, at most kMaxPollNs, before it
  // sleeps: a stream of messages is then caught without a futex wake-up, and
  // an idle queue costs no CPU once kMaxPollNs have passed without a message.
  int64_t typical_wait_ns_ = 100'000;
  mutable common::UseGate gate_;  // SYNC: UseGate's enter/begin_close pairing; file_ is reset only once idle
};

}  // namespace vipc::broadcast
