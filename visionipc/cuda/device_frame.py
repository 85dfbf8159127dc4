"""DeviceFrame: a frame in GPU memory, readable by any CUDA framework without a copy.

It speaks both interchange protocols: ``__cuda_array_interface__`` (CuPy, Numba,
PyTorch's ``torch.as_tensor``) and DLPack (``torch.from_dlpack``,
``cupy.from_dlpack``, ``jax.dlpack.from_dlpack``). The copy that fills it is
asynchronous; both protocols tell the consumer how to wait for it: the array
interface names the copy's stream, and ``__dlpack__(stream=S)`` makes the
consumer's stream S wait for the copy's event (no host synchronisation at all).
``synchronize()`` waits on the host; ``ready`` asks without waiting.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import numpy as np

from msgq.errors import ClosedError, InvalidArgumentError
from visionipc import _visionipc
from visionipc.cuda._runtime import DEVICE_TO_DEVICE, DEVICE_TO_HOST
from visionipc.frame import plane

if TYPE_CHECKING:
    import numpy.typing as npt

    from visionipc.cuda._runtime import Runtime
    from visionipc.cuda.device_pool import DevicePool
    from visionipc.formats import Geometry
    from visionipc.frame import VisionBuf

KDL_CUDA = 2
_TYPE_CODES = {"u": 1, "i": 0, "f": 2}
_DEFAULT_STREAM = 1  # cudaStreamLegacy: what a consumer means by "no stream" (DLPack, array interface)


class DeviceArray:
    """Device memory at ``ptr`` seen as an array (``shape``, byte ``strides``, ``dtype``)
    on device ``device``; ``owner`` keeps the memory alive; ``event``/``stream``: the
    copy that fills it (the event completes when the bytes are there)."""

    __slots__ = (
        "ptr", "shape", "strides", "dtype", "device", "_owner", "_event", "_stream", "_runtime", "_pool", "__weakref__"
    )  # fmt: skip

    def __init__(
        self,
        ptr: int,
        shape: Sequence[int],
        strides: Sequence[int],
        dtype: npt.DTypeLike,
        device: int,
        owner: object,
        event: Any,
        stream: int,
        runtime: Runtime,
        pool: DevicePool | None = None,
    ) -> None:
        self.ptr, self.shape, self.strides = int(ptr), tuple(shape), tuple(strides)
        self.dtype, self.device = np.dtype(dtype), int(device)
        self._owner, self._event, self._stream, self._runtime = owner, event, stream, runtime
        self._pool = pool  # a pool in device memory this array is part of (None: memory of its own)

    def _mapped(self) -> int:
        """``ptr``, unless the pool in device memory it lies in is unmapped (its client closed)."""
        pool = self._pool
        if pool is not None and pool.closed:
            raise ClosedError(
                "this frame lies in a pool in GPU memory that was unmapped when its VisionIpcClient "
                "(or VisionIpcServer) closed: copy what you keep (to_device(), to_host()) before closing"
            )
        return self.ptr

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def ready(self) -> bool:
        """True once the copy that fills it has completed on the device."""
        event = self._event
        return event is None or event.handle is None or self._runtime.event_done(event.handle)

    def synchronize(self) -> None:
        """Wait (on the host) until the copy that fills it has completed."""
        event = self._event
        if event is not None and event.handle is not None:
            self._runtime.event_sync(event.handle)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self._mapped(), False),
            "version": 3,
            "strides": self.strides,
            "stream": self._stream if self._stream else None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device)

    def __dlpack__(
        self,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device):
            raise BufferError(f"a DeviceFrame lives on CUDA device {self.device}; copy it to {dl_device} yourself")
        if copy:
            raise BufferError("a DeviceFrame is exported without copying (copy=True is not supported)")
        ptr = self._mapped()
        event = self._event
        if event is not None and event.handle is not None and stream != -1:
            self._runtime.stream_wait_event(_DEFAULT_STREAM if stream is None else int(stream), event.handle)
        item = self.dtype.itemsize
        return _visionipc.dlpack_capsule(
            self,
            ptr,
            list(self.shape),
            [s // item for s in self.strides],
            _TYPE_CODES[self.dtype.kind],
            item * 8,
            KDL_CUDA,
            self.device,
        )

    def to_host(self) -> np.ndarray:
        """A new host copy (numpy, C-contiguous), after the copy that fills this array:
        for checks and tests; a model reads the device array itself."""
        self._mapped()
        self.synchronize()
        extent = sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        span = self.dtype.itemsize + extent if all(self.shape) else 0
        raw = np.empty(span, np.uint8)
        if span:
            self._copy_out(raw)
        return np.ndarray(self.shape, self.dtype, buffer=raw, strides=self.strides).copy()

    def _copy_out(self, host: np.ndarray) -> None:
        rt = self._runtime
        rt.set_device(self.device)
        stream = self._stream or 0
        rt.memcpy_async(host.ctypes.data, self.ptr, host.nbytes, DEVICE_TO_HOST, stream)
        rt.stream_sync(stream)

    def _view(self, offset, shape, strides, dtype=None):
        return DeviceArray(
            self.ptr + offset, shape, strides, dtype or self.dtype, self.device, self, self._event, self._stream,
            self._runtime, self._pool,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.shape} {self.dtype} on cuda:{self.device}>"


class DeviceFrame(DeviceArray):
    """A VisionIPC frame in device memory: copied there (``VisionBuf.to_device``), or
    received from a pool in device memory (``create_buffers(memory="cuda")``: the
    server's own buffer, mapped into this process, no byte copied). The host frame's
    shape and strides, its plane views (``.y``, ``.uv``, ``.u``, ``.v``, device arrays
    too), ``frame_id``, the timestamps, ``format``, ``width``, ``height``, ``stride``.

    A received one is leased like a host frame: the server does not reuse its buffer
    while it is the client's newest frame (or inside ``with frame:``); ``valid`` says
    whether it still holds this frame. Finish the device work that reads it before
    the next ``recv()`` (or copy it: ``to_device(out=)``, whose lease lasts until the
    copy has completed)."""

    __slots__ = (
        "geometry", "frame_id", "timestamp_sof", "timestamp_eof", "timestamp_publish", "timestamp_recv", "_frame"
    )  # fmt: skip

    def __init__(
        self,
        ptr: int,
        host_array: np.ndarray,
        geometry: Geometry,
        device: int,
        owner: object,
        event: Any,
        stream: int,
        runtime: Runtime,
        meta: tuple[int, int, int, int, int],
        pool: DevicePool | None = None,
        frame: VisionBuf | None = None,
    ) -> None:
        shape, strides, dtype = host_array.shape, host_array.strides, host_array.dtype
        super().__init__(ptr, shape, strides, dtype, device, owner, event, stream, runtime, pool)
        self.geometry = geometry
        self.frame_id, self.timestamp_sof, self.timestamp_eof, self.timestamp_publish, self.timestamp_recv = meta
        self._frame = frame  # received from a pool in device memory: the host record of its buffer and lease

    @classmethod
    def template(cls, frame: VisionBuf, pool: DevicePool | None, runtime: Runtime) -> PoolTemplate:
        """What the frames of one mapping share (made from one of them, ``frame``):
        ``received`` (a pool in device memory's) and ``copied`` (``to_device``'s) make
        each frame from it with stores alone."""
        array = frame.array
        return PoolTemplate(cls, array.shape, array.strides, array.dtype, frame.geometry, pool, runtime)

    @staticmethod
    def copied(
        frame: VisionBuf, t: PoolTemplate, ptr: int, device: int, owner: object, event: Any, stream: int
    ) -> DeviceFrame:
        """``frame`` copied into device memory at ``ptr`` (the copy's ``event`` on ``stream``)."""
        self = t.cls.__new__(t.cls)
        self.ptr, self.shape, self.strides, self.dtype, self.device, self.geometry = (
            ptr,
            t.shape,
            t.strides,
            t.dtype,
            device,
            t.geometry,
        )
        self._owner, self._pool, self._event, self._stream, self._runtime = owner, None, event, stream, t.runtime
        self.frame_id, self.timestamp_sof, self.timestamp_eof = frame.frame_id, frame.timestamp_sof, frame.timestamp_eof
        self.timestamp_publish, self.timestamp_recv, self._frame = frame.timestamp_publish, frame.timestamp_recv, None
        return self

    @staticmethod
    def received(frame: VisionBuf, t: PoolTemplate) -> DeviceFrame:
        """A client's frame of a pool in device memory (``frame``: its host record). The
        per-frame path, run cold after the client's wake-up: no call but the allocation."""
        self = t.cls.__new__(t.cls)
        pool = t.pool
        assert pool is not None  # a received frame's template names its pool
        self.ptr = pool.base + frame.idx * pool.slot_size
        self.shape, self.strides, self.dtype, self.device, self.geometry = (
            t.shape,
            t.strides,
            t.dtype,
            pool.device,
            t.geometry,
        )
        self._owner, self._pool, self._event, self._stream, self._runtime = pool, pool, None, 0, t.runtime
        self.frame_id, self.timestamp_sof, self.timestamp_eof = frame.frame_id, frame.timestamp_sof, frame.timestamp_eof
        self.timestamp_publish, self.timestamp_recv, self._frame = frame.timestamp_publish, frame.timestamp_recv, frame
        return self

    @property
    def valid(self) -> bool:
        """Whether the frame is still there: a copy always is; a received frame of a pool
        in device memory while its buffer was not reused (its generation, checked now)."""
        frame = self._frame
        return (frame is None or frame.valid) and not (self._pool is not None and self._pool.closed)

    def to_device(self, out: Any = None, stream: Any = None) -> DeviceFrame:
        """A copy of a received frame of a pool in device memory (device to device; into
        ``out=`` if given, so nothing is allocated); its lease is held until the copy has
        completed, so the copy is this frame whatever the server does meanwhile."""
        frame = self._frame
        if frame is None:
            raise InvalidArgumentError("this DeviceFrame is a copy already (to_device() copies received frames)")
        to_device = getattr(frame.owner, "frame_to_device", None)
        if to_device is None:
            raise InvalidArgumentError("to_device() needs the frame's VisionIpcClient")
        return to_device(frame, out, stream, (self._mapped(), DEVICE_TO_DEVICE))  # type: ignore[no-any-return]

    def __enter__(self) -> DeviceFrame:
        if self._frame is not None:
            self._frame.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._frame is not None:
            self._frame.__exit__(*exc)

    format = property(lambda self: self.geometry.format)
    width = property(lambda self: self.geometry.width)
    height = property(lambda self: self.geometry.height)
    stride = property(lambda self: self.geometry.stride)

    def _plane(self, which) -> DeviceArray:
        offset, shape, strides = plane(self.geometry, which)
        return self._view(offset, shape, strides, np.uint8)

    y = property(lambda self: self._plane("Y"))
    uv = property(lambda self: self._plane("UV"))
    u = property(lambda self: self._plane("U"))
    v = property(lambda self: self._plane("V"))

    def __repr__(self) -> str:
        return f"<DeviceFrame {self.format} {self.width}x{self.height} frame_id={self.frame_id} on cuda:{self.device}>"


class PoolTemplate(NamedTuple):
    """What the DeviceFrames of one mapping share (``pool``: its memory on the device, for
    the received frames of a pool in device memory; None for copies)."""

    cls: type[DeviceFrame]
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]
    geometry: Geometry
    pool: DevicePool | None
    runtime: Runtime


class DeviceBuffer:
    """Device memory this library allocated for a DeviceFrame (``to_device()`` without
    ``out=``): freed when the last array over it goes."""

    def __init__(self, runtime: Runtime, device: int, size: int) -> None:
        runtime.set_device(device)
        self.ptr = runtime.malloc(size)
        self.size = size
        self._finalizer = weakref.finalize(self, _free, runtime, device, self.ptr)


def _free(runtime, device, ptr):
    try:
        runtime.set_device(device)
        runtime.free(ptr)
    except Exception:  # noqa: BLE001 - at exit the driver may be gone already
        pass


def _interface(obj, what):
    cai = getattr(obj, "__cuda_array_interface__", None)
    if not isinstance(cai, dict) or "data" not in cai:
        raise InvalidArgumentError(f"{what} must have __cuda_array_interface__ (CuPy, PyTorch, Numba), not {type(obj)}")
    itemsize = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != contiguous_strides(cai["shape"], itemsize):
        raise InvalidArgumentError(f"{what} must be C-contiguous")
    return cai, int(cai["data"][0]), int(np.prod(cai["shape"])) * itemsize


def _on_device(ptr, device, runtime, what, verified=None):
    """Refuse ``ptr`` unless it is memory of CUDA ``device``. ``verified``: a set of
    pointers already found there (each check is a driver call costing tens of µs when
    the driver's caches are cold, as they are at a camera's pace); under unified
    addressing a pointer's device cannot change while it stays allocated."""
    if verified is not None and ptr in verified:
        return
    where = runtime.pointer_device(ptr)
    if where != device:
        place = "host memory" if where is None else f"CUDA device {where}"
        raise InvalidArgumentError(f"{what} is in {place}; this object copies to and from CUDA device {device}")
    if verified is not None:
        if len(verified) >= 64:
            verified.clear()
        verified.add(ptr)


def device_source(array: Any, device: int, runtime: Runtime, verified: set[int] | None = None) -> tuple[int, int]:
    """``(pointer, bytes)`` of a C-contiguous device array on ``device`` (a frame's source)."""
    _, ptr, nbytes = _interface(array, "the device array")
    _on_device(ptr, device, runtime, "the device array", verified)
    return ptr, nbytes


def external_buffer(
    out: Any, size: int, device: int, runtime: Runtime, verified: set[int] | None = None
) -> tuple[int, Any]:
    """``(pointer, owner)`` of a caller's device buffer (anything with
    ``__cuda_array_interface__``) that can hold ``size`` contiguous bytes on ``device``."""
    cai, ptr, nbytes = _interface(out, "out=")
    if cai["data"][1]:
        raise InvalidArgumentError("out= is read-only")
    if nbytes < size:
        raise InvalidArgumentError(f"out= holds {nbytes} bytes; this frame needs {size}")
    _on_device(ptr, device, runtime, "out=", verified)
    return ptr, out


def contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """The byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
