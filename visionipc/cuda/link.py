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
nothing on the device but the frame's own memory (none with ``out=``). At a camera's
pace every driver call is cold (tens of µs each, measured on an H200), so the
per-frame path makes as few as it can: the copy and its event (a caller's ``out=``
checked once per pointer, the device made current once per thread; the copy and the
event go to a stream of this device whatever device is current).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Dict, Hashable, List, Set, Tuple

import numpy as np

from msgq.errors import InvalidArgumentError
from visionipc.cuda import _runtime
from visionipc.cuda.device_frame import DeviceBuffer, DeviceFrame, device_source, external_buffer

if TYPE_CHECKING:
    from visionipc.cuda.device_frame import PoolTemplate
    from visionipc.frame import VisionBuf

EVENTS = 8  # events in the ring: a copy's event is reused EVENTS copies later (long done by then)


class _Event:
    __slots__ = ("handle",)

    def __init__(self, handle: int | None) -> None:
        self.handle = handle


class CudaLink:
    def __init__(self, cuda: bool | int, runtime: _runtime.Runtime | None = None) -> None:
        rt = self.runtime = runtime or _runtime.runtime()
        self.device = _runtime.resolve_device(rt, cuda)
        rt.set_device(self.device)
        self.stream = rt.stream_create()
        self._events = [_Event(rt.event_create()) for _ in range(EVENTS)]
        self._next = 0
        self.inflight: Dict[
            Hashable, List[_Event]
        ] = {}  # key -> events of copies not known to be complete, oldest first
        self._pinned: Dict[
            Hashable, Tuple[int, int, object]
        ] = {}  # key -> (address, length, keepalive) of a registered span
        self._pid = os.getpid()
        self._verified: Set[int] = set()  # device pointers of callers' buffers found on self.device
        self._out: Any = None  # the last out= of copy_to_device, found to hold _out_size bytes at _out_ptr
        self._out_ptr = self._out_size = 0
        self._template: PoolTemplate | None = None  # of the last geometry copied
        self._thread = threading.local()  # .current: this thread made self.device current

    def _current(self) -> None:
        """Make this device current on the calling thread, once per thread."""
        if not getattr(self._thread, "current", False):
            self.runtime.set_device(self.device)
            self._thread.current = True

    # registration ------------------------------------------------------------
    def pin(self, key: Hashable, span: tuple[int, int], keepalive: object, read_only: bool = False) -> None:
        """Register ``span`` = (address, length) as ``key``'s (after dropping the one
        it had: a client's remapped pool); ``keepalive`` keeps the span mapped."""
        self.unpin(key)
        address, length = span
        self.runtime.set_device(self.device)
        self.runtime.host_register(address, length, read_only)
        self._pinned[key] = (address, length, keepalive)

    def unpin(self, key: Hashable | None = None) -> None:
        """Unregister ``key``'s span (None: every one), once the copies in flight are done."""
        keys = list(self._pinned) if key is None else [key] if key in self._pinned else []
        if keys:
            self.finish()
        for k in keys:
            self.runtime.host_unregister(self._pinned.pop(k)[0])

    def pinned(self, address: int, size: int) -> bool:
        """Whether host bytes [address, address + size) are registered."""
        return any(a <= address and address + size <= a + n for a, n, _ in self._pinned.values())

    def host_device(self, frame: VisionBuf) -> int | None:
        """DLPack's CUDA-host device id (0) of a frame whose bytes are registered, else None."""
        return 0 if self.pinned(frame.as_array().ctypes.data, len(frame)) else None

    # copies ------------------------------------------------------------------
    def _record(self, key: Hashable, stream: int) -> _Event:
        event = self._events[self._next]
        self._next = (self._next + 1) % EVENTS
        assert event.handle is not None  # only close() destroys the events, and it drops them
        self.runtime.event_record(event.handle, stream)
        self.inflight.setdefault(key, []).append(event)
        return event

    def copy_to_device(
        self,
        frame: VisionBuf,
        out: Any = None,
        stream: Any = None,
        key: Hashable = "lease",
        src: int | None = None,
        kind: str = _runtime.HOST_TO_DEVICE,
    ) -> DeviceFrame:
        """Submit the copy of ``frame`` (whose lease the caller holds) into device
        memory; the returned DeviceFrame is ready once its event completes.
        ``src``: the address of the frame's bytes (default: its host view's), ``kind``
        the copy's (device to device from a pool in device memory).

        The per-frame path, run cold at a camera's pace: a caller's ``out=`` is checked
        the first time it is given (the last one is kept: its memory cannot move while
        it lives), and the DeviceFrame is made from a template per geometry."""
        rt, size = self.runtime, frame.geometry.size
        if src is None:
            src = frame.as_array().ctypes.data
        self._current()
        if out is None:
            dst = DeviceBuffer(rt, self.device, size)
            ptr, owner = dst.ptr, dst
        elif out is self._out and size <= self._out_size:
            ptr, owner = self._out_ptr, out
        else:
            ptr, owner = external_buffer(out, size, self.device, rt, self._verified)
            self._out, self._out_ptr, self._out_size = out, ptr, size
        s = self.stream if stream is None else _runtime.stream_handle(stream)
        rt.memcpy_async(ptr, src, size, kind, s)
        event = self._record(key, s)
        t = self._template
        if t is None or t.geometry is not frame.geometry:
            t = self._template = DeviceFrame.template(frame, None, rt)
        return DeviceFrame.copied(frame, t, ptr, self.device, owner, event, s)

    def copy_from_device(
        self, buf: VisionBuf, array: Any, stream: Any = None, dest: tuple[int, str] | None = None
    ) -> None:
        """Submit the copy of device array ``array`` into the pool buffer ``buf`` (a
        producer's): the whole buffer's bytes, or its rows without the stride's padding
        (a (h, w, 3) image into a padded RGB buffer, (h*3/2, w) into a padded NV12 one).
        ``dest``: (pointer, kind) of the buffer's bytes, if not the host pool's (a pool
        in device memory: device to device)."""
        rt, g = self.runtime, buf.geometry
        ptr, nbytes = device_source(array, self.device, rt, self._verified)
        dst, kind = (buf.as_array().ctypes.data, _runtime.DEVICE_TO_HOST) if dest is None else dest
        rows = buf.array.shape[0]
        self._current()
        s = self.stream if stream is None else _runtime.stream_handle(stream)
        if nbytes == g.size:
            rt.memcpy_async(dst, ptr, nbytes, kind, s)
        elif nbytes % rows == 0 and nbytes // rows <= g.stride:
            row = nbytes // rows
            rt.memcpy2d_async(dst, g.stride, ptr, row, row, rows, kind, s)
        else:
            raise InvalidArgumentError(
                f"a device array of {nbytes} bytes does not fit a {g.width}x{g.height} {g.format} frame "
                f"({g.size} bytes with the stride, or {rows} rows of at most {g.stride})"
            )
        self._record((buf.stream, buf.idx), s)

    def copy_host_into(self, buf: VisionBuf, data: Any, dest: int) -> None:
        """The copying send into a pool in device memory: host bytes ``data`` (already
        checked to be the buffer's size) to device pointer ``dest``, on this link's
        stream; ``send`` waits for it like for ``copy_from_device``."""
        host = np.ascontiguousarray(np.frombuffer(data, np.uint8) if isinstance(data, (bytes, memoryview)) else data)
        self._current()
        self.runtime.memcpy_async(dest, host.ctypes.data, host.nbytes, _runtime.HOST_TO_DEVICE, self.stream)
        # (from pageable memory the call returns once the bytes are staged: ``host`` may go)
        self._record((buf.stream, buf.idx), self.stream)

    def finish(self, key: Hashable | None = None) -> None:
        """Wait until every copy of ``key`` (None: every copy) submitted so far has
        completed (before a lease goes, before a buffer is sent)."""
        for k in list(self.inflight) if key is None else [key]:
            for event in self.inflight.pop(k, ()):
                handle = event.handle
                assert handle is not None  # close() destroys events after this finish() emptied inflight
                if not self.runtime.event_done(handle):
                    self.runtime.event_sync(handle)

    # lifetime ----------------------------------------------------------------
    def close(self) -> None:
        if self._pid != os.getpid():
            return self.forget()
        rt = self.runtime
        self.finish()
        self.unpin()
        for event in self._events:  # frames still holding one see it done (every copy finished above)
            handle, event.handle = event.handle, None
            assert handle is not None  # each destroyed once: the list is emptied below
            rt.event_destroy(handle)
        self._events, self._out, self._template = [], None, None
        if self.stream:
            rt.stream_destroy(self.stream)
            self.stream = 0

    def forget(self) -> None:
        """In a forked child: drop the parent's registrations, stream and events untouched."""
        self._pinned, self._events, self.inflight, self.stream = {}, [], {}, 0
