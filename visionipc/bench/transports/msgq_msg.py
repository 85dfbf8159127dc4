"""Plain msgq, no frame: the producer publishes a 64-byte message carrying (frame id,
send time) on a msgq topic; the client receives it as ``bytes``. The same harness,
pacing and pinning as the frame transports, so a paced run shows in one table what a
VisionIPC frame costs over the ring message that announces it (issue 19's "plain msgq
64 B at the same pace")."""

import time
from typing import Any, Callable, Tuple

from visionipc.bench.transports import END, HDR, RECV_TIMEOUT_MS, Received, State
from visionipc.bench.workers import BenchError

SIZE = 64
SEGMENT = 1 << 16


def _topic(tag):
    return f"vbm{tag}"


class Producer:
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        import msgq

        self.pub = msgq.pub_sock(_topic(tag), segment_size=SEGMENT)
        self.nclients = nclients
        self.msg = bytearray(SIZE)
        self._send = self.pub.send

    def prefault(self) -> None:
        pass

    def accept(self) -> None:
        if not self.pub.wait_for_readers(self.nclients, timeout=20.0):
            raise BenchError(f"msgq publisher saw fewer than {self.nclients} subscribers within 20 s")

    def check(self) -> None:
        pass

    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = HDR.pack_into,
    ) -> int:
        msg = self.msg
        ts = now()
        pack(msg, 0, fid, ts)
        self._send(msg)
        return ts

    def end(self) -> None:
        self.send(END, False)

    def close(self) -> None:
        self.pub.close()


class Consumer:
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        import msgq

        self.sub = msgq.sub_sock(_topic(tag), conflate=conflate, timeout=RECV_TIMEOUT_MS, segment_size=SEGMENT)
        self._recv = self.sub.receive

    def recv(
        self, now: Callable[[], int] = time.monotonic_ns, unpack: Callable[..., Tuple[Any, ...]] = HDR.unpack_from
    ) -> Received:
        m = self._recv()
        t = now()
        if m is None:
            return None
        fid, ts = unpack(m)
        if fid == END:
            return "end"
        return fid, ts, t, t, len(m) == SIZE

    def close(self) -> None:
        self.sub.close()
