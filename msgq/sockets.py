"""The public socket classes, compatible with commaai's msgq Python API.

Code written for the reference runs unchanged::

    ctx = msgq.Context()
    pub = msgq.PubSocket(); pub.connect(ctx, "topic")
    sub = msgq.SubSocket(); sub.connect(ctx, "topic")
    pub.send(b"hello"); sub.receive()  # -> b"hello"

Beside it, a small Pythonic layer: context managers, iteration, ``fileno()``,
``receive_batch()``, and zero-copy publishing with ``PubSocket.loan()``.
Receives always copy out of the ring (the copy is what makes a lapped reader
safe); sends copy in, unless you fill a loan in place.
"""

import os
import sys
import time
import types
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Type, Union, cast

from msgq import backends
from msgq._shared import INT32_MAX, INT64_MAX, MAX_SPIN_US, ClosesOnExit, check_int, check_timeout_ms, deadline, expired
from msgq.errors import ClosedError, InvalidArgumentError, IpcError
from msgq.schemas import forget_schema

if TYPE_CHECKING:
    import asyncio  # at run time imported where used: it costs most of msgq's import time

    from msgq._shared import BufferLike


def _text(value: Union[str, bytes, bytearray]) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else value


def _size(what: str, value: int) -> int:
    """A byte count as an int >= 0 (the backend checks its own upper limits)."""
    return check_int(what, value, 0, INT64_MAX)


def _resolve(future: "asyncio.Future[None]") -> None:
    """``add_reader`` callback: the descriptor is readable (once is enough)."""
    if not future.done():
        future.set_result(None)


class Context:
    """Holds the backend its sockets use: ``backend`` if given, else the one
    the environment names (``MSGQ_BACKEND``, see :func:`msgq.backends.choose`)
    when each socket connects."""

    def __init__(self, backend: Optional[str] = None) -> None:
        self._backend = backends.load(backend) if backend is not None else None

    @property
    def backend(self) -> types.ModuleType:
        return self._backend if self._backend is not None else backends.load()

    def term(self) -> None:
        """Kept for compatibility: sockets own their resources and close on their own."""


class _Socket(ClosesOnExit):
    """What both socket kinds share: closing, the closed check, context
    management. ``_FAST`` names the hot method bound straight to the native one.
    No close at collection: the backend object closes itself when it is
    collected, and a bound ``receive``/``send`` or a :class:`Loan` may outlive
    the socket."""

    _FAST = ""
    _impl: Any  # the backend's Publisher or Subscriber (None before connect)
    _backend: Any  # the backend module (None before connect)
    endpoint: Optional[str]

    def close(self) -> None:
        impl = self._impl
        if impl is not None:
            was_open = not impl.closed
            impl.close()
            if was_open and self.endpoint is not None:  # the topic's schema file goes with its ring
                forget_schema(self.endpoint, isinstance(self, PubSocket), getattr(self._backend, "NAME", ""))
        self.__dict__.pop(self._FAST, None)

    @property
    def closed(self) -> bool:
        return self._impl is None or self._impl.closed

    def _connected(self) -> Any:
        if self._impl is None or self._impl.closed:
            kind = type(self).__name__
            raise ClosedError(f"{kind} is not connected" if self._impl is None else f"{kind} is closed")
        return self._impl

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected"
        return f"<{type(self).__name__} {self.endpoint!r} {state}>"


