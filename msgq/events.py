"""Fake events: let a test decide when each ``receive()`` of a process runs.

The reference's deterministic-testing hooks (commaai/msgq ``event.cc``,
``impl_fake.h``), with the same Python API. With the ``fake`` backend
(``CEREAL_FAKE=1``, :func:`toggle_fake_events`, or ``MSGQ_BACKEND=fake``), a
subscriber whose event handle is enabled does, at each ``receive()``:

1. set its ``recv_called`` event (the harness learns the consumer has
   finished its previous step and is asking for the next message);
2. wait for ``recv_ready`` (the harness has published what this step gets);
3. clear ``recv_ready``, then receive normally.

A harness therefore runs a consumer in lockstep, with no sleeps::

    handle = msgq.fake_event_handle("carState", enable=True)  # before the consumer connects, or after
    called, ready = handle.recv_called_event, handle.recv_ready_event
    called.wait(10); called.clear()      # the consumer is in receive()
    pub.send(msg); ready.set()           # deliver exactly this message
    called.wait(10)                      # it has processed it (and published its output)

One handle state exists per (run prefix, identifier, endpoint); the fake
subscriber uses identifier ``CEREAL_FAKE_PREFIX`` (empty if unset). Events
are FIFOs: ``set()`` writes a byte, ``clear()`` drains them (returns how
many), ``wait()``/``peek()`` poll for one.

Unlike the reference, the state file and FIFOs live in the segment directory
(``/dev/shm``) under the run prefix (``msgq@PREFIX@fake@IDENTIFIER@ENDPOINT``,
``msgq@PREFIX@fake~TOKEN.called|ready``), are created owner-only, and are
removed when the last handle or subscriber using them closes (or is
collected); files of killed processes are swept by the next owning handle or
publisher. Names follow the topic rules (no ``/``, no ``..``). All waits
release the GIL and are interrupted by Ctrl-C. If the harness that owns the
FIFOs closes its handle or dies, a subscriber waiting in step 2 is released
and later receives run normally: a consumer never hangs on a dead harness.
"""

import contextlib
import hashlib
import math
import mmap
import os
import secrets
import select
import struct
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Union

from msgq import _msgq, artifacts
from msgq._shared import ClosesOnExit
from msgq.errors import ClosedError, IpcError, IpcTimeoutError, IpcTypeError, SegmentError
from msgq.names import current_prefix, run_segment_prefix, segment_dir, validate_name

__all__ = [
    "Event",
    "SocketEventHandle",
    "toggle_fake_events",
    "set_fake_prefix",
    "get_fake_prefix",
    "delete_fake_prefix",
    "wait_for_one_event",
]

FAKE_ENV = "CEREAL_FAKE"
FAKE_PREFIX_ENV = "CEREAL_FAKE_PREFIX"

# --- the shared state file -------------------------------------------------------------
# Layout (64 bytes, little endian):
#   0  magic "MSGQFEV1"
#   8  enabled (u8): any handle writes it at any time; subscribers read it at every receive
#   12 generation (u32): bumped after every token change, under the attach lock
#   16 token (48 bytes ASCII, NUL padded): names the owner's FIFOs; "" when none.
#      Written and read only under the attach lock (byte 0), so never torn.
# The file is a ShmFile (cpp/common/shm_file.h, bound as _msgq.ShmFile): the C++ core
# opens it (O_NOFOLLOW, owner checks), takes its locks (the attach lock guards the token)
# and unlinks it when the last user leaves, as for the segments, so the stale sweep treats
# these files like segments. Only the 64 bytes above are this module's.
_MAGIC = b"MSGQFEV1"
_STATE_SIZE = 64
_OFF_ENABLED = 8
_OFF_GENERATION = 12
_OFF_TOKEN = 16
_TOKEN_SIZE = 48

_FIFO_KINDS = ("called", "ready")
RECV_CALLED, RECV_READY = 0, 1


def _text(value: Union[str, bytes, bytearray, None], what: str) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise IpcTypeError(f"{what} must be str or bytes, not {type(value).__name__}")
    return value


