"""Frames of one stream filled by several workers in parallel, published out
of order, received in frame-id order (or newest first).

Built on an ordered topic (:mod:`msgq.ordered`, seed 004): each frame is one
slot, laid out as a VisionIPC buffer of the stream's format
(:func:`visionipc.layout`), followed by a small trailer describing the
geometry so clients need nothing else. Workers are threads or processes::

    # in each worker (thread or process); the first one creates the stream
    writer = OrderedFrameWriter("camerad", "road", width=1928, height=1208, format="nv12", count=32)
    frame = writer.get_buffer()          # reserves the next frame id: frame.frame_id
    frame.array[:] = render(frame.frame_id)          # fill in place, as long as it takes
    writer.send(frame, timestamp_sof=t0, timestamp_eof=t1)  # publish (any order)

    client = OrderedFrameClient("camerad", "road", mode="sequential")   # or "newest"
    frame = client.recv(timeout_ms=100)  # VisionBuf: frame ids 0, 1, 2... never one early

Frame ids are handed out in ``get_buffer()`` order; ``get_buffer(frame_id=N)``
takes an explicit id, which must be higher than every id reserved before
(ids skipped over are never delivered). At most 16 frames are in flight; a
17th ``get_buffer()`` waits for the oldest to be sent. Client frames are
read-only views into the slot (no copy; ``.data`` a read-only memoryview,
``.array`` a read-only numpy array); ``frame.valid`` turns False
once the ring reuses the slot (``count`` frames later), so a client that holds
a frame longer should copy it.
"""

import struct
from typing import Any, Optional, Tuple

from msgq._shared import Closeable, check_timeout_ms
from msgq.errors import InvalidArgumentError, IpcTimeoutError, SegmentError
from msgq.ordered import OrderedProducer, OrderedReader
from visionipc.formats import (
    FORMAT_TABLE,
    Geometry,
    check_count,
    layout,
    normalize_format,
)
from visionipc.frame import ViewCache, VisionBuf
from visionipc.streams import ServerName, StreamId, server_name, stream_key

_TRAILER = struct.Struct("<8sIIIIIQ")  # magic, format code, width, height, stride, uv_offset, size
_MAGIC = b"VIPCORD1"


def topic_name(name: ServerName, stream: StreamId) -> str:
    """The ordered topic a stream lives on: ``vipc_ordered_<name>_<stream>``."""
    return f"vipc_ordered_{server_name(name)}_{stream_key(stream)}"


def _align64(n: int) -> int:
    return (n + 63) & ~63


class OrderedFrameWriter(Closeable):
    """A worker's handle on an ordered stream. Every writer passes the same
    geometry (``width``, ``height``, ``format``) and ``count`` (frames in the
    ring, at least 16): the first creates the stream, the others attach to it
    (different sizes raise InvalidArgumentError). Thread-safe."""

    def __init__(
        self, name: ServerName, stream: StreamId, width: int, height: int, format: str = "nv12", count: int = 32
    ) -> None:
        self.name, self.stream = server_name(name), stream_key(stream)
        geo = layout(normalize_format(format), check_count("width", width), check_count("height", height))
        count = check_count("count", count)
        if count < 16:
            raise InvalidArgumentError(f"count must be at least 16 (the in-flight window), got {count}")
        self._producer = OrderedProducer(topic_name(name, stream), count, _align64(geo.size) + _TRAILER.size)
        self._views = ViewCache(geo, self._producer.capacity)  # per slot

    def _trailer_offset(self, slot_bytes: int) -> int:
        return slot_bytes - _TRAILER.size

    def get_buffer(self, frame_id: Optional[int] = None, timeout: Optional[float] = None) -> VisionBuf:
        """Reserve the next frame id (or ``frame_id``) and return its writable
        frame; fill ``.array`` (or the plane views) in place, then ``send()``."""
        res = self._producer.reserve(frame_id, timeout=timeout)
        geo = self._views.geometry
        try:
            _TRAILER.pack_into(
                res.data,
                self._trailer_offset(len(res.data)),
                _MAGIC,
                geo.info.code,
                geo.width,
                geo.height,
                geo.stride,
                geo.uv_offset,
                geo.size,
            )
        except BaseException:
            res.cancel()
            raise
        slot = res.id % self._producer.capacity
        buf = VisionBuf(
            self._views.get(slot, res.data[: geo.size]), geo, slot, 0, res.id, owner=self, stream=self.stream
        )
        buf._reservation = res
        return buf

    def send(self, buf: VisionBuf, timestamp_sof: int = 0, timestamp_eof: int = 0) -> None:
        """Publish a frame from ``get_buffer()``: clients waiting for its id wake up."""
        res = getattr(buf, "_reservation", None)
        if res is None or buf.owner is not self:
            raise InvalidArgumentError("this frame does not come from this writer's get_buffer()")
        buf.timestamp_sof, buf.timestamp_eof = timestamp_sof, timestamp_eof
        res.publish(self._producer.slot_bytes, timestamp_sof, timestamp_eof)
        buf._reservation = None

    def cancel(self, buf: VisionBuf) -> None:
        """Give a reserved frame up: clients skip its id."""
        res = getattr(buf, "_reservation", None)
        if res is not None:
            res.cancel()
            buf._reservation = None

    def frame_valid(self, buf: VisionBuf) -> bool:
        """FrameOwner: a producer's frame is valid until it is sent."""
        return getattr(buf, "_reservation", None) is not None

    def close(self) -> None:
        """Leave the stream; frames reserved and not sent are cancelled."""
        self._producer.close()