class SubSocket(_Socket):
    """Receives the messages of one topic, in order, each exactly once.

    A subscriber that falls a whole ring behind is reset to the newest data
    and counts the loss in ``resets``; it is never handed a torn message.
    """

    _FAST = "receive"

    def __init__(self) -> None:
        self._impl = None
        self._backend = None
        self._timeout = -1
        self.endpoint = None
        # receive_async()'s pending future -> its event loop (close() resolves it)
        self._async_waits: Dict["asyncio.Future[None]", "asyncio.AbstractEventLoop"] = {}

    def connect(
        self,
        context: Context,
        endpoint: Union[str, bytes],
        address: Union[str, bytes] = "127.0.0.1",
        conflate: bool = False,
        segment_size: int = 0,
    ) -> None:
        if self._impl is not None:
            raise IpcError(f"SubSocket is already connected to {self.endpoint!r}")
        endpoint = _text(endpoint)
        impl = context.backend.Subscriber(endpoint, _text(address), bool(conflate), _size("segment_size", segment_size))
        impl.set_timeout(self._timeout)
        self._impl, self._backend, self.endpoint = impl, context.backend, endpoint
        # The hot path calls the native method directly (saves a Python frame per message).
        self.receive = impl.receive  # type: ignore[method-assign]

    def receive(self, non_blocking: bool = False) -> Optional[bytes]:
        """The next message as ``bytes``, or ``None`` if none came in time
        (see :meth:`setTimeout`; without one, block until a message comes)."""
        raise ClosedError("SubSocket is not connected" if self.endpoint is None else "SubSocket is closed")

    def setTimeout(self, timeout: Optional[float]) -> None:
        """Milliseconds :meth:`receive` waits; negative or ``None``: forever
        (at most 2**31 - 1 ms; anything else is an InvalidArgumentError)."""
        self._timeout = check_timeout_ms(timeout)
        if self._impl is not None:
            self._impl.set_timeout(self._timeout)

    @property
    def timeout(self) -> Optional[int]:
        return None if self._timeout < 0 else self._timeout

    def receive_batch(self, max_messages: int = 1024, timeout: Optional[float] = 0) -> List[bytes]:
        """Up to ``max_messages`` waiting messages in one call (the shared-memory
        backend also stops after 256 KiB); waits up to ``timeout`` ms
        (negative: forever) for the first one. An empty list: nothing came."""
        max_messages = check_int("max_messages", max_messages, 0, INT32_MAX)
        return self._connected().receive_batch(max_messages, check_timeout_ms(timeout))

    def ready(self) -> bool:
        """True if a receive would not wait."""
        return self._connected().ready()

    def fileno(self) -> int:
        """A descriptor for select/epoll: call :meth:`arm` before waiting on it
        (arm returns True, without arming, if a message is already there)."""
        return self._connected().fileno()

    def arm(self) -> bool:
        return self._connected().arm()

    def disarm(self) -> None:
        self._connected().disarm()

    @property
    def resets(self) -> int:
        """How many times this subscriber fell a whole ring behind and skipped ahead."""
        return self._connected().resets

    @property
    def spin_us(self) -> int:
        """Longest busy-wait (µs) before a blocking receive sleeps; 0 never spins."""
        return self._connected().spin_us

    @spin_us.setter
    def spin_us(self, value: int) -> None:
        self._connected().spin_us = check_int("spin_us", value, 0, MAX_SPIN_US)

    async def receive_async(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """Await the next message (``bytes``), or ``None`` after ``timeout``
        seconds (``None``: no limit). Waits on :meth:`fileno` in the running
        event loop: no thread and no polling loop per socket."""
        import asyncio  # lazily: it costs most of msgq's import time

        impl = self._connected()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        fd = None  # our own duplicate of the wake-up descriptor: a close() elsewhere cannot close it under the loop
        try:
            while True:
                msg = impl.receive(True)  # ClosedError once closed meanwhile
                if msg is not None:
                    return msg
                if impl.arm():  # a message arrived between the receive and arming
                    continue
                if fd is None:
                    fd = os.dup(impl.fileno())
                readable = loop.create_future()
                self._async_waits[readable] = loop
                loop.add_reader(fd, _resolve, readable)
                try:
                    if impl.closed:  # by a close() that looked for waiters before we registered
                        continue
                    left = None if deadline is None else max(0.0, deadline - loop.time())
                    await asyncio.wait_for(readable, left)
                except asyncio.TimeoutError:
                    if impl.ready():
                        continue
                    return None
                finally:
                    loop.remove_reader(fd)
                    self._async_waits.pop(readable, None)
                    if not impl.closed:
                        impl.disarm()
        finally:
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        """Also from any thread or task: every receive_async() waiting wakes and
        raises ClosedError (its descriptor is its own, closed by itself)."""
        super().close()
        for future, loop in list(self._async_waits.items()):
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: nothing waits there any more
                pass

    def __iter__(self) -> Iterator[bytes]:
        """Yield messages until a receive times out."""
        while True:
            msg = self.receive()
            if msg is None:
                return
            yield msg


class Loan:
    """A message being written in place in the ring (zero copy).

    ``data`` is a writable memoryview of ``size`` bytes. :meth:`commit`
    publishes the first ``n`` bytes; used as a context manager it commits all
    of them on success and cancels on an exception. Release any view you made
    of ``data`` (numpy arrays too) before committing.
    """

    def __init__(self, impl: Any, size: int) -> None:
        self._impl = impl
        self._buffer = impl.loan(size)
        self.size = size
        self.data: Optional[memoryview] = memoryview(self._buffer)

    def commit(self, size: Optional[int] = None) -> None:
        """Publish the first ``size`` bytes (default: all). A size that is not
        an int from 0 to the loan's size raises and leaves the loan open."""
        if self.data is None:
            raise IpcError("this loan was already committed or cancelled")
        size = self.size if size is None else check_int("commit size", size, 0, self.size)
        self._release()
        self._impl.commit(size)

    def cancel(self) -> None:
        self._release()
        self._impl.cancel_loan()

    def _release(self) -> None:
        if self.data is None:
            raise IpcError("this loan was already committed or cancelled")
        try:
            self.data.release()
            # A view made from `data` (numpy does this) shares its managed
            # buffer, which holds a reference to the loan buffer: any count
            # above ours (+1 for the call) means a view still points into the ring.
            still_viewed = sys.getrefcount(self._buffer) > 2
        except BufferError:
            still_viewed = True
        if still_viewed:
            self.data = memoryview(self._buffer)
            raise IpcError("release every view of the loaned buffer (memoryview, numpy array) before commit")
        self.data = self._buffer = None

    def __enter__(self) -> memoryview:
        return cast(memoryview, self.data)

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[types.TracebackType]
    ) -> None:
        if self.data is None:
            return
        if exc_type is None:
            self.commit()
        else:
            self.cancel()


