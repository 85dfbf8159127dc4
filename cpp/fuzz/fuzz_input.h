// Helpers shared by the fuzz targets: a cursor over the fuzzer's bytes and a
// message sink that allocates exactly the size asked for (so reading one byte
// too many is an AddressSanitizer report, not a silent overrun).
#pragma once

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

namespace fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), left_(size) {}

  // Integers are read little-endian from the next bytes; past the end they are 0.
  template <class T>
  T take() {
    T v{};
    const size_t n = left_ < sizeof(T) ? left_ : sizeof(T);
    if (n != 0) std::memcpy(&v, p_, n);  // p_ may be null for an empty input
    p_ += n;
    left_ -= n;
    return v;
  }
  // Copy up to n bytes into dst (zero-filling the rest); returns how many came from the input.
  size_t fill(void* dst, size_t n) {
    const size_t k = left_ < n ? left_ : n;
    if (k != 0) std::memcpy(dst, p_, k);
    if (n != k) std::memset(static_cast<uint8_t*>(dst) + k, 0, n - k);
    p_ += k;
    left_ -= k;
    return k;
  }
  const uint8_t* rest() const { return p_; }
  size_t left() const { return left_; }
  bool empty() const { return left_ == 0; }

 private:
  const uint8_t* p_;
  size_t left_;
};

// A Sink for vipc::msgq::RingReader::read: one exactly-sized heap buffer per message.
struct ExactSink {
  std::unique_ptr<uint8_t[]> buf;
  size_t size = 0;
  char* prepare(size_t n) {
    buf.reset(new uint8_t[n]);
    size = n;
    return reinterpret_cast<char*>(buf.get());
  }
  void discard() {
    buf.reset();
    size = 0;
  }
};

// A private directory for segment files: in $VIPC_TEST_TMPDIR (tests/system/test_fuzz.py
// removes it afterwards), else /dev/shm, else /tmp.
inline std::string make_temp_dir() {
  const char* base = getenv("VIPC_TEST_TMPDIR");
  std::string templ =
      std::string(base && *base ? base : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp")) + "/vipc-fuzz-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) abort();
  return templ;
}

// sockaddr_un of an abstract address (leading NUL included in `address`).
inline socklen_t abstract_address(const std::string& address, sockaddr_un& sa) {
  sa = sockaddr_un{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, address.data(), address.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
}

}  // namespace fuzz
