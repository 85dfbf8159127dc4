// The native C++ API (vipc/vipc.h) against an installed visionipc: topics,
// zero copy both ways, the error model, fds for event loops, leases.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <vipc/vipc.h>

#include "../compat/compat_check.h"

static vipc::TopicOptions topic_options(bool conflate = false) {
  return {.run = vipc::RunOptions::from_environment(), .conflate = conflate};
}

template <class F>
static vipc::ErrorKind error_of(F&& f) {
  try {
    f();
  } catch (const vipc::Error& e) {
    return e.kind();
  }
  CHECK(!"no vipc::Error thrown");
  return vipc::ErrorKind::ipc;
}

static std::string text(const vipc::Bytes& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

TEST(test_publish_receive_and_zero_copy_loan) {
  const std::string topic = random_sock();
  vipc::Publisher pub(topic, topic_options());
  vipc::Subscriber sub(topic, topic_options());
  pub.send(std::string_view("hello"));
  std::span<std::byte> room = pub.loan(16);
  std::memcpy(room.data(), "in place", 8);
  pub.commit(8);
  CHECK(text(*sub.receive(vipc::Timeout(1000))) == "hello");
  CHECK(text(*sub.receive(vipc::Timeout(1000))) == "in place");
  CHECK(!sub.receive(vipc::Timeout(0)));
  CHECK(pub.num_readers() == 1);
}

TEST(test_errors_are_one_exception_type_with_a_kind) {
  const std::string topic = random_sock();
  CHECK(error_of([] { vipc::Publisher bad("no/slash"); }) == vipc::ErrorKind::invalid_argument);
  vipc::Publisher first(topic, topic_options());
  vipc::Publisher second(topic, topic_options());
  CHECK(error_of([&] { first.send(std::string_view("x")); }) == vipc::ErrorKind::multiple_publishers);
  CHECK(error_of([&] { second.send(vipc::Bytes(second.max_message_size() + 1)); }) ==
        vipc::ErrorKind::message_too_large);
  vipc::Publisher moved = std::move(second);
  CHECK(error_of([&] { second.send(std::string_view("x")); }) == vipc::ErrorKind::closed);
}

TEST(test_the_fd_wakes_an_event_loop_and_the_poller_reports_ready_subscribers) {
  const std::string topic = random_sock(), other = random_sock();
  vipc::Publisher pub(topic, topic_options());
  vipc::Subscriber sub(topic, topic_options()), idle(other, topic_options());
  CHECK(!sub.arm());  // nothing waiting: armed
  std::thread writer([&] { pub.send(std::string_view("wake")); });
  pollfd p{sub.fd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 5000) == 1);
  writer.join();
  sub.disarm();
  CHECK(text(*sub.receive(vipc::Timeout(0))) == "wake");
  vipc::Poller poller;
  poller.add(idle);
  poller.add(sub);
  CHECK(poller.poll(vipc::Timeout(0)).empty());
  pub.send(std::string_view("again"));
  CHECK(poller.poll(vipc::Timeout(1000)) == std::vector<std::size_t>{1});
}

TEST(test_close_from_another_thread_ends_a_blocking_receive) {
  vipc::Subscriber sub(random_sock(), topic_options());
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sub.close();
  });
  CHECK(error_of([&] { sub.receive(); }) == vipc::ErrorKind::closed);
  closer.join();
}

