"""Pieces of the pub/sub message benchmarks (msgq against pyzmq, the zmq backend
against raw pyzmq): socket set-up per transport and the timed loops both suites run.

Only set-up goes through the socket classes; the timed loops call the sockets' own
methods. Every message of a latency run carries its CLOCK_MONOTONIC send time
(``time.monotonic_ns``, one clock for every process) in its first 8 bytes; ``END``
there marks the end of the run."""

import contextlib
import struct
import time
from itertools import repeat
from typing import Any, Callable, Iterator, List, Optional, Protocol, Tuple, Type, Union

from msgq.tooling import ensure_descriptors
from visionipc.bench.workers import BenchError, Control

Send = Callable[[Any], Any]  # a socket's bound send method: takes bytes-like
Timeouts = Union[Type[BaseException], Tuple[Type[BaseException], ...]]  # pyzmq's Again, () for msgq


class Sockets(Protocol):
    """What the tasks use of MsgqSockets and ZmqSockets (and the suites' own kinds)."""

    def wait_subscribed(self, pub: Any, timeout: float = 20.0) -> None: ...

    def close(self, *socks: Any) -> None: ...


STAMP = struct.Struct("<q")
END = -1  # timestamp of the end marker


class MsgqSockets:
    """msgq ``pub_sock`` / ``sub_sock`` (whichever backend ``MSGQ_BACKEND`` picks)."""

    def __init__(self) -> None:
        import msgq

        self.msgq = msgq

    def wait_subscribed(self, pub: Any, timeout: float = 20.0) -> None:
        if not pub.wait_for_readers(1, timeout=timeout):
            raise BenchError(f"no subscriber attached to {pub.endpoint} within {timeout} s")

    def close(self, *socks: Any) -> None:
        for s in socks:
            if s is not None:
                s.close()


class ZmqSockets:
    """Raw pyzmq: an XPUB bound on ``self.url(topic)`` (it sends exactly as a PUB does, and
    shows the sender its subscription arrive) and a SUB connected to it."""

    def __init__(
        self, ctx: Any, hwm: Optional[int] = None, nodrop: bool = False, timeout_ms: Optional[int] = None
    ) -> None:
        import zmq

        self.zmq, self.ctx = zmq, ctx
        self.hwm, self.nodrop, self.timeout_ms = hwm, nodrop, timeout_ms

    def url(self, topic: str) -> str:
        raise NotImplementedError

    def pub(self, topic: str, *_: Any) -> Any:
        ensure_descriptors("benchmark ZeroMQ publisher")  # libzmq aborts when it runs out
        s = self.ctx.socket(self.zmq.XPUB)
        s.setsockopt(self.zmq.LINGER, 0)
        if self.hwm is not None:
            s.setsockopt(self.zmq.SNDHWM, self.hwm)
        if self.nodrop:
            s.setsockopt(self.zmq.XPUB_NODROP, 1)
        s.bind(self.url(topic))
        return s

    def sub(self, topic: str, *_: Any) -> Any:
        ensure_descriptors("benchmark ZeroMQ subscriber")
        s = self.ctx.socket(self.zmq.SUB)
        s.setsockopt(self.zmq.LINGER, 0)
        if self.hwm is not None:
            s.setsockopt(self.zmq.RCVHWM, self.hwm)
        s.setsockopt(self.zmq.SUBSCRIBE, b"")
        if self.timeout_ms is not None:
            s.setsockopt(self.zmq.RCVTIMEO, self.timeout_ms)
        s.connect(self.url(topic))
        return s

    def wait_subscribed(self, pub: Any, timeout: float = 20.0) -> None:
        # XPUB hands us the subscription once the subscriber's connection is
        # live: everything sent afterwards reaches it.
        if not pub.poll(int(timeout * 1000)):
            raise BenchError(f"no subscription on the XPUB within {timeout} s")
        msg = pub.recv()
        if not msg or msg[0] != 1:
            raise BenchError(f"unexpected XPUB message {msg!r}")

    def close(self, *socks: Any) -> None:
        for s in socks:
            if s is not None:
                s.close(linger=0)


