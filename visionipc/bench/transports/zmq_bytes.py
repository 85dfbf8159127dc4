"""pyzmq ``ipc://``: XPUB (XPUB_NODROP, high-water mark 2) sends the frame bytes with
``copy=False`` (no user-space copy: pyzmq's best case; the kernel still copies them
through the socket), the stamp in a 16-byte header part; SUB makes ``np.frombuffer``."""

import time
from typing import Any, Callable, Tuple

from msgq.tooling import ensure_descriptors
from visionipc.bench.transports import END, HDR, RECV_TIMEOUT_MS, Received, State, nv12
from visionipc.bench.workers import BenchError

HWM = 2


def _context(state):
    import zmq

    ensure_descriptors("pyzmq benchmark transport")  # libzmq aborts the process when it runs out

    if "zmq_ctx" not in state:
        state["zmq_ctx"] = zmq.Context()
        state.setdefault("teardown", []).append(lambda: state.pop("zmq_ctx").destroy(linger=0))
    return state["zmq_ctx"]


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        import numpy as np
        import zmq

        self.zmq, self.nclients = zmq, nclients
        self.sock = _context(state).socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # one subscription message per subscriber
        self.sock.setsockopt(zmq.SNDHWM, HWM)
        self.sock.bind(f"ipc://{state['ipc_dir']}/z{tag}")
        self.frame = np.zeros(nv12(w, h)[0], np.uint8)  # touched now: no page faults later
        self.hdr = bytearray(HDR.size)

    def prefault(self) -> None:
        pass

    def accept(self) -> None:
        # XPUB hands us each subscription once that subscriber's connection is live.
        self.sock.setsockopt(self.zmq.RCVTIMEO, 20000)
        for _ in range(self.nclients):
            try:
                msg = self.sock.recv()
            except self.zmq.Again:
                raise BenchError("a subscription did not reach the XPUB within 20 s") from None
            if not msg or msg[0] != 1:
                raise BenchError(f"unexpected XPUB message {msg!r}")

    def check(self) -> None:
        pass

    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = HDR.pack_into,
    ) -> int:
        # The frame part is never modified while in flight (zero-copy send):
        # the stamp travels in the header part; ``fill`` writes a fresh frame first.
        if fill:
            self.frame.fill(fid & 0xFF)
        ts = now()
        pack(self.hdr, 0, fid, ts)
        self.sock.send_multipart([self.hdr, self.frame], copy=False)
        return ts

    def end(self) -> None:
        self.sock.send_multipart([HDR.pack(END, 0), b"\0"])

    def close(self) -> None:
        self.sock.close(linger=0)


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        import numpy as np
        import zmq

        self.np, self.zmq = np, zmq
        self.shape = nv12(w, h)[1]
        self.sock = _context(state).socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, HWM)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        self.sock.connect(f"ipc://{state['ipc_dir']}/z{tag}")

    def recv(
        self, now: Callable[[], int] = time.monotonic_ns, unpack: Callable[..., Tuple[Any, ...]] = HDR.unpack_from
    ) -> Received:
        try:
            parts = self.sock.recv_multipart(copy=False)
        except self.zmq.Again:
            return None
        tr = now()
        fid, ts = unpack(parts[0].buffer)
        if fid == END:
            return "end"
        view = self.np.frombuffer(parts[1].buffer, self.np.uint8).reshape(self.shape)
        tv = now()
        return fid, ts, tr, tv, view.shape[0] > 0  # a message is a private copy: always intact

    def close(self) -> None:
        self.sock.close(linger=0)
