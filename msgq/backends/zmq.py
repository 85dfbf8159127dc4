"""The ZeroMQ backend (``MSGQ_BACKEND=zmq``, or the reference's ``ZMQ=1``):
the msgq API over pyzmq TCP sockets, so a subscriber on another host can
receive a topic and a plain pyzmq ``SUB`` socket can read it.

Wire format and addresses
    A topic lives on TCP port ``msgq.names.zmq_port(topic)``:
    ``8023 + fnv1a64(key) % 57512``, key = ``TOPIC`` or ``PREFIX@TOPIC``
    under a run prefix (``MSGQ_PREFIX``). Every message is one ZeroMQ frame
    holding exactly the payload bytes (no topic frame, no header), so::

        s = zmq.Context.instance().socket(zmq.SUB)
        s.subscribe(b"")
        s.connect(f"tcp://{host}:{msgq.names.zmq_port('topic')}")
        s.recv()  # the bytes a msgq publisher sent on "topic"

    and a plain ``PUB`` bound on that port feeds msgq subscribers.

Publisher
    An ``XPUB`` bound to ``tcp://BIND:PORT``, BIND from ``MSGQ_ZMQ_BIND``
    (default ``*``: every interface, as the reference did, so anyone who can
    reach the port can subscribe unless CURVE is on, see below; set
    ``MSGQ_ZMQ_BIND=127.0.0.1`` to keep topics on this host, or the address
    of one interface). ``XPUB_VERBOSER`` reports every subscribe and
    unsubscribe, which is how ``num_readers()`` counts subscribers (the
    notices queue up in ZeroMQ until ``num_readers()`` reads them).
    Lossy like the shared-memory ring: ``send`` never blocks, and a
    subscriber that falls behind by about the high-water mark loses
    messages (``MSGQ_ZMQ_HWM`` messages, default 1000, for both the
    publisher's queue per subscriber and the subscriber's; ZeroMQ drops
    silently: ``resets`` stays 0). The publisher learns of its subscribers'
    progress in steps of half the HWM, so a burst of more than about half
    of it can already lose messages.
    One publisher per topic: a second one (in any process of this host)
    cannot bind the port and raises :class:`MultiplePublishersError` when
    it is created; the shared-memory backend lets the newest publisher win.
    Topic ports overlap Linux's ephemeral range (32768-60999 by default),
    so a port may be held by some outgoing connection, for up to a minute
    after it closed (TIME_WAIT); the publisher then retries for a moment
    and raises :class:`IpcError` saying so. Reserve your topics' ports with
    ``sysctl net.ipv4.ip_local_reserved_ports=PORT,...`` where that matters.

Subscriber
    A ``SUB`` connected to ``tcp://ADDRESS:PORT``, subscribed to everything.
    Connecting is asynchronous: a message published right after
    ``sub_sock()`` returns can be lost until the subscription has reached
    the publisher (ZeroMQ's "slow joiner"); ``pub.wait_for_readers()``
    waits for it. A subscriber reconnects on its own to a restarted
    publisher (it re-subscribes when it next receives or polls).

Authentication and encryption (off by default)
    ``MSGQ_ZMQ_CURVE_DIR=DIR`` (a keys directory, ``python -m msgq.curve
    DIR``): publishers are CURVE servers admitting only the client keys in
    ``DIR/authorized``, subscribers CURVE clients with ``DIR``'s client key
    pair trusting ``DIR/server.key``; all traffic is encrypted. A
    subscriber without an admitted key receives nothing. (A plain pyzmq
    SUB then needs the same CURVE options.)

Descriptors
    A publisher or subscriber is refused with ``DescriptorsExhaustedError``
    (an :class:`IpcError`) when fewer than ``msgq._descriptors.ZMQ_HEADROOM``
    descriptors are left: libzmq would abort the process instead.

Differences from the shared-memory backend, all inherent to ZeroMQ:
``all_readers_updated()`` is an approximation (True once at least one
subscriber is connected: ZeroMQ cannot see how far a reader has read);
drops are invisible (``resets`` is always 0); ``num_readers()`` follows
connects and disconnects with a network delay; ``segment_size`` has no
ring behind it but bounds a message as on the shared-memory backend
(``max_message_size``: about half of it), so a program moves between the
backends unchanged: the publisher refuses a larger message
(``MessageTooLargeError``), and a subscriber refuses one from the network
(``ZMQ_MAXMSGSIZE``, before buffering it: memory stays bounded whatever a peer
sends, without CURVE), so a subscriber of a topic with a larger
``segment_size`` than the default is given the same ``segment_size``. A peer
that breaks the limit loses its connection, which the subscriber makes again
after a back-off (msgq/_zmq_capped.py; logged once per subscriber); ``spin_us`` is accepted and ignored; the publisher's
``wake`` (or ``MSGQ_WAKE``) is checked and reported back but changes nothing
(ZeroMQ's own threads wake its subscribers: ``readers_woken`` stays 0); ``Poller.fileno()``
is not supported; ``fileno()`` is ZeroMQ's edge-triggered descriptor
(call ``arm()`` before each wait; it may wake without a message).
Loaned buffers are ordinary memory, copied into ZeroMQ at ``commit``.
Closing discards messages not yet sent (``LINGER`` 0), so an exiting
process never hangs on a dead peer.

Threads: a socket is used by one thread at a time (ZeroMQ sockets are not
thread-safe; a ``send()`` while another thread is inside one raises IpcError
instead of entering libzmq beside it), except ``close()``, which may come from any thread: it ends a
receive or poll waiting on the subscriber in another thread (that wait
raises :class:`ClosedError`), and a send or receive running meanwhile
finishes first. The hot paths take no lock for this (a lock would cost as
much as the send itself): see msgq/_guarded.py.
Processes: each process (a forked child too) gets its own ZeroMQ context;
sockets inherited across ``fork()`` are disowned in the child, which
cannot use them (``ClosedError``) and never closes the parent's.
"""

