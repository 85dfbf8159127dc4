"""CudaLink: what a ``cuda=True`` client (or server) keeps for the GPU: its device,
its own CUDA stream, the registration of the mapped pool's pages, and the copies
still in flight.

Invariants (the lease contract of ``VisionBuf.to_device``):

- A copy from the pool is submitted only while the client holds the read lease on
  the frame's buffer, and the lease is released only after every copy submitted
  from it has completed on the device (``finish()`` waits for their events):
  ``VisionIpcClient.recv()``, ``release_frame()`` (the end of ``with frame:``)
  and ``close()`` call ``finish()`` before they drop the lease. So the server
  never reuses a buffer under a DMA in flight, whatever the consumer does.
- The pages are registered once per mapping (``pin``), unregistered before the
  client drops that mapping (``pin`` of the next one, ``close``), and the
  registration holds a view of the mapping, so it is never unmapped while
  registered, even when frames outlive the client.
- A forked child forgets the parent's registrations, stream and events
  (``forget``) without a CUDA call: they are the parent's.

Events come from a small ring made up front, so the per-frame path allocates
nothing on the device but the frame's own memory (none with ``out=``).
"""

from __future__ import annotations

import os

from visionipc.cuda import _runtime
from visionipc.cuda.device_frame import DeviceBuffer, DeviceFrame, external_buffer

EVENTS = 8  # events in the ring: a copy's event is reused EVENTS copies later (long done by then)


class _Event:
    __slots__ = ("handle",)

    def __init__(self, handle):
        self.handle = handle


class CudaLink:
    def __init__(self, cuda, runtime=None):
        rt = self.runtime = runtime or _runtime.runtime()
        self.device = _runtime.resolve_device(rt, cuda)
        rt.set_device(self.device)
        self.stream = rt.stream_create()
        self._events = [_Event(rt.event_create()) for _ in range(EVENTS)]
        self._next = 0
        self.inflight = []  # events of copies not known to be complete, oldest first
        self._pinned = None  # (address, keepalive) of the registered span
        self._pid = os.getpid()

    # registration ------------------------------------------------------------
    def pin(self, span, keepalive, read_only=False) -> None:
        """Register ``span`` = (address, length) of a new mapping (after dropping the old one)."""
        self.unpin()
        address, length = span
        self.runtime.set_device(self.device)
        self.runtime.host_register(address, length, read_only)
        self._pinned = (address, length, keepalive)

    def unpin(self) -> None:
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            self.finish()
            self.runtime.host_unregister(pinned[0])

    def pinned(self, address: int, size: int) -> bool:
        """Whether host bytes [address, address + size) are registered."""
        p = self._pinned
        return p is not None and p[0] <= address and address + size <= p[0] + p[1]

    # copies ------------------------------------------------------------------
    def copy_to_device(self, frame, out=None, stream=None) -> DeviceFrame:
        """Submit the copy of ``frame`` (whose lease the caller holds) into device
        memory; the returned DeviceFrame is ready once its event completes."""
        rt, size = self.runtime, frame.geometry.size
        host = frame.as_array()
        rt.set_device(self.device)
        if out is None:
            dst = DeviceBuffer(rt, self.device, size)
            ptr, owner = dst.ptr, dst
        else:
            ptr, owner = external_buffer(out, size, self.device, rt)
        s = self.stream if stream is None else _runtime.stream_handle(stream)
        rt.memcpy_async(ptr, host.ctypes.data, size, _runtime.HOST_TO_DEVICE, s)
        event = self._events[self._next]
        self._next = (self._next + 1) % EVENTS
        rt.event_record(event.handle, s)
        self.inflight.append(event)
        meta = (frame.frame_id, frame.timestamp_sof, frame.timestamp_eof, frame.timestamp_publish, frame.timestamp_recv)
        return DeviceFrame(ptr, frame.array, frame.geometry, self.device, owner, event, s, rt, meta)

    def finish(self) -> None:
        """Wait until every copy submitted so far has completed (before a lease goes)."""
        while self.inflight:
            event = self.inflight[0]
            if not self.runtime.event_done(event.handle):
                self.runtime.event_sync(event.handle)
            self.inflight.pop(0)

    # lifetime ----------------------------------------------------------------
    def close(self) -> None:
        if self._pid != os.getpid():
            return self.forget()
        rt = self.runtime
        self.finish()
        self.unpin()
        for event in self._events:  # frames still holding one see it done (every copy finished above)
            handle, event.handle = event.handle, None
            rt.event_destroy(handle)
        self._events = []
        if self.stream:
            rt.stream_destroy(self.stream)
            self.stream = 0

    def forget(self) -> None:
        """In a forked child: drop the parent's registration, stream and events untouched."""
        self._pinned, self._events, self.inflight, self.stream = None, [], [], 0
