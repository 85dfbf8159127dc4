"""Bare futex wake-up, the floor any receiver that sleeps pays: the producer writes
(frame id, send time) next to a futex word on a shared tmpfs mmap, bumps the word
and calls FUTEX_WAKE (all waiters); each client sleeps in FUTEX_WAIT (not private:
the processes differ). Both sides are Python calling ``syscall(SYS_futex)``
through ctypes (which releases the GIL, as the visionipc binding does around its
wait), so it carries the same interpreter-to-kernel-to-interpreter path minus
the transport. No frame is involved (its "view" time is its wake-up time)."""

import ctypes
import mmap
import os
import time
from typing import Any, Callable, Tuple

from visionipc.bench.transports import END, HDR, RECV_TIMEOUT_MS, Received, State, shm_name

FUTEX_WAIT, FUTEX_WAKE = 0, 1
SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(os.uname().machine, 202)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Futex:
    def __init__(self, path, create):
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, 4096)
            self.mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.word = ctypes.c_uint32.from_buffer(self.mm, 0)
        self.addr = ctypes.addressof(self.word)
        libc = ctypes.CDLL(None, use_errno=True)
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.syscall.argtypes = [
            ctypes.c_long,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
        ]
        self.timeout = _Timespec(RECV_TIMEOUT_MS // 1000, 0)
        self.timeout_ptr = ctypes.addressof(self.timeout)

    def close(self) -> None:
        self.word = None
        self.mm.close()


def _path(tag):
    return f"/dev/shm/{shm_name(tag)}.futex"


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        self.path = _path(tag)
        self.fx = _Futex(self.path, True)

    def prefault(self) -> None:
        pass

    def accept(self) -> None:
        pass

    def check(self) -> None:
        pass

    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = HDR.pack_into,
    ) -> int:
        fx = self.fx
        ts = now()
        pack(fx.mm, 8, fid, ts)
        fx.word.value = (fx.word.value + 1) & 0xFFFFFFFF
        fx.syscall(SYS_FUTEX, fx.addr, FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
        return ts

    def end(self) -> None:
        self.send(END, False)

    def close(self) -> None:
        self.fx.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        self.fx = _Futex(_path(tag), False)
        self.seen = self.fx.word.value

    def recv(
        self, now: Callable[[], int] = time.monotonic_ns, unpack: Callable[..., Tuple[Any, ...]] = HDR.unpack_from
    ) -> Received:
        fx = self.fx
        deadline = time.monotonic() + RECV_TIMEOUT_MS / 1000
        while True:
            v = fx.word.value
            if v != self.seen:
                t = now()
                break
            fx.syscall(SYS_FUTEX, fx.addr, FUTEX_WAIT, self.seen, fx.timeout_ptr, None, 0)
            if time.monotonic() > deadline:
                return None
        self.seen = v
        fid, ts = unpack(fx.mm, 8)
        if fid == END:
            return "end"
        return fid, ts, t, t, True

    def close(self) -> None:
        self.fx.close()
