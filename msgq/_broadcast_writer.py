"""The writer of a broadcast queue (msgq/broadcast.py): the ring's native writer, the
overflow files of messages larger than a chunk, the ZeroMQ channel to remote readers."""

import logging
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Sequence, Tuple, cast

from msgq import _broadcast_queue as shared
from msgq import _queues
from msgq._broadcast_queue import DEFAULT_MAX_MESSAGE_BYTES, BroadcastHandle, BroadcastQueue, queue_basename
from msgq._broadcast_remote import FRAME, KIND_PICKLE, KIND_RAW, KIND_SHUTDOWN, RemoteChannel, zmq_module
from msgq._overflow import OverflowDir
from msgq._shared import check_int
from msgq._shared import deadline as _deadline
from msgq._shared import expired as _expired
from msgq._shared import time_left as _left
from msgq.backends.shm import _mode
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    IpcTimeoutError,
    IpcTypeError,
    MessageTooLargeError,
    QueueShutdownError,
)
from msgq.names import current_prefix, segment_dir, validate_name

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from msgq._shared import BufferLike

logger = logging.getLogger("msgq.broadcast")

# 256 chunks of 64 KiB (16 MiB, as 16 of 1 MiB before): the writer runs up to 256
# messages ahead of the slowest reader, so small messages need few wake-ups (1.4x the
# messages/s of 16 x 1 MiB for 1 KiB objects to 4 readers, BENCHMARKS.md); a larger
# message travels as a file (about 3x slower for 256 KiB ones): see the hint below.
DEFAULT_CHUNK_BYTES = 64 << 10
DEFAULT_MAX_CHUNKS = 256
DEFAULT_WARN_INTERVAL = 60.0


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
        if writer is None or self._remote_sock is not None or self._generation != shared.fork_generation:
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
