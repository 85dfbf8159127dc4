#include "visionipc/pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

common::UniqueFd create_sealed_memfd(const char* name, size_t size) {
  common::UniqueFd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) common::fail_errno("memfd_create");
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) common::fail_errno("sizing a memfd to " + std::to_string(size));
  // Reserve the pages now: running out of memory later would be a SIGBUS in
  // the producer's pixel writes instead of an exception here.
  if (int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); err != 0) {
    common::fail_errno("reserving " + std::to_string(size) + " bytes of shared memory", err);
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) common::fail_errno("sealing a memfd");
  return fd;
}

std::string sealed_memfd_problem(int fd, size_t size) {
  struct stat st {};
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
