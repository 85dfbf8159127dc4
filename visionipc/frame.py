"""VisionBuf: one frame in a pool, seen without copying.

``.data`` is a writable ``memoryview`` (format ``"B"``) of the whole buffer,
as in the reference (commaai/msgq #688); ``.array`` is a numpy view shaped
for the format, ``.y`` / ``.uv`` (NV12) and ``.y`` / ``.u`` / ``.v`` (I420)
are plane views, all over the same bytes. Every view keeps the pool's mapping
alive, even after the client is gone. A client's frames are writable, as in
the reference, and shared: every client of the stream sees the same bytes, so
treat them as read-only unless you mean to annotate the frame for everyone.
Frames of an ordered stream's client are read-only (``.data`` too). The
per-buffer metadata (generation, frame id, timestamps) is mapped read-only in
clients.

``valid`` says whether the buffer still holds this frame (its generation is
unchanged). ``with client.recv() as frame:`` holds the client's read lease on
the frame for the block, so the server does not reuse the buffer meanwhile.

The objects that hand out frames (server, client, ordered writer and client)
are :class:`FrameOwner` s; those with read leases are :class:`LeasingOwner` s.
Each keeps a :class:`ViewCache`: the views of every buffer, made once.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from msgq.errors import InvalidArgumentError
from visionipc import _visionipc
from visionipc.formats import Geometry

if TYPE_CHECKING:
    from msgq.ordered import Reservation
    from visionipc.cuda.device_frame import DeviceFrame

_Buf = TypeVar("_Buf", bound="VisionBuf")


@runtime_checkable
class FrameOwner(Protocol):
    """Where a VisionBuf comes from: says whether the buffer still holds the frame."""

    def frame_valid(self, buf: VisionBuf) -> bool: ...


@runtime_checkable
class LeasingOwner(FrameOwner, Protocol):
    """An owner whose readers lease frames (``with frame:`` holds, then releases)."""

    def hold_frame(self, buf: VisionBuf) -> None: ...

    def release_frame(self, buf: VisionBuf) -> None: ...


class FrameViews(NamedTuple):
    """The views of one whole buffer, all over the same bytes."""

    data: memoryview  # format "B", the whole buffer (read-only where the source is)
    flat: np.ndarray  # uint8, the whole buffer
    array: np.ndarray  # shaped for the format (VisionBuf.array)
    # Fresh views of ``array`` never handed out yet, made ahead of time (``prepare``)
    # so that ``VisionBuf.array`` on the per-frame path, which runs cold right after
    # a wake-up, only pops one instead of asking numpy for a new view. (The C base
    # of VisionBuf reads these fields by position: keep their order.)
    spares: list

    def prepare(self) -> None:
        """Make the next ``VisionBuf.array`` of this buffer ready (call while warm)."""
        if not self.spares:
            self.spares.append(self.array.view())


def frame_views(source: Any, geometry: Geometry) -> FrameViews:
    """The views of a buffer-protocol object covering one buffer laid out as ``geometry``."""
    data = memoryview(source)
    if data.format != "B" or data.ndim != 1:
        data = data.cast("B")
    flat = np.frombuffer(data, dtype=np.uint8)
    return FrameViews(data, flat, _shaped(flat, geometry), [])


def _shaped(flat: np.ndarray, g: Geometry) -> np.ndarray:
    info, h, w, s = g.info, g.height, g.width, g.stride
    if info.yuv420:
        if g.uv_offset == s * h and s * (h * 3 // 2) <= g.size:
            return np.ndarray((h * 3 // 2, s), dtype=np.uint8, buffer=flat, strides=(s, 1))
        return flat  # a custom layout whose chroma does not follow the luma directly
    dtype = np.dtype(f"u{info.sample_bytes}")
    if info.channels > 1:
        return np.ndarray(
            (h, w, info.channels), dtype=dtype, buffer=flat, strides=(s, info.bytes_per_pixel, info.sample_bytes)
        )
    return np.ndarray((h, w), dtype=dtype, buffer=flat, strides=(s, info.bytes_per_pixel))


def plane(g: Geometry, which: str) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """``(offset, shape, byte strides)`` of plane ``which`` ("Y", "UV", "U", "V") of a
    frame laid out as ``g``, uint8 (host frames and visionipc.cuda's device frames)."""
    if not g.info.yuv420:
        raise InvalidArgumentError(f"{g.format} frames have no {which} plane")
    if which == "Y":
        return 0, (g.height, g.width), (g.stride, 1)
    if which == "UV":
        if g.info.planes != 2:
            raise InvalidArgumentError(f"{g.format} frames have separate .u and .v planes")
        return g.uv_offset, (g.height // 2, g.width // 2, 2), (g.stride, 2, 1)
    if g.info.planes != 3:
        raise InvalidArgumentError(f"{g.format} frames have no separate {which} plane (interleaved .uv)")
    cs, ch = g.stride // 2, g.height // 2
    return g.uv_offset + (cs * ch if which == "V" else 0), (ch, g.width // 2), (cs, 1)


class ViewCache:
    """The views of each buffer of one mapping (a pool, a ring of slots), made on
    first use and shared by every VisionBuf of that buffer. Drop it when the
    mapping goes; frames already handed out keep their views alive."""

    __slots__ = ("_source", "made", "geometry")

    def __init__(self, geometry: Geometry, count: int, source: Callable[[int], Any] | None = None) -> None:
        """``source(idx)``: a buffer-protocol object over buffer ``idx`` (or pass one to ``get``)."""
        self.geometry = geometry
        self.made: list[FrameViews | None] = [None] * count  # per buffer: its FrameViews, None until first used
        self._source = source

    def get(self, idx: int, buffer: Any = None) -> FrameViews:
        """Buffer ``idx``'s views; made the first time, from ``buffer`` or ``source(idx)``."""
        views = self.made[idx]
        if views is None:
            if buffer is None:
                assert self._source is not None, "a ViewCache without a source is given each buffer"
                buffer = self._source(idx)
            views = self.made[idx] = frame_views(buffer, self.geometry)
        return views


# The fields of the C base, _visionipc.Frame (cpp/python/frame_object.cpp), as it declares them.
_FIELDS = tuple(n for n, v in vars(_visionipc.Frame).items() if isinstance(v, types.MemberDescriptorType))


class VisionBuf(_visionipc.Frame):
    """One frame: buffer ``idx`` of ``owner``'s mapping, seen through ``views``
    (the owner's cached :class:`FrameViews` of it). ``.data`` / ``.array`` return
    a fresh view of them each time, so callers may reshape, flag or release
    theirs without touching anyone else's."""

    # The per-frame fields (idx, generation, frame_id, the timestamps, stream and
    # the views) and ``.array`` live in the C base, so a client stores a received
    # frame and hands out its view without running Python (cpp/python/frame_object.h).
    # Other attributes still go to __dict__.
    __slots__ = ("__dict__", "__weakref__")
    _reservation: Reservation | None  # a frame of an ordered writer's get_buffer(): its id until sent

    def __init__(
        self,
        views: FrameViews,
        geometry: Geometry,
        idx: int,
        generation: int,
        frame_id: int = 0,
        timestamp_sof: int = 0,
        timestamp_eof: int = 0,
        owner: FrameOwner | None = None,
        stream: Any = None,
        timestamp_publish: int = 0,
        timestamp_recv: int = 0,
    ) -> None:
        self._views = views
        self._geometry = geometry
        self.idx = idx
        self.generation = generation
        self.frame_id = frame_id
        self.timestamp_sof = timestamp_sof
        self.timestamp_eof = timestamp_eof
        # CLOCK_MONOTONIC ns when the server sent this frame and when this client got it
        # (0 for frames that were not received); receive - publish is the handoff latency.
        self.timestamp_publish = timestamp_publish
        self.timestamp_recv = timestamp_recv
        self._owner = owner  # the FrameOwner this frame came from
        self.stream = stream

    def __copy__(self: _Buf) -> _Buf:
        """``copy.copy(frame)``: another frame object with the same fields and views
        (over the same pixels; no bytes are copied)."""
        other = type(self).__new__(type(self))
        for name in _FIELDS:
            if hasattr(self, name):
                setattr(other, name, getattr(self, name))
        other.__dict__.update(self.__dict__)
        return other

    @classmethod
    def blank(cls: type[_Buf], owner: FrameOwner | None, stream: Any) -> _Buf:
        """A frame of ``owner`` whose buffer and numbers the caller fills in (all of
        ``__init__``'s fields): a client makes it before waiting, as the steps after
        a wake-up run cold, where every allocation and call costs."""
        f = cls.__new__(cls)
        f._owner, f.stream = owner, stream
        return f

    # geometry
    @property
    def width(self) -> int:
        return self._geometry.width

    @property
    def height(self) -> int:
        return self._geometry.height

    @property
    def stride(self) -> int:
        return self._geometry.stride

    @property
    def uv_offset(self) -> int:
        return self._geometry.uv_offset

    @property
    def format(self) -> str:
        return self._geometry.format

    @property
    def len(self) -> int:
        return self._geometry.size

    @property
    def geometry(self) -> Geometry:
        return self._geometry

    @property
    def owner(self) -> FrameOwner | None:
        return self._owner

    def __len__(self) -> int:
        return self._geometry.size

    @property
    def valid(self) -> bool:
        """True while the buffer still holds this frame (checks its generation now)."""
        return self._owner is not None and self._owner.frame_valid(self)

    @property
    def data(self) -> memoryview:
        """The whole buffer as a memoryview (format "B"; writable unless the frame is read-only)."""
        return memoryview(self._views.data)

    def as_array(self) -> np.ndarray:
        """The whole buffer as a flat uint8 numpy array (what ``.data`` was before it became a memoryview)."""
        return self._views.flat.view()

    def _plane(self, which: str) -> np.ndarray:
        offset, shape, strides = plane(self._geometry, which)
        return np.ndarray(shape, dtype=np.uint8, buffer=self._views.flat, offset=offset, strides=strides)

    @property
    def y(self) -> np.ndarray:
        """The luma plane, ``(height, width)``."""
        return self._plane("Y")

    @property
    def uv(self) -> np.ndarray:
        """NV12 interleaved chroma, ``(height//2, width//2, 2)``."""
        return self._plane("UV")

    @property
    def u(self) -> np.ndarray:
        """I420 U, ``(height//2, width//2)``."""
        return self._plane("U")

    @property
    def v(self) -> np.ndarray:
        """I420 V, ``(height//2, width//2)``."""
        return self._plane("V")

    def to_bgr(self) -> np.ndarray:
        """A new (h, w, 3) BGR image, converted by OpenCV (``pip install visionipc[cv]``)."""
        try:
            import cv2  # noqa: F401
        except ImportError as e:  # optional dependency
            raise ImportError("VisionBuf.to_bgr() needs OpenCV: pip install 'visionipc[cv]'") from e
        from visionipc.pixels import pack, to_bgr  # the format table's conversions

        return to_bgr(pack(self), self.format)  # a new image either way (pack copies)

    # GPU (visionipc.cuda) and DLPack
    def to_device(self, out: Any = None, stream: Any = None) -> DeviceFrame:
        """An asynchronous copy of this frame into GPU memory, as a
        :class:`visionipc.cuda.DeviceFrame` (a client made with ``cuda=True``).
        ``out``: a device buffer of yours to fill (anything with
        ``__cuda_array_interface__``), so nothing is allocated; ``stream``: the CUDA
        stream to copy on (default: the client's own). The frame's read lease is
        held until the copy has completed on the device."""
        to_device = getattr(self._owner, "frame_to_device", None)
        if to_device is None:
            raise InvalidArgumentError("to_device() needs a frame of a VisionIpcClient made with cuda=True")
        return to_device(self, out, stream)

    def copy_from_device(self, array: Any, stream: Any = None) -> None:
        """Fill this producer's buffer from GPU memory (``VisionIpcServer(..., cuda=True)``):
        an asynchronous device-to-host copy of ``array`` (``__cuda_array_interface__``; the
        whole buffer's bytes, or its rows without the stride's padding) on ``stream`` (default:
        the server's own); ``server.send(buf, ...)`` waits for it to land."""
        from_device = getattr(self._owner, "frame_from_device", None)
        if from_device is None:
            raise InvalidArgumentError("copy_from_device() needs a buffer of a VisionIpcServer made with cuda=True")
        from_device(self, array, stream)

    @property
    def device_array(self) -> DeviceFrame:
        """A producer's buffer of a pool in device memory (``create_buffers(...,
        memory="cuda")``) as a :class:`visionipc.cuda.DeviceFrame` of its device memory:
        write it with your kernels (``cupy.asarray(buf.device_array)``,
        ``torch.as_tensor(..., device="cuda")``), finish that work, then ``send(buf)``."""
        device_array = getattr(self._owner, "frame_device_array", None)
        if device_array is None:
            raise InvalidArgumentError("device_array is a producer's buffer of a pool in device memory")
        return device_array(self)  # type: ignore[no-any-return]

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack's CPU (1, 0), or CUDA-host (3, 0) when the pool is registered with CUDA."""
        registered = getattr(self._owner, "cuda_host_device", None)
        return (1, 0) if registered is None or registered(self) is None else (3, 0)

    def __dlpack__(
        self,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """``numpy.from_dlpack(frame)`` / ``torch.from_dlpack(frame)``: ``.array``'s bytes
        without a copy (the pool stays mapped while the result lives)."""
        array = self.array
        if copy:
            raise BufferError("a VisionBuf is exported without copying (copy=True is not supported)")
        if self.__dlpack_device__()[0] == 1:
            if max_version is None and dl_device is None and copy is None:
                return array.__dlpack__(stream=stream)
            return array.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        item = array.dtype.itemsize
        return _visionipc.dlpack_capsule(
            array, array.ctypes.data, list(array.shape), [s // item for s in array.strides], 1, item * 8, 3, 0
        )

    # read lease for a block
    def __enter__(self: _Buf) -> _Buf:
        if isinstance(self._owner, LeasingOwner):
            self._owner.hold_frame(self)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if isinstance(self._owner, LeasingOwner):
            self._owner.release_frame(self)
        return False

    def __repr__(self) -> str:
        return (
            f"<VisionBuf {self.format} {self.width}x{self.height} stride={self.stride} idx={self.idx} "
            f"frame_id={self.frame_id}>"
        )
