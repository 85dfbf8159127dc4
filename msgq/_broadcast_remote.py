"""The ZeroMQ side of a broadcast queue (msgq/broadcast.py): the writer's XPUB
to its remote readers and each remote reader's SUB, each in a :class:`RemoteChannel`.

Wire: a message is ``[kind+sequence, *parts]`` (``FRAME``); a remote reader
subscribes to everything plus ``HELLO + rank``, a subscription that only tells
the writer (``XPUB_VERBOSE``) that reader ``rank`` is there. The writer never
drops (``XPUB_NODROP``): a reader's full queue (``RCVHWM`` = ``REMOTE_HWM``
messages, then the TCP buffers) makes it wait, so an idle remote reader's memory
stays bounded.

Threads: a queue is used by one thread at a time, except ``close()`` and
``shutdown()``, which may come from any thread, e.g. to stop a consumer thread
blocked in ``dequeue()`` or a writer blocked on a slow remote reader. ZeroMQ
sockets are not thread-safe, so a channel follows msgq/_guarded.py's protocol:
every use of the socket is between ``enter()`` and ``leave()``, every wait there goes through
``wait()``, which polls the socket together with a pipe that ``close()`` and
``shutdown()`` write a byte to, and the socket is closed by whoever leaves it
last (``close()`` itself if nobody is inside, else the user on its way out,
which raises ClosedError). ``shutdown()`` puts the shutdown message in
``_farewell``; it is sent exactly once (taken under ``_close_lock``), by
``shutdown()`` if nobody is inside, else by the user when it wakes or leaves,
or at the latest by the close.
"""

import errno
import logging
import math
import os
import struct
import time
import types
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Set, Tuple

from msgq._descriptors import ensure_descriptors
from msgq._guarded import Guarded
from msgq._zmq_capped import CappedConnection
from msgq.errors import ClosedError, QueueShutdownError

if TYPE_CHECKING:
    import zmq  # optional (pip install 'visionipc[zmq]'): imported where used

KIND_PICKLE, KIND_RAW, KIND_SHUTDOWN = 0, 1, 2
FRAME = struct.Struct("<BQ")  # first ZeroMQ frame of a message: kind, sequence number
HELLO = b"\xffmsgq-broadcast-reader:"  # a subscription that only says "reader N is here"
REMOTE_HWM = 1000  # messages queued per remote reader before the writer waits (never drops)
_log = logging.getLogger("msgq.broadcast")
FAREWELL_LINGER_MS = 1000  # how long ZeroMQ's I/O thread may go on delivering the shutdown message after close


def parse(frames: Sequence["zmq.Frame"]) -> Tuple[int, int, List[memoryview]]:
    """``(kind, sequence, parts)`` of a message as received; ValueError saying
    what is wrong with one the writer cannot have sent."""
    head = frames[0].bytes
    if len(head) != FRAME.size:
        raise ValueError(f"a first frame of {len(head)} bytes, not {FRAME.size}")
    kind, seq = FRAME.unpack(head)
    parts = [f.buffer for f in frames[1:]]
    if kind == KIND_RAW and len(parts) != 1:
        raise ValueError(f"a bytes message in {len(parts)} parts, not 1")
    if kind == KIND_PICKLE and not parts:
        raise ValueError("a pickled message without its pickle stream")
    if kind not in (KIND_PICKLE, KIND_RAW, KIND_SHUTDOWN):
        raise ValueError(f"unknown kind {kind}")
    return kind, seq, parts


def zmq_module() -> types.ModuleType:
    try:
        import zmq
    except ImportError as e:  # optional dependency
        raise ImportError(
            "messages larger than a chunk and remote readers need pyzmq: pip install 'visionipc[zmq]'"
        ) from e
    return zmq


def _curve():
    """msgq.curve, imported on first use (``python -m msgq.curve`` imports msgq first)."""
    from msgq import curve

    return curve


