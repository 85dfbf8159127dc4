"""A lossless broadcast queue: one writer, N readers known at creation (cpp/broadcast/README.md).

Every reader gets every message, in order, exactly once. Messages travel
through a shared-memory ring of chunks (``cpp/broadcast``): the writer reuses
a chunk only after every reader has consumed it, so a slow reader slows the
writer down instead of losing messages. A message larger than a chunk
travels in an overflow file of its own (``msgq/_overflow.py``: an
owner-only directory, kept until every reader has it, so a reader that dies
and comes back under its rank loses nothing whatever the size); readers on
other hosts get every message over ZeroMQ TCP (optionally authenticated and
encrypted with CURVE: :mod:`msgq.curve`). Readers find the queue through a small picklable
:class:`BroadcastHandle`::

    q = BroadcastQueue(n_readers=2)                  # the writer
    handle = q.handle                                # pickle it to the readers
    r = BroadcastQueue.create_from_handle(handle, 0) # reader 0, in any process
    q.enqueue({"frame": np.zeros((480, 640))})       # pickle protocol 5, buffers out of band
    obj = r.dequeue(timeout=1.0)                     # TimeoutError after 1 s

The writer logs a warning naming the readers it waits for every
``warn_interval`` seconds; ``shutdown()`` (from any side) ends every wait with
:class:`~msgq.errors.QueueShutdownError` once the readers have drained what
was written before it.
"""

import dataclasses
import logging
import os
import pickle
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any, Iterable, List, NoReturn, Optional, Sequence, Tuple, cast

from msgq import _queues
from msgq._broadcast_remote import FRAME, KIND_PICKLE, KIND_RAW, KIND_SHUTDOWN, RemoteChannel, zmq_module
from msgq._broadcast_remote import parse as parse_message
from msgq._descriptors import DescriptorsExhaustedError
from msgq._overflow import OverflowDir
from msgq._shared import Closeable, check_int
from msgq._shared import deadline as _deadline
from msgq._shared import expired as _expired
from msgq._shared import time_left as _left
from msgq.backends.shm import _mode
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    IpcError,
    IpcTimeoutError,
    IpcTypeError,
    MessageTooLargeError,
    NoSpaceError,
    QueueShutdownError,
)
from msgq.names import current_prefix, segment_basename, segment_dir, validate_name

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from msgq._shared import BufferLike

logger = logging.getLogger("msgq.broadcast")

# Bumped in a forked child: a queue made before the fork belongs to the
# parent. (Cheaper than os.getpid() per call, a system call on every message.)
_fork_generation = 0


def _after_fork() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork)

# 256 chunks of 64 KiB (16 MiB, as 16 of 1 MiB before): the writer runs up to 256
# messages ahead of the slowest reader, so small messages need few wake-ups (1.4x the
# messages/s of 16 x 1 MiB for 1 KiB objects to 4 readers, BENCHMARKS.md); a larger
# message travels as a file (about 3x slower for 256 KiB ones): see the hint below.
DEFAULT_CHUNK_BYTES = 64 << 10
DEFAULT_MAX_CHUNKS = 256
DEFAULT_WARN_INTERVAL = 60.0
# The largest message (its pickle stream and buffers together). Remote readers refuse a
# larger one from the network before buffering it (ZMQ_MAXMSGSIZE), so what a peer on the
# writer's address can make a reader hold stays bounded without CURVE.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30


def queue_basename(name: str, prefix: str) -> str:
    """File name of a queue's shared memory: ``msgq@PREFIX@NAME#broadcast``."""
    return segment_basename(name, prefix, "#broadcast", "queue name")


@dataclasses.dataclass(frozen=True)
class BroadcastHandle:
    """Everything a reader needs to find the queue; small and picklable.
    Readers ``0 .. n_readers-1`` are local (shared memory), the next
    ``n_remote_readers`` ranks are remote (ZeroMQ TCP). ``local_addr`` is
    no longer used (messages larger than a chunk travel in files in
    ``overflow_dir`` now, not over a socket) and always None."""

    name: str
    prefix: str
    shm_dir: str
    n_readers: int
    n_remote_readers: int
    chunk_bytes: int
    max_chunks: int
    local_addr: Optional[str]
    remote_addr: Optional[str]
    overflow_dir: Optional[str] = None
    curve_server_key: Optional[str] = None  # the writer's CURVE public key (z85) if remote readers must use CURVE
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # the writer refuses larger; remote readers too