import errno
import itertools
import logging
import math
import os
import re
import threading
import time
import weakref
from typing import Any, Dict, List, Optional

import zmq

from msgq import curve as msgq_curve
from msgq._descriptors import ensure_descriptors
from msgq._guarded import Guarded
from msgq._msgq import DEFAULT_SEGMENT_SIZE, MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE
from msgq._msgq import max_message_size as _ring_max_message
from msgq._shared import wake_choice
from msgq._zmq_capped import CappedConnection
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    IpcError,
    IpcTypeError,
    MessageTooLargeError,
    MultiplePublishersError,
)
from msgq.names import zmq_port

NAME = "zmq"

DEFAULT_HWM = 1000  # messages queued per subscriber before the publisher drops (ZeroMQ's default)
MAX_MESSAGE_SIZE = _ring_max_message(MAX_SEGMENT_SIZE)  # the largest any topic allows (its segment_size's)
REBIND_GRACE_S = 2.0  # a port this process just closed is released by ZeroMQ's I/O thread a moment later
PORT_BUSY_GRACE_S = 1.0  # how long bind() retries while a TCP connection (not a listener) holds the port

_NOBLOCK = zmq.NOBLOCK
_POLLIN = zmq.POLLIN
_EVENTS = zmq.EVENTS
_Again = zmq.Again
_ZMQError = zmq.ZMQError
_zmq_poll = zmq.zmq_poll

_HOST = re.compile(r"[A-Za-z0-9_.%:*\[\]-]+\Z")

# ------------------------------------------------------------------ context, fork


_lock = threading.Lock()
_context = None
_context_pid = None
_live: "weakref.WeakSet[_Guarded]" = weakref.WeakSet()  # our sockets, to disown in a forked child
# the parent's zmq objects in a forked child: kept, never touched
_inherited: "List[zmq.Context[Any] | zmq.Socket[Any]]" = []
_closed_ports: Dict[int, float] = {}  # port -> monotonic time a publisher of this process closed it
_wake_ids = itertools.count()  # names of the subscribers' private inproc wake-up endpoints


