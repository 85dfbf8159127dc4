// Fixtures shared by the C++ tests: a private segment directory, a ring on the
// heap (no files, exact size so ASan catches any access past its end), and a
// Sink that keeps one message in an exactly-sized buffer.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "msgq/layout.h"
#include "msgq/ring.h"

namespace testing {

// A fresh directory for segment files, removed with whatever is left in it.
// Created in $VIPC_TEST_TMPDIR when set (the pytest driver points it at a
// directory it removes even if a test aborts), else /dev/shm when usable
// (the real thing), else $TMPDIR or /tmp.
class TempDir {
 public:
  TempDir() {
    const char* given = std::getenv("VIPC_TEST_TMPDIR");
    const char* tmp = std::getenv("TMPDIR");
    std::string base = "/tmp";
    if (given != nullptr && *given != '\0') {
      base = given;
    } else if (access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    } else if (tmp != nullptr) {
      base = tmp;
    }
    std::string templ = base + "/vipc-test-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) check::failed(__FILE__, __LINE__, "mkdtemp in " + base);
    path_ = templ;
  }
  ~TempDir() {
    for (const std::string& name : entries()) unlink((path_ + "/" + name).c_str());
    rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
      }
      closedir(d);
    }
    return names;
  }

 private:
  std::string path_;
};

// A segment laid out as in shared memory, but on the heap: header, then
// exactly data_size bytes of ring.
class HeapRing {
 public:
  explicit HeapRing(uint32_t data_size) : data_size_(data_size) {
    const size_t bytes = vipc::msgq::kHeaderSize + data_size;
    mem_ = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t{vipc::msgq::kCacheLine}));
    std::memset(mem_, 0, bytes);
    vipc::msgq::SegmentHeader& h = *header();
    h.magic = vipc::msgq::kMagic;
    h.layout_version = vipc::msgq::kLayoutVersion;
    h.header_size = vipc::msgq::kHeaderSize;
    h.data_size = data_size;
    h.max_readers = vipc::msgq::kMaxReaders;
    h.state.store(vipc::msgq::kStateReady, std::memory_order_relaxed);
  }
  ~HeapRing() { ::operator delete(mem_, std::align_val_t{vipc::msgq::kCacheLine}); }
  HeapRing(const HeapRing&) = delete;
  HeapRing& operator=(const HeapRing&) = delete;

  vipc::msgq::SegmentHeader* header() const { return reinterpret_cast<vipc::msgq::SegmentHeader*>(mem_); }
  uint8_t* data() const { return mem_ + vipc::msgq::kHeaderSize; }
  uint32_t data_size() const { return data_size_; }
  vipc::msgq::RingView view() const { return vipc::msgq::RingView{header(), data(), data_size_}; }
  vipc::msgq::ReaderSlot& slot(uint32_t i) const { return header()->readers[i]; }

  // What Subscriber::claim_slot does, minus the file lock: register, then reset.
  vipc::msgq::RingReader add_reader(uint32_t i) {
    header()->reader_mask.fetch_or(uint64_t{1} << i, std::memory_order_seq_cst);
    vipc::msgq::RingReader reader(view(), i);
    reader.reset();
    return reader;
  }

  int64_t prefix_at(uint32_t offset) const { return vipc::msgq::load_prefix(data() + offset); }
  void set_prefix_at(uint32_t offset, int64_t value) { vipc::msgq::store_prefix(data() + offset, value); }

 private:
  uint32_t data_size_;
  uint8_t* mem_;
};

// Holds the last message in a buffer of exactly its size (so an overrun is an
// ASan error, not silent), counting prepare() and discard() calls.
struct VecSink {
  std::unique_ptr<char[]> buf;
  size_t size = 0;
  int prepared = 0;
  int discarded = 0;

  char* prepare(size_t n) {
    prepared++;
    buf.reset(new char[n]);  // new char[0] is a valid, unreadable allocation
    size = n;
    return buf.get();
  }
  void discard() {
    discarded++;
    buf.reset();
    size = 0;
  }
  std::string str() const { return std::string(buf.get(), size); }
};

}  // namespace testing