def _identifier(value: Union[str, bytes, None]) -> str:
    text = _text(value, "fake-event identifier")
    return validate_name(text, "fake-event identifier") if text else ""


def _state_basename(prefix: str, identifier: str, endpoint: str) -> str:
    base = run_segment_prefix(prefix)
    name = f"{base}fake@{identifier}@{endpoint}"  # '@' is never part of a name: no collisions
    if len(name.encode()) > _msgq.MAX_FILE_NAME_LENGTH:
        digest = hashlib.blake2b(f"{identifier}@{endpoint}".encode(), digest_size=16).hexdigest()
        name = f"{base}fake#{digest}"
    return name


def _fifo_rest(token: str, kind: str) -> str:
    """A FIFO's name after the run prefix: ``fake~TOKEN.KIND``, TOKEN = ``PID-RANDOM``
    (the form msgq.artifacts judges such files by)."""
    return f"fake~{token}.{kind}"


def _fifo_basename(prefix: str, token: str, kind: str) -> str:
    return run_segment_prefix(prefix) + _fifo_rest(token, kind)


def _sweep_stale(directory: str, prefix: str) -> None:
    """Remove what killed processes of this run left behind (FIFOs whose creator is
    gone, state files nobody has attached, and every other kind: msgq.artifacts)."""
    artifacts.sweep(directory, prefix)


class _State:
    """One process's attachment to a handle state file (created if missing)."""

    def __init__(self, endpoint: Union[str, bytes], identifier: Union[str, bytes, None]) -> None:
        endpoint = validate_name(_text(endpoint, "endpoint"))
        identifier = _identifier(identifier)
        self.endpoint, self.identifier = endpoint, identifier
        self.prefix = current_prefix()
        self.directory = segment_dir()
        self.pid = os.getpid()
        # opened (O_NOFOLLOW, owner checks) with its attach lock held, by the C++ core
        self.file = _msgq.ShmFile(self.directory, _state_basename(self.prefix, identifier, endpoint), 0o600)
        self.path = self.file.path
        self.mm: Any = None  # the state file's mmap.mmap (None once detached)
        try:
            self.mm = self._map(self.file)
            self.file.finish_attach()
        except BaseException:
            if self.mm is not None:
                self.mm.close()
            self.file.close()
            raise

    def _map(self, file: _msgq.ShmFile) -> mmap.mmap:
        """Map the state, creating it in a new file (or one nobody else uses that holds
        something else: a leftover, as for the segments); a state in use that is not one
        is refused untouched."""
        size = file.size_at_open
        if size != _STATE_SIZE:
            if not file.alone_at_open:
                raise SegmentError(f"{self.path}: {size} bytes, not a msgq fake-event state")
            os.ftruncate(file.fd, 0)
            os.ftruncate(file.fd, _STATE_SIZE)
        mm = mmap.mmap(file.fd, _STATE_SIZE)
        if mm[: len(_MAGIC)] != _MAGIC:
            if not file.alone_at_open:
                mm.close()
                raise SegmentError(f"{self.path} is not a msgq fake-event state (bad magic)")
            mm[:] = _MAGIC.ljust(_STATE_SIZE, b"\0")
        return mm

    # Lock-free fields

    @property
    def enabled(self) -> bool:
        return self.mm[_OFF_ENABLED] != 0

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.mm[_OFF_ENABLED] = 1 if value else 0

    @property
    def generation(self) -> int:
        return struct.unpack_from("<I", self.mm, _OFF_GENERATION)[0]

    # Fields behind the attach lock

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.file.lock()  # bounded by MSGQ_LOCK_TIMEOUT_S, names a stuck holder, Ctrl-C ends it
        try:
            yield
        finally:
            self.file.unlock()

    def read_token(self) -> str:
        """The current owner's token ("" if none); call under :meth:`locked`."""
        raw = bytes(self.mm[_OFF_TOKEN : _OFF_TOKEN + _TOKEN_SIZE]).rstrip(b"\0")
        token = raw.decode("ascii", "replace")
        return token if artifacts.kind_of(_fifo_rest(token, _FIFO_KINDS[0])) == artifacts.FAKE_FIFO else ""

    def write_token(self, token: str) -> None:
        """Install ``token`` and bump the generation; call under :meth:`locked`."""
        self.mm[_OFF_TOKEN : _OFF_TOKEN + _TOKEN_SIZE] = token.encode("ascii").ljust(_TOKEN_SIZE, b"\0")
        struct.pack_into("<I", self.mm, _OFF_GENERATION, (self.generation + 1) & 0xFFFFFFFF)

    def fifo_path(self, token: str, which: int) -> str:
        return os.path.join(self.directory, _fifo_basename(self.prefix, token, _FIFO_KINDS[which]))

    def detach(self, on_leave: Optional[Callable[[mmap.mmap], None]] = None) -> None:
        """Leave the state; the last user unlinks it. ``on_leave(mm)`` runs
        under the attach lock first. In a forked child that inherited the
        attachment, only the descriptors are closed (ShmFile.close knows)."""
        mm, file = self.mm, self.file
        if mm is None:
            return
        try:
            if on_leave is not None and file.opened_here:
                file.lock()  # held on by close(), which takes it again
                on_leave(mm)
        finally:
            self.mm = None
            mm.close()  # first: its duplicate descriptor would keep our locks past close()
            file.close()


