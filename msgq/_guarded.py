"""``Guarded``: an object whose ZeroMQ socket one thread uses at a time, while
``close()`` may come from any thread.

ZeroMQ sockets are not thread-safe: closing one while another thread polls,
receives or sends on it is undefined (libzmq asserts, or the process crashes).
The zmq backend's publisher and subscriber (msgq/backends/zmq.py) and a
broadcast queue's remote side (msgq/_broadcast_remote.py) follow this protocol.

The user marks itself inside before it touches the socket and then checks for
closing; ``close()`` marks closing and then checks for a user inside. Under the
GIL these steps are sequentially consistent, so at least one side sees the
other (Dekker): either the user backs out before the socket, or close() leaves
the socket to the user, who closes it on its way out (and close() wakes it if
it waits). Only the closing itself takes a lock, so that it happens exactly
once. (This leans on the GIL; a free-threaded build would need the flags to be
atomics.)

The flags are ``_inside`` / ``_closing`` for the ordinary methods; a subclass
whose per-message path keeps its own flags (cells of a closure: cheaper than
attributes there) reports them through ``_hot_inside()`` and has
``_mark_closing()`` set them.
"""

import threading
from typing import Any

from msgq._shared import Closeable
from msgq.errors import ClosedError


class Guarded(Closeable):
    """Subclasses set ``_zsock`` (the socket) and ``_kind`` (a word for messages),
    call ``_init_guard()`` once the socket is ready, and define ``_close_socket()``
    (and ``_wake_user()`` if a user can wait on the socket)."""

    _closing = True  # until a subclass has its socket
    _inside = False
    _zsock: Any = None  # a zmq socket
    _kind = "socket"

    @staticmethod
    def _hot_inside() -> bool:
        return False

    def _init_guard(self) -> None:
        self._close_lock = threading.Lock()
        self._inside = False
        self._closing = False

    def _closed_error(self, what: str) -> ClosedError:
        return ClosedError(f"{what} on a closed {self._kind}")

    def _enter(self, what: str) -> None:
        self._inside = True
        if self._closing:
            self._leave()
            raise self._closed_error(what)

    def _leave(self) -> None:
        self._inside = False
        if self._closing:
            self._finish_close()

    def close(self) -> None:
        lock = getattr(self, "_close_lock", None)
        if lock is None:  # the constructor failed
            return
        with lock:
            if self._closing:
                return
            self._closing = True
            self._mark_closing()
            if self._inside or self._hot_inside():
                self._wake_user()  # the user closes the socket when it leaves it
            else:
                self._close_socket()

    @property
    def closed(self) -> bool:
        return self._closing

    def _finish_close(self) -> None:
        with self._close_lock:
            if self._zsock is not None:
                self._close_socket()

    def _mark_closing(self) -> None:
        """Raise whatever flag the subclass's hot path tests (before close() looks for a user inside)."""

    def _wake_user(self) -> None:
        pass

    def _close_socket(self) -> None:  # with _close_lock held and no user inside
        raise NotImplementedError

    def _disown(self, sock: Any) -> None:
        """A forked child's copy of the parent's socket: never closed here (it belongs to the parent)."""

    def _forget_after_fork(self) -> None:
        self._closing, self._inside = True, False
        self._mark_closing()
        self._close_lock = threading.Lock()  # a lock held by a parent thread stays held in the child
        if self._zsock is not None:
            self._disown(self._zsock)
            self._zsock = None
