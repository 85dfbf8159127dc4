"""The CUDA runtime calls visionipc.cuda makes, on NVIDIA's own binding
(``cuda-bindings``: ``cuda.bindings.runtime``), each checked: a failure is a
:class:`CudaError` naming the call and the runtime's error, in one line.

Everything above this module talks to a :class:`Runtime`; handles (pointers,
streams, events) are plain ints. The tests of the CPU-side bookkeeping give the
client a stand-in with the same methods where no device exists
(``tests/visionipc/test_cuda.py``); on a GPU machine they use this one.
"""

from __future__ import annotations

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

HOST_TO_DEVICE, DEVICE_TO_HOST = "h2d", "d2h"


class Runtime:
    """Checked calls into ``cuda.bindings.runtime``; handles are ints."""

    def __init__(self) -> None:
        self._rt = rt = _load()
        self._ok = rt.cudaError_t.cudaSuccess
        self._not_ready = rt.cudaError_t.cudaErrorNotReady
        self._kinds = {
            HOST_TO_DEVICE: rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
            DEVICE_TO_HOST: rt.cudaMemcpyKind.cudaMemcpyDeviceToHost,
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
