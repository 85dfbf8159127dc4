"""Messages larger than a chunk of a :class:`~msgq.broadcast.BroadcastQueue`.

Each travels in a file of its own, ``DIR/SEQ``, in the queue's overflow
directory ``SHM_DIR/msgq@PREFIX@NAME#broadcast~TOKEN`` (TOKEN: the writer's,
random): a directory only the owner (and the group, if the segment's mode
admits it) may enter, so the payload is exactly as private as the ring.
No socket is involved, so nothing a local user could connect to.

Lifetime (the ring's chunk of message SEQ carries only the overflow flag):

1. The writer writes ``DIR/SEQ`` completely, then the chunk (BW1..BW3): a
   reader that sees the flag finds the whole file.
2. A reader reads the file, then consumes the chunk (BR3). One that dies
   before BR3 finds the chunk, and the file, again when it comes back under
   its rank: lossless through restarts, whatever the size.
3. The reader whose BR3 completes the chunk's mask unlinks the file; the
   writer unlinks the files of messages every reader consumed as it goes
   (a reader may die between BR3 and its unlink) and when it closes.
4. The last process to leave the queue (its ring file is gone once it
   detached) removes the directory; a writer that creates a queue alone
   removes directories of earlier queues of that name (all dead).

A file is ``[header][u64 part length x n][parts, each 64-aligned]``; a
reader maps it copy-on-write, so out-of-band buffers (numpy arrays) come
back writable without a copy.
"""

import contextlib
import errno
import mmap
import os
import secrets
import stat
import struct
from typing import List, Tuple

from msgq._descriptors import DescriptorsExhaustedError
from msgq.errors import InvalidArgumentError, IpcError, IpcPermissionError, NoSpaceError

_HEADER = struct.Struct("<8sII")  # magic, kind, number of parts
_MAGIC = b"MSGQOVF1"
_ALIGN = 64
_MAX_PARTS = 1 << 16


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def dir_mode(segment_mode: int) -> int:
    """Owner rwx; the group too if the segment's mode lets the group read and write."""
    return 0o700 | (0o070 if segment_mode & 0o060 == 0o060 else 0)


def no_space(what: str, err: OSError) -> IpcError:
    """The exception for ``err`` (an OSError) while ``what``: exhaustion is named as such."""
    code = err.errno or 0
    advice = {
        errno.ENOSPC: "the shared-memory filesystem is full: free space, enlarge it (docker --shm-size), "
        "or send smaller messages",
        errno.EDQUOT: "over the disk quota of the shared-memory filesystem",
        errno.EFBIG: "over the file size limit (ulimit -f)",
        errno.ENOMEM: "out of memory, or over the process's memory limit (ulimit -v, a cgroup): "
        "the message stays for a retry",
    }.get(code)
    if advice:
        return NoSpaceError(f"{what}: {os.strerror(code)} ({advice})")
    if err.errno in (errno.EMFILE, errno.ENFILE):
        return DescriptorsExhaustedError(f"{what}: out of file descriptors ({os.strerror(code)}): raise `ulimit -n`")
    if err.errno in (errno.EACCES, errno.EPERM):
        return IpcPermissionError(f"{what}: {err}")
    return IpcError(f"{what}: {err}")