def _socket(kind, what):
    """A ZeroMQ socket of ``kind`` (a name: "XPUB"; LINGER 0), once enough
    descriptors are left (checked before pyzmq is even imported)."""
    ensure_descriptors(what)
    zmq = zmq_module()
    sock = zmq.Context.instance().socket(getattr(zmq, kind))
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class RemoteChannel(Guarded):
    """One ZeroMQ socket of a broadcast queue; see the module docstring.
    ``name``: the queue's, for messages; ``closed_message``: what ClosedError says."""

    _kind = "broadcast queue"

    def __init__(self, sock: "zmq.Socket[Any]", name: str, closed_message: str) -> None:
        zmq = zmq_module()
        try:
            self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # [read, write]: close() wakes a wait
        except BaseException:
            sock.close(linger=0)
            raise
        self._zsock, self.name, self._closed_message = sock, name, closed_message
        self._poll_in = [(sock, zmq.POLLIN), (self._pipe[0], zmq.POLLIN)]  # zmq_poll items of a wait to read
        self._zmq_poll = zmq.zmq_poll
        self.subscribed: Set[int] = set()  # writer: the remote ranks whose hello arrived
        self.shut_down = False
        self._farewell: Optional[bytes] = None  # the shutdown message, until it is sent
        self._farewell_sent = False
        self._link: Optional[CappedConnection] = None  # a reader's CappedConnection: its monitor is polled too
        self._init_guard()

    @classmethod
    def writer(cls, name: str, bind_url: str, curve_dir: Optional[str] = None) -> Tuple["RemoteChannel", int]:
        """The writer's XPUB bound to ``bind_url`` (``tcp://IFACE``, a random port): ``(channel, port)``."""
        sock = _socket("XPUB", f"broadcast queue {name!r}: the remote readers' socket")
        zmq = zmq_module()
        try:
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription reaches us: we count readers
            sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue makes send() wait, never drop
            sock.setsockopt(zmq.SNDHWM, REMOTE_HWM)
            if curve_dir is not None:
                _curve().make_server(sock, curve_dir)
            port = sock.bind_to_random_port(bind_url)
        except BaseException:
            sock.close(linger=0)
            raise
        return cls(sock, name, f"broadcast queue {name!r} is closed"), port

    @classmethod
    def reader(
        cls,
        name: str,
        rank: int,
        addr: str,
        max_message_bytes: int,
        curve_dir: Optional[str] = None,
        curve_server_key: Optional[str] = None,
    ) -> "RemoteChannel":
        """Remote reader ``rank``'s SUB, connected to the writer at ``addr``, refusing a
        message over ``max_message_bytes`` before buffering it (a peer that sends one
        loses its connection, made again after a back-off: msgq/_zmq_capped.py)."""
        sock = _socket("SUB", f"broadcast queue {name!r}: remote reader {rank}'s socket")
        zmq = zmq_module()
        try:
            # Bounded, so a reader that does not dequeue holds at most REMOTE_HWM messages and
            # then TCP backs up: the writer (XPUB_NODROP) waits, as for a slow local reader.
            # (0, unlimited, took everything the writer sent: 276 MB for 4,000 x 64 KB unread.)
            sock.setsockopt(zmq.RCVHWM, REMOTE_HWM)
            if addr.startswith("tcp://["):
                sock.setsockopt(zmq.IPV6, 1)
            if curve_dir is not None:
                _curve().make_client(sock, curve_dir, curve_server_key)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.SUBSCRIBE, HELLO + str(rank).encode())
            link = CappedConnection(zmq, sock, addr, max_message_bytes)
        except BaseException:
            sock.close(linger=0)
            raise
        try:
            channel = cls(sock, name, f"broadcast queue reader {rank} is closed")
        except BaseException:
            link.close_monitor()
            raise
        channel._link = link
        channel._poll_in.append((link.monitor, zmq.POLLIN))
        return channel

    # -------------------------------------------------------------- using

    def _closed_error(self, what: str) -> ClosedError:
        return ClosedError(self._closed_message)

    def enter(self, what: str, after_shutdown: bool = False) -> "zmq.Socket[Any]":
        """The socket, for this thread alone until ``leave()`` (call it in a
        ``finally``): ClosedError if the channel is closed; QueueShutdownError
        once it was shut down, unless ``after_shutdown``. (Not a context
        manager: this is on every message's path.)"""
        self._enter(what)
        if self.shut_down and not after_shutdown:
            try:
                self._check_shut_down()
            finally:
                self._leave()
        return self._zsock

    def leave(self) -> None:
        self._leave()

    def wait(self, events: int, timeout_ms: Optional[int]) -> bool:
        """Between ``enter()`` and ``leave()``: wait up to ``timeout_ms`` (None: no limit) for
        ``events`` on the socket; False if the time ran out. A close() or
        shutdown() from another thread ends the wait with its error."""
        items = self._poll_in
        if events != items[0][1]:
            items = [(self._zsock, events), *items[1:]]
        link = self._link
        wait_ms = -1 if timeout_ms is None else timeout_ms
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            sock_ready = False
            for what, _ in self._zmq_poll(items, wait_ms if link is None else link.poll_ms(wait_ms)):
                if what is self._zsock:
                    sock_ready = True
                elif link is None or what is not link.monitor:
                    self._drain_pipe()
            if self._closing:
                raise self._closed_error("wait")
            if self.shut_down:
                self._check_shut_down()
            if link is None:
                return sock_ready
            if sock_ready:
                link.working()
                return True
            if link.after_wait() and link.reconnects == 1:  # a connection the writer's address closed
                _log.warning(
                    "broadcast queue %r: %s closed the connection (the writer went away, or sent a message over "
                    "max_message_bytes=%d, which is refused); reconnecting",
                    self.name,
                    link.endpoint,
                    link.max_size,
                )
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait_ms = max(1, math.ceil(left * 1000))

    def _check_shut_down(self):
        if self.shut_down:
            self._send_farewell()  # we may be the one who has the socket
            raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")

    def drain_subscriptions(self) -> None:
        """Between ``enter()`` and ``leave()`` on the writer: take the (un)subscriptions waiting on the socket."""
        zmq = zmq_module()
        while True:
            try:
                msg = self._zsock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[1:].startswith(HELLO):
                try:
                    rank = int(msg[1 + len(HELLO) :])
                except ValueError:  # not a reader's: a stray or hostile peer on our port
                    continue
                if msg[0] == 1:
                    self.subscribed.add(rank)
                else:
                    self.subscribed.discard(rank)

    def refresh_subscriptions(self) -> set:
        """The remote ranks subscribed now (writer)."""
        self.enter("wait_until_ready()", after_shutdown=True)
        try:
            self.drain_subscriptions()
        finally:
            self.leave()
        return self.subscribed

    # -------------------------------------------------------------- shutting down, closing

    def shut_down_with(self, frame: bytes) -> None:
        """Send ``frame`` (the shutdown message) once, now or as soon as the
        thread using the socket wakes or leaves; every later use raises
        QueueShutdownError."""
        with self._close_lock:
            if self._closing or self.shut_down:
                return
            self._farewell = frame
            self.shut_down = True  # before looking for a user (Dekker, as close())
            if self._inside:
                self._wake_user()  # it sends the farewell
            else:
                self._send_farewell_locked()  # a user that enters now sees shut_down and waits for the lock

    def close(self, farewell: Optional[bytes] = None) -> None:
        """Close (from any thread); ``farewell``: a shutdown message to send
        first unless the channel was shut down already (the writer's close)."""
        lock = getattr(self, "_close_lock", None)
        if farewell is not None and lock is not None:
            with lock:
                if not self.shut_down and not self._closing:
                    self._farewell = farewell  # sent by whoever closes the socket, or by a user leaving first
        super().close()

    def _leave(self):
        super()._leave()
        if self._farewell is not None:
            self._send_farewell()

    def _send_farewell(self):
        with self._close_lock:
            if self._zsock is not None:
                self._send_farewell_locked()

    def _send_farewell_locked(self):
        frame, self._farewell = self._farewell, None
        if frame is not None:
            zmq = zmq_module()
            try:
                self._zsock.send(frame, zmq.NOBLOCK)
                self._farewell_sent = True
            except zmq.ZMQError:  # a full queue or a gone peer: the readers see the socket close instead
                pass

    def _wake_user(self):
        try:
            os.write(self._pipe[1], b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def _drain_pipe(self):
        if self._closing:
            return  # left readable: every later wait returns at once
        try:
            while os.read(self._pipe[0], 4096):
                pass
        except OSError as e:
            if e.errno != errno.EAGAIN:
                raise

    def _close_socket(self):  # with _close_lock held and no user inside
        self._send_farewell_locked()
        if self._link is not None:
            self._link.close_monitor()
        sock, self._zsock = self._zsock, None
        sock.close(linger=FAREWELL_LINGER_MS if self._farewell_sent else 0)  # close() itself never waits
        self._close_pipe()

    def _close_pipe(self):
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            for fd in pipe:
                os.close(fd)

    def _forget_after_fork(self):
        if self._link is not None:
            self._link.forget()  # the parent's monitor socket: never touched here
        super()._forget_after_fork()
        self._close_pipe()  # our copies; the parent's stay open