// close() from another thread while messages and frames flow: the reader's
// call in flight finishes or ends with Error(closed), never on unmapped memory.
TEST(test_close_from_another_thread_while_messages_and_frames_flow) {
  for (int round = 0; round < 20; round++) {
    const std::string topic = random_sock();
    vipc::Publisher pub(topic, topic_options());
    vipc::Subscriber sub(topic, topic_options());
    vipc::FrameServer server(topic, {.run = vipc::RunOptions::from_environment()});
    server.create_buffers("road", 4, 256, 128, vipc::PixelFormat::gray8);
    server.start_listener();
    vipc::FrameClient client(topic, "road", {.run = vipc::RunOptions::from_environment()});
    CHECK(client.connect(vipc::Timeout(5000)));
    std::atomic<bool> stop{false};
    std::atomic<int> busy{0};
    std::thread producer([&] {
      const std::string payload(4096, 'm');
      for (uint64_t id = 1; !stop.load(); id++) {
        pub.send(std::string_view(payload));
        try {
          vipc::WriteBuffer buf = server.get_buffer("road");
          std::memset(buf.data().data(), static_cast<int>(id & 0xff), buf.data().size());
          server.send(std::move(buf), {id, 0, 0});
        } catch (const vipc::Error& e) {
          CHECK(e.kind() == vipc::ErrorKind::closed);
        }
      }
    });
    std::thread messages([&] {
      vipc::Bytes out;
      try {
        for (;;) {
          if (sub.receive_into(out, vipc::Timeout(1000))) busy.fetch_or(1);
        }
      } catch (const vipc::Error& e) {
        CHECK(e.kind() == vipc::ErrorKind::closed);
      }
    });
    std::thread frames([&] {
      try {
        for (;;) {
          std::optional<vipc::Frame> f = client.recv(vipc::Timeout(1000));
          if (!f) continue;
          busy.fetch_or(2);
          const auto want = static_cast<std::byte>(f->info().frame_id & 0xff);
          bool intact = true;
          for (size_t i = 0; i < f->data().size(); i += 37) intact = intact && f->data()[i] == want;
          if (f->valid()) CHECK(intact);
        }
      } catch (const vipc::Error& e) {
        CHECK(e.kind() == vipc::ErrorKind::closed);
      }
    });
    while (busy.load() != 3) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (round % 5)));
    sub.close();
    client.close();
    messages.join();
    frames.join();
    server.close();  // while the producer may be in get_buffer or send
    stop.store(true);
    producer.join();
    CHECK(error_of([&] { sub.receive(vipc::Timeout(0)); }) == vipc::ErrorKind::closed);
    CHECK(error_of([&] { client.recv(vipc::Timeout(0)); }) == vipc::ErrorKind::closed);
    CHECK(error_of([&] { server.get_buffer("road"); }) == vipc::ErrorKind::closed);
  }
}

TEST(test_a_loan_stays_writable_when_another_thread_closes_the_publisher) {
  const std::string topic = random_sock();
  vipc::Subscriber sub(topic, topic_options());
  vipc::Publisher pub(topic, topic_options());
  std::span<std::byte> loan = pub.loan(64 * 1024);
  std::thread closer([&] { pub.close(); });
  closer.join();
  std::memset(loan.data(), 7, loan.size());  // still mapped: no crash
  CHECK(error_of([&] { pub.commit(loan.size()); }) == vipc::ErrorKind::closed);
  CHECK(!sub.receive(vipc::Timeout(0)).has_value());  // nothing was published
}

TEST(test_frames_zero_copy_with_leases_and_generations) {
  const std::string name = random_sock();
  vipc::FrameServer server(name, {.run = vipc::RunOptions::from_environment()});
  server.create_buffers("road", 1, 64, 48, vipc::PixelFormat::gray8);
  server.start_listener();
  vipc::FrameClient client(name, "road", {.run = vipc::RunOptions::from_environment()});
  CHECK(client.connect(vipc::Timeout(5000)));
  const vipc::Geometry g = client.geometry();
  CHECK(g.format == vipc::PixelFormat::gray8 && g.width == 64 && g.stride == 64 && client.num_buffers() == 1);
  CHECK(!client.arm());
  vipc::WriteBuffer buf = server.get_buffer("road");
  CHECK(buf.generation() % 2 == 1 && buf.data().size() == g.size);
  std::memset(buf.data().data(), 7, g.size);
  server.send(std::move(buf), {.frame_id = 1});
  CHECK(!buf);
  CHECK(error_of([&] { server.send(std::move(buf), {}); }) == vipc::ErrorKind::invalid_argument);
  pollfd p{client.fd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 5000) == 1);
  std::optional<vipc::Frame> f = client.recv(vipc::Timeout(0));
  CHECK(f && f->info().frame_id == 1 && f->data()[g.size - 1] == std::byte{7} && f->valid());
  // The only buffer is leased: the next get_buffer() must recycle it, and the
  // frame the client holds says so instead of showing torn pixels.
  vipc::WriteBuffer again = server.get_buffer("road");
  CHECK(!f->valid());
  std::memset(again.data().data(), 2, g.size);
  server.send(std::move(again), {.frame_id = 2});
  std::optional<vipc::Frame> last = client.recv(vipc::Timeout(1000));
  CHECK(last && last->info().frame_id == 2 && last->valid() && last->data()[0] == std::byte{2});
  CHECK(vipc::FrameClient::available_streams(name, {.run = vipc::RunOptions::from_environment()}) ==
        std::vector<std::string>{"road"});
  client.close();
  CHECK(last->data()[0] == std::byte{2});  // the frame keeps its mapping
  CHECK(error_of([&] { server.create_buffers("bad", 0, 64, 48); }) == vipc::ErrorKind::invalid_argument);
}

