"""GPU consumers: a VisionIPC frame into device memory, three ways. The producer is the
zero-copy ``visionipc`` one; the "view" time of these rows is when the frame's bytes are
in device memory (the copy completed, waited for on the host).

- ``visionipc-cuda``: ``VisionIpcClient(cuda=True)``, ``frame.to_device(out=)`` straight
  from the pool's registered pages into a device buffer made once;
- ``naive-cuda``: ``cupy.asarray(frame.array)``, what users write today (pageable memory:
  the driver stages it through a pinned buffer of its own);
- ``pinned-staging``: ``np.copyto`` into a pinned host buffer, then an async copy.
"""

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from visionipc.bench.transports import State, nv12
from visionipc.bench.transports.vipc import Consumer as _HostConsumer
from visionipc.bench.transports.vipc import Producer

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf

__all__ = ["Producer", "Consumer", "NaiveConsumer", "PinnedConsumer"]


class Consumer(_HostConsumer):
    CUDA = True

    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        super().__init__(state, tag, w, h, conflate)
        from visionipc import cuda

        self.out = cuda.empty(nv12(w, h)[0])  # made once: the per-frame path allocates nothing

    def consume(self, frame: "VisionBuf", view_ns: int, now: Callable[[], int] = time.monotonic_ns) -> int:
        frame.to_device(out=self.out).synchronize()
        return now()


class NaiveConsumer(_HostConsumer):
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        super().__init__(state, tag, w, h, conflate)
        import cupy

        self.cupy = cupy

    def consume(self, frame: "VisionBuf", view_ns: int, now: Callable[[], int] = time.monotonic_ns) -> int:
        self.cupy.asarray(frame.array)
        self.cupy.cuda.runtime.deviceSynchronize()
        return now()


class PinnedConsumer(_HostConsumer):
    def __init__(self, state: State, tag: str, w: int, h: int, conflate: bool) -> None:
        super().__init__(state, tag, w, h, conflate)
        import cupy

        size = nv12(w, h)[0]
        self.cupy = cupy
        self.pinned = cupy.cuda.alloc_pinned_memory(size)
        self.staging = np.frombuffer(self.pinned, np.uint8, size)
        self.device = cupy.empty(size, cupy.uint8)
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def consume(self, frame: "VisionBuf", view_ns: int, now: Callable[[], int] = time.monotonic_ns) -> int:
        np.copyto(self.staging, frame.as_array())
        self.device.data.copy_from_host_async(self.staging.ctypes.data, self.staging.nbytes, self.stream)
        self.stream.synchronize()
        return now()
