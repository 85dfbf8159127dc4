#include "common/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common/errors.h"

namespace vipc::common {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

UniqueFd::~UniqueFd() { reset(); }

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

struct flock byte_lock(off_t byte, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  fl.l_pid = 0;  // required for OFD locks
  return fl;
}

}  // namespace

bool ofd_try_lock(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  for (;;) {
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    fail_errno("fcntl(F_OFD_SETLK)");
  }
}

void ofd_lock(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  while (fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno != EINTR) fail_errno("fcntl(F_OFD_SETLKW)");
  }
}

void ofd_unlock(int fd, off_t byte) {
  struct flock fl = byte_lock(byte, F_UNLCK);
  fcntl(fd, F_OFD_SETLK, &fl);
}

bool ofd_is_locked(int fd, off_t byte, bool exclusive) {
  struct flock fl = byte_lock(byte, exclusive ? F_WRLCK : F_RDLCK);
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) fail_errno("fcntl(F_OFD_GETLK)");
  return fl.l_type != F_UNLCK;
}

}  // namespace vipc::common