// Four subscribers asleep on a topic whose publisher hands wake-ups on: every
// message reaches every one of them before the next is sent (a wake-up lost
// would leave one asleep until the 5 s timeout), and the publisher itself
// wakes at most one subscriber per message.
TEST(test_a_handoff_publisher_wakes_every_sleeping_subscriber) {
  const std::string topic = random_sock();
  vipc::TopicOptions options = topic_options();
  options.spin = std::chrono::microseconds(0);  // sleep at once: every message finds sleepers
  options.wake = vipc::Wake::handoff;
  vipc::Publisher pub(topic, options);
  constexpr int kReaders = 4, kMessages = 50;
  std::atomic<int> received{0}, failures{0};
  std::vector<std::thread> readers;
  std::atomic<int> attached{0};
  for (int r = 0; r < kReaders; r++) {
    readers.emplace_back([&] {
      vipc::Subscriber sub(topic, options);
      attached++;
      for (int i = 0; i < kMessages; i++) {
        std::optional<vipc::Bytes> m = sub.receive(vipc::Timeout(5000));
        if (!m || text(*m) != std::to_string(i)) failures++;
        received++;
      }
    });
  }
  while (attached.load() < kReaders || pub.num_readers() < kReaders)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; i < kMessages; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let them fall asleep
    pub.send(std::to_string(i));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (received.load() < (i + 1) * kReaders && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    CHECK(received.load() == (i + 1) * kReaders);
  }
  for (auto& t : readers) t.join();
  CHECK(failures.load() == 0);
  CHECK(pub.wake() == vipc::Wake::handoff);
  CHECK(pub.readers_woken() > 0 && pub.readers_woken() <= static_cast<uint64_t>(kMessages));
}