NOT_YET = -1  # a remote reader's sequence number before its first message


def _default_ip() -> str:
    """This host's address on its default route (no packet is sent), else 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


# Pickle protocol 5: [stream, every contiguous buffer out of band (not
# copied)]; the same function the native hot path (put) pickles with.
_serialize = _queues.serialize


def _decode(kind: int, parts: Sequence[Any]) -> Any:
    if kind == KIND_RAW:
        return bytes(parts[0])
    return pickle.loads(parts[0], buffers=parts[1:])


class BroadcastQueue(Closeable):
    """One end of a broadcast queue: ``BroadcastQueue(n_readers, n_remote_readers=0, ...)``
    makes the writer (a :class:`BroadcastQueueWriter`), ``BroadcastQueue.create_from_handle(handle,
    rank)`` a reader (a :class:`BroadcastQueueReader`). What both ends share lives here: the
    handle, fork checks, ``shutdown()``, ``close()``; a call of the other role's (``dequeue`` on
    the writer, ``enqueue`` on a reader) raises :class:`~msgq.errors.IpcError`."""

    name: str
    handle: BroadcastHandle

    def __new__(cls, *args: Any, **kwargs: Any) -> "BroadcastQueue":
        # BroadcastQueue(...) itself is the writer's constructor (its spelling before the split)
        return object.__new__(BroadcastQueueWriter if cls is BroadcastQueue else cls)

    @classmethod
    def create_from_handle(
        cls, handle: BroadcastHandle, rank: int, curve_dir: Optional[str] = None
    ) -> "BroadcastQueueReader":
        """Reader ``rank`` of the queue ``handle`` describes (local ranks first,
        then remote). A remote reader of a queue made with ``curve_dir`` needs
        a keys directory with an authorized client key pair (:mod:`msgq.curve`)."""
        return BroadcastQueueReader(handle, rank, curve_dir)

    def _init_common(self, name: str, handle_ring: Tuple[str, str]) -> None:
        """State both ends keep; ``handle_ring``: the ring's (shm_dir, basename)."""
        self.name = name
        self._pid = os.getpid()
        self._generation = _fork_generation
        self._overflow: Optional[OverflowDir] = None  # local side: the overflow directory (msgq/_overflow.py)
        self._ring_path = os.path.join(*handle_ring)

    # ------------------------------------------------------- the other role's calls

    def enqueue(self, obj: object, timeout: Optional[float] = None) -> None:
        raise IpcError("only the writer can enqueue (this is a reader)")

    def enqueue_bytes(self, data: "BufferLike", timeout: Optional[float] = None) -> None:
        raise IpcError("only the writer can enqueue (this is a reader)")

    def wait_until_ready(self, timeout: Optional[float] = None) -> None:
        raise IpcError("only the writer can enqueue (this is a reader)")

    def dequeue(self, timeout: Optional[float] = None) -> Any:
        raise IpcError("only readers can dequeue (this is the writer)")

    def dequeue_bytes(self, timeout: Optional[float] = None) -> bytes:
        raise IpcError("only readers can dequeue (this is the writer)")

    # ---------------------------------------------------------------- both ends

    def _check(self) -> None:
        """Usable here: not inherited across a fork, not closed."""
        if self._generation != _fork_generation:
            raise IpcError("a forked child cannot use its parent's queue")
        if self.closed:
            raise self._closed_error()

    def _closed_error(self) -> ClosedError:  # pragma: no cover - each role says its own
        raise NotImplementedError

    def _role(self) -> str:  # pragma: no cover - each role says its own
        raise NotImplementedError

    def _detach(self) -> Tuple[Any, Any]:  # pragma: no cover - each role drops its own
        """Forget and return this end's (native ring end, remote channel), each possibly None."""
        raise NotImplementedError

    def shutdown(self) -> None:  # pragma: no cover - each role shuts down its own end
        """Wake every waiting reader and writer: once the readers have read
        what was written before, every call raises QueueShutdownError."""
        raise NotImplementedError

    def _farewell(self) -> Optional[bytes]:
        """What the remote channel sends as it closes (the writer's shutdown message)."""
        return None

    @property
    def closed(self) -> bool:  # pragma: no cover - each role says its own
        raise NotImplementedError

    def close(self) -> None:
        """Leave the queue. The writer's close shuts the queue down (readers
        drain what was written, then get QueueShutdownError); the shared memory
        goes once every reader has left too, and with it the overflow
        directory (by whoever leaves last). Safe to call twice."""
        ours = self._pid == os.getpid()
        # The writer's close shuts the queue down, after the calls in flight on
        # other threads ended with ClosedError: the native close does so for the
        # local readers, the remote channel sends its farewell as it closes.
        farewell = self._farewell() if ours and not self.closed else None
        native, remote = self._detach()
        left = native is not None and ours
        if native is not None:
            if ours:
                native.close()
            else:
                native._forget_after_fork()
        overflow, self._overflow = self._overflow, None
        if left and overflow is not None and not os.path.exists(self._ring_path):
            overflow.remove_all()  # we were the last to leave (the ring goes with the last detach)
        if remote is not None:
            if ours:
                remote.close(farewell)  # a dequeue() or enqueue() in another thread ends with ClosedError
            else:
                remote._forget_after_fork()

    def __getstate__(self) -> NoReturn:
        raise IpcTypeError("a BroadcastQueue cannot be pickled: send its .handle and call create_from_handle()")

    def __repr__(self) -> str:
        return (
            f"<BroadcastQueue {self.name!r} {self._role()}, {self.handle.n_readers} local + "
            f"{self.handle.n_remote_readers} remote readers>"
        )