# --------------------------------------------------------------------------- the two sides of a task
# A task's workers keep in step by barriers: "bound" once the publishers exist, then
# the subscribers connect and the publishers wait until they see them, "ready", the
# timed part, "done".


@contextlib.contextmanager
def publishing(
    ctl: Control, sockets: Sockets, pub: Any, open_sub: Optional[Callable[[], Any]] = None
) -> Iterator[Tuple[Any, Any]]:
    """The sending side around the timed part: ``open_sub()`` (a subscriber of its own,
    for pongs or acks) once the publishers are bound; yields ``(pub, sub)`` once a
    subscriber is there."""
    sub = None
    try:
        ctl.barrier("bound")
        if open_sub is not None:
            sub = open_sub()
        sockets.wait_subscribed(pub)
        ctl.barrier("ready")
        yield pub, sub
        ctl.barrier("done")
    finally:
        sockets.close(pub, sub)


@contextlib.contextmanager
def subscribing(ctl: Control, sockets: Sockets, open_sub: Callable[[], Any]) -> Iterator[Any]:
    """The receiving side: ``open_sub()`` once the publisher is bound; yields the subscriber."""
    ctl.barrier("bound")
    sub = open_sub()
    try:
        ctl.barrier("ready")
        yield sub
        ctl.barrier("done")
    finally:
        sockets.close(sub)


# --------------------------------------------------------------------------- timed loops


def paced_send(
    send: Send, size: int, count: int, interval_us: float, end_copies: int = 1, end_pause_s: float = 0.0
) -> None:
    """Send ``count`` stamped messages of ``size`` bytes, sleeping ``interval_us`` before
    each, then the end marker ``end_copies`` times (a lossy transport may drop some)."""
    buf = bytearray(size)
    pack, now, sleep = STAMP.pack_into, time.monotonic_ns, time.sleep
    interval = interval_us * 1e-6
    for _ in repeat(None, count):
        sleep(interval)
        pack(buf, 0, now())
        send(buf)
    pack(buf, 0, END)
    send_end_markers(send, buf, end_copies, end_pause_s)


def send_end_markers(send: Send, marker: Union[bytes, bytearray], copies: int, pause_s: float) -> None:
    for _ in range(copies):
        send(marker)
        if pause_s:
            time.sleep(pause_s)


def latency_loop(recv: Callable[[], Any], lat: List[int], Again: Timeouts = ()) -> str:
    """Blocking receive until the end marker, appending receive - send time (ns) to
    ``lat``. A timeout is ``recv()`` returning None (msgq) or raising ``Again`` (pyzmq).
    Returns "end" or "timeout"."""
    now, unpack, app = time.monotonic_ns, STAMP.unpack_from, lat.append
    try:
        while True:
            m = recv()
            t = now()
            if m is None:
                return "timeout"
            ts = unpack(m)[0]
            if ts < 0:
                return "end"
            app(t - ts)
    except Again:
        return "timeout"


def busy_latency_loop(
    recv: Callable[[Any], Any],
    nonblocking: Any,
    lat: List[int],
    timeout_ms: float,
    Again: Timeouts = (),
) -> str:
    """The same with a busy non-blocking receive, ``recv(nonblocking)``: nothing waiting
    is None (msgq) or ``Again`` (pyzmq); "timeout" after ``timeout_ms`` with nothing."""
    now, unpack, app = time.monotonic_ns, STAMP.unpack_from, lat.append
    spins = 0
    deadline = now() + timeout_ms * 1_000_000
    while True:
        try:
            m = recv(nonblocking)
        except Again:
            m = None
        if m is None:
            spins += 1
            if not spins & 0xFFFF and now() > deadline:
                return "timeout"
            continue
        t = now()
        ts = unpack(m)[0]
        if ts < 0:
            return "end"
        app(t - ts)
        deadline = t + timeout_ms * 1_000_000


def flat_send(send: Send, size: int, count: int) -> float:
    """Send ``count`` messages of ``size`` bytes flat out; returns the seconds it took."""
    payload = bytes(size)
    now = time.monotonic_ns
    t0 = now()
    for _ in repeat(None, count):
        send(payload)
    return (now() - t0) * 1e-9