// The same for frames: a FrameServer with Wake::handoff and three clients
// asleep in recv(); every frame reaches every client before the next.
TEST(test_a_handoff_frame_server_reaches_every_sleeping_client) {
  const std::string name = random_sock();
  vipc::ServerOptions options{.run = vipc::RunOptions::from_environment()};
  options.wake = vipc::Wake::handoff;
  vipc::FrameServer server(name, options);
  server.create_buffers("road", 8, 64, 48, vipc::PixelFormat::gray8);
  server.start_listener();
  constexpr int kClients = 3, kFrames = 30;
  std::atomic<int> received{0}, connected{0}, failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; c++) {
    clients.emplace_back([&] {
      vipc::FrameClient client(name, "road", {.run = vipc::RunOptions::from_environment()});
      if (!client.connect(vipc::Timeout(5000))) failures++;
      connected++;
      for (int i = 1; i <= kFrames; i++) {
        std::optional<vipc::Frame> f = client.recv(vipc::Timeout(5000));
        if (!f || f->info().frame_id != static_cast<uint64_t>(i)) failures++;
        received++;
      }
    });
  }
  while (connected.load() < kClients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(server.num_clients("road") == kClients && server.wake() == vipc::Wake::handoff);
  CHECK(error_of([&] { server.num_clients("nope"); }) == vipc::ErrorKind::invalid_argument);
  for (int i = 1; i <= kFrames; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    server.send(server.get_buffer("road"), {.frame_id = static_cast<uint64_t>(i)});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (received.load() < i * kClients && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    CHECK(received.load() == i * kClients);
  }
  for (auto& t : clients) t.join();
  CHECK(failures.load() == 0);
  CHECK(server.readers_woken("road") > 0 && server.readers_woken("road") <= static_cast<uint64_t>(kFrames));
}

// The invalid_argument message F throws ("" if it throws none).
template <class F>
static std::string refusal_of(F&& f) {
  try {
    f();
  } catch (const vipc::Error& e) {
    CHECK(e.kind() == vipc::ErrorKind::invalid_argument);
    return e.what();
  }
  return "";
}

// The names Python's msgq.names refuses, refused here too in the same words
// (one rule: cpp/common/names.cc); before, the C++ API made segments of them.
TEST(test_topic_names_follow_the_one_name_rule) {
  const vipc::TopicOptions options = topic_options();
  CHECK(refusal_of([&] { vipc::Publisher bad("with space", options); }) ==
        "topic name 'with space' may only use letters, digits and _ . : - (no '/', no '..', not starting with '.')");
  CHECK(refusal_of([&] { vipc::Publisher bad("..", options); }).find("topic name '..' may only use") == 0);
  CHECK(refusal_of([&] { vipc::Subscriber bad("a\x1b[2Jb", options); }).find("topic name 'a\\x1b[2Jb' may") == 0);
  CHECK(refusal_of([&] { vipc::Publisher bad("", options); }) == "topic name must not be empty");
  CHECK(refusal_of([&] { vipc::Publisher bad(std::string(129, 'x'), options); }).find("is 129 characters long") !=
        std::string::npos);
  vipc::TopicOptions prefixed = options;
  prefixed.run.prefix = "../up";
  CHECK(refusal_of([&] { vipc::Publisher bad("fine", prefixed); }).find("prefix '../up' may only use") == 0);
  CHECK(refusal_of([&] { vipc::Publisher good(random_sock() + "_Az09.:-", options); }).empty());
}

TEST(test_run_options_default_to_the_cores_shm_dir_and_msgq_shm_dir) {
  // The public header names no directory: the default is the core's (cpp/common/names.h).
  CHECK(vipc::RunOptions{}.shm_dir == "/dev/shm");
  CHECK(vipc::RunOptions::default_shm_dir() == "/dev/shm");
  const char* outer = std::getenv("MSGQ_SHM_DIR");
  const std::string saved = outer == nullptr ? "" : outer;
  CHECK(setenv("MSGQ_SHM_DIR", "/elsewhere", 1) == 0);
  CHECK(vipc::RunOptions::from_environment().shm_dir == "/elsewhere");
  CHECK(unsetenv("MSGQ_SHM_DIR") == 0);
  CHECK(vipc::RunOptions::from_environment().shm_dir == "/dev/shm");
  if (outer != nullptr) CHECK(setenv("MSGQ_SHM_DIR", saved.c_str(), 1) == 0);
}

TEST(test_msgq_wake_from_the_environment) {
  CHECK(setenv("MSGQ_WAKE", "handoff", 1) == 0);
  CHECK(vipc::RunOptions::wake_from_environment() == vipc::Wake::handoff);
  CHECK(setenv("MSGQ_WAKE", " handoff\n", 1) == 0);  // blanks around it do not count, as in Python
  CHECK(vipc::RunOptions::wake_from_environment() == vipc::Wake::handoff);
  CHECK(setenv("MSGQ_WAKE", "  ", 1) == 0);
  CHECK(vipc::RunOptions::wake_from_environment() == vipc::Wake::all);
  CHECK(setenv("MSGQ_WAKE", "sometimes", 1) == 0);
  CHECK(error_of([] { vipc::RunOptions::wake_from_environment(); }) == vipc::ErrorKind::invalid_argument);
  // Worded as Python's msgq words it (tests/system/test_cpp_install.py compares the two).
  CHECK(refusal_of([] { vipc::RunOptions::wake_from_environment(); }) ==
        "MSGQ_WAKE must be 'all' or 'handoff', not 'sometimes'");
  CHECK(unsetenv("MSGQ_WAKE") == 0);
  CHECK(vipc::RunOptions::wake_from_environment() == vipc::Wake::all);
}

TEST(test_msgq_spin_from_the_environment) {
  using std::chrono::microseconds;
  const auto spin = [] { return vipc::RunOptions::spin_from_environment(); };
  CHECK(unsetenv("MSGQ_SPIN_US") == 0);
  CHECK(spin() == microseconds(50));
  CHECK(setenv("MSGQ_SPIN_US", " 0 ", 1) == 0);
  CHECK(spin() == microseconds(0));
  CHECK(setenv("MSGQ_SPIN_US", "1000000", 1) == 0);
  CHECK(spin() == microseconds(1'000'000));
  const std::pair<const char*, const char*> refused[] = {
      {"abc", "MSGQ_SPIN_US='abc' must be an integer from 0 to 1000000"},
      {"12us", "MSGQ_SPIN_US='12us' must be an integer from 0 to 1000000"},
      {"1000001", "MSGQ_SPIN_US must be 0 to 1000000, got 1000001"},
      {"-5", "MSGQ_SPIN_US must be 0 to 1000000, got -5"},
      {"99999999999999999999", "MSGQ_SPIN_US must be 0 to 1000000, got 99999999999999999999"},
  };
  for (const auto& [value, message] : refused) {
    CHECK(setenv("MSGQ_SPIN_US", value, 1) == 0);
    CHECK(refusal_of(spin) == message);
  }
  CHECK(unsetenv("MSGQ_SPIN_US") == 0);
}

int main() { return run_compat_tests(); }
