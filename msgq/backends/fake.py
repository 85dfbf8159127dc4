"""The fake backend: the shared-memory ring plus the reference's fake-event
hooks (``CEREAL_FAKE=1`` or ``MSGQ_BACKEND=fake``), for deterministic tests.

Publishers are the ``msgq`` backend's. A subscriber wraps an ``msgq``
subscriber: while the fake-event handle of its endpoint (identifier
``CEREAL_FAKE_PREFIX``) is enabled, each ``receive()`` first hands control
to the harness (see :mod:`msgq.events`) and the subscriber counts as always
ready (``ready()``/``arm()`` return True, a Poller returns it at once): its
receive waits for the harness, not for the ring. While the handle is
disabled, or no handle exists, it behaves exactly like the ``msgq`` backend.
"""

import weakref
from typing import Any, List, Optional

from msgq.backends import shm
from msgq.events import SubscriberHook, fake_prefix

NAME = "fake"

Publisher = shm.Publisher


class Subscriber:
    """An ``msgq`` subscriber with the fake-event handshake before each receive."""

    def __init__(
        self, endpoint: str, address: str = "127.0.0.1", conflate: bool = False, segment_size: int = 0
    ) -> None:
        self._impl: Any = None
        impl = shm.Subscriber(endpoint, address, conflate, segment_size)  # validates like msgq does
        try:
            hook = SubscriberHook(endpoint, fake_prefix())
        except BaseException:
            impl.close()
            raise
        self._impl, self._hook = impl, hook
        self._finalizer = weakref.finalize(self, hook.close)

    def receive(self, non_blocking: bool = False) -> Optional[bytes]:
        if self._hook.enabled:
            self._hook.handshake()
        return self._impl.receive(non_blocking)

    def receive_batch(self, max_messages: int = 1024, timeout_ms: int = 0) -> List[bytes]:
        if not self._hook.enabled:
            return self._impl.receive_batch(max_messages, timeout_ms)
        # As the reference's drain does: one handshake per receive, the last one included.
        self._hook.handshake()
        out = self._impl.receive_batch(1, timeout_ms) if max_messages > 0 else []
        while out and len(out) < max_messages:
            msg = self.receive(non_blocking=True)
            if msg is None:
                break
            out.append(msg)
        return out

    def ready(self) -> bool:
        return self._hook.enabled or self._impl.ready()

    def arm(self) -> bool:
        return self._hook.enabled or self._impl.arm()

    def disarm(self) -> None:
        self._impl.disarm()

    def set_timeout(self, ms: int) -> None:
        self._impl.set_timeout(ms)

    def fileno(self) -> int:
        return self._impl.fileno()

    @property
    def events_enabled(self) -> bool:
        """Whether receive() currently waits for a harness (fake events on)."""
        return self._hook.enabled

    @property
    def resets(self) -> int:
        return self._impl.resets

    @property
    def spin_us(self) -> int:
        return self._impl.spin_us

    @spin_us.setter
    def spin_us(self, value: int) -> None:
        self._impl.spin_us = value

    @property
    def conflate(self) -> bool:
        return self._impl.conflate

    @property
    def segment_size(self) -> int:
        return self._impl.segment_size

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def close(self) -> None:
        try:
            self._impl.close()
        finally:
            self._finalizer()

    def __getattr__(self, name: str) -> Any:
        # Anything else the msgq subscriber offers (timeout_ms, slot, ...).
        impl = self.__dict__.get("_impl")
        if impl is None:
            raise AttributeError(name)
        return getattr(impl, name)


class Poller:
    """The ``msgq`` poller, except that subscribers with fake events enabled
    are returned at once (the reference's fake poller returns every socket):
    their receive waits for the harness instead."""

    def __init__(self) -> None:
        self._impl = shm.Poller()
        self._subscribers: List[Subscriber] = []

    def add(self, subscriber: Subscriber) -> None:
        self._impl.add(subscriber._impl)
        self._subscribers.append(subscriber)

    def poll(self, timeout_ms: int) -> List[int]:
        enabled = [i for i, s in enumerate(self._subscribers) if s._hook.enabled]
        if not enabled:
            return self._impl.poll(timeout_ms)
        return sorted(set(enabled).union(self._impl.poll(0)))

    def fileno(self) -> int:
        return self._impl.fileno()

    def __len__(self) -> int:
        return len(self._subscribers)