def _zmq_context():
    global _context, _context_pid
    pid = os.getpid()
    if _context_pid != pid:
        with _lock:
            if _context_pid != pid:
                if _context is not None:
                    _inherited.append(_context)
                ctx = zmq.Context()
                ctx.setsockopt(zmq.LINGER, 0)
                _context, _context_pid = ctx, pid
    return _context


def _forget_after_fork():
    # The child shares its parent's zmq state only as copied memory: the I/O
    # threads did not survive the fork, and closing would write to the
    # parent's descriptors. Disown everything; pyzmq itself never closes a
    # socket created in another process.
    global _context, _context_pid, _lock
    _lock = threading.Lock()  # a parent thread may have held it at fork()
    for obj in list(_live):
        obj._forget_after_fork()
    _live.clear()
    if _context is not None:
        _inherited.append(_context)
    _context, _context_pid = None, None
    _closed_ports.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _host(address, what):
    """``(host for a tcp:// URL, is_ipv6)``; ``InvalidArgumentError`` if unusable."""
    if isinstance(address, (bytes, bytearray)):
        address = bytes(address).decode("utf-8", "replace")
    if not isinstance(address, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(address).__name__}")
    host = address.strip()
    if not host or not _HOST.match(host):
        raise InvalidArgumentError(f"{what} {address!r} is not a host name, IPv4 or IPv6 address")
    ipv6 = ":" in host
    if ipv6 and not host.startswith("["):
        host = f"[{host}]"
    return host, ipv6


def _curve_dir():
    """``MSGQ_ZMQ_CURVE_DIR``: a CURVE keys directory (msgq.curve), or None (no CURVE)."""
    return os.environ.get("MSGQ_ZMQ_CURVE_DIR") or None


def _new_socket(kind, what):
    """A socket of the process's context, once enough descriptors are left
    (libzmq aborts the process when it runs out)."""
    ensure_descriptors(what)
    return _zmq_context().socket(kind)


def _hwm():
    """High-water mark in messages: ``MSGQ_ZMQ_HWM`` (0: unlimited), default 1000."""
    text = os.environ.get("MSGQ_ZMQ_HWM", "")
    if not text:
        return DEFAULT_HWM
    try:
        hwm = int(text)
    except ValueError:
        hwm = -1
    if hwm < 0:
        raise InvalidArgumentError(f"MSGQ_ZMQ_HWM={text!r} is not a number of messages (>= 0; 0: unlimited)")
    return hwm


def _port_listening(port):
    """Whether a socket of this network namespace listens on TCP ``port``
    (None where ``/proc/net/tcp`` cannot tell)."""
    wanted, readable = f":{port:04X}", False
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as table:
                readable = True
                next(table, None)
                for line in table:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(wanted):  # 0A: LISTEN
                        return True
        except OSError:
            continue
    return False if readable else None


def _segment_size(segment_size):
    size = int(segment_size)
    if size == 0:
        return DEFAULT_SEGMENT_SIZE
    if not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE:
        raise InvalidArgumentError(
            f"segment_size must be between {MIN_SEGMENT_SIZE} and {MAX_SEGMENT_SIZE} bytes, got {size}"
        )
    return size


def _payload(data):
    """``data`` as something pyzmq sends byte for byte: any C-contiguous buffer."""
    try:
        view = memoryview(data)
    except TypeError:
        raise IpcTypeError(f"send() takes bytes or a C-contiguous buffer, not {type(data).__name__}") from None
    if not view.c_contiguous:
        raise IpcTypeError(
            "send() takes a C-contiguous buffer; this one is strided (copy it, e.g. numpy.ascontiguousarray)"
        )
    return view


# ------------------------------------------------------------------ closing from any thread


class _Guarded(Guarded):
    """msgq._guarded's protocol; a forked child keeps the parent's sockets untouched."""

    def _disown(self, sock):
        _inherited.append(sock)