class BroadcastQueueWriter(BroadcastQueue):
    """The writer: ``BroadcastQueue(n_readers, n_remote_readers=0, ...)`` (or
    ``BroadcastQueueWriter(...)``), the only end that enqueues.

    ``chunk_bytes`` bounds a message that travels in shared memory (larger
    ones take the ZeroMQ side channel); ``max_chunks`` is how many messages
    the writer may be ahead of the slowest reader. ``remote_host`` is the
    address remote readers connect to (default: this host's address on its
    default route), ``remote_bind`` the interface the writer listens on.
    ``curve_dir``: a CURVE keys directory (:mod:`msgq.curve`); remote readers
    must then present an authorized key, and everything is encrypted.
    ``max_message_bytes``: the largest message (pickle stream and buffers
    together; default 1 GiB, or ``chunk_bytes`` if larger, and at least that);
    ``enqueue`` refuses a larger one (:class:`MessageTooLargeError`) and remote
    readers refuse one from the network before buffering it.
    """

    def __init__(
        self,
        n_readers: int,
        n_remote_readers: int = 0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_chunks: int = DEFAULT_MAX_CHUNKS,
        name: Optional[str] = None,
        remote_host: Optional[str] = None,
        remote_bind: str = "*",
        warn_interval: float = DEFAULT_WARN_INTERVAL,
        curve_dir: Optional[str] = None,
        max_message_bytes: Optional[int] = None,
    ) -> None:
        n_readers = check_int("n_readers", n_readers, 0, _queues.MAX_READERS)
        n_remote_readers = check_int("n_remote_readers", n_remote_readers, 0, 1 << 16)
        if n_readers + n_remote_readers == 0:
            raise InvalidArgumentError("a broadcast queue needs at least one reader")
        chunk_bytes = check_int("chunk_bytes", chunk_bytes, 64, 1 << 31)
        max_chunks = check_int("max_chunks", max_chunks, 1, 4096)
        if max_message_bytes is None:  # the default, raised to the chunk size if that is larger
            max_message_bytes = max(DEFAULT_MAX_MESSAGE_BYTES, chunk_bytes)
        self._max_message = check_int("max_message_bytes", max_message_bytes, chunk_bytes, 1 << 40)
        if not warn_interval > 0:
            raise InvalidArgumentError(f"warn_interval must be positive, got {warn_interval!r}")
        name = validate_name(name or f"bq{secrets.token_hex(6)}", "queue name")
        prefix, shm_dir = current_prefix(), segment_dir()
        basename = queue_basename(name, prefix)
        self._init_common(name, (shm_dir, basename))
        self._seq = 0  # sequence number of the next message
        self._writer: Optional[_queues.BroadcastWriter] = None
        self._remote_sock: Optional[RemoteChannel] = None
        self._in_overflow: List[int] = []  # sequence numbers whose overflow file may still exist
        self._overflow_hinted = False  # said once that large messages travel as files
        self._n_total = n_readers + n_remote_readers
        self.warn_interval = float(warn_interval)
        self._mode = _mode()
        remote_addr = overflow_dir = curve_key = None
        if n_readers:
            self._writer = _queues.BroadcastWriter(shm_dir, basename, n_readers, max_chunks, chunk_bytes, self._mode)
        try:
            if n_readers:
                self._overflow = OverflowDir.create(shm_dir, basename, self._mode)
                overflow_dir = self._overflow.path
            if n_remote_readers:
                host = remote_host or _default_ip()
                if curve_dir is not None:
                    from msgq import curve

                    curve_key = curve.server_public_key(curve_dir).decode()
                self._remote_sock, port = RemoteChannel.writer(self.name, f"tcp://{remote_bind}", curve_dir)
                remote_addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        except BaseException:
            self.close()
            raise
        self.handle = BroadcastHandle(
            self.name,
            prefix,
            shm_dir,
            n_readers,
            n_remote_readers,
            chunk_bytes,
            max_chunks,
            None,
            remote_addr,
            overflow_dir,
            curve_key,
            self._max_message,
        )

    def _role(self) -> str:
        return "writer"

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"broadcast queue {self.name!r} is closed")

    @property
    def closed(self) -> bool:
        return self._writer is None and self._remote_sock is None

    def _ring(self) -> "_queues.BroadcastWriter":
        """The ring's native writer (ClosedError once close() on another thread dropped it)."""
        writer = self._writer
        if writer is None:
            raise self._closed_error()
        return writer

    def _files(self) -> OverflowDir:
        """The overflow directory (ClosedError once close() on another thread dropped it)."""
        overflow = self._overflow
        if overflow is None:
            raise self._closed_error()
        return overflow

    def enqueue(self, obj: object, timeout: Optional[float] = None) -> None:
        """Send ``obj`` to every reader (pickle protocol 5; contiguous buffers
        such as numpy arrays go out of band, copied once into shared memory).
        Waits while the slowest reader is ``max_chunks`` messages behind; raises
        ``TimeoutError`` (:class:`~msgq.errors.IpcTimeoutError`) after ``timeout`` s."""
        self._put(obj, False, timeout)

    def enqueue_bytes(self, data: "BufferLike", timeout: Optional[float] = None) -> None:
        """Send one bytes-like message as it is (no pickling)."""
        try:
            view = memoryview(cast("Buffer", data))  # an ndarray too (numpy's stubs say so from 3.12 on)
        except TypeError:
            raise IpcTypeError(f"enqueue_bytes() takes a bytes-like object, not {type(data).__name__}") from None
        self._put(view, True, timeout)

    def _put(self, obj: Any, raw: bool, timeout: Optional[float]) -> None:
        writer = self._writer
        if writer is None or self._remote_sock is not None or self._generation != _fork_generation:
            deadline = _deadline(timeout)
            self._check()  # remote readers need the parts too
            self._send(KIND_RAW if raw else KIND_PICKLE, [obj] if raw else _serialize(obj), deadline)
            return
        # The hot path: one native call checks the timeout, pickles, waits
        # (up to one warning interval) and writes; only a wait that ran out or
        # a message larger than a chunk comes back here, with the parts, the
        # deadline and when the wait began, for the slow path.
        got = writer.put(obj, raw, timeout, self.warn_interval)
        if got is None:
            self._seq += 1
            return
        status, parts, deadline, started = got
        self._send(KIND_RAW if raw else KIND_PICKLE, parts, deadline, status, started)

    def _send(
        self,
        kind: int,
        parts: list,
        deadline: Optional[float],
        status: Optional[str] = None,
        started: Optional[float] = None,
    ) -> None:
        seq = self._seq
        size = sum(memoryview(p).nbytes for p in parts)
        if size > self._max_message:
            raise MessageTooLargeError(
                f"broadcast queue {self.name!r}: a {size}-byte message exceeds its max_message_bytes="
                f"{self._max_message} (create the queue with a larger one)"
            )
        if self._writer is not None:
            flags = _queues.FLAG_RAW if kind == KIND_RAW else 0
            if not self._write_chunk(flags, parts, deadline, status, started):
                self._write_overflow(seq, kind, flags, parts, deadline)
        remote = self._remote_sock  # once: a close() on another thread sets it to None
        if remote is not None:
            first = self.handle.n_readers
            self._zmq_send(remote, range(first, first + self.handle.n_remote_readers), kind, seq, parts, deadline)
        self._seq = seq + 1

    def _write_chunk(
        self,
        flags: int,
        parts: list,
        deadline: Optional[float],
        status: Optional[str] = None,
        started: Optional[float] = None,
    ) -> bool:
        """Write into the next chunk, waiting (and warning) for slow readers;
        False if the message does not fit in a chunk. ``status``: what a
        first attempt (begun at ``started``) already returned."""
        started = time.monotonic() if started is None else started
        writer = self._ring()
        while True:
            if status is None:
                status = writer.write(flags, parts, _left(deadline, self.warn_interval))
            if status == "ready":
                return True
            if status == "too_large":
                return False
            if status == "shutdown":
                raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")
            if status == "closed":  # by another thread, while this one waited
                raise self._closed_error()
            waiting = self._describe_readers(writer.pending_readers())
            if _expired(deadline):
                raise IpcTimeoutError(
                    f"broadcast queue {self.name!r}: message {self._seq} timed out after "
                    f"{time.monotonic() - started:.3g} s waiting for {waiting}"
                )
            logger.warning(
                "broadcast queue %r: the writer has waited %.1f s for %s to consume message %d",
                self.name,
                time.monotonic() - started,
                waiting,
                self._seq - writer.n_chunks,
            )
            status = None

    def _write_overflow(self, seq: int, kind: int, flags: int, parts: list, deadline: Optional[float]) -> None:
        """Message ``seq``, larger than a chunk: its file first, then the
        chunk that says so (msgq/_overflow.py); nothing is left if either fails."""
        if not self._overflow_hinted:
            self._overflow_hinted = True
            logger.warning(
                "broadcast queue %r: message %d (%d bytes) is larger than chunk_bytes=%d and travels as a "
                "file of its own; for a stream of such messages create the queue with a larger chunk_bytes",
                self.name,
                seq,
                sum(memoryview(p).nbytes for p in parts),
                self._ring().chunk_bytes,
            )
        self._drop_consumed_overflow()
        overflow = self._files()
        overflow.write(seq, kind, parts, self._mode)
        try:
            self._write_chunk(flags | _queues.FLAG_OVERFLOW, [], deadline)
        except BaseException:
            overflow.remove(seq)
            raise
        self._in_overflow.append(seq)

    def _drop_consumed_overflow(self) -> None:
        """Unlink the overflow files every reader has consumed (normally their last reader did)."""
        keep = []
        writer, overflow = self._ring(), self._files()
        for seq in self._in_overflow:
            if writer.consumed_by_all(seq):
                overflow.remove(seq)
            else:
                keep.append(seq)
        self._in_overflow = keep

    def _describe_readers(self, ranks: Iterable[int]) -> str:
        out = []
        writer = self._ring()
        for rank in ranks:
            if rank >= self.handle.n_readers:
                out.append(f"remote reader {rank}")
            elif writer.reader_attached(rank):
                out.append(f"reader {rank} (pid {writer.reader_pid(rank)}, consumed {writer.reader_consumed(rank)})")
            elif writer.reader_pid(rank):
                out.append(f"reader {rank} (pid {writer.reader_pid(rank)} has left or died)")
            else:
                out.append(f"reader {rank} (never attached)")
        return ", ".join(out) or "nobody"

    def _zmq_send(
        self,
        remote: RemoteChannel,
        ranks: Sequence[int],
        kind: int,
        seq: int,
        parts: List[Any],
        deadline: Optional[float],
    ) -> None:
        """Send one message to every reader in ``ranks`` once each has subscribed;
        waits (with warnings) while a slow remote reader's queue is full."""
        zmq = zmq_module()
        wanted = set(ranks)
        started = time.monotonic()
        frames = [FRAME.pack(kind, seq), *parts]
        sock = remote.enter("enqueue()")
        try:
            while True:
                remote.drain_subscriptions()
                missing = wanted - remote.subscribed
                events = zmq.POLLIN
                if not missing:
                    try:
                        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                        return
                    except zmq.Again:  # a reader's queue is full (XPUB_NODROP): wait for it
                        events = zmq.POLLIN | zmq.POLLOUT
                if _expired(deadline):
                    what = f"readers {sorted(missing)} to subscribe" if missing else "a slow remote reader"
                    raise IpcTimeoutError(f"broadcast queue {self.name!r}: message {seq} timed out waiting for {what}")
                slice_s = _left(deadline, self.warn_interval)
                remote.wait(events, None if slice_s is None else int(slice_s * 1000) + 1)
                if time.monotonic() - started >= self.warn_interval:
                    started = time.monotonic()
                    logger.warning(
                        "broadcast queue %r: the writer is waiting for %s on the ZeroMQ channel",
                        self.name,
                        f"readers {sorted(missing)} to connect" if missing else "a slow remote reader",
                    )
        finally:
            remote.leave()

    def wait_until_ready(self, timeout: Optional[float] = None) -> None:
        """Writer: wait until every reader has attached (local: shared memory;
        remote: its TCP subscription)."""
        self._check()
        deadline = _deadline(timeout)
        while True:
            writer, remote = self._writer, self._remote_sock  # once each: close() on another thread drops them
            if (self.handle.n_readers and writer is None) or (self.handle.n_remote_readers and remote is None):
                raise self._closed_error()
            missing = [r for r in range(self.handle.n_readers) if writer is None or not writer.reader_attached(r)]
            if remote is not None:
                subscribed = remote.refresh_subscriptions()  # ClosedError once closing
                missing += [r for r in range(self.handle.n_readers, self._n_total) if r not in subscribed]
            if not missing:
                return
            if _expired(deadline):
                raise IpcTimeoutError(f"broadcast queue {self.name!r}: readers {sorted(set(missing))} did not attach")
            time.sleep(0.005)

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
        remote = self._remote_sock
        if remote is not None:
            remote.shut_down_with(FRAME.pack(KIND_SHUTDOWN, self._seq))

    def _farewell(self) -> Optional[bytes]:
        if self._writer is not None and self._overflow is not None:
            self._drop_consumed_overflow()
        return FRAME.pack(KIND_SHUTDOWN, self._seq)

    def _detach(self) -> Tuple[Any, Any]:
        native, remote = self._writer, self._remote_sock
        self._writer = self._remote_sock = None
        return native, remote


