"""Ordered topics: many producers, out-of-order submission (cpp/ordered/README.md).

Producers (threads or processes) reserve consecutive message ids, fill their
messages in any order and make each id available; readers see exactly which
ids are available (a bitmap packed with the last id in one 64-bit atomic,
``cpp/ordered``). A ``sequential`` reader gets every id in order and never
sees id N before N is available, even when N+1 finished first; a ``newest``
reader gets the newest available message and skips older ones::

    topic = OrderedProducer("detections", capacity=64, slot_bytes=4096)  # creates it
    with topic.reserve() as msg:        # id = msg.id, reserved in order
        msg.data[:5] = b"hello"         # fill in place (any order between producers)
        msg.size = 5                    # published when the block ends
    topic.send(b"one copy")             # reserve + copy + publish

    reader = OrderedReader("detections", mode="sequential")
    m = reader.recv(timeout=1.0)        # m.id, m.data (bytes); TimeoutError after 1 s

At most 16 ids are in flight at once (the window of the bitmap): a 17th
``reserve()`` waits until the oldest is published. A producer that closes
with reservations still open cancels them, so readers skip them instead of
waiting forever. One that dies holding a reservation (SIGKILL) is noticed by
whoever waits on its id (a sequential reader, or a producer waiting for room
in the window) within about 50 ms: the id is reclaimed and becomes a gap that
readers pass and count in ``reclaimed``. (Each producer holds a lock the
kernel drops when it dies; an id reserved but never stamped is reclaimed
after 1 s.)
"""

import os
import types
from typing import TYPE_CHECKING, Any, Iterator, Literal, NamedTuple, NoReturn, Optional, Tuple, Type, cast

from msgq import _queues
from msgq._shared import Closeable, check_choice, check_int
from msgq._shared import deadline as _deadline
from msgq._shared import time_left as _left
from msgq.backends.shm import _mode
from msgq.errors import ClosedError, InvalidArgumentError, IpcTimeoutError, IpcTypeError, QueueShutdownError
from msgq.names import segment_basename, segment_dir, validate_name

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from msgq._shared import BufferLike

MODES = ("sequential", "newest")
WINDOW = _queues.WINDOW


def topic_basename(name: str, prefix: Optional[str] = None) -> str:
    """File name of an ordered topic: ``msgq@PREFIX@NAME#ordered``."""
    return segment_basename(name, prefix, "#ordered", "ordered topic name")


def _raise_status(status: str, what: str) -> NoReturn:
    if status == "timeout":
        raise IpcTimeoutError(what)
    if status == "shutdown":
        raise QueueShutdownError("the ordered topic was shut down")
    raise ClosedError("the ordered topic was closed while waiting")


def _uint(what: str, value: int) -> int:
    return check_int(what, value, 0, (1 << 64) - 1)


class Availability(NamedTuple):
    """A snapshot of the availability word: ids in ``[begin, end)`` are still in
    the ring; every id below ``available_end`` is available (or a gap);
    ``bitmap`` bit k is id ``end-1-k``."""

    begin: int
    end: int
    available_end: int
    bitmap: int


class Message(NamedTuple):
    id: int
    data: bytes
    t0: int
    t1: int


class Reservation:
    """A reserved id and its slot: fill ``data`` (a writable memoryview of
    ``slot_bytes``), set ``size``, then ``publish()`` (or leave the ``with``
    block); ``cancel()`` or an exception in the block gives the id up."""

    def __init__(self, producer: "OrderedProducer", id_: int) -> None:
        self._producer = producer
        self.id = id_
        self.data = memoryview(producer._native.slot(id_))
        self.size = 0
        self.t0 = self.t1 = 0
        self._done = False

    def publish(self, size: Optional[int] = None, t0: Optional[int] = None, t1: Optional[int] = None) -> None:
        if self._done:
            raise InvalidArgumentError(f"message {self.id} was already published or cancelled")
        size = self.size if size is None else size
        size = _uint("size", size)
        self._producer._open().publish(
            self.id, size, _uint("t0", self.t0 if t0 is None else t0), _uint("t1", self.t1 if t1 is None else t1)
        )  # a bad size leaves it open
        self._done = True
        self._release_view()

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._release_view()
            self._producer._open().cancel(self.id)

    def _release_view(self) -> None:
        try:
            self.data.release()  # no writes after publishing, through this view at least
        except BufferError:
            pass  # numpy views of it exist; they keep the mapping alive

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[types.TracebackType]
    ) -> Literal[False]:
        if exc_type is None:
            if not self._done:
                self.publish()
        else:
            self.cancel()
        return False


class _Attached(Closeable):
    """close() / context manager / finalizer shared by producers and readers."""

    _native: Any = None  # the native producer or reader; None once closed
    _ROLE = ""  # "producer" or "reader": what a ClosedError names
    name: str
    _pid: int  # the process that attached (a forked child only forgets the native object)

    def _open(self) -> Any:
        """The native object, or ClosedError once closed."""
        if self._native is None:
            raise ClosedError(f"ordered {self._ROLE} of {self.name!r} is closed")
        return self._native

    def close(self) -> None:
        """Leave the topic (a producer cancels its open reservations: readers skip them)."""
        native, self._native = self._native, None
        if native is not None:
            if self._pid == os.getpid():
                native.close()
            else:
                native._forget_after_fork()

    @property
    def closed(self) -> bool:
        return self._native is None

    @property
    def capacity(self) -> int:
        return self._open().capacity

    @property
    def slot_bytes(self) -> int:
        return self._open().slot_bytes


