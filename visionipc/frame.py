"""VisionBuf: one frame in a pool, seen without copying.

``.data`` is a flat uint8 numpy array over the whole buffer (what the
reference returns; it supports the buffer protocol, so ``memoryview(buf.data)``
works too), ``.array`` is shaped for the format, ``.y`` / ``.uv`` (NV12) and
``.y`` / ``.u`` / ``.v`` (I420) are plane views. Every view keeps the pool's
mapping alive through its ``.base`` chain, even after the client is gone.
A client's frames are writable, as in the reference, and shared: every client
of the stream sees the same bytes, so treat them as read-only unless you mean
to annotate the frame for everyone. The per-buffer metadata (generation,
frame id, timestamps) is mapped read-only in clients.

``valid`` says whether the buffer still holds this frame (its generation is
unchanged). ``with client.recv() as frame:`` holds the client's read lease on
the frame for the block, so the server does not reuse the buffer meanwhile.
"""

import numpy as np

from msgq.errors import InvalidArgumentError


def buffer_arrays(view, geometry):
    """(flat, shaped): the uint8 array over a whole buffer and its format-shaped view
    (see ``VisionBuf.array``), both keeping ``view`` (and so the mapping) alive.
    Owners build these once per buffer and hand them to every VisionBuf of it."""
    flat = np.frombuffer(view, dtype=np.uint8)
    g = geometry
    fmt, h, w, s = g["format"], g["height"], g["width"], g["stride"]

    def plane(shape, strides, dtype=np.uint8):
        return np.ndarray(shape, dtype=dtype, buffer=flat, offset=0, strides=strides)

    if fmt in ("nv12", "i420", "custom"):
        if g["uv_offset"] == s * h and s * (h * 3 // 2) <= g["size"]:
            return flat, plane((h * 3 // 2, s), (s, 1))
        return flat, flat
    if fmt in ("rgb8", "bgr8"):
        return flat, plane((h, w, 3), (s, 3, 1))
    if fmt == "gray8":
        return flat, plane((h, w), (s, 1))
    return flat, plane((h, w), (s, 2), np.uint16)  # raw16


class VisionBuf:
    """One frame. ``arrays``: the owner's cached ``buffer_arrays(view, geometry)`` for
    this buffer; ``.data`` / ``.array`` return a fresh view of them each time, so
    callers may reshape or flag their arrays without touching anyone else's."""

    def __init__(self, view, geometry, idx, generation, frame_id=0, timestamp_sof=0, timestamp_eof=0,
                 owner=None, stream=None, arrays=None, timestamp_publish=0, timestamp_recv=0):
        self._view = view
        self._geometry = geometry
        self._arrays = arrays
        self.idx = idx
        self.generation = generation
        self.frame_id = frame_id
        self.timestamp_sof = timestamp_sof
        self.timestamp_eof = timestamp_eof
        # CLOCK_MONOTONIC ns when the server sent this frame and when this client got it
        # (0 for frames that were not received); receive - publish is the handoff latency.
        self.timestamp_publish = timestamp_publish
        self.timestamp_recv = timestamp_recv
        self._owner = owner      # the VisionIpcServer or VisionIpcClient this frame came from
        self.stream = stream

    # geometry
    width = property(lambda self: self._geometry["width"])
    height = property(lambda self: self._geometry["height"])
    stride = property(lambda self: self._geometry["stride"])
    uv_offset = property(lambda self: self._geometry["uv_offset"])
    format = property(lambda self: self._geometry["format"])
    len = property(lambda self: self._geometry["size"])

    def __len__(self):
        return self._geometry["size"]

    @property
    def valid(self) -> bool:
        """True while the buffer still holds this frame (checks its generation now)."""
        return self._owner is not None and self._owner._frame_valid(self)

    def _cached(self):
        if self._arrays is None:
            self._arrays = buffer_arrays(self._view, self._geometry)
        return self._arrays

    @property
    def data(self) -> np.ndarray:
        return self._cached()[0].view()

    def as_array(self) -> np.ndarray:
        return self.data

    def _plane(self, offset, shape, strides, dtype=np.uint8):
        return np.ndarray(shape, dtype=dtype, buffer=self._cached()[0], offset=offset, strides=strides)

    @property
    def array(self) -> np.ndarray:
        """NV12/I420: ``(height*3//2, stride)`` uint8; RGB/BGR: ``(h, w, 3)``; GRAY: ``(h, w)``;
        RAW16: ``(h, w)`` uint16. A custom layout whose chroma does not follow the luma
        directly is the flat buffer."""
        return self._cached()[1].view()

    def _yuv(self, what):
        if self.format not in ("nv12", "i420", "custom"):
            raise InvalidArgumentError(f"{self.format} frames have no {what} plane")

    @property
    def y(self) -> np.ndarray:
        self._yuv("Y")
        return self._plane(0, (self.height, self.width), (self.stride, 1))

    @property
    def uv(self) -> np.ndarray:
        """NV12 interleaved chroma, ``(height//2, width//2, 2)``."""
        self._yuv("UV")
        if self.format == "i420":
            raise InvalidArgumentError("i420 frames have separate .u and .v planes")
        return self._plane(self.uv_offset, (self.height // 2, self.width // 2, 2), (self.stride, 2, 1))

    def _i420(self, which):
        if self.format != "i420":
            raise InvalidArgumentError(f"only i420 frames have a separate {which} plane")
        cs, ch = self.stride // 2, self.height // 2
        offset = self.uv_offset + (cs * ch if which == "V" else 0)
        return self._plane(offset, (ch, self.width // 2), (cs, 1))

    u = property(lambda self: self._i420("U"))
    v = property(lambda self: self._i420("V"))

    def to_bgr(self) -> np.ndarray:
        """A new (h, w, 3) BGR image, converted by OpenCV (``pip install visionipc[cv]``)."""
        try:
            import cv2
        except ImportError as e:  # optional dependency
            raise ImportError("VisionBuf.to_bgr() needs OpenCV: pip install 'visionipc[cv]'") from e
        fmt, w = self.format, self.width
        if fmt in ("nv12", "custom"):
            packed = np.vstack([self.y, self.uv.reshape(self.height // 2, w)])
            return cv2.cvtColor(packed, cv2.COLOR_YUV2BGR_NV12)
        if fmt == "i420":
            packed = np.concatenate([self.y.ravel(), self.u.ravel(), self.v.ravel()]).reshape(self.height * 3 // 2, w)
            return cv2.cvtColor(packed, cv2.COLOR_YUV2BGR_I420)
        if fmt == "rgb8":
            return cv2.cvtColor(self.array, cv2.COLOR_RGB2BGR)
        if fmt == "bgr8":
            return self.array.copy()
        if fmt == "gray8":
            return cv2.cvtColor(self.array, cv2.COLOR_GRAY2BGR)
        gray = (self.array >> 8).astype(np.uint8)  # raw16: the high byte, as a preview
        return cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)

    # read lease for a block
    def __enter__(self):
        if self._owner is not None:
            self._owner._hold(self)
        return self

    def __exit__(self, *exc):
        if self._owner is not None:
            self._owner._release(self)
        return False

    def __repr__(self):
        return (f"<VisionBuf {self.format} {self.width}x{self.height} stride={self.stride} idx={self.idx} "
                f"frame_id={self.frame_id}>")