# ------------------------------------------------------------------ publisher


def _too_large(n, endpoint, segment_size):
    return MessageTooLargeError(
        f"a {n}-byte message exceeds topic {endpoint!r}'s {_ring_max_message(segment_size)}-byte maximum (about half "
        f"its segment_size of {segment_size} bytes, as on the msgq backend): use a larger segment_size for the "
        f"publisher and its subscribers"
    )


def _publisher_send(raw_send, publisher, max_size, endpoint, segment_size):
    """``send`` for one publisher, with its state in cells, and the accessors
    the publisher's other methods use: ``(send, inside(), block(flag,
    closing_too=False), count_sent(n) -> total)``. ``publisher`` is a weak
    reference: the closure must not keep its owner alive."""
    inside = False
    blocked = False  # closed, or a loan outstanding: the one flag the hot path tests
    closing = False
    sent = 0

    def send(data):
        nonlocal inside, sent
        if type(data) is bytes:
            n = len(data)
        else:
            data = _payload(data)
            n = data.nbytes
        if n > max_size:
            raise _too_large(n, endpoint, segment_size)
        if inside:  # pyzmq releases the GIL while it sends: another thread of ours is in there
            raise IpcError(
                "send() while another thread is inside a send() on the same publisher: a publisher is used "
                "by one thread at a time (serialize the threads' sends, e.g. with a lock)"
            )
        inside = True  # _Guarded's protocol
        try:
            if blocked:
                if closing:
                    raise ClosedError("send() on a closed publisher")
                raise IpcError("a loaned message is outstanding: commit() or cancel it before send()")
            raw_send(data)
            sent += 1
        except _ZMQError:
            if closing:
                raise ClosedError("send() on a closed publisher") from None
            raise
        finally:
            inside = False
            if closing:
                owner = publisher()
                if owner is not None:
                    owner._finish_close()

    def is_inside():
        return inside

    def block(flag, closing_too=False):
        nonlocal blocked, closing
        closing = closing or closing_too
        blocked = flag or closing

    def count_sent(n):
        nonlocal sent
        sent += n
        return sent

    return send, is_inside, block, count_sent