class PubSocket(_Socket):
    """Publishes messages on one topic. One publisher per topic: the last one
    to connect wins, and an older one's next send raises
    :class:`MultiplePublishersError`."""

    _FAST = "send"

    def __init__(self) -> None:
        self._impl = None
        self._backend = None
        self.endpoint = None

    def connect(
        self, context: Context, endpoint: Union[str, bytes], segment_size: int = 0, wake: Optional[str] = None
    ) -> None:
        """Publish on ``endpoint``; ``wake`` ("all" or "handoff"; None: ``MSGQ_WAKE``,
        else "all") is how a send wakes subscribers asleep in a blocking receive."""
        if self._impl is not None:
            raise IpcError(f"PubSocket is already connected to {self.endpoint!r}")
        endpoint = _text(endpoint)
        impl = context.backend.Publisher(endpoint, _size("segment_size", segment_size), wake)
        self._impl, self._backend, self.endpoint = impl, context.backend, endpoint
        self.send = impl.send  # type: ignore[method-assign]

    def send(self, data: "BufferLike") -> None:
        """Publish ``data`` (bytes or any C-contiguous buffer); copies it into the ring once."""
        raise ClosedError("PubSocket is not connected" if self.endpoint is None else "PubSocket is closed")

    def loan(self, size: int) -> Loan:
        """Reserve ``size`` bytes in the ring to fill in place; see :class:`Loan`."""
        return Loan(self._connected(), _size("loan size", size))

    def all_readers_updated(self) -> bool:
        """True if there is at least one reader and every one has read everything sent."""
        return self._connected().all_readers_updated()

    @property
    def num_readers(self) -> int:
        """Subscribers currently attached (dead ones are reclaimed first)."""
        return self._connected().num_readers()

    def wait_for_readers(self, count: int = 1, timeout: Optional[float] = None) -> bool:
        """Wait until at least ``count`` subscribers are attached; ``timeout`` in
        seconds (``None``: forever). Returns whether they are."""
        count = check_int("count", count, 0, INT32_MAX)
        until = deadline(timeout)
        while self.num_readers < count:
            if expired(until):
                return False
            time.sleep(0.002)
        return True

    @property
    def wake(self) -> str:
        """How a send wakes subscribers asleep in a blocking receive: ``"all"`` (the
        publisher wakes every sleeper with one system call) or ``"handoff"`` (it wakes
        one, and that subscriber wakes the others)."""
        return "handoff" if self._connected().handoff_wakes else "all"

    @property
    def readers_woken(self) -> int:
        """Sleeping subscribers this publisher's own system calls have woken so far:
        about sleepers x messages with ``wake="all"``, at most one per message with
        ``"handoff"``; always 0 on the zmq backend (ZeroMQ wakes its subscribers)."""
        return self._connected().readers_woken

    @property
    def max_message_size(self) -> int:
        return self._connected().max_message_size

    @property
    def segment_size(self) -> int:
        return self._connected().segment_size


class Poller:
    """Waits on many subscribers at once. ``poll(timeout_ms)`` returns the
    registered sockets that have a message (an empty list on timeout)."""

    def __init__(self) -> None:
        self._sockets: List[SubSocket] = []
        self._impl: Any = None
        self._backend: Optional[types.ModuleType] = None

    def registerSocket(self, socket: SubSocket) -> None:
        impl = socket._connected()
        if any(s is socket for s in self._sockets):
            raise InvalidArgumentError(f"{socket!r} is already registered with this Poller")
        if self._impl is None:
            self._impl, self._backend = socket._backend.Poller(), socket._backend
        elif socket._backend is not self._backend:
            raise InvalidArgumentError("a Poller cannot mix sockets of different backends")
        self._impl.add(impl)
        self._sockets.append(socket)

    def poll(self, timeout: Optional[float]) -> List[SubSocket]:
        timeout = check_timeout_ms(timeout)
        if self._impl is None:
            if timeout > 0:
                time.sleep(timeout / 1000)
            return []
        return [self._sockets[i] for i in self._impl.poll(timeout)]

    def fileno(self) -> int:
        """An epoll descriptor that becomes readable while :meth:`poll` waits."""
        if self._impl is None:
            raise ClosedError("register a socket before asking for the Poller's fileno()")
        return self._impl.fileno()

    def __len__(self) -> int:
        return len(self._sockets)