def _open_fifo(path: str, flags: int) -> Optional[int]:
    """Open one of our FIFOs, non-blocking (the C++ core refuses a symbolic link,
    anything but a FIFO and another user's); None if it does not exist (or,
    writing, has no reader: the harness is gone)."""
    fd = _msgq.open_fifo(path, flags)
    return None if fd < 0 else fd


def _poll_timeout_ms(timeout: Optional[float]) -> Optional[int]:
    """Seconds (the reference's unit; floats welcome) to poll() milliseconds; None or <0: forever."""
    if timeout is None or timeout < 0:
        return None
    return int(math.ceil(timeout * 1000))


def _timeout_error(timeout: Optional[float], what: str = "event") -> IpcTimeoutError:
    return IpcTimeoutError(f"{what} timed out after {timeout} s (pid {os.getpid()})")


class Event:
    """One fake event (a FIFO): ``set()`` raises it, ``clear()`` lowers it and
    returns how many ``set()`` calls it absorbed, ``wait(timeout)`` blocks up
    to ``timeout`` seconds (negative or None: forever) and raises
    :class:`IpcTimeoutError` (a ``RuntimeError``) if it stays low, ``peek()``
    tells without waiting. ``fd`` is -1 for an event whose FIFO does not
    exist (see ``SocketEventHandle(..., override=False)``)."""

    __slots__ = ("_fd", "_owner", "__weakref__")

    def __init__(self, fd: int = -1, _owner: Optional["SocketEventHandle"] = None) -> None:
        self._fd = int(fd)
        self._owner = _owner  # keeps the handle (and so the descriptor) alive

    @property
    def fd(self) -> int:
        owner = self._owner
        return -1 if owner is not None and owner.closed else self._fd

    @property
    def ptr(self) -> int:
        """An identity for this event (the reference's C++ address; here ``id()``)."""
        return id(self)

    def _valid_fd(self) -> int:
        fd = self.fd
        if fd < 0:
            owner = self._owner
            if owner is not None and owner.closed:
                raise ClosedError("Event's SocketEventHandle is closed")
            raise IpcError("Event has no valid file descriptor (no FIFO yet: create a handle with override=True)")
        return fd

    def set(self) -> None:
        try:
            os.write(self._valid_fd(), b"\1")
        except BlockingIOError:
            pass  # the FIFO is full: the event is set already

    def clear(self) -> int:
        fd = self._valid_fd()
        total = 0
        while True:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return total
            if not chunk:
                return total
            total += len(chunk)

    def wait(self, timeout: Optional[float] = -1) -> None:
        if not _poll([self._valid_fd()], _poll_timeout_ms(timeout)):
            raise _timeout_error(timeout)

    def peek(self) -> bool:
        return bool(_poll([self._valid_fd()], 0))

    def __repr__(self) -> str:
        return f"<msgq.Event fd={self.fd}>"


