"""A reader of a broadcast queue (msgq/broadcast.py): a local rank reads the shared-memory
ring (and the overflow files), a remote one the writer's ZeroMQ channel."""

import pickle
from typing import Any, List, Optional, Sequence, Tuple

from msgq import _broadcast_queue as shared
from msgq import _queues
from msgq._broadcast_queue import BroadcastHandle, BroadcastQueue, queue_basename
from msgq._broadcast_remote import KIND_PICKLE, KIND_RAW, KIND_SHUTDOWN, RemoteChannel, zmq_module
from msgq._broadcast_remote import parse as parse_message
from msgq._descriptors import DescriptorsExhaustedError
from msgq._overflow import OverflowDir
from msgq._shared import check_int
from msgq._shared import deadline as _deadline
from msgq._shared import time_left as _left
from msgq.backends.shm import _mode
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    IpcError,
    IpcTimeoutError,
    IpcTypeError,
    NoSpaceError,
    QueueShutdownError,
)

NOT_YET = -1  # a remote reader's sequence number before its first message


def _decode(kind: int, parts: Sequence[Any]) -> Any:
    if kind == KIND_RAW:
        return bytes(parts[0])
    return pickle.loads(parts[0], buffers=parts[1:])


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
        if reader is None or self._stash is not None or self._generation != shared.fork_generation:
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
