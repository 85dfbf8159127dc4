"""The CUDA runtime calls visionipc.cuda makes, on NVIDIA's own binding
(``cuda-bindings``: ``cuda.bindings.runtime``), each checked: a failure is a
:class:`CudaError` naming the call and the runtime's error, in one line.

Everything above this module talks to a :class:`Runtime`; handles (pointers,
streams, events) are plain ints. The tests of the CPU-side bookkeeping give the
client a stand-in with the same methods where no device exists
(``tests/visionipc/test_cuda.py``); on a GPU machine they use this one.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from msgq.errors import InvalidArgumentError, IpcError


class CudaError(IpcError):
    """A CUDA runtime call failed (the message names the call and the runtime's error)."""


class CudaUnavailableError(CudaError):
    """No CUDA here: ``cuda-bindings`` is not installed, no NVIDIA driver, or no device."""


def _load():
    try:
        from cuda.bindings import runtime
    except ImportError as e:
        raise CudaUnavailableError(
            f"visionipc.cuda needs NVIDIA's CUDA Python binding ({e}): pip install 'visionipc[cuda]'"
        ) from None
    return runtime


_UNAVAILABLE = {
    "cudaErrorInsufficientDriver": "no NVIDIA driver is loaded (or it is older than the CUDA runtime)",
    "cudaErrorNoDevice": "no CUDA device is present",
    "cudaErrorDevicesUnavailable": "every CUDA device is busy or unavailable",
    "cudaErrorStubLibrary": "only the CUDA driver's stub library is installed (no NVIDIA driver)",
}

HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = "h2d", "d2h", "d2d"
IPC_HANDLE_SIZE = 64  # bytes of a cudaIpcMemHandle_t


class Runtime:
    """Checked calls into ``cuda.bindings.runtime``; handles are ints."""

    def __init__(self) -> None:
        self._rt = rt = _load()
        self._ok = rt.cudaError_t.cudaSuccess
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self._kinds = {
            HOST_TO_DEVICE: rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
            DEVICE_TO_HOST: rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
            DEVICE_TO_DEVICE: rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
        }

    def _check(self, what: str, result):
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self._ok:
            name = getattr(err, "name", str(err))
            if name in _UNAVAILABLE:
                raise CudaUnavailableError(f"CUDA is unavailable: {_UNAVAILABLE[name]} ({what}: {name})")
            raise CudaError(f"{what} failed: {name}")
        return values[0] if len(values) == 1 else values

    # devices
    def device_count(self) -> int:
        return self._check("cudaGetDeviceCount", self._rt.cudaGetDeviceCount())

    def set_device(self, device: int) -> None:
        self._check(f"cudaSetDevice({device})", self._rt.cudaSetDevice(device))

    def pointer_device(self, ptr: int) -> int | None:
        """The device ordinal of device memory at ``ptr``, or None for host memory."""
        attrs = self._check("cudaPointerGetAttributes", self._rt.cudaPointerGetAttributes(ptr))
        kind = getattr(attrs.type, "name", "")
        return attrs.device if kind in ("cudaMemoryTypeDevice", "cudaMemoryTypeManaged") else None

    def device_uuid(self, device: int) -> bytes:
        """The 16-byte UUID of device ``device`` (the same in every process, whatever
        CUDA_VISIBLE_DEVICES renumbers)."""
        props = self._check(f"cudaGetDeviceProperties({device})", self._rt.cudaGetDeviceProperties(device))
        return bytes(props.uuid.bytes)[:16]

    # host registration
    def host_register(self, ptr: int, size: int, read_only: bool = False) -> None:
        flags = self._rt.cudaHostRegisterDefault
        if read_only:
            flags |= self._rt.cudaHostRegisterReadOnly
        self._check(f"cudaHostRegister({size} bytes)", self._rt.cudaHostRegister(ptr, size, flags))

    def host_unregister(self, ptr: int) -> None:
        self._check("cudaHostUnregister", self._rt.cudaHostUnregister(ptr))

    # device memory
    def malloc(self, size: int) -> int:
        return int(self._check(f"cudaMalloc({size} bytes)", self._rt.cudaMalloc(size)))

    def free(self, ptr: int) -> None:
        self._check("cudaFree", self._rt.cudaFree(ptr))

    def memset(self, ptr: int, value: int, size: int) -> None:
        self._check(f"cudaMemset({size} bytes)", self._rt.cudaMemset(ptr, value, size))

    # memory shared between processes (CUDA IPC)
    def ipc_get_handle(self, ptr: int) -> bytes:
        """The CUDA IPC handle of the allocation at ``ptr`` (from cudaMalloc), as bytes."""
        handle = self._check("cudaIpcGetMemHandle", self._rt.cudaIpcGetMemHandle(ptr))
        return ctypes.string_at(handle.getPtr(), IPC_HANDLE_SIZE)

    def ipc_open(self, handle: bytes) -> int:
        """Map another process's allocation (its ``ipc_get_handle``) into this one's
        current device; the driver counts repeated opens of one handle."""
        h = self._rt.cudaIpcMemHandle_t()
        ctypes.memmove(h.getPtr(), bytes(handle), IPC_HANDLE_SIZE)  # its own 64 bytes
        flags = self._rt.cudaIpcMemLazyEnablePeerAccess
        return int(self._check("cudaIpcOpenMemHandle", self._rt.cudaIpcOpenMemHandle(h, flags)))

    def ipc_close(self, ptr: int) -> None:
        self._check("cudaIpcCloseMemHandle", self._rt.cudaIpcCloseMemHandle(ptr))

    def allocation_range(self, ptr: int) -> tuple[int, int]:
        """``(base, size)`` of the device allocation holding ``ptr`` (one opened through
        CUDA IPC included), from the driver (``cuMemGetAddressRange``)."""
        from cuda.bindings import driver

        err, base, size = driver.cuMemGetAddressRange(driver.CUdeviceptr(ptr))
        if err != driver.CUresult.CUDA_SUCCESS:
            raise CudaError(f"cuMemGetAddressRange failed: {getattr(err, 'name', err)}")
        return int(base), int(size)

    # streams and events
    def stream_create(self) -> int:
        flags = self._rt.cudaStreamNonBlocking
        return int(self._check("cudaStreamCreateWithFlags", self._rt.cudaStreamCreateWithFlags(flags)))

    def stream_destroy(self, stream: int) -> None:
        self._check("cudaStreamDestroy", self._rt.cudaStreamDestroy(self._rt.cudaStream_t(stream)))

    def event_create(self) -> int:
        flags = self._rt.cudaEventDisableTiming
        return int(self._check("cudaEventCreateWithFlags", self._rt.cudaEventCreateWithFlags(flags)))

    def event_destroy(self, event: int) -> None:
        self._check("cudaEventDestroy", self._rt.cudaEventDestroy(self._rt.cudaEvent_t(event)))

    def event_record(self, event: int, stream: int) -> None:
        rt = self._rt
        self._check("cudaEventRecord", rt.cudaEventRecord(rt.cudaEvent_t(event), rt.cudaStream_t(stream)))

    def event_done(self, event: int) -> bool:
        (err,) = self._rt.cudaEventQuery(self._rt.cudaEvent_t(event))
        if err == self._not_ready:
            return False
        self._check("cudaEventQuery", (err,))
        return True

    def event_sync(self, event: int) -> None:
        self._check("cudaEventSynchronize", self._rt.cudaEventSynchronize(self._rt.cudaEvent_t(event)))

    def stream_sync(self, stream: int) -> None:
        self._check("cudaStreamSynchronize", self._rt.cudaStreamSynchronize(self._rt.cudaStream_t(stream)))

    def stream_wait_event(self, stream: int, event: int) -> None:
        rt = self._rt
        self._check("cudaStreamWaitEvent", rt.cudaStreamWaitEvent(rt.cudaStream_t(stream), rt.cudaEvent_t(event), 0))

    def memcpy2d_async(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, kind: str, stream: int
    ) -> None:
        rt, how = self._rt, self._kinds[kind]
        result = rt.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, how, rt.cudaStream_t(stream))
        self._check(f"cudaMemcpy2DAsync({width}x{height}, {kind})", result)

    def memcpy_async(self, dst: int, src: int, size: int, kind: str, stream: int) -> None:
        rt = self._rt
        result = rt.cudaMemcpyAsync(dst, src, size, self._kinds[kind], rt.cudaStream_t(stream))
        self._check(f"cudaMemcpyAsync({size} bytes, {kind})", result)


