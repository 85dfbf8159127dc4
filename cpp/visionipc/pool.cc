#include "visionipc/pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "common/errors.h"
#include "visionipc/format.h"

namespace vipc::visionipc {

PoolLayout make_layout(uint32_t count, uint64_t buffer_size) {
  if (count == 0 || count > kMaxBuffers) {
    common::fail(common::ErrorKind::kInvalidArgument,
                 "buffer count " + std::to_string(count) + " must be 1.." + std::to_string(kMaxBuffers));
  }
  PoolLayout l;
  l.count = count;
  l.buffer_size = buffer_size;
  l.slot_size = align_up(buffer_size, kBufferAlign);
  l.data_offset = align_up(uint64_t{count} * sizeof(BufferMeta), kBufferAlign);
  l.total_size = l.data_offset + uint64_t{count} * l.slot_size;
  return l;
}

Mapping::Mapping(int fd, size_t size, bool writable, size_t read_only_prefix) : size_(size) {
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) common::fail_errno("mmap of a frame pool (" + std::to_string(size) + " bytes)");
  data_ = static_cast<uint8_t*>(p);
  if (writable && read_only_prefix != 0 && mprotect(p, read_only_prefix, PROT_READ) != 0) {
    const int err = errno;
    munmap(p, size);
    common::fail_errno("mprotect of a frame pool's metadata", err);
  }
}

Mapping::~Mapping() { munmap(data_, size_); }

namespace {

// The first number in a small text file (or after `key` in it); nullopt if absent.
std::optional<uint64_t> read_number(const std::string& path, const std::string& key = "") {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string word;
  while (in >> word) {
    if (!key.empty() && word != key) continue;
    if (!key.empty() && !(in >> word)) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
    if (errno != 0 || end == word.c_str() || *end != '\0') return std::nullopt;  // "max": no limit
    return v;
  }
  return std::nullopt;
}

// Our cgroup v2 directory (from "0::/path" in /proc/self/cgroup).
std::string cgroup2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "";
}

void consider(uint64_t value, const std::string& source, uint64_t& limit, std::string* why) {
  if (value >= limit) return;
  limit = value;
  if (why != nullptr) *why = source;
}

}  // namespace

uint64_t pool_memory_limit(std::string* why) {
  uint64_t limit = UINT64_MAX;
  if (auto kb = read_number("/proc/meminfo", "MemAvailable:")) {
    consider(*kb * 1024, "the memory available (MemAvailable " + std::to_string(*kb * 1024) + " bytes)", limit, why);
  }
  const std::string v2 = cgroup2_dir();
  auto max = v2.empty() ? std::nullopt : read_number(v2 + "/memory.max");
  auto used = v2.empty() ? std::nullopt : read_number(v2 + "/memory.current");
  std::string kind = "cgroup v2 memory.max";
  if (!max) {
    max = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    kind = "cgroup v1 memory.limit_in_bytes";
  }
  if (max) {
    const uint64_t total = *max, in_use = used.value_or(0);  // plain values: GCC 12 misreads optionals here
    const uint64_t room = total > in_use ? total - in_use : 0;
    consider(room,
             "the room left under this process's " + kind + " (" + std::to_string(total) + " bytes, " +
                 std::to_string(in_use) + " used)",
             limit, why);
  }
  if (const char* cap = std::getenv("VIPC_MAX_POOL_BYTES"); cap != nullptr && *cap != '\0') {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(cap, &end, 10);
    if (errno != 0 || *end != '\0' || cap[0] == '-' || v == 0) {
      common::fail(common::ErrorKind::kInvalidArgument,
                   "VIPC_MAX_POOL_BYTES=" + std::string(cap).substr(0, 40) + " must be a positive number of bytes");
    }
    consider(v, "VIPC_MAX_POOL_BYTES=" + std::to_string(v), limit, why);
  }
  return limit;
}

common::UniqueFd create_sealed_memfd(const char* name, size_t size) {
  std::string why;
  if (const uint64_t limit = pool_memory_limit(&why); size > limit) {
    common::fail(common::ErrorKind::kNoSpace, std::string(name) + " needs " + std::to_string(size) +
                                                  " bytes of shared memory but this process may take at most " +
                                                  std::to_string(limit) + " (" + why +
                                                  "): use fewer or smaller buffers, or give the process more memory");
  }
  common::UniqueFd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) common::fail_errno("memfd_create");
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    common::fail_errno("sizing a memfd to " + std::to_string(size));
  // Reserve the pages now: running out of memory later would be a SIGBUS in
  // the producer's pixel writes instead of an exception here.
  if (int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); err != 0) {
    common::fail_errno("reserving " + std::to_string(size) + " bytes of shared memory", err);
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    common::fail_errno("sealing a memfd");
  return fd;
}

std::string sealed_memfd_problem(int fd, size_t size) {
  struct stat st{};
  if (fstat(fd, &st) != 0) return "fstat failed";
  if (static_cast<uint64_t>(st.st_size) != size) {
    return "shared memory is " + std::to_string(st.st_size) + " bytes, expected " + std::to_string(size);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return "shared memory is not sealed against resizing";
  }
  return "";
}

}  // namespace vipc::visionipc
