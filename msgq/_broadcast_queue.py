"""What both ends of a broadcast queue share (msgq/broadcast.py): the handle a reader finds
the queue by, the ring's file name, and :class:`BroadcastQueue`, the base of both roles and
the factory that makes them (the writer in ``_broadcast_writer.py``, a reader in
``_broadcast_reader.py``)."""

import dataclasses
import os
from typing import TYPE_CHECKING, Any, NoReturn, Optional, Tuple

from msgq._overflow import OverflowDir
from msgq._shared import Closeable
from msgq.errors import ClosedError, IpcError, IpcTypeError
from msgq.names import segment_basename

if TYPE_CHECKING:
    from msgq._broadcast_reader import BroadcastQueueReader
    from msgq._shared import BufferLike

# Bumped in a forked child: a queue made before the fork belongs to the
# parent. (Cheaper than os.getpid() per call, a system call on every message.)
# Read as ``_broadcast_queue.fork_generation`` by both roles (a copy would not change).
fork_generation = 0


def _after_fork() -> None:
    global fork_generation
    fork_generation += 1


os.register_at_fork(after_in_child=_after_fork)

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
        if cls is not BroadcastQueue:
            return object.__new__(cls)
        from msgq._broadcast_writer import BroadcastQueueWriter  # the role's module imports this one

        return object.__new__(BroadcastQueueWriter)

    @classmethod
    def create_from_handle(
        cls, handle: BroadcastHandle, rank: int, curve_dir: Optional[str] = None
    ) -> "BroadcastQueueReader":
        """Reader ``rank`` of the queue ``handle`` describes (local ranks first,
        then remote). A remote reader of a queue made with ``curve_dir`` needs
        a keys directory with an authorized client key pair (:mod:`msgq.curve`)."""
        from msgq._broadcast_reader import BroadcastQueueReader  # the role's module imports this one

        return BroadcastQueueReader(handle, rank, curve_dir)

    def _init_common(self, name: str, handle_ring: Tuple[str, str]) -> None:
        """State both ends keep; ``handle_ring``: the ring's (shm_dir, basename)."""
        self.name = name
        self._pid = os.getpid()
        self._generation = fork_generation
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
        if self._generation != fork_generation:
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