class Publisher(_Guarded):
    """An XPUB bound on the topic's port; see the module docstring."""

    _kind = "publisher"

    def __init__(self, endpoint: str, segment_size: int = 0, wake: Optional[str] = None) -> None:
        port = zmq_port(endpoint)
        self._segment_size = _segment_size(segment_size)
        self.handoff_wakes = wake_choice(wake)  # checked as the msgq backend does; nothing to hand off here
        host, ipv6 = _host(os.environ.get("MSGQ_ZMQ_BIND", "*"), "MSGQ_ZMQ_BIND")
        self.endpoint, self.port = endpoint, port
        self.url = f"tcp://{host}:{port}"
        sock = _new_socket(zmq.XPUB, f"topic {endpoint!r}: publisher")
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, _hwm())
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe and unsubscribe, not only the first and last
            if ipv6:
                sock.setsockopt(zmq.IPV6, 1)
            if _curve_dir():
                msgq_curve.make_server(sock, _curve_dir())
            self._bind(sock, port)
        except BaseException:
            sock.close(linger=0)
            raise
        self._zsock = sock
        self._send = sock.send
        self._loan: Optional[bytearray] = None
        self._readers = 0
        self._max_size = _ring_max_message(self._segment_size)
        # the hot path: an instance attribute (a closure) in place of the class's send
        self.send, self._hot_inside, self._block, self._count_sent = _publisher_send(  # type: ignore[method-assign]
            sock.send, weakref.ref(self), self._max_size, endpoint, self._segment_size
        )
        self._init_guard()
        _live.add(self)

    def _bind(self, sock, port):
        closed_at = _closed_ports.get(port)
        rebind_until = closed_at + REBIND_GRACE_S if closed_at is not None else 0.0
        busy_until = None
        while True:
            try:
                sock.bind(self.url)
                return
            except _ZMQError as e:
                if e.errno != errno.EADDRINUSE:
                    raise IpcError(f"topic {self.endpoint!r}: cannot bind {self.url}: {e}") from None
            now = time.monotonic()
            if now < rebind_until:  # our own listener, closing in ZeroMQ's I/O thread
                time.sleep(0.005)
                continue
            if _port_listening(port) is False:
                # The topic's port is the local port of some TCP connection (topic ports overlap the
                # system's ephemeral range): usually a connection attempt that is over in a moment.
                busy_until = busy_until or now + PORT_BUSY_GRACE_S
                if now < busy_until:
                    time.sleep(0.01)
                    continue
                raise IpcError(
                    f"topic {self.endpoint!r}: port {port} is taken as the local port of a TCP connection, perhaps "
                    f"one closed within the last minute (TIME_WAIT): topic ports share the system's ephemeral port "
                    f"range. Reserve the port (sysctl net.ipv4.ip_local_reserved_ports), or use another MSGQ_PREFIX"
                )
            raise MultiplePublishersError(
                f"topic {self.endpoint!r}: {self.url} is already bound, by another publisher of this topic "
                f"(the zmq backend allows one per topic and host) or by another program listening on port {port}"
            )

    def loan(self, size: int) -> memoryview:
        size = int(size)
        if size < 0:
            raise InvalidArgumentError(f"loan size must be >= 0, got {size}")
        if size > self._max_size:
            raise _too_large(size, self.endpoint, self._segment_size)
        if self._closing:
            raise ClosedError("loan() on a closed publisher")
        if self._loan is not None:
            raise IpcError("a loaned message is already outstanding: commit() or cancel it first")
        self._loan = bytearray(size)
        self._block(True)
        # A view, so that the caller holds the only reference to the object it
        # gets (sockets.Loan counts them to find views left behind).
        return memoryview(self._loan)

    def commit(self, size: int) -> None:
        size = int(size)
        self._enter("commit()")
        try:
            if self._loan is None:
                raise IpcError("commit() without a loaned message")
            if not 0 <= size <= len(self._loan):
                raise InvalidArgumentError(f"commit({size}) exceeds the {len(self._loan)} bytes loaned")
            buf, self._loan = self._loan, None
            self._block(self._closing)
            with memoryview(buf) as view:
                self._send(view[:size])
            self._count_sent(1)
        finally:
            self._leave()

    def cancel_loan(self) -> None:
        self._loan = None
        self._block(self._closing)

    @property
    def has_loan(self) -> bool:
        return self._loan is not None

    def _count_readers(self):
        # Each message an XPUB receives is a (un)subscription: b"\x01" + prefix
        # or b"\x00" + prefix. Every subscription counts as one reader.
        sock = self._zsock
        while sock.getsockopt(_EVENTS) & _POLLIN:
            msg = sock.recv(_NOBLOCK)
            if msg[:1] == b"\x01":
                self._readers += 1
            elif msg[:1] == b"\x00" and self._readers > 0:
                self._readers -= 1
        return self._readers

    def num_readers(self) -> int:
        self._enter("num_readers()")
        try:
            return self._count_readers()
        finally:
            self._leave()

    def all_readers_updated(self) -> bool:
        """True once at least one subscriber is connected. An approximation:
        ZeroMQ queues and sends on its own threads and cannot tell how far a
        remote reader has read."""
        return self.num_readers() > 0

    @property
    def max_message_size(self) -> int:
        return self._max_size

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def messages_sent(self) -> int:
        return self._count_sent(0)

    @property
    def readers_woken(self) -> int:
        return 0  # ZeroMQ's I/O threads wake its subscribers, never this publisher's calls

    def _mark_closing(self):
        self._block(True, True)

    def _close_socket(self):
        sock, self._zsock, self._loan = self._zsock, None, None
        self._block(True, True)
        sock.close(linger=0)
        now = time.monotonic()
        if len(_closed_ports) > 256:
            for port in [p for p, t in _closed_ports.items() if now - t > REBIND_GRACE_S]:
                del _closed_ports[port]
        _closed_ports[self.port] = now
        _live.discard(self)

    def _forget_after_fork(self):
        super()._forget_after_fork()
        self._loan = None

    def __repr__(self) -> str:
        return f"<zmq Publisher {getattr(self, 'endpoint', '?')!r} {'closed' if self.closed else 'open'}>"


