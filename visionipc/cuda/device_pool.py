"""Pools in device memory: ``VisionIpcServer.create_buffers(..., memory="cuda")``.

The frames of such a stream live in one device allocation of the server (buffer
``i`` at ``i * slot_size``, the host pool's own layout) and reach the clients of
the same machine through a CUDA IPC handle, so no byte crosses the PCIe link.

The stream keeps its host pool for everything else: the generations, the leases,
the frames' numbers and the admission of clients work exactly as for host pools.
Its pixel pages are never touched, so the kernel gives them no memory; buffer 0's
first bytes hold the allocation's descriptor (``DESCRIPTOR``), which therefore
reaches exactly the clients the server admits (the pool's file goes to them over
the access-checked socket). The server's reply says the pool's frames are in
device memory (``pool_flags``), so a reader of host frames refuses the stream
rather than reading the descriptor as pixels.

Ordering: the server writes the descriptor before it creates the stream's first
frame, and a client reads it at its first frame of a mapping, after the frame's
release/acquire pair: the descriptor is always there when read. The server waits
for the copies into a buffer (their events) before it sends it, so a received
frame's device bytes are complete.

Lifetime: a client maps the allocation once per pool mapping
(``cudaIpcOpenMemHandle``) and unmaps it when the client closes (frames of it
then refuse use with a ClosedError) or, after a restarted server's pool replaced
it, when the last frame of it goes. CUDA refuses to open a handle in the process
that exported it: a client in the server's own process uses the server's pointer.
A forked child forgets its parent's mappings without a CUDA call.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from typing import TYPE_CHECKING, Callable, Dict

import numpy as np

from msgq.errors import IpcError
from visionipc import _visionipc
from visionipc.cuda._runtime import CudaError, Runtime

if TYPE_CHECKING:
    import numpy.typing as npt

# magic, version, reserved, device UUID, allocation bytes, slot size, CUDA IPC handle
DESCRIPTOR = struct.Struct("<8sII16sQQ64s")
MAGIC, VERSION = b"VIPCCUDA", 1
HOST, CUDA = "host", "cuda"  # create_buffers(memory=...)

_exported: Dict[bytes, DevicePool] = {}  # IPC handle -> the pool, of the pools this process exports
_lock = threading.Lock()


def slot_size(buffer_size: int) -> int:
    """The bytes between two buffers of a pool (the core's layout: each buffer starts on a
    BUFFER_ALIGN boundary); the device allocation mirrors it."""
    align = _visionipc.BUFFER_ALIGN
    return -(-buffer_size // align) * align


class DevicePool:
    """One pool's device allocation as seen by this process: ``ptr(index)`` is buffer
    ``index``; ``closed`` once unmapped (or freed, on the server). ``lender``: the
    exporting pool, for a client of this process's own server (closed with it)."""

    __slots__ = (
        "runtime",
        "device",
        "base",
        "slot_size",
        "count",
        "lender",
        "_closed",
        "_close",
        "_pid",
        "__weakref__",
    )

    def __init__(
        self,
        runtime: Runtime,
        device: int,
        base: int,
        slot_size: int,
        count: int,
        close: Callable[[int], None] | None,
        lender: DevicePool | None = None,
    ) -> None:
        self.runtime, self.device, self.base = runtime, device, base
        self.slot_size, self.count, self.lender = slot_size, count, lender
        self._closed = False
        self._pid = os.getpid()
        # the unmapping (or freeing) runs once: at close(), or when the last reference goes
        self._close = weakref.finalize(self, _release, runtime, device, base, close, self._pid)

    def ptr(self, index: int) -> int:
        return self.base + index * self.slot_size

    @property
    def closed(self) -> bool:
        return self._closed or (self.lender is not None and self.lender.closed)

    def close(self) -> None:
        self._closed = True
        self._close()

    def forget(self) -> None:
        """In a forked child: the mapping is the parent's; drop it without a CUDA call."""
        self._closed = True
        self._close.detach()


