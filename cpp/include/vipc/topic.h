// Topics (MSGQ): one Publisher, up to 64 Subscribers, on a shared-memory ring.
// Wire-compatible with the Python msgq package on the same RunOptions.
//
// Threads: an object is used by one thread at a time, except close(), which
// any thread may call to end a wait in progress (it then throws Error(closed)).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "vipc/error.h"

namespace vipc {

struct TopicOptions {
  RunOptions run;
  std::size_t segment_size = 0;  // ring bytes; 0: the existing segment's, or the default (10 MiB)
  bool conflate = false;         // subscribers: keep only the newest message
  // Subscribers: the longest busy-wait of a blocking receive before it sleeps
  // on a futex (Python's spin_us, MSGQ_SPIN_US; 0 never spins). Spinning
  // saves the wake-up on an idle core; on an oversubscribed machine it costs.
  std::chrono::microseconds spin{50};
  // Publishers: how a send wakes sleeping subscribers (Wake; MSGQ_WAKE).
  Wake wake = Wake::all;
};

using Bytes = std::vector<std::byte>;

class VIPC_API Publisher {
 public:
  // Creates or takes over the topic; the previous publisher's next send throws
  // Error(multiple_publishers).
  explicit Publisher(std::string_view topic, const TopicOptions& options = {});
  ~Publisher();
  Publisher(Publisher&&) noexcept;
  Publisher& operator=(Publisher&&) noexcept;

  void send(std::span<const std::byte> message);
  void send(std::string_view message) { send(std::as_bytes(std::span(message.data(), message.size()))); }

  // Zero-copy: room for up to max_size bytes inside the ring; fill it, then
  // commit(n <= max_size) publishes n bytes. Nothing else is sent in between.
  // The span stays writable until commit(), even when another thread closes
  // the publisher meanwhile (commit() then throws Error(closed), nothing is sent).
  std::span<std::byte> loan(std::size_t max_size);
  void commit(std::size_t size);

  std::size_t num_readers();
  bool all_readers_updated();
  std::size_t max_message_size() const;
  // How send() wakes sleeping subscribers, and how many this publisher's own system
  // calls have woken so far (Wake::handoff: at most one per message).
  Wake wake() const;
  uint64_t readers_woken() const;
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class VIPC_API Subscriber {
 public:
  explicit Subscriber(std::string_view topic, const TopicOptions& options = {});
  ~Subscriber();
  Subscriber(Subscriber&&) noexcept;
  Subscriber& operator=(Subscriber&&) noexcept;

  // The next message, or nullopt when none came within the timeout.
  std::optional<Bytes> receive(Timeout timeout = kForever);
  // Same, into `out` (its capacity is reused): false when none came.
  bool receive_into(Bytes& out, Timeout timeout = kForever);

  // Event loops: arm(), then wait until fd() is readable, then receive(Timeout{0})
  // until nullopt. arm() returns true (and arms nothing) when a message is
  // already waiting.
  int fd();
  bool arm();
  void disarm();
  void close();

 private:
  friend class Poller;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Waits on several subscribers at once.
class VIPC_API Poller {
 public:
  Poller();
  ~Poller();
  Poller(Poller&&) noexcept;
  Poller& operator=(Poller&&) noexcept;

  void add(Subscriber& subscriber);  // the subscriber must outlive its polls
  // Indices (in add() order) of the subscribers with a message waiting.
  std::vector<std::size_t> poll(Timeout timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vipc
