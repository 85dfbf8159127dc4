"""Plain msgq, no frame: the producer publishes a 64-byte message carrying (frame id,
send time) on a msgq topic; the client receives it as ``bytes``. The same harness,
pacing and pinning as the frame transports, so a paced run shows in one table what a
VisionIPC frame costs over the ring message that announces it (issue 19's "plain msgq
64 B at the same pace")."""

import time

from visionipc.bench.transports import END, HDR, RECV_TIMEOUT_MS
from visionipc.bench.workers import BenchError

SIZE = 64
SEGMENT = 1 << 16


def _topic(tag):
    return f"vbm{tag}"


class Producer:
    def __init__(self, state, tag, w, h, nbuf, nclients):
        import msgq

        self.pub = msgq.pub_sock(_topic(tag), segment_size=SEGMENT)
        self.nclients = nclients
        self.msg = bytearray(SIZE)
        self._send = self.pub.send

    def prefault(self):
        pass

    def accept(self):
        if not self.pub.wait_for_readers(self.nclients, timeout=20.0):
            raise BenchError(f"msgq publisher saw fewer than {self.nclients} subscribers within 20 s")

    def check(self):
        pass

    def send(self, fid, fill, now=time.monotonic_ns, pack=HDR.pack_into):
        msg = self.msg
        ts = now()
        pack(msg, 0, fid, ts)
        self._send(msg)
        return ts

    def end(self):
        self.send(END, False)

    def close(self):
        self.pub.close()


class Consumer:
    def __init__(self, state, tag, w, h, conflate):
        import msgq

        self.sub = msgq.sub_sock(_topic(tag), conflate=conflate, timeout=RECV_TIMEOUT_MS, segment_size=SEGMENT)
        self._recv = self.sub.receive

    def recv(self, now=time.monotonic_ns, unpack=HDR.unpack_from):
        m = self._recv()
        t = now()
        if m is None:
            return None
        fid, ts = unpack(m)
        if fid == END:
            return "end"
        return fid, ts, t, t, len(m) == SIZE

    def close(self):
        self.sub.close()
