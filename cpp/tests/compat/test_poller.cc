// The reference's msgq/tests/test_poller.py scenarios, in C++ against "msgq/ipc.h".
#include <atomic>
#include <cerrno>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "compat_check.h"
#include "msgq/ipc.h"

static const std::string SERVICE_NAME = random_sock();

// One subscriber in a thread: connects, says so, polls, then receives what the poll reported.
static std::vector<std::string> poller(std::atomic<bool>* connected) {
  std::unique_ptr<Context> context(Context::create());
  std::unique_ptr<Poller> p(Poller::create());
  std::unique_ptr<SubSocket> sub(SubSocket::create());
  CHECK(sub->connect(context.get(), SERVICE_NAME, "127.0.0.1") == 0);
  p->registerSocket(sub.get());
  connected->store(true);
  std::vector<std::string> r;
  for (SubSocket* s : p->poll(10000)) {
    std::unique_ptr<Message> m(s->receive(true));
    CHECK(m);
    r.emplace_back(m->getData(), m->getSize());
  }
  return r;
}

static void wait_for(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A publisher, a polling subscriber in a thread, `extra` more subscribers
// created meanwhile (they must not disturb the poll), then one message.
static void poll_once_with(int extra) {
  std::unique_ptr<Context> context(Context::create());
  std::unique_ptr<PubSocket> pub(PubSocket::create());
  CHECK(pub->connect(context.get(), SERVICE_NAME) == 0);
  std::atomic<bool> connected{false};
  auto poll = std::async(std::launch::async, poller, &connected);
  wait_for(connected);
  std::unique_ptr<Context> c(Context::create());
  for (int i = 0; i < extra; i++) {
    std::unique_ptr<SubSocket> s(SubSocket::create());
    CHECK(s->connect(c.get(), SERVICE_NAME, "127.0.0.1") == 0);
  }
  char a[] = "a";
  CHECK(pub->send(a, 1) == 1);
  CHECK(poll.get() == std::vector<std::string>{"a"});
}

TEST(test_poll_once) { poll_once_with(0); }

TEST(test_poll_and_create_many_subscribers) { poll_once_with(10); }

// Python's MultiplePublishersError: in C++ the older publisher's send() fails with EADDRINUSE.
TEST(test_multiple_publishers_exception) {
  std::unique_ptr<Context> context(Context::create());
  std::unique_ptr<PubSocket> pub1(PubSocket::create());
  CHECK(pub1->connect(context.get(), SERVICE_NAME) == 0);
  std::unique_ptr<PubSocket> pub2(PubSocket::create());
  CHECK(pub2->connect(context.get(), SERVICE_NAME) == 0);
  char a[] = "a";
  errno = 0;
  CHECK(pub1->send(a, 1) == -1);
  CHECK(errno == EADDRINUSE);
  CHECK(pub2->send(a, 1) == 1);
}

TEST(test_multiple_messages) {
  std::unique_ptr<Context> context(Context::create());
  std::unique_ptr<PubSocket> pub(PubSocket::create());
  CHECK(pub->connect(context.get(), SERVICE_NAME) == 0);
  std::unique_ptr<SubSocket> sub(SubSocket::create());
  CHECK(sub->connect(context.get(), SERVICE_NAME, "127.0.0.1") == 0);
  for (int i = 1; i < 100; i++) {
    std::string msg(static_cast<size_t>(i), 'a');
    CHECK(pub->send(msg.data(), msg.size()) == i);
  }
  bool msg_seen = false;
  int i = 1;
  for (;;) {
    std::unique_ptr<Message> r(sub->receive(true));
    if (r) {
      CHECK(std::string(r->getData(), r->getSize()) == std::string(static_cast<size_t>(i), 'a'));
      msg_seen = true;
      i++;
    }
    if (!r && msg_seen) break;
  }
  CHECK(i == 100);
}

TEST(test_conflate) {
  std::unique_ptr<Context> context(Context::create());
  std::unique_ptr<PubSocket> pub(PubSocket::create());
  CHECK(pub->connect(context.get(), SERVICE_NAME) == 0);
  std::unique_ptr<SubSocket> sub(SubSocket::create());
  CHECK(sub->connect(context.get(), SERVICE_NAME, "127.0.0.1", true) == 0);
  char a[] = "a", b[] = "b";
  pub->send(a, 1);
  pub->send(b, 1);
  std::unique_ptr<Message> r(sub->receive());
  CHECK(r && std::string(r->getData(), r->getSize()) == "b");
}

int main() { return run_compat_tests(); }
