// vipc::Publisher / Subscriber / Poller on the core's msgq ring (cpp/msgq).
#include "vipc/topic.h"

#include <unistd.h>

#include <utility>

#include "api/guard.h"
#include "common/names.h"
#include "common/use_gate.h"
#include "msgq/publisher.h"
#include "msgq/segment.h"
#include "msgq/subscriber.h"

namespace vipc {

namespace {

msgq::SegmentSpec spec_for(std::string_view topic, const TopicOptions& options) {
  // The rule Python's msgq.names applies (one implementation: common/names.h).
  common::check_name("topic name", topic, common::kMaxTopicNameLength);
  if (!options.run.prefix.empty()) common::check_name("prefix", options.run.prefix, common::kMaxPrefixLength);
  msgq::SegmentSpec spec;
  spec.dir = options.run.shm_dir;
  spec.basename = msgq::segment_basename(options.run.prefix, api::str(topic));
  spec.data_size = options.segment_size;
  return spec;
}

// A message read straight into a byte vector (one copy out of the ring).
struct VectorSink {
  Bytes& out;
  char* prepare(size_t n) {
    out.resize(n);
    return reinterpret_cast<char*>(out.data());
  }
  void discard() { out.clear(); }
};

[[noreturn]] void moved_from() { throw Error(ErrorKind::closed, "use of a moved-from or closed object"); }

// A message into `out`, waiting up to `timeout` for one (false: none came).
bool read_or_wait(msgq::Subscriber& sub, Bytes& out, Timeout timeout) {
  VectorSink sink{out};
  if (sub.try_read(sink)) return true;
  if (timeout.count() == 0) return false;
  const int64_t deadline = api::deadline_of(timeout);
  for (;;) {
    const common::WaitStatus st = sub.wait(deadline);
    if (st == common::WaitStatus::kClosed)
      common::fail(common::ErrorKind::kClosed, "subscriber was closed while waiting");
    if (sub.try_read(sink)) return true;
    if (st == common::WaitStatus::kTimeout) return false;
    if (deadline != common::kNever && common::monotonic_ns() >= deadline) return false;
  }
}

}  // namespace

struct Publisher::Impl {
  explicit Impl(const msgq::SegmentSpec& spec) : pub(spec) {}
  msgq::Publisher pub;
};

Publisher::Publisher(std::string_view topic, const TopicOptions& options)
    : impl_(api::guarded([&] {
        auto impl = std::make_unique<Impl>(spec_for(topic, options));
        impl->pub.set_wake_mode(api::wake_mode(options.wake));
        return impl;
      })) {}
Publisher::~Publisher() = default;
Publisher::Publisher(Publisher&&) noexcept = default;
Publisher& Publisher::operator=(Publisher&&) noexcept = default;

void Publisher::send(std::span<const std::byte> message) {
  if (!impl_) moved_from();
  api::guarded([&] { impl_->pub.send(message.data(), message.size()); });
}

std::span<std::byte> Publisher::loan(std::size_t max_size) {
  if (!impl_) moved_from();
  return api::guarded([&] { return std::span(reinterpret_cast<std::byte*>(impl_->pub.loan(max_size)), max_size); });
}

void Publisher::commit(std::size_t size) {
  if (!impl_) moved_from();
  api::guarded([&] { impl_->pub.commit(size); });
}

Wake Publisher::wake() const {
  if (!impl_) moved_from();
  return api::public_wake(impl_->pub.wake_mode());
}

uint64_t Publisher::readers_woken() const {
  if (!impl_) moved_from();
  return impl_->pub.readers_woken();
}

std::size_t Publisher::num_readers() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->pub.num_readers(); });
}

bool Publisher::all_readers_updated() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->pub.all_readers_updated(); });
}

std::size_t Publisher::max_message_size() const {
  if (!impl_) moved_from();
  return impl_->pub.max_message_size();
}

void Publisher::close() {
  if (impl_) impl_->pub.close();
}

struct Subscriber::Impl {
  explicit Impl(std::shared_ptr<msgq::Subscriber> s) : sub(std::move(s)) {}
  std::shared_ptr<msgq::Subscriber> sub;
  // Calls in flight (receive, fd, arm, disarm): a close() on another thread
  // ends a wait (interrupt), waits for them to leave, then unmaps; later calls
  // throw closed. SYNC: UseGate's enter/begin_close pairing.
  common::UseGate calls;
  template <class F>
  auto use(F&& f) {
    const common::UseOrClosed in(calls, "subscriber is closed");
    return f();
  }
};

Subscriber::Subscriber(std::string_view topic, const TopicOptions& options)
    : impl_(api::guarded([&] {
        auto sub = std::make_shared<msgq::Subscriber>(spec_for(topic, options), options.conflate);
        sub->set_spin_limit_ns(std::chrono::nanoseconds(options.spin).count());
        return std::make_unique<Impl>(std::move(sub));
      })) {}
Subscriber::~Subscriber() = default;
Subscriber::Subscriber(Subscriber&&) noexcept = default;
Subscriber& Subscriber::operator=(Subscriber&&) noexcept = default;

bool Subscriber::receive_into(Bytes& out, Timeout timeout) {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->use([&] { return read_or_wait(*impl_->sub, out, timeout); }); });
}

std::optional<Bytes> Subscriber::receive(Timeout timeout) {
  Bytes out;
  if (!receive_into(out, timeout)) return std::nullopt;
  return out;
}

int Subscriber::fd() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->use([&] { return impl_->sub->fileno(); }); });
}

bool Subscriber::arm() {
  if (!impl_) moved_from();
  return api::guarded([&] { return impl_->use([&] { return impl_->sub->arm(); }); });
}

void Subscriber::disarm() {
  if (!impl_) moved_from();
  api::guarded([&] { impl_->use([&] { impl_->sub->disarm(); }); });
}

void Subscriber::close() {
  if (!impl_) return;
  impl_->calls.begin_close();
  impl_->sub->interrupt();   // a receive asleep on the ring returns: closed
  impl_->calls.wait_idle();  // one reading a message finishes it
  impl_->sub->close();
}

struct Poller::Impl {
  msgq::Poller poller;
  std::vector<size_t> ready;
};

Poller::Poller() : impl_(api::guarded([] { return std::make_unique<Impl>(); })) {}
Poller::~Poller() = default;
Poller::Poller(Poller&&) noexcept = default;
Poller& Poller::operator=(Poller&&) noexcept = default;

void Poller::add(Subscriber& subscriber) {
  if (!impl_ || !subscriber.impl_) moved_from();
  api::guarded([&] { impl_->poller.add(subscriber.impl_->sub); });
}

std::vector<std::size_t> Poller::poll(Timeout timeout) {
  if (!impl_) moved_from();
  return api::guarded([&] {
    const int64_t deadline = api::deadline_of(timeout);
    for (;;) {
      const int64_t left = deadline == common::kNever ? -1 : std::max<int64_t>(0, deadline - common::monotonic_ns());
      const common::WaitStatus st = impl_->poller.poll(left, impl_->ready);
      if (!impl_->ready.empty() || st == common::WaitStatus::kTimeout || left == 0) return impl_->ready;
    }
  });
}

}  // namespace vipc
