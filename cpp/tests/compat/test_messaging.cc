// The reference's msgq/tests/test_messaging.py scenarios, in C++ against the
// reference's header names ("msgq/ipc.h") as its C++ users write them.
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compat_check.h"
#include "msgq/ipc.h"

static std::string random_bytes(std::mt19937& rng, size_t length = 1000) {
  std::string s(length, '\0');
  for (char& c : s) c = static_cast<char>(rng() % 0xff);
  return s;
}

static std::string text(Message* m) { return std::string(m->getData(), m->getSize()); }

static std::vector<std::string> drain(SubSocket* sock) {
  std::vector<std::string> out;
  while (Message* m = sock->receive(true)) {
    out.push_back(text(m));
    delete m;
  }
  return out;
}

TEST(test_pub_sub) {
  std::mt19937 rng(1);
  std::unique_ptr<Context> ctx(Context::create());
  const std::string sock = random_sock();
  std::unique_ptr<PubSocket> pub(PubSocket::create(ctx.get(), sock));
  std::unique_ptr<SubSocket> sub(SubSocket::create(ctx.get(), sock, "127.0.0.1", false));
  CHECK(pub && sub);
  for (int i = 0; i < 100; i++) {
    std::string msg = random_bytes(rng);
    CHECK(pub->send(msg.data(), msg.size()) == static_cast<int>(msg.size()));
    std::unique_ptr<Message> recvd(sub->receive());
    CHECK(recvd && text(recvd.get()) == msg);
  }
}

TEST(test_conflate) {
  std::mt19937 rng(2);
  std::unique_ptr<Context> ctx(Context::create());
  const std::string sock = random_sock();
  std::unique_ptr<PubSocket> pub(PubSocket::create(ctx.get(), sock));
  for (bool conflate : {true, false}) {
    const int num_msgs = 3 + static_cast<int>(rng() % 8);
    std::unique_ptr<SubSocket> sub(SubSocket::create(ctx.get(), sock, "127.0.0.1", conflate));
    std::vector<std::string> sent;
    for (int i = 0; i < num_msgs; i++) {
      sent.push_back(random_bytes(rng));
      Message m;
      m.init(sent.back().data(), sent.back().size());
      CHECK(pub->sendMessage(&m) == static_cast<int>(sent.back().size()));
    }
    std::vector<std::string> recvd = drain(sub.get());
    if (conflate) {
      CHECK(recvd.size() == 1 && recvd[0] == sent.back());
    } else {
      CHECK(recvd == sent);
    }
  }
}

TEST(test_receive_timeout) {
  std::unique_ptr<Context> ctx(Context::create());
  std::unique_ptr<SubSocket> sub(SubSocket::create(ctx.get(), random_sock()));
  CHECK(sub);
  const int timeout_ms = 5;
  sub->setTimeout(timeout_ms);
  const auto start = std::chrono::steady_clock::now();
  Message* recvd = sub->receive();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(recvd == nullptr);
  CHECK(elapsed >= std::chrono::milliseconds(timeout_ms));
}

TEST(test_connect_refuses_a_remote_address_without_aborting) {
  std::unique_ptr<Context> ctx(Context::create());
  std::unique_ptr<SubSocket> sub(SubSocket::create());
  CHECK(sub->connect(ctx.get(), random_sock(), "10.0.0.1") == -1);
  CHECK(sub->receive(true) == nullptr);
  CHECK(SubSocket::create(ctx.get(), "bad/name") == nullptr);
}

int main() { return run_compat_tests(); }