class OverflowDir:
    """One queue's overflow directory (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def create(cls, shm_dir: str, ring_basename: str, segment_mode: int) -> "OverflowDir":
        """The writer's: sweep dead queues' directories of this name, make a new one."""
        prefix = ring_basename + "~"
        try:
            names = os.listdir(shm_dir)
        except OSError:
            names = []
        for name in names:
            if name.startswith(prefix):  # the ring was created alone: nobody uses these any more
                cls(os.path.join(shm_dir, name)).remove_all()
        path = os.path.join(shm_dir, prefix + secrets.token_hex(8))
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, dir_mode(segment_mode))  # mkdir's mode is masked by the umask
        except OSError as e:
            raise no_space(f"cannot create the overflow directory {path}", e) from None
        return cls(path)

    @classmethod
    def named(cls, path: str, shm_dir: str, ring_basename: str) -> "OverflowDir":
        """A reader's: ``path`` (from a handle) must be this queue's directory
        name, ``SHM_DIR/<ring>~<16 hex digits>``: a handle cannot point a reader
        (who removes the directory when it leaves last) anywhere else."""
        name = os.path.basename(path)
        token = name[len(ring_basename) + 1 :]
        if (
            os.path.normpath(os.path.dirname(path)) != os.path.normpath(shm_dir)
            or not name.startswith(ring_basename + "~")
            or len(token) != 16
            or token.strip("0123456789abcdef")
        ):
            raise InvalidArgumentError(f"{path!r} is not the overflow directory of {ring_basename!r}")
        return cls(path)

    def _file(self, seq: int) -> str:
        return os.path.join(self.path, str(seq))

    def write(self, seq: int, kind: int, parts: list, segment_mode: int) -> None:
        """Write message ``seq`` whole; on any failure nothing is left and it raises."""
        views = [memoryview(p).cast("B") for p in parts]
        if len(views) > _MAX_PARTS:
            raise IpcError(f"a message of {len(views)} parts has more than {_MAX_PARTS}")
        head = _HEADER.pack(_MAGIC, kind, len(views)) + b"".join(struct.pack("<Q", v.nbytes) for v in views)
        offsets, at = [], _aligned(len(head))
        for v in views:
            offsets.append(at)
            at = _aligned(at + v.nbytes)
        path = self._file(seq)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise no_space(f"cannot create overflow file {path}", e) from None
        try:
            os.fchmod(fd, segment_mode & 0o660)
            os.posix_fallocate(fd, 0, max(at, 1))  # a full filesystem fails here, not as a SIGBUS later
            os.pwrite(fd, head, 0)
            for v, offset in zip(views, offsets):
                done = 0
                while done < v.nbytes:
                    done += os.pwrite(fd, v[done : done + (1 << 30)], offset + done)
        except BaseException as e:
            os.close(fd)
            self.remove(seq)
            if isinstance(e, OSError):
                raise no_space(f"cannot write overflow file {path} ({at} bytes)", e) from None
            raise
        os.close(fd)

    def read(self, seq: int) -> Tuple[int, List[memoryview]]:
        """``(kind, parts)`` of message ``seq``: parts are views of a private,
        copy-on-write mapping of its file. Raises IpcError if it is gone or malformed."""
        path = self._file(seq)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise IpcError(
                f"overflow file {path} of message {seq} is gone (removed by hand, or its writer died)"
            ) from None
        except OSError as e:
            raise no_space(f"cannot open overflow file {path}", e) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise IpcPermissionError(f"overflow file {path} is not a regular file of ours: refusing to read it")
            if st.st_size < _HEADER.size:
                raise IpcError(f"overflow file {path} is truncated")
            try:
                mapped = mmap.mmap(fd, st.st_size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:
                raise no_space(f"cannot map overflow file {path}", e) from None
        finally:
            os.close(fd)
        view = memoryview(mapped)
        magic, kind, n = _HEADER.unpack_from(view)
        lens_end = _HEADER.size + 8 * n
        if magic != _MAGIC or n > _MAX_PARTS or lens_end > len(view):
            raise IpcError(f"overflow file {path} is not one of ours (bad header)")
        parts, at = [], _aligned(lens_end)
        for i in range(n):
            (size,) = struct.unpack_from("<Q", view, _HEADER.size + 8 * i)
            if at + size > len(view):
                raise IpcError(f"overflow file {path} is truncated (part {i} past its end)")
            parts.append(view[at : at + size])
            at = _aligned(at + size)
        return kind, parts

    def remove(self, seq: int) -> None:
        try:
            os.unlink(self._file(seq))
        except OSError:
            pass

    def remove_all(self) -> None:
        """Remove every file and the directory (never following a link)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone, or out of descriptors: an empty directory still goes below
            fd = None
        if fd is not None:
            try:
                for name in os.listdir(fd):  # (itself needs a descriptor more)
                    try:
                        os.unlink(name, dir_fd=fd)
                    except IsADirectoryError:  # not ours to make, but ours to remove (if empty)
                        with contextlib.suppress(OSError):
                            os.rmdir(name, dir_fd=fd)
                    except OSError:
                        pass
            except OSError:
                pass
            finally:
                os.close(fd)
        try:
            os.rmdir(self.path)
        except OSError:
            pass
