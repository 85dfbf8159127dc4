"""The naive approach: a ``multiprocessing.shared_memory`` ring of ``nbuf`` frames and
the slot index sent to each client over a ``multiprocessing.connection`` AF_UNIX
stream (what ``multiprocessing.Pipe()`` is). Nothing stops the producer from
overwriting a slot a client is reading: the stamp check counts such torn frames."""

import struct
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, List, Tuple

from visionipc.bench.transports import END, FID, Received, State, nv12, shm_name

MSG = struct.Struct("<qQQ")  # slot, frame id, send time (ns)


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        from multiprocessing import shared_memory
        from multiprocessing.connection import Listener

        import numpy as np

        size, shape = nv12(w, h)
        self.slot = -(-size // 4096) * 4096
        self.nbuf, self.nclients = nbuf, nclients
        self.shm = shared_memory.SharedMemory(name=shm_name(tag), create=True, size=self.slot * nbuf)
        self.views = [np.ndarray(shape, np.uint8, buffer=self.shm.buf, offset=i * self.slot) for i in range(nbuf)]
        self.listener = Listener(f"{state['ipc_dir']}/p{tag}", family="AF_UNIX")
        self.conns: List[Connection] = []

    def prefault(self) -> None:
        for v in self.views:
            v.fill(0)

    def accept(self) -> None:
        self.conns = [self.listener.accept() for _ in range(self.nclients)]

    def check(self) -> None:
        pass

    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = FID.pack_into,
        msg: Callable[..., bytes] = MSG.pack,
    ) -> int:
        i = fid % self.nbuf
        v = self.views[i]
        if fill:
            v.fill(fid & 0xFF)
        pack(v, 0, fid)
        ts = now()
        m = msg(i, fid, ts)
        for c in self.conns:
            c.send_bytes(m)
        return ts

    def end(self) -> None:
        for c in self.conns:
            c.send_bytes(MSG.pack(-1, END, 0))

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.listener.close()
        self.views = []
        self.shm.close()
        self.shm.unlink()


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        from multiprocessing import shared_memory
        from multiprocessing.connection import Client

        import numpy as np

        self.np = np
        size, self.shape = nv12(w, h)
        self.slot = -(-size // 4096) * 4096
        # Python < 3.13 registers an attached segment with the resource tracker too;
        # spawn children share the parent's tracker, so this duplicates the
        # producer's entry and the producer's unlink() clears it.
        self.shm = shared_memory.SharedMemory(name=shm_name(tag))
        self.conn = Client(f"{state['ipc_dir']}/p{tag}", family="AF_UNIX")

    def recv(
        self,
        now: Callable[[], int] = time.monotonic_ns,
        unpack: Callable[..., Tuple[Any, ...]] = MSG.unpack,
        stamp: Callable[..., Tuple[Any, ...]] = FID.unpack_from,
    ) -> Received:
        try:  # blocking, as a pipe reader would; the runner's task timeout covers a lost peer
            m = self.conn.recv_bytes()
        except EOFError:
            return None
        tr = now()
        i, fid, ts = unpack(m)
        if fid == END:
            return "end"
        view = self.np.ndarray(self.shape, self.np.uint8, buffer=self.shm.buf, offset=i * self.slot)
        tv = now()
        return fid, ts, tr, tv, stamp(view)[0] == fid

    def close(self) -> None:
        self.conn.close()
        self.shm.close()