class BroadcastQueueReader(BroadcastQueue):
    """Reader ``rank`` of a broadcast queue: ``BroadcastQueue.create_from_handle(handle, rank)``
    (or ``BroadcastQueueReader(handle, rank)``); local ranks read the shared-memory ring,
    the others the writer's ZeroMQ channel."""

    def __init__(self, handle: BroadcastHandle, rank: int, curve_dir: Optional[str] = None) -> None:
        if not isinstance(handle, BroadcastHandle):
            raise InvalidArgumentError(f"expected a BroadcastHandle, not {type(handle).__name__}")
        self.rank = check_int("rank", rank, 0, handle.n_readers + handle.n_remote_readers - 1)
        basename = queue_basename(handle.name, handle.prefix)
        self._init_common(handle.name, (handle.shm_dir, basename))
        self.handle = handle
        self._seq = 0  # sequence number of the next message (a remote reader: NOT_YET until its first)
        self._reader: Optional[_queues.BroadcastReader] = None
        self._sub: Optional[RemoteChannel] = None
        self._stash: Optional[Tuple[int, List[Any]]] = None  # a message dequeue_bytes refused, kept for the next
        try:
            if self.rank < handle.n_readers:
                self._reader = _queues.BroadcastReader(handle.shm_dir, basename, self.rank, _mode())
                self._seq = self._reader.consumed
                if handle.overflow_dir:
                    self._overflow = OverflowDir.named(handle.overflow_dir, handle.shm_dir, basename)
            else:
                # Set by the first message: a remote reader that comes back under its
                # rank gets what the writer sends from then on (ZeroMQ has no replay).
                self._seq = NOT_YET
                if handle.curve_server_key and curve_dir is None:
                    raise InvalidArgumentError(
                        f"broadcast queue {handle.name!r} admits only CURVE-authenticated remote readers: "
                        f"pass curve_dir= (a keys directory with an authorized client key, see msgq.curve)"
                    )
                if curve_dir is not None and not handle.curve_server_key:
                    raise InvalidArgumentError(
                        f"broadcast queue {handle.name!r} was made without curve_dir: its remote readers take none"
                    )
                if not handle.remote_addr:
                    raise InvalidArgumentError(f"broadcast queue {handle.name!r}: the handle names no remote address")
                self._sub = RemoteChannel.reader(
                    handle.name,
                    self.rank,
                    handle.remote_addr,
                    handle.max_message_bytes,
                    curve_dir,
                    handle.curve_server_key,
                )
        except BaseException:
            self.close()
            raise

    def _role(self) -> str:
        return f"reader {self.rank}"

    def _closed_error(self) -> ClosedError:
        return ClosedError(f"broadcast queue reader {self.rank} is closed")

    @property
    def closed(self) -> bool:
        return self._reader is None and self._sub is None

    def _detach(self) -> Tuple[Any, Any]:
        native, remote = self._reader, self._sub
        self._reader = self._sub = None
        return native, remote

    def shutdown(self) -> None:
        if self._reader is not None:
            self._reader.shutdown()

    def dequeue(self, timeout: Optional[float] = None) -> Any:
        """The next message (the object, or bytes if it was sent with
        ``enqueue_bytes``). Raises ``TimeoutError`` after ``timeout`` s and
        :class:`~msgq.errors.QueueShutdownError` once the queue was shut down
        and everything before it was read."""
        reader = self._reader
        if reader is None or self._stash is not None or self._generation != _fork_generation:
            return _decode(*self._next(_deadline(timeout)))  # remote, or what the hot path leaves; checks the state
        # The hot path: one native call checks the timeout (as _deadline
        # does), waits, unpickles in place and consumes.
        try:
            got = reader.take(timeout)
        except BaseException:  # e.g. a message that does not unpickle: it is consumed all the same
            self._seq = reader.consumed
            raise
        if got.__class__ is object:  # one of the native layer's sentinels (or a plain object() sent)
            if got is _queues.OVERFLOW:
                return _decode(*self._take_overflow())
            if got is _queues.TIMEOUT:
                raise IpcTimeoutError(f"broadcast queue {self.name!r}: reader {self.rank} got no message in time")
            if got is _queues.SHUTDOWN:
                raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")
            if got is _queues.CLOSED:  # by another thread, while this one waited or read
                raise self._closed_error()
        self._seq += 1
        return got

    def dequeue_bytes(self, timeout: Optional[float] = None) -> bytes:
        """The next message, which must have been sent with ``enqueue_bytes``;
        a pickled one raises ``TypeError`` and stays for ``dequeue()``."""
        kind, parts = self._next(_deadline(timeout))
        if kind != KIND_RAW:
            self._stash = (kind, parts)
            raise IpcTypeError("the next message was enqueued as an object: use dequeue()")
        return bytes(parts[0])

    def _next(self, deadline: Optional[float]) -> Tuple[int, List[Any]]:
        self._check()
        if self._stash is not None:
            if self._stash[0] == KIND_SHUTDOWN:  # a remote reader stays shut down
                raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")
            stashed, self._stash = self._stash, None
            return stashed
        reader = self._reader  # once: a close() on another thread sets it to None (the object then raises ClosedError)
        if reader is None:
            remote = self._sub  # the same
            if remote is None:
                raise self._closed_error()
            return self._recv_remote(remote, deadline)
        while True:
            got = reader.read()
            if got is not None:
                flags, parts = got
                if flags & _queues.FLAG_OVERFLOW:
                    return self._take_overflow()
                self._seq += 1
                return (KIND_RAW if flags & _queues.FLAG_RAW else KIND_PICKLE), parts
            status = reader.wait(_left(deadline))
            if status == "timeout":
                raise IpcTimeoutError(f"broadcast queue {self.name!r}: reader {self.rank} got no message in time")
            if status == "shutdown":
                raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")
            if status == "closed":  # by another thread, while this one waited
                raise self._closed_error()

    def _recv_frames(self, remote: RemoteChannel, deadline: Optional[float]) -> Tuple[int, int, List[Any]]:
        zmq = zmq_module()
        left = _left(deadline)
        sock = remote.enter("dequeue()")
        try:
            if not remote.wait(zmq.POLLIN, None if left is None else int(left * 1000)):
                raise IpcTimeoutError(f"broadcast queue {self.name!r}: reader {self.rank} got no message in time")
            frames = sock.recv_multipart(copy=False)
        finally:
            remote.leave()
        try:
            return parse_message(frames)
        except ValueError as e:  # spent: the next dequeue takes the next message
            raise IpcError(
                f"broadcast queue {self.name!r}: remote reader {self.rank} got a malformed message "
                f"from {self.handle.remote_addr} ({e}) and skipped it"
            ) from None

    def _take_overflow(self) -> Tuple[int, List[Any]]:
        """The message whose chunk (not yet consumed) says it is in an overflow
        file: read the file, then consume the chunk (BR3); the last reader
        unlinks the file (msgq/_overflow.py). A file that is gone, malformed
        or not ours is an error, and the message is spent."""
        seq = self._seq
        try:
            if self._overflow is None:
                raise IpcError(
                    f"broadcast queue {self.name!r}: message {seq} is larger than a chunk, "
                    f"but the handle names no overflow directory"
                )
            got = self._overflow.read(seq)
        except (NoSpaceError, DescriptorsExhaustedError):  # out of memory / descriptors: it stays for a retry
            raise
        except IpcError:  # gone, malformed or not ours: spent (waiting would not bring it back)
            self._consume_overflow(seq)
            raise
        self._consume_overflow(seq)
        return got

    def _consume_overflow(self, seq: int) -> None:
        reader = self._reader
        if reader is None:
            raise self._closed_error()
        last = reader.consume()  # BR3, after the copy-on-write mapping of the file was made
        self._seq = reader.consumed
        if last and self._overflow is not None:
            self._overflow.remove(seq)

    def _recv_remote(self, remote: RemoteChannel, deadline: Optional[float]) -> Tuple[int, List[Any]]:
        kind, seq, parts = self._recv_frames(remote, deadline)
        if kind == KIND_SHUTDOWN:
            self._stash = (kind, parts)  # stays shut down
            raise QueueShutdownError(f"broadcast queue {self.name!r} was shut down")
        if self._seq == NOT_YET:  # our first message: a reader that (re)joins starts where the writer is
            self._seq = seq
        if seq != self._seq:  # a gap: say so once, then go on from there (the message is kept)
            expected, self._seq, self._stash = self._seq, seq + 1, (kind, parts)
            raise IpcError(
                f"broadcast queue {self.name!r}: remote reader {self.rank} got message {seq}, "
                f"expected {expected}: messages {expected}..{seq - 1} were lost; the next dequeue returns {seq}"
            )
        self._seq += 1
        return kind, parts


__all__ = ["BroadcastQueue", "BroadcastQueueWriter", "BroadcastQueueReader", "BroadcastHandle", "queue_basename"]