class OrderedProducer(_Attached):
    """A producer of topic ``name``. The first one creates it with ``capacity``
    slots of ``slot_bytes`` each; later ones (any process) may pass 0 to take
    the existing sizes. One producer may be shared by threads."""

    _ROLE = "producer"

    def __init__(self, name: str, capacity: int = 0, slot_bytes: int = 0) -> None:
        self.name = validate_name(name, "ordered topic name")
        self._pid = os.getpid()
        self._native = _queues.OrderedProducer(
            segment_dir(), topic_basename(name), _uint("capacity", capacity), _uint("slot_bytes", slot_bytes), _mode()
        )

    def reserve(self, id: Optional[int] = None, timeout: Optional[float] = None) -> Reservation:
        """Reserve the next id (or exactly ``id``, which must not be reserved yet:
        ids skipped over become gaps readers pass). Waits while 16 ids are in flight."""
        native = self._open()
        got = native.reserve(None if id is None else _uint("id", id), _left(_deadline(timeout)))
        if isinstance(got, str):
            _raise_status(
                got,
                f"ordered topic {self.name!r}: no id within {timeout} s: message "
                f"{native.oldest_in_flight} was reserved but not published (its producer is slow "
                f"or died)",
            )
        return Reservation(self, got)

    def send(self, data: "BufferLike", timeout: Optional[float] = None, t0: int = 0, t1: int = 0) -> int:
        """Reserve the next id, copy ``data`` (bytes-like) into it, publish; returns the id."""
        native = self._open()
        try:
            view = memoryview(cast("Buffer", data))  # an ndarray too (numpy's stubs say so from 3.12 on)
        except TypeError:
            raise IpcTypeError(f"send() takes a bytes-like object, not {type(data).__name__}") from None
        got = native.send(view, _left(_deadline(timeout)), _uint("t0", t0), _uint("t1", t1))
        if isinstance(got, str):
            _raise_status(
                got,
                f"ordered topic {self.name!r}: no id within {timeout} s: message "
                f"{native.oldest_in_flight} was reserved but not published",
            )
        return got

    def availability(self) -> Availability:
        return Availability(*self._open().availability())

    def is_available(self, id: int) -> bool:
        return self._open().is_available(_uint("id", id))

    def shutdown(self) -> None:
        """Wake every reader and producer waiting on the topic; their calls raise QueueShutdownError."""
        self._open().shutdown()


class OrderedReader(_Attached):
    """A reader of an existing topic: ``mode="sequential"`` (every id, in id
    order) or ``"newest"`` (the newest available message, skipping older
    ones). It starts at the first id still in flight when it attaches."""

    _ROLE = "reader"

    def __init__(self, name: str, mode: str = "sequential") -> None:
        check_choice("mode", mode, MODES)
        self.name = validate_name(name, "ordered topic name")
        self.mode = mode
        self._pid = os.getpid()
        self._native = _queues.OrderedReader(segment_dir(), topic_basename(name), mode, _mode())

    def recv(self, timeout: Optional[float] = None) -> Message:
        """The next message (copied out and checked); ``TimeoutError`` after ``timeout`` s."""
        native = self._open()  # once: a close() on another thread sets _native to None
        got = native.recv(_left(_deadline(timeout)))
        if isinstance(got, str):
            _raise_status(got, f"ordered topic {self.name!r}: message {native.cursor} did not come within {timeout} s")
        return Message(*got)

    def _recv_view(self, timeout: Optional[float]) -> Tuple[Any, ...]:
        """(id, read-only view into the slot, t0, t1, stamp), without copying;
        ``_is_valid(id, stamp)`` says whether the slot still holds it."""
        got = self._open().recv(_left(_deadline(timeout)), True)
        if isinstance(got, str):
            _raise_status(got, f"ordered topic {self.name!r}: no message within {timeout} s")
        return got

    def _is_valid(self, id_: int, stamp: int) -> bool:
        return self._native is not None and self._native.is_valid(id_, stamp)

    def availability(self) -> Availability:
        return Availability(*self._open().availability())

    def __iter__(self) -> Iterator[Message]:
        """Messages until a shutdown."""
        while True:
            try:
                yield self.recv()
            except QueueShutdownError:
                return

    @property
    def dropped(self) -> int:  # ids the ring overwrote before we read them
        return self._open().dropped

    @property
    def gaps(self) -> int:  # ids skipped by reserve(id=...), cancelled or reclaimed
        return self._open().gaps

    @property
    def reclaimed(self) -> int:  # of the gaps: ids whose producer died holding them
        return self._open().reclaimed

    def shutdown(self) -> None:
        self._open().shutdown()


__all__ = [
    "OrderedProducer",
    "OrderedReader",
    "Reservation",
    "Message",
    "Availability",
    "MODES",
    "WINDOW",
    "topic_basename",
]
