// The reference's msgq/ipc.h (commaai/msgq) on vipc::Publisher / Subscriber /
// Poller. Its error style: nullptr or -1 with errno, a line on stderr where
// the reference printed one; never an abort.
#include "msgq/ipc.h"

#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>

#include "vipc/topic.h"

namespace {

int errno_of(vipc::ErrorKind kind) {
  switch (kind) {
    case vipc::ErrorKind::multiple_publishers:
      return EADDRINUSE;  // what the reference's send() sets
    case vipc::ErrorKind::message_too_large:
      return EMSGSIZE;
    case vipc::ErrorKind::invalid_argument:
      return EINVAL;
    case vipc::ErrorKind::permission:
      return EACCES;
    case vipc::ErrorKind::no_space:
      return ENOSPC;
    case vipc::ErrorKind::too_many_readers:
      return EBUSY;
    case vipc::ErrorKind::closed:
      return EBADF;
    case vipc::ErrorKind::timeout:
      return ETIMEDOUT;
    default:
      return EIO;
  }
}

// Runs f; on vipc::Error sets errno (and keeps the message for create()'s report) and returns false.
template <class F>
bool attempt(std::string* why, F&& f) {
  try {
    f();
    return true;
  } catch (const vipc::Error& e) {
    if (why != nullptr) *why = e.what();
    errno = errno_of(e.kind());
    return false;
  }
}

vipc::Timeout timeout_of(int ms) { return ms < 0 ? vipc::kForever : vipc::Timeout(ms); }

class ShmSubSocket : public SubSocket {
 public:
  int connect(Context* context, std::string endpoint, std::string address, bool conflate, bool check_endpoint,
              size_t segment_size) override {
    (void)check_endpoint;
    if (context == nullptr || address != "127.0.0.1") {  // shared memory is local only
      why_ = context == nullptr ? "no Context" : "address '" + address + "' is not local (127.0.0.1)";
      errno = EINVAL;
      return -1;
    }
    sub_.reset();
    return attempt(&why_,
                   [&] {
                     const vipc::TopicOptions options{vipc::RunOptions::from_environment(), segment_size, conflate,
                                                      vipc::RunOptions::spin_from_environment()};
                     sub_.emplace(endpoint, options);
                   })
               ? 0
               : -1;
  }
  void setTimeout(int timeout) override { timeout_ms_ = timeout < 0 ? -1 : timeout; }
  Message* receive(bool non_blocking) override {
    if (!sub_) {
      errno = ENOTCONN;
      return nullptr;
    }
    bool got = false;
    if (!attempt(nullptr, [&] {
          got = sub_->receive_into(buffer_, non_blocking ? vipc::Timeout(0) : timeout_of(timeout_ms_));
        })) {
      return nullptr;
    }
    if (!got) return nullptr;
    auto* msg = new Message();
    msg->init(reinterpret_cast<char*>(buffer_.data()), buffer_.size());
    return msg;
  }
  vipc::Subscriber* subscriber() { return sub_ ? &*sub_ : nullptr; }
  const std::string& why() const { return why_; }

 private:
  std::optional<vipc::Subscriber> sub_;
  int timeout_ms_ = -1;
  vipc::Bytes buffer_;
  std::string why_;
};

class ShmPoller : public Poller {
 public:
  void registerSocket(SubSocket* socket) override {
    auto* s = dynamic_cast<ShmSubSocket*>(socket);
    if (s == nullptr || s->subscriber() == nullptr) {
      std::cerr << "Poller::registerSocket: not a connected SubSocket of this library; ignored" << std::endl;
      return;
    }
    poller_.add(*s->subscriber());
    sockets_.push_back(socket);
  }
  std::vector<SubSocket*> poll(int timeout) override {
    std::vector<SubSocket*> out;
    std::vector<size_t> ready;
    attempt(nullptr, [&] { ready = poller_.poll(timeout_of(timeout)); });
    for (size_t i : ready) out.push_back(sockets_[i]);
    return out;
  }

 private:
  vipc::Poller poller_;
  std::vector<SubSocket*> sockets_;
};

}  // namespace

Context* Context::create() { return new Context(); }

void Message::init(size_t sz) {
  close();
  size = sz;
  data = new char[sz];
}

void Message::init(char* d, size_t sz) {
  init(sz);
  if (sz != 0) std::memcpy(data, d, sz);
}

void Message::takeOwnership(char* d, size_t sz) {
  close();
  size = sz;
  data = d;
}

void Message::close() {
  delete[] data;
  data = nullptr;
  size = 0;
}

Message::~Message() { close(); }

SubSocket* SubSocket::create() { return new ShmSubSocket(); }

SubSocket* SubSocket::create(Context* context, std::string endpoint, std::string address, bool conflate,
                             bool check_endpoint, size_t segment_size) {
  auto* s = new ShmSubSocket();
  if (s->connect(context, endpoint, address, conflate, check_endpoint, segment_size) == 0) return s;
  const int err = errno;
  std::cerr << "Error, failed to connect SubSocket to " << endpoint << ": " << s->why() << std::endl;
  delete s;
  errno = err;
  return nullptr;
}

struct PubSocket::Impl {
  std::optional<vipc::Publisher> pub;
  std::string why;
};

int PubSocket::connect(Context* context, std::string endpoint, bool check_endpoint, size_t segment_size) {
  (void)check_endpoint;
  if (impl == nullptr) impl = new Impl();
  if (context == nullptr) {
    impl->why = "no Context";
    errno = EINVAL;
    return -1;
  }
  impl->pub.reset();
  vipc::TopicOptions options{vipc::RunOptions::from_environment(), segment_size, false};
  options.wake = vipc::RunOptions::wake_from_environment();  // MSGQ_WAKE
  return attempt(&impl->why, [&] { impl->pub.emplace(endpoint, options); }) ? 0 : -1;
}

int PubSocket::sendMessage(Message* message) { return send(message->getData(), message->getSize()); }

int PubSocket::send(char* data, size_t size) {
  if (impl == nullptr || !impl->pub) {
    errno = ENOTCONN;
    return -1;
  }
  const bool ok = attempt(nullptr, [&] { impl->pub->send(std::span(reinterpret_cast<const std::byte*>(data), size)); });
  return ok ? static_cast<int>(size) : -1;
}

bool PubSocket::all_readers_updated() {
  bool r = false;
  if (impl != nullptr && impl->pub) attempt(nullptr, [&] { r = impl->pub->all_readers_updated(); });
  return r;
}

PubSocket* PubSocket::create() { return new PubSocket(); }

PubSocket* PubSocket::create(Context* context, std::string endpoint, bool check_endpoint, size_t segment_size) {
  auto* s = new PubSocket();
  if (s->connect(context, endpoint, check_endpoint, segment_size) == 0) return s;
  const int err = errno;
  std::cerr << "Error, failed to bind PubSocket to " << endpoint << ": " << s->impl->why << std::endl;
  delete s;
  errno = err;
  return nullptr;
}

PubSocket::~PubSocket() { delete impl; }

Poller* Poller::create() { return new ShmPoller(); }

Poller* Poller::create(std::vector<SubSocket*> sockets) {
  Poller* p = Poller::create();
  for (SubSocket* s : sockets) p->registerSocket(s);
  return p;
}