# ------------------------------------------------------------------ subscriber


def _receive_waiting(sock, timeout, link):
    """Poll up to ``timeout`` ms (-1: no limit) for a message of ``sock`` and take it, or
    None. The wait watches the connection too (``link``: a CappedConnection): a
    connection the publisher closed is made again once its back-off has passed."""
    deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
    items = [(sock, _POLLIN), (link.monitor, _POLLIN)]
    while True:
        _zmq_poll(items, link.poll_ms(timeout))
        try:
            msg = sock.recv(_NOBLOCK)
        except _Again:  # woken by a state change or the monitor, not a message
            pass
        else:
            link.working()
            return msg
        if link.after_wait():
            _reconnected(link)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            timeout = max(1, math.ceil(left * 1000))


_log = logging.getLogger("msgq.zmq")


def _reconnected(link):
    if link.reconnects == 1:
        _log.warning(
            "zmq subscriber: %s closed its connection (the publisher went away, or sent a message over the "
            "topic's %d-byte maximum, which is refused; give the subscriber the publisher's segment_size); "
            "reconnecting",
            link.endpoint,
            link.max_size,
        )


def _subscriber_receive(sock, subscriber, link):
    """``receive`` for one subscriber, with its state in cells, and the
    accessors its other methods use: ``(receive, inside(), mark_closing(),
    set_timeout(ms))``. ``subscriber`` is a weak reference: the closure must
    not keep its owner alive (its ``__del__`` closes the socket)."""
    recv = sock.recv
    inside = False
    closing = False
    timeout = -1

    def receive(non_blocking=False):
        nonlocal inside
        inside = True  # _Guarded's protocol
        try:
            if closing:
                raise ClosedError("receive() on a closed subscriber")
            if non_blocking:
                try:
                    msg = recv(_NOBLOCK)
                except _Again:
                    return None
            else:  # a close() from another thread sends a wake-up, which ends the wait
                try:
                    msg = recv(_NOBLOCK)
                except _Again:
                    msg = _receive_waiting(sock, timeout, link)
            if closing:  # a wake-up, or a message that raced with close(): not handed out
                raise ClosedError("the subscriber was closed while receive() waited")
            return msg
        finally:
            inside = False
            if closing:
                owner = subscriber()
                if owner is not None:
                    owner._finish_close()

    def is_inside():
        return inside

    def mark_closing():
        nonlocal closing
        closing = True

    def set_timeout(ms):
        nonlocal timeout
        timeout = ms

    return receive, is_inside, mark_closing, set_timeout