@functools.lru_cache(maxsize=None)
def runtime() -> Runtime:
    """The process's Runtime (CudaUnavailableError without cuda-bindings)."""
    return Runtime()


def resolve_device(rt: Runtime, cuda: bool | int) -> int:
    """The device ordinal of a ``cuda=`` argument (True: device 0), checked against
    the devices present (CudaUnavailableError without a driver or a device)."""
    if isinstance(cuda, bool):
        device = 0
    elif isinstance(cuda, int):
        device = cuda
    else:
        raise InvalidArgumentError(f"cuda must be True, False or a device ordinal, not {cuda!r}")
    count = rt.device_count()
    if count == 0:
        raise CudaUnavailableError("CUDA is unavailable: no CUDA device is present")
    if not 0 <= device < count:
        raise InvalidArgumentError(f"CUDA device {device} does not exist (this machine has {count}: 0..{count - 1})")
    return device


def stream_handle(stream: Any) -> int:
    """A CUDA stream given as an int handle, a ``cuda.bindings`` stream, an object
    with ``__cuda_stream__`` (the stream protocol), ``.cuda_stream`` (PyTorch) or
    ``.ptr`` (CuPy)."""
    if isinstance(stream, bool):
        raise InvalidArgumentError("a CUDA stream is an int handle or a stream object, not a bool")
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"not a CUDA stream: {type(stream).__name__}") from None
