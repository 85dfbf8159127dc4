"""A ZeroMQ connection whose incoming messages are capped (``ZMQ_MAXMSGSIZE``) and
that comes back after the peer broke the cap: what ``msgq-bridge in``, the zmq
backend's subscribers and a broadcast queue's remote readers share.

libzmq refuses a message over ``ZMQ_MAXMSGSIZE`` as soon as its size is announced,
before buffering it, so memory stays bounded whatever a peer sends (no CURVE
needed). It then closes that connection and, as for any protocol error, never
reconnects it by itself. :class:`CappedConnection` watches the socket's
connections with a monitor (``ZMQ_EVENT_DISCONNECTED``) and makes the connection
again after a back-off: 0.1 s, doubled up to 2 s, back to the start once a message
arrives (``working()``), so a peer that sends an oversized message again at once
costs one connection per back-off, not a loop at network speed.

After an ordinary disconnect (a peer that went away) ZeroMQ reconnects by itself,
keeping the socket's queue; the monitor then reports the new connection
(``ZMQ_EVENT_CONNECTED``) and the pending reconnection is called off. Making it
anyway would tear down a live connection and drop what is queued on it: a
restarted publisher's first messages came through and the ones sent right after
were lost (a reader whose loop ran late under load, after ZeroMQ had reconnected).

Threads: ZeroMQ sockets are not thread-safe; every method is called by the thread
that uses the socket (between the owner's enter and leave), never from another.
"""

from __future__ import annotations

import contextlib
import time
import types
from typing import Any

RECONNECT_FIRST_S, RECONNECT_MAX_S = 0.1, 2.0


class CappedConnection:
    """``sock`` (a SUB, not yet connected) connected to ``endpoint`` with messages of at
    most ``max_size`` bytes (each frame of a multipart message). ``monitor`` is the
    socket to poll beside ``sock``; ``poll_ms(timeout_ms)`` bounds a wait so that a
    due reconnection is not missed; ``after_wait()`` handles what the monitor said."""

    def __init__(self, zmq: types.ModuleType, sock: Any, endpoint: str, max_size: int) -> None:
        from zmq.utils.monitor import parse_monitor_message  # pyzmq is optional: imported by its users

        self._event = parse_monitor_message
        self._zmq, self.sock, self.endpoint, self.max_size = zmq, sock, endpoint, int(max_size)
        self.reconnects = 0  # connections made again after the peer closed one
        self.due: float | None = None  # monotonic time of the next reconnection, None: none pending
        self.backoff = RECONNECT_FIRST_S
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_size)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
        try:
            sock.connect(endpoint)  # never fails for a host that is down: ZeroMQ keeps retrying
        except BaseException:
            self.close_monitor()
            raise

    def closed(self, now: float | None = None) -> bool:
        """Take the monitor's events; True if a connection was closed. A reconnection is
        then due after the current back-off, unless ZeroMQ connected again by itself
        (a later event): that calls off a pending one."""
        zmq, seen = self._zmq, False
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if self._event(frames)["event"] == zmq.EVENT_CONNECTED:
                self.due = None
            else:
                seen = True
                if self.due is None:
                    self.due = (time.monotonic() if now is None else now) + self.backoff
                    self.backoff = min(2 * self.backoff, RECONNECT_MAX_S)
        return seen

    def working(self) -> None:
        """A message arrived: the next closed connection waits the shortest back-off."""
        self.backoff = RECONNECT_FIRST_S

    def poll_ms(self, timeout_ms: int, now: float | None = None) -> int:
        """``timeout_ms`` (-1: none) shortened to when a pending reconnection is due."""
        if self.due is None:
            return timeout_ms
        left = max(0, int((self.due - (time.monotonic() if now is None else now)) * 1000) + 1)
        return left if timeout_ms < 0 else min(timeout_ms, left)

    def reconnect_if_due(self, now: float | None = None) -> bool:
        """Make the connection again if its back-off has passed and ZeroMQ has not
        connected again meanwhile (the monitor's latest events are taken first); True
        if it did."""
        if self.due is None or (time.monotonic() if now is None else now) < self.due:
            return False
        self.closed(now)  # a connection made since the last look calls the reconnection off
        if self.due is None:
            return False
        self.due = None
        with contextlib.suppress(self._zmq.ZMQError):  # already gone after a protocol error
            self.sock.disconnect(self.endpoint)
        self.sock.connect(self.endpoint)
        self.reconnects += 1
        return True

    def after_wait(self) -> bool:
        """After any wait: note a closed connection, reconnect one that is due; True if
        a reconnection was made."""
        self.closed()
        return self.reconnect_if_due()

    def close_monitor(self) -> None:
        """Idempotent; the owner closes ``sock`` itself."""
        monitor, self.monitor = self.monitor, None
        if monitor is not None:
            with contextlib.suppress(Exception):
                self.sock.disable_monitor()
            monitor.close(0)

    def forget(self) -> None:
        """In a forked child: the monitor is the parent's; drop it untouched."""
        self.monitor = None