class Subscriber(_Guarded):
    """A SUB connected to the topic's port at ``address``; see the module docstring.

    Waiting: without a timeout, receive() waits inside ZeroMQ (a blocking
    ``recv``, the cheapest wait pyzmq has); with one, it takes a waiting
    message directly and otherwise polls until the deadline, which holds
    across signals (a signal handler that returns makes pyzmq restart a
    blocking ``recv``'s own timeout from the start). Python signal handlers
    run during either wait, and Ctrl-C raises ``KeyboardInterrupt``.

    Waking: the SUB is also connected to a private ``inproc`` XPUB; close()
    from another thread sends one message through it, which ends any wait
    on the socket (receive, receive_batch, a Poller). Every receive checks
    ``_closing`` after it gets a message, so that message is never handed
    out: the caller gets :class:`ClosedError`.
    """

    _kind = "subscriber"

    def __init__(
        self, endpoint: str, address: str = "127.0.0.1", conflate: bool = False, segment_size: int = 0
    ) -> None:
        port = zmq_port(endpoint)
        host, ipv6 = _host(address, "address")
        self._segment_size = _segment_size(segment_size)
        self.endpoint, self.url = endpoint, f"tcp://{host}:{port}"
        self._conflate = bool(conflate)
        sock = _new_socket(zmq.SUB, f"topic {endpoint!r}: subscriber")
        try:
            wake = _zmq_context().socket(zmq.XPUB)
        except BaseException:
            sock.close(linger=0)
            raise
        try:
            for s in (sock, wake):
                s.setsockopt(zmq.LINGER, 0)
            if self._conflate:
                sock.setsockopt(zmq.CONFLATE, 1)  # must precede connect
            else:
                sock.setsockopt(zmq.RCVHWM, _hwm())
            if ipv6:
                sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            wake_url = f"inproc://msgq-wake-{next(_wake_ids)}"
            wake.bind(wake_url)
            sock.connect(wake_url)
            # The XPUB has the SUB's subscription (so a wake-up cannot be dropped) once it hands it out.
            wake.setsockopt(zmq.RCVTIMEO, 5000)
            wake.recv()
            if _curve_dir():  # after the inproc wake-up connection, which stays unauthenticated
                msgq_curve.make_client(sock, _curve_dir())
            link = CappedConnection(zmq, sock, self.url, _ring_max_message(self._segment_size))
        except _ZMQError as e:
            sock.close(linger=0)
            wake.close(linger=0)
            raise InvalidArgumentError(f"topic {endpoint!r}: cannot connect to {self.url}: {e}") from None
        except BaseException:
            sock.close(linger=0)
            wake.close(linger=0)
            raise
        self._zsock, self._wake, self._link = sock, wake, link
        self._recv = sock.recv
        self._items = [(sock, _POLLIN), (link.monitor, _POLLIN)]  # for Poller
        self._timeout = -1
        self._spin_us = 0
        # the hot path: an instance attribute (a closure) in place of the class's receive
        self.receive, self._hot_inside, self._mark_closing, self._set_hot_timeout = _subscriber_receive(  # type: ignore[method-assign]
            sock, weakref.ref(self), link
        )
        self._init_guard()
        _live.add(self)

    # -------------------------------------------------------------- receiving

    def receive_batch(self, max_messages: int = 1024, timeout_ms: int = 0) -> List[bytes]:
        max_messages = int(max_messages)
        timeout_ms = int(timeout_ms)
        self._enter("receive_batch()")
        try:
            out: List[bytes] = []
            recv = self._recv
            try:
                while len(out) < max_messages:
                    out.append(recv(_NOBLOCK))
            except _Again:
                pass
            if not out and max_messages > 0 and timeout_ms != 0:
                first = _receive_waiting(self._zsock, timeout_ms, self._link)
                if first is not None:
                    out.append(first)
                    try:
                        while len(out) < max_messages:
                            out.append(recv(_NOBLOCK))
                    except _Again:
                        pass
            if self._closing:
                raise ClosedError("the subscriber was closed while receive_batch() waited")
            return out
        finally:
            self._leave()

    def set_timeout(self, ms: int) -> None:
        ms = int(ms)
        self._timeout = -1 if ms < 0 else ms
        self._set_hot_timeout(self._timeout)

    @property
    def timeout_ms(self) -> int:
        return self._timeout

    # -------------------------------------------------------------- readiness

    def ready(self) -> bool:
        self._enter("ready()")
        try:
            return bool(self._zsock.getsockopt(_EVENTS) & _POLLIN)
        finally:
            self._leave()

    def fileno(self) -> int:
        """ZeroMQ's descriptor: edge-triggered, readable when the socket's
        state may have changed. Call :meth:`arm` before each wait."""
        self._enter("fileno()")
        try:
            return self._zsock.getsockopt(zmq.FD)
        finally:
            self._leave()

    def arm(self) -> bool:
        """True if a message is waiting (do not wait then). Otherwise the
        descriptor becomes readable at the socket's next state change
        (reading ZMQ_EVENTS is what re-arms it). A connection the publisher
        closed is made again here once its back-off has passed."""
        self._enter("arm()")
        try:
            if self._link.after_wait():
                _reconnected(self._link)
            return bool(self._zsock.getsockopt(_EVENTS) & _POLLIN)
        finally:
            self._leave()

    def disarm(self) -> None:
        pass

    # -------------------------------------------------------------- properties

    @property
    def resets(self) -> int:
        """Always 0: ZeroMQ drops at its high-water mark without telling anyone."""
        if self._closing:
            raise ClosedError("resets of a closed subscriber")
        return 0

    @property
    def spin_us(self) -> int:
        """Accepted for compatibility; the zmq backend never spins."""
        return self._spin_us

    @spin_us.setter
    def spin_us(self, value: int) -> None:
        value = int(value)
        if value < 0:
            raise InvalidArgumentError(f"spin_us must be >= 0, got {value}")
        self._spin_us = value

    @property
    def conflate(self) -> bool:
        return self._conflate

    @property
    def segment_size(self) -> int:
        return self._segment_size

    # -------------------------------------------------------------- closing

    def _wake_user(self):
        self._wake.send(b"", _NOBLOCK)

    def _close_socket(self):
        sock, wake, self._zsock, self._wake = self._zsock, self._wake, None, None
        self._link.close_monitor()
        sock.close(linger=0)
        wake.close(linger=0)
        self._items = []
        _live.discard(self)

    def _forget_after_fork(self):
        if self._wake is not None:
            _inherited.append(self._wake)
            self._wake = None
        if self._link.monitor is not None:
            _inherited.append(self._link.monitor)
            self._link.forget()
        super()._forget_after_fork()
        self._items = []

    def __repr__(self) -> str:
        return f"<zmq Subscriber {getattr(self, 'endpoint', '?')!r} {'closed' if self.closed else 'open'}>"