# The longest one poll() system call waits: a signal that lands after Python last ran its
# handlers but before the call blocks (a Ctrl-C just as a receive starts waiting) interrupts
# nothing, and its handler (KeyboardInterrupt) runs only when the call returns.
SIGNAL_SLICE_MS = 200


def _poll_slices(poller: Any, timeout_ms: Optional[int]) -> List[Tuple[int, int]]:
    """``poller.poll(timeout_ms)`` (None: forever) in slices of at most SIGNAL_SLICE_MS,
    so a pending signal's handler runs within one slice. poll() releases the GIL; Python
    retries it after a signal unless the handler raises (KeyboardInterrupt propagates)."""
    deadline = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
    while True:
        left = SIGNAL_SLICE_MS if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        events = poller.poll(min(left, SIGNAL_SLICE_MS))
        if events or (deadline is not None and left <= SIGNAL_SLICE_MS):
            return events


def _poll(fds: List[int], timeout_ms: Optional[int]) -> List[int]:
    """Indices of ``fds`` with data, after up to ``timeout_ms`` (None: forever)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ready = {fd for fd, mask in _poll_slices(poller, timeout_ms) if mask & select.POLLIN}
    return [i for i, fd in enumerate(fds) if fd in ready]


def wait_for_one_event(events: Iterable[Event], timeout: Optional[float] = -1) -> int:
    """Wait up to ``timeout`` seconds (negative or None: forever) until one of
    ``events`` is set; return the index of the first set one. Raises
    :class:`IpcTimeoutError` (a ``RuntimeError``) on timeout."""
    events = list(events)
    if not events:
        raise IpcError("wait_for_one_event needs at least one event")
    ready = _poll([e._valid_fd() for e in events], _poll_timeout_ms(timeout))
    if not ready:
        raise _timeout_error(timeout, "wait_for_one_event")
    return ready[0]


class _HandleResources:
    """What a SocketEventHandle owns; released by close() or its finalizer
    (which must not reference the handle itself)."""

    def __init__(self, state: _State) -> None:
        self.state: Any = state  # the _State (None once closed)
        self.token = ""  # set if this handle created (owns) the FIFOs
        self.fds = [-1, -1]  # current FIFO descriptors (O_RDWR)
        self.seen_generation: Optional[int] = None
        self.stale_fds: List[int] = []  # replaced descriptors, kept open for Event objects that still hold them

    def close(self) -> None:
        state, self.state = self.state, None
        if state is None:
            return
        try:
            if self.token and os.getpid() == state.pid:
                token = self.token

                def leave(mm: mmap.mmap) -> None:
                    if state.read_token() == token:  # still the owner: hand the topic back to normal delivery
                        mm[_OFF_ENABLED] = 0
                        state.write_token("")
                    for which in (RECV_CALLED, RECV_READY):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(state.fifo_path(token, which))
                    if self.fds[RECV_READY] >= 0:  # release a subscriber waiting for us
                        with contextlib.suppress(BlockingIOError):
                            os.write(self.fds[RECV_READY], b"\1")

                state.detach(leave)
            else:
                state.detach()
        finally:
            for fd in self.fds + self.stale_fds:
                if fd >= 0:
                    os.close(fd)
            self.fds, self.stale_fds = [-1, -1], []


class SocketEventHandle(ClosesOnExit):
    """The fake-event state of one endpoint for one identifier (the fake
    subscriber uses ``CEREAL_FAKE_PREFIX``) in this run prefix.

    ``override=True`` makes this handle the owner: it creates fresh FIFOs
    (taking over from any earlier owner) and resets ``enabled`` to False.
    ``override=False`` only attaches: its events have ``fd == -1`` while no
    owner exists. Close it (or use ``with``) to remove the FIFOs; the owner
    closing also disables the events, so consumers go back to normal delivery.
    """

    def __init__(self, endpoint: str, identifier: Union[str, bytes] = "", override: bool = True) -> None:
        state = _State(endpoint, identifier)
        self._res = res = _HandleResources(state)
        self._finalizer = weakref.finalize(self, res.close)
        self.endpoint, self.identifier = state.endpoint, state.identifier
        try:
            if override:
                _sweep_stale(state.directory, state.prefix)
                self._take_over(res)
            else:
                self._refresh()
        except BaseException:
            self.close()
            raise

    def _take_over(self, res: _HandleResources) -> None:
        state = res.state
        token = f"{os.getpid()}-{secrets.token_hex(8)}"  # PID-RANDOM: the stale sweep reads the pid
        with state.locked():
            old = state.read_token()
            fds = []
            try:
                for which in (RECV_CALLED, RECV_READY):
                    path = state.fifo_path(token, which)
                    os.mkfifo(path, 0o600)
                    fd = _open_fifo(path, os.O_RDWR)
                    if fd is None:
                        raise IpcError(f"fake-event FIFO {path} vanished while being created")
                    fds.append(fd)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                for which in (RECV_CALLED, RECV_READY):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(state.fifo_path(token, which))
                raise
            state.enabled = False
            state.write_token(token)
            res.token, res.fds, res.seen_generation = token, fds, state.generation
            if old:  # an earlier owner's FIFOs: its open descriptors keep working, its subscribers move to ours
                for which in (RECV_CALLED, RECV_READY):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(state.fifo_path(old, which))

    def _refresh(self) -> None:
        """For a non-owning handle: follow the owner's FIFOs if they changed."""
        res = self._res
        state = res.state
        if res.token or state.generation == res.seen_generation:
            return
        with state.locked():
            generation, token = state.generation, state.read_token()
            fds = [-1, -1]
            if token:
                for which in (RECV_CALLED, RECV_READY):
                    fd = _open_fifo(state.fifo_path(token, which), os.O_RDWR)
                    fds[which] = -1 if fd is None else fd
        res.stale_fds.extend(fd for fd in res.fds if fd >= 0)
        res.fds, res.seen_generation = fds, generation

    def _state(self) -> _State:
        state = self._res.state
        if state is None:
            raise ClosedError(f"SocketEventHandle for {self.endpoint!r} is closed")
        return state

    @property
    def enabled(self) -> bool:
        return self._state().enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        state = self._state()
        if value:
            self._refresh()
            if self._res.fds[RECV_READY] < 0:
                raise IpcError(
                    f"no fake events exist for {self.endpoint!r} (identifier {self.identifier!r}): "
                    "create a handle with override=True first"
                )
        state.enabled = bool(value)

    def _event(self, which: int) -> Event:
        self._state()
        self._refresh()
        return Event(self._res.fds[which], _owner=self)

    @property
    def recv_called_event(self) -> Event:
        """Set by the subscriber when its receive() starts."""
        return self._event(RECV_CALLED)

    @property
    def recv_ready_event(self) -> Event:
        """Set by the harness to let one waiting receive() go on."""
        return self._event(RECV_READY)

    @property
    def owner(self) -> bool:
        """True if this handle created the FIFOs (``override=True``)."""
        return bool(self._res.token)

    @property
    def closed(self) -> bool:
        return self._res.state is None

    def close(self) -> None:
        """Release the state; an owner removes its FIFOs and disables the events."""
        self._finalizer()

    def __repr__(self) -> str:
        if self.closed:
            return f"<SocketEventHandle {self.endpoint!r} closed>"
        role = "owner" if self.owner else "attached"
        return f"<SocketEventHandle {self.endpoint!r} identifier={self.identifier!r} {role} enabled={self.enabled}>"


