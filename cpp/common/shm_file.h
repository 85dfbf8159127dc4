// One named shared-memory file (a /dev/shm segment) of any of our layouts:
// open or create it with owner checks, allocate and map it, and unlink it
// when the last process detaches. Used by msgq segments, broadcast queues and
// ordered topics; each puts its own versioned header at offset 0 and
// validates it while it holds the init lock.
//
// Ownership is carried by OFD byte-range locks, which the kernel drops when
// the holder dies (so the file of a killed run can be swept):
//  - byte 0 (kLockInit), exclusive: the attach / detach critical section;
//  - byte 1 (kLockPresence), shared while attached. Detach unlinks the file
//    when it can take this lock exclusively: nobody else is attached.
// Higher bytes are free for the layouts (reader slots, liveness locks).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/names.h"

namespace vipc::common {

inline constexpr off_t kLockInit = 0;
inline constexpr off_t kLockPresence = 1;

// Longest file basename of a shared-memory file, NUL included.
inline constexpr size_t kBasenameCapacity = 256;

// Throws kInvalidArgument unless `basename` is a plain file name we may create
// (shorter than `capacity`).
void check_basename(const std::string& basename, size_t capacity = kBasenameCapacity);

// Where a shared-memory file lives and the mode it is created with; the specs
// of the broadcast queue and of ordered topics extend it with their sizes.
struct ShmFileSpec {
  std::string dir{kSegmentDir};
  std::string basename;
  mode_t mode = 0600;
};

class ShmFile {
 public:
  // Opens (creating it with `mode`) dir/basename with O_NOFOLLOW and takes the
  // init lock. Refuses symbolic links, non-regular files, files of another
  // user and world-writable files (kPermission). A file unlinked by a
  // detaching peer while we opened it is opened again.
  // `trusted_uids`: owners besides us whose files we accept (sharing between users).
  static ShmFile open_locked(const std::string& dir, const std::string& basename, mode_t mode,
                             const std::vector<uid_t>& trusted_uids = {});
  // Attach through a descriptor another process opened for us (it is
  // duplicated, and must be an open file description of its own: OFD locks
  // are per description), named `path` in messages. Takes the init lock.
  // Detaching only unlinks the name if the file is our own and still at `path`.
  static ShmFile adopt(int fd, const std::string& path);

  ShmFile() = default;
  ShmFile(ShmFile&& o) noexcept;
  ShmFile& operator=(ShmFile&& o) noexcept;
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  // Detach: unmap; release presence; unlink the file if no one else is attached.
  ~ShmFile();

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  size_t size_at_open() const { return size_at_open_; }
  // True if no other process was attached when we opened the file (a header
  // that fails validation is then a leftover we may overwrite).
  bool alone_at_open() const { return alone_; }

  // Empty the file and give it `size` zero bytes, reserved now
  // (posix_fallocate: a full /dev/shm fails here with kNoSpace instead of a
  // later SIGBUS), with permissions `mode`; then map it.
  // `size_name`: the option a caller lowers to ask for less (in the message).
  void allocate(size_t size, mode_t mode, const char* size_name = "size");
  // Map the whole file as it is (`size` bytes).
  void map(size_t size);
  uint8_t* data() const { return data_; }
  size_t mapped_size() const { return mapped_; }

  // Take the presence lock and drop the init lock: the attach is complete.
  void finish_attach();
  // Give the file the name `path` (rename(2), replacing the file there).
  void rename_to(const std::string& path);
  // Unlink the name now (the file lives on for those who have it mapped).
  void unlink_name();
  // Still the file the name points to?
  bool still_linked() const;
  // In a forked child: drop the inherited descriptor and mapping without
  // touching any lock (the parent still owns them).
  void forget();

 private:
  void unmap();
  void detach();
  UniqueFd fd_;
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  size_t size_at_open_ = 0;
  bool alone_ = false;
  uint8_t* data_ = nullptr;
  size_t mapped_ = 0;
  bool ours_ = true;          // false for an adopted file of another user: never unlinked by us
  bool participant_ = false;  // we took the init lock: detaching runs the unlink protocol
};

// Unlink files in `dir` whose names start with `name_prefix` and that no live
// process is attached to (left behind when every participant was killed).
// Returns the basenames removed. Works for every layout built on ShmFile.
std::vector<std::string> remove_stale_files(const std::string& dir, const std::string& name_prefix);

// Whether `dir/name` is a regular file of this user that no live process is
// attached to (no presence lock held; nobody attaching right now, which holds the
// init lock). With `remove`, such a file is unlinked, checked as above while both
// locks are held (so a process that attaches meanwhile keeps it); without, the
// locks are only probed and released (nothing changes). The test
// remove_stale_files applies to each name.
bool stale_file(const std::string& dir, const std::string& name, bool remove);

// Opens the FIFO `path` (a wake-up channel beside the files above, made by
// mkfifo) with `flags` (O_RDONLY, O_WRONLY or O_RDWR), non-blocking: empty if
// there is none, or (O_WRONLY) nobody reads it. Refuses (kPermission) a
// symbolic link, anything but a FIFO, and a FIFO of another user.
UniqueFd open_fifo(const std::string& path, int flags);

}  // namespace vipc::common
