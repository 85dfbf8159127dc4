"""commaai/msgq's VisionIPC (the reference, built from source: docs/reference.md).

Its Python API has no zero-copy send: ``send(stream, data, ...)`` copies the frame
into a free buffer, as our ``visionipc-copy`` transport does. The client reads the
frame through ``VisionBuf.data`` (a memoryview of the mapped buffer) as a numpy view.
"""

import time
from typing import Any, Callable, Tuple

import numpy as np

from visionipc.bench import reference
from visionipc.bench.transports import END, FID, RECV_TIMEOUT_MS, Received, State, shm_name, stamp
from visionipc.bench.workers import BenchError

STREAM = 0  # VISION_STREAM_ROAD


def _name(tag):
    return "r" + shm_name(tag)  # the run's id is in every file the reference makes


def after_run(run: str) -> None:
    """The reference leaves its topic file (``/dev/shm/msgq_visionipc_<name>_0``) behind by
    design, and its listener socket (``/tmp/visionipc_<name>``) when a worker is killed."""
    reference.remove_files(f"/dev/shm/msgq_visionipc_rvipcb{run}_*", f"/tmp/visionipc_rvipcb{run}_*")


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        vipc = reference.load("visionipc")
        self.server = vipc.VisionIpcServer(_name(tag))
        self.server.create_buffers(STREAM, nbuf, w, h)
        self.server.start_listener()
        self.frame = np.zeros(w * h * 3 // 2, np.uint8)  # the camera's frame (its NV12: stride = width)
        self.nbuf = nbuf

    def prefault(self) -> None:
        for _ in range(self.nbuf):
            self.server.send(STREAM, self.frame, 0, 0, 0)

    def accept(self) -> None:
        pass  # a client's connect() returns once the server registered it

    def check(self) -> None:
        pass  # the reference does not tell how many clients it has

    def send(self, fid: int, fill: bool, now: Callable[[], int] = time.monotonic_ns) -> int:
        stamp(self.frame, fid, fill)
        ts = now()
        self.server.send(STREAM, self.frame, fid & 0xFFFFFFFF, 0, ts)
        return ts

    def end(self) -> None:
        FID.pack_into(self.frame, 0, END)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs: from Python 3.12)
        self.server.send(STREAM, self.frame, 0xFFFFFFFF, 0, 0)

    def close(self) -> None:
        del self.server  # its destructor stops the listener and unmaps the pool


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        vipc = reference.load("visionipc")
        self.client = vipc.VisionIpcClient(_name(tag), STREAM, conflate)
        deadline = time.monotonic() + 20
        while not self.client.connect(False):
            if time.monotonic() > deadline:
                raise BenchError(f"reference client could not connect to {_name(tag)}")
            time.sleep(0.01)
        self._recv = self.client.recv

    def recv(
        self, now: Callable[[], int] = time.monotonic_ns, unpack: Callable[..., Tuple[Any, ...]] = FID.unpack_from
    ) -> Received:
        buf = self._recv(RECV_TIMEOUT_MS)
        tr = now()
        if buf is None:
            return None
        arr = np.frombuffer(buf.data, np.uint8)  # the numpy view an application works with
        tv = now()
        stamp = unpack(arr)[0]
        if stamp == END:
            return "end"
        fid = self.client.frame_id
        # the reference's frame ids are 32-bit; the stamp carries the full id
        return stamp, self.client.timestamp_eof, tr, tv, (stamp & 0xFFFFFFFF) == fid

    def close(self) -> None:
        del self.client