class SubscriberHook:
    """The subscriber side of the handshake (used by the ``fake`` backend).

    Attaches to the state of (run prefix, ``identifier``, ``endpoint``) and,
    when it is enabled, runs the handshake before each receive. Holds no
    reference to its subscriber, so a finalizer may call :meth:`close`.
    """

    def __init__(self, endpoint: str, identifier: Union[str, bytes]) -> None:
        self._state: Any = _State(endpoint, identifier)  # None once closed
        self.mm = self._state.mm  # receive() reads the enabled byte straight from it
        self._generation: Optional[int] = None
        self._called = -1  # O_WRONLY: we only set it
        self._ready = -1  # O_RDONLY: poll() reports POLLHUP once no harness holds it
        self._poller: Any = None  # a select.poll on the ready FIFO

    @property
    def enabled(self) -> bool:
        return self.mm is not None and self.mm[_OFF_ENABLED] != 0

    def _close_fifos(self) -> None:
        for fd in (self._called, self._ready):
            if fd >= 0:
                os.close(fd)
        self._called = self._ready = -1
        self._poller = None

    def _reopen(self) -> None:
        state = self._state
        self._close_fifos()
        with state.locked():
            self._generation, token = state.generation, state.read_token()
            if not token:
                return
            # ready first: if a harness holds the FIFOs now, a later hang-up is reported
            ready = _open_fifo(state.fifo_path(token, RECV_READY), os.O_RDONLY)
            called = _open_fifo(state.fifo_path(token, RECV_CALLED), os.O_WRONLY) if ready is not None else None
        if ready is None or called is None:
            if ready is not None:
                os.close(ready)
            return
        self._called, self._ready = called, ready
        self._poller = select.poll()
        self._poller.register(ready, select.POLLIN)

    def handshake(self) -> None:
        """recv_called.set(); recv_ready.wait(); recv_ready.clear()."""
        if self._state.generation != self._generation:
            self._reopen()
        if self._ready < 0:
            return  # enabled but no harness FIFOs: deliver normally
        try:
            os.write(self._called, b"\1")
        except BlockingIOError:
            pass
        except BrokenPipeError:  # nobody reads recv_called any more: the harness is gone
            self._close_fifos()
            return
        events = _poll_slices(self._poller, None)  # Ctrl-C raises here
        if any(mask & select.POLLIN for _, mask in events):
            while True:
                try:
                    if not os.read(self._ready, 4096):
                        break
                except BlockingIOError:
                    break
        else:  # POLLHUP: every holder of the FIFOs closed them (harness gone)
            self._close_fifos()

    def close(self) -> None:
        state, self.mm = self._state, None
        if state is not None:
            self._state = None
            try:
                state.detach()
            finally:
                self._close_fifos()