def _release(runtime: Runtime, device: int, base: int, close: Callable[[int], None] | None, pid: int) -> None:
    if os.getpid() != pid or close is None:
        return  # a forked child's copy, or a pool borrowed from this process's own server
    try:
        runtime.set_device(device)
        close(base)
    except CudaError:  # at exit the driver may be gone already
        pass


def export_pool(runtime: Runtime, device: int, count: int, slot_size: int) -> tuple[DevicePool, bytes]:
    """Allocate a pool's device memory (zeroed) on ``device``: ``(pool, descriptor)``;
    ``write_descriptor`` puts the descriptor where the clients read it."""
    size = count * slot_size
    runtime.set_device(device)
    base = runtime.malloc(size)
    try:
        runtime.memset(base, 0, size)
        runtime.stream_sync(0)  # cudaMemset is asynchronous: done before any stream writes a frame
        handle = runtime.ipc_get_handle(base)
        uuid = runtime.device_uuid(device)
    except BaseException:
        runtime.free(base)
        raise

    def free(ptr: int) -> None:
        with _lock:
            _exported.pop(handle, None)
        runtime.free(ptr)

    pool = DevicePool(runtime, device, base, slot_size, count, free)
    with _lock:
        _exported[handle] = pool
    return pool, DESCRIPTOR.pack(MAGIC, VERSION, 0, uuid, size, slot_size, handle)


def write_descriptor(buffer0: npt.NDArray[np.uint8], descriptor: bytes) -> None:
    """Write the descriptor into the host pool's buffer 0 (its first page)."""
    buffer0[: len(descriptor)] = np.frombuffer(descriptor, np.uint8)


def import_pool(runtime: Runtime, buffer0: npt.NDArray[np.uint8], count: int, slot_size: int) -> DevicePool:
    """Map the device allocation a pool's descriptor names (``buffer0``: the host pool's
    buffer 0) into this process, on the device of that UUID."""
    if buffer0.nbytes < DESCRIPTOR.size:
        raise IpcError("the stream's frames are in GPU memory but its buffers are too small for the descriptor")
    magic, version, _, uuid, size, slot, handle = DESCRIPTOR.unpack(bytes(buffer0[: DESCRIPTOR.size]))
    if magic != MAGIC or version != VERSION:
        raise IpcError(
            f"the stream's pool names no device memory this client understands (descriptor {magic!r} "
            f"version {version}): is the server's visionipc of another version?"
        )
    if slot != slot_size or size != count * slot_size:
        raise IpcError(f"the stream's device-memory descriptor ({size} bytes, slots of {slot}) does not fit its pool")
    device = _device_of(runtime, uuid)
    with _lock:
        own = _exported.get(handle)
    if own is not None:  # this process's own server: CUDA does not reopen its own handle
        return DevicePool(runtime, device, own.base, slot_size, count, None, own)
    runtime.set_device(device)
    base = runtime.ipc_open(handle)
    pool = DevicePool(runtime, device, base, slot_size, count, runtime.ipc_close)
    # The descriptor lies in pixels every admitted client can write (the reference's
    # rule: a client's mapping is writable), so the handle may name another allocation
    # than the server's: one smaller than the pool would let frames read past its end.
    start, length = runtime.allocation_range(base)
    if start != base or length < size:
        pool.close()
        raise IpcError(
            f"the stream's device-memory descriptor names an allocation of {length} bytes at offset "
            f"{base - start}, not the pool's {size}: its buffer 0 was overwritten (by a client?)"
        )
    return pool


def _device_of(runtime: Runtime, uuid: bytes) -> int:
    """The ordinal, in this process, of the device with ``uuid``."""
    count = runtime.device_count()
    for device in range(count):
        if runtime.device_uuid(device) == uuid:
            return device
    raise CudaError(
        f"the stream's frames are in the memory of GPU {uuid.hex()}, which this process cannot see "
        f"(its {count} devices differ: CUDA_VISIBLE_DEVICES?)"
    )


def _forget_exports() -> None:
    """In a forked child: the parent's exported pools are not this process's."""
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at fork
    _exported.clear()


os.register_at_fork(after_in_child=_forget_exports)