# ------------------------------------------------------------------ poller


class Poller:
    """``zmq_poll`` over the added subscribers (a close() wakes it through the subscriber).

    A closed subscriber counts as ready, so the caller's receive raises
    :class:`ClosedError` instead of the poll waiting on it forever.
    """

    def __init__(self) -> None:
        self._subs: List[Subscriber] = []

    def add(self, subscriber: Subscriber) -> None:
        if not isinstance(subscriber, Subscriber):
            raise IpcTypeError(f"a zmq Poller takes zmq backend subscribers, not {type(subscriber).__name__}")
        if subscriber.closed:
            raise ClosedError("Poller.add() of a closed subscriber")
        self._subs.append(subscriber)

    def poll(self, timeout_ms: int) -> List[int]:
        timeout_ms = int(timeout_ms)
        subs = self._subs
        if not subs:
            if timeout_ms > 0:
                time.sleep(timeout_ms / 1000)
            return []
        for s in subs:  # _Guarded's protocol: inside first, then look for a close
            s._inside = True
        try:
            closed = [i for i, s in enumerate(subs) if s._closing]
            if closed:
                return closed
            items = [item for s in subs for item in s._items]
            deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms >= 0 else None
            while True:
                wait = min((s._link.poll_ms(timeout_ms) for s in subs), key=lambda t: (t < 0, t))
                ready = {id(sock) for sock, _ in _zmq_poll(items, wait)}
                found = [i for i, s in enumerate(subs) if s._closing or id(s._zsock) in ready]
                for s in subs:  # a connection the publisher closed: made again once its back-off passed
                    if s._link.after_wait():
                        _reconnected(s._link)
                if found:
                    return found
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return []
                    timeout_ms = max(1, math.ceil(left * 1000))
        finally:
            for s in subs:
                s._leave()

    def fileno(self) -> int:
        raise IpcError("Poller.fileno() is not supported by the zmq backend: poll(), or use each subscriber's fileno()")

    def __len__(self) -> int:
        return len(self._subs)