def toggle_fake_events(enabled: bool) -> None:
    """Make sockets connected afterwards (here and in child processes) use the
    ``fake`` backend (``CEREAL_FAKE=1``), or stop doing so. An
    ``MSGQ_BACKEND`` naming another backend is switched along with it."""
    if enabled:
        os.environ[FAKE_ENV] = "1"
        if os.environ.get("MSGQ_BACKEND", "fake") != "fake":
            os.environ["MSGQ_BACKEND"] = "fake"
    else:
        os.environ.pop(FAKE_ENV, None)
        if os.environ.get("MSGQ_BACKEND") == "fake":
            del os.environ["MSGQ_BACKEND"]


def set_fake_prefix(prefix: Union[str, bytes]) -> None:
    """Set ``CEREAL_FAKE_PREFIX``, the identifier fake subscribers use; an empty prefix unsets it."""
    prefix = _identifier(prefix)
    if prefix:
        os.environ[FAKE_PREFIX_ENV] = prefix
    else:
        os.environ.pop(FAKE_PREFIX_ENV, None)


def get_fake_prefix() -> bytes:
    """``CEREAL_FAKE_PREFIX`` as bytes (b"" if unset), as the reference returns it."""
    return os.environ.get(FAKE_PREFIX_ENV, "").encode("utf-8")


def delete_fake_prefix() -> None:
    os.environ.pop(FAKE_PREFIX_ENV, None)


def fake_prefix() -> str:
    """``CEREAL_FAKE_PREFIX`` as str (the fake subscriber's identifier)."""
    return os.environ.get(FAKE_PREFIX_ENV, "")
