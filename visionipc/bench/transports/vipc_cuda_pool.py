"""visionipc-cuda-pool: the stream's pool in device memory (``create_buffers(...,
memory="cuda")``), the frames handed to the client through CUDA IPC: no byte crosses
the link. The producer stands in for a GPU one (a decoder, a renderer): it writes the
frame in device memory through CuPy (``fill``: a device fill; the stamp: an 8-byte copy),
waits for that, then stamps the send time and sends. The client's "view" is the received
``DeviceFrame`` itself (ready on arrival); the stamp is read back only to check the
frame, after the times are taken.
"""

import time
from typing import Any, Callable

import numpy as np

from visionipc.bench.transports import END, FID, RECV_TIMEOUT_MS, Received, State
from visionipc.bench.transports.vipc import Consumer as _HostConsumer
from visionipc.bench.transports.vipc import Producer as _HostProducer
from visionipc.bench.workers import BenchError


class Producer(_HostProducer):
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        import cupy

        from visionipc import VisionIpcServer

        self.server = VisionIpcServer(f"vb{tag}", wake=self.WAKE)
        self.server.create_buffers("s", nbuf, w, h, "nv12", memory="cuda")
        self.server.start_listener()
        self.nbuf, self.nclients = nbuf, nclients
        self._get, self._send = self.server.get_buffer, self.server.send
        self.cupy = cupy
        self._stamp = np.zeros(FID.size, np.uint8)  # host side of the 8-byte stamp copy
        self._frames: dict = {}  # buffer index -> a CuPy view of its device memory, flat

    def _write(self, buf: Any, fid: int, fill: bool) -> None:
        """The frame in device memory: filled and stamped, completed."""
        view = self._frames.get(buf.idx)
        if view is None:
            view = self._frames[buf.idx] = self.cupy.asarray(buf.device_array).ravel()
        if fill:
            view.fill(fid & 0xFF)
        FID.pack_into(self._stamp, 0, fid)  # type: ignore[arg-type]  # an ndarray is a buffer
        view[: FID.size].set(self._stamp)
        self.cupy.cuda.runtime.deviceSynchronize()

    def prefault(self) -> None:
        for _ in range(self.nbuf):  # no client yet: these frames reach nobody
            buf = self._get("s")
            self._write(buf, 0, True)
            self._send(buf, frame_id=0, timestamp_eof=0)

    def send(self, fid: int, fill: bool, now: Callable[[], int] = time.monotonic_ns, pack: Any = None) -> int:
        buf = self._get("s")
        self._write(buf, fid, fill)
        ts = now()
        self._send(buf, frame_id=fid, timestamp_eof=ts)
        return ts

    def end(self) -> None:
        buf = self._get("s")
        self._write(buf, END, False)
        self._send(buf, frame_id=END, timestamp_eof=0)


class Consumer(_HostConsumer):
    CUDA = True

    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        super().__init__(state, tag, w, h, conflate)
        import cupy

        self.cupy = cupy

    def recv(self, now: Callable[[], int] = time.monotonic_ns, unpack: Any = FID.unpack_from) -> Received:
        f: Any = self._recv(RECV_TIMEOUT_MS)  # a DeviceFrame: ready on arrival
        tr = now()
        if f is None:
            return None
        fid = f.frame_id
        if fid == END:
            return "end"
        if not hasattr(f, "__cuda_array_interface__"):
            raise BenchError("visionipc-cuda-pool received a host frame")
        # the check, after the times: the stamp read back from device memory, then the lease
        stamp = self.cupy.asarray(f).ravel()[: FID.size].get()
        intact = unpack(stamp)[0] == fid and f.valid
        return fid, f.timestamp_eof, tr, tr, intact