class OrderedFrameClient(Closeable):
    """Receives an ordered stream: ``mode="sequential"`` (every frame in
    frame-id order) or ``"newest"`` (the newest frame, skipping older ones)."""

    def __init__(self, name: ServerName, stream: StreamId, mode: str = "sequential") -> None:
        self.name, self.stream = server_name(name), stream_key(stream)
        self._reader = OrderedReader(topic_name(name, stream), mode)
        self.mode = mode
        self._trailer: Optional[Tuple[Any, ...]] = (
            None  # the last geometry trailer seen, and the ViewCache (per slot) made for it
        )
        self._views: Optional[ViewCache] = None

    def recv(self, timeout_ms: Optional[float] = 100) -> Optional[VisionBuf]:
        """The next frame as a read-only VisionBuf, or None after ``timeout_ms``
        (< 0: wait forever)."""
        timeout_ms = check_timeout_ms(timeout_ms, "timeout_ms")
        timeout = None if timeout_ms < 0 else timeout_ms / 1000.0
        try:
            id_, view, sof, eof, stamp = self._reader._recv_view(timeout)
        except IpcTimeoutError:
            return None
        view = memoryview(view)
        trailer = _TRAILER.unpack_from(view, len(view) - _TRAILER.size)
        if trailer != self._trailer:
            self._views = ViewCache(self._trailer_geometry(id_, trailer, len(view)), self._reader.capacity)
            self._trailer = trailer
        views, slot = self._views, id_ % self._reader.capacity
        assert views is not None  # made for the first trailer above
        buf = VisionBuf(
            views.get(slot, view[: views.geometry.size]),
            views.geometry,
            slot,
            stamp,
            id_,
            sof,
            eof,
            owner=self,
            stream=self.stream,
        )
        if not buf.valid:  # overwritten while we looked: the next one
            return self.recv(timeout_ms)
        return buf

    def _trailer_geometry(self, id_: int, trailer: Tuple[Any, ...], slot_bytes: int) -> Geometry:
        magic, code, width, height, stride, uv_offset, size = trailer
        if (
            magic != _MAGIC
            or code >= len(FORMAT_TABLE)
            or not FORMAT_TABLE[code].selectable
            or size > slot_bytes - _TRAILER.size
        ):
            raise SegmentError(f"ordered stream {self.name}/{self.stream}: frame {id_} has no valid geometry trailer")
        return Geometry(FORMAT_TABLE[code].name, width, height, stride, uv_offset, size)

    def frame_valid(self, buf: VisionBuf) -> bool:
        """FrameOwner: the ring has not reused the frame's slot."""
        return self._reader._is_valid(buf.frame_id, buf.generation)

    @property
    def dropped(self) -> int:  # frames the ring overwrote before we got them
        return self._reader.dropped

    @property
    def width(self) -> Optional[int]:
        return None if self._views is None else self._views.geometry.width  # None before the first frame

    @property
    def height(self) -> Optional[int]:
        return None if self._views is None else self._views.geometry.height

    def close(self) -> None:
        self._reader.close()


__all__ = ["OrderedFrameWriter", "OrderedFrameClient", "topic_name"]
