"""Pixels between OpenCV images and VisionIPC pool buffers (needs OpenCV).

Two shapes of a frame are used outside the pool:

- a BGR image ``(h, w, 3)``: what cameras and video files deliver and lossy
  recordings store; ``write_bgr`` converts one into a buffer of any format.
- the *compact image*: the frame's bytes without row padding, in the format's
  own layout (``compact_shape``): NV12/I420 their ``(h*3//2, w)`` plane image
  (OpenCV's layout: Y rows, then UV rows, or U then V), GRAY8 ``(h, w)``,
  RGB8/BGR8 ``(h, w, 3)``, RAW16 ``(h, w)`` uint16. ``pack`` and ``unpack``
  move it exactly (lossless recording and replay).

Buffers are written in place (``dst=`` / ``out=``); when OpenCV cannot write
into a strided view directly it returns a new array, which is then copied in.
"""

import types
from typing import TYPE_CHECKING, Optional

import numpy as np

from msgq.errors import InvalidArgumentError
from visionipc.formats import PixelFormat, format_info
from visionipc.optional import need

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf


def _cv2() -> types.ModuleType:
    return need("cv2", "cv")


def compact_shape(fmt: str, width: int, height: int) -> tuple:
    info = format_info(fmt)
    if info.yuv420:
        return (height * 3 // 2, width)
    if info.channels > 1:
        return (height, width, info.channels)
    return (height, width)


def compact_dtype(fmt: str) -> np.dtype:
    return np.dtype(f"u{format_info(fmt).sample_bytes}")


def _into(result: np.ndarray, dst: np.ndarray) -> None:
    if result is not dst:  # OpenCV allocated instead of writing in place
        np.copyto(dst, result)


def _compact_planes(planes: int, compact: np.ndarray, width: int, height: int) -> list:
    """Views of a YUV compact image's ``planes`` (2 or 3), shaped as a buffer's (``_buffer_planes``)."""
    if planes == 2:  # Y rows, then interleaved UV rows
        return [compact[:height], compact[height:].reshape(height // 2, width // 2, 2)]
    cw, ch = width // 2, height // 2  # Y, then U, then V
    flat = compact.reshape(-1)
    u = flat[width * height : width * height + cw * ch].reshape(ch, cw)
    v = flat[width * height + cw * ch : width * height + 2 * cw * ch].reshape(ch, cw)
    return [compact[:height], u, v]


def _buffer_planes(planes: int, buf: "VisionBuf") -> list:
    return [buf.y, buf.uv] if planes == 2 else [buf.y, buf.u, buf.v]


def unpack(compact: np.ndarray, buf: "VisionBuf") -> None:
    """Write a compact image (see module doc) into ``buf`` exactly."""
    fmt, w, h = buf.format, buf.width, buf.height
    if compact.shape != compact_shape(fmt, w, h):
        raise InvalidArgumentError(f"image of shape {compact.shape} does not fit a {w}x{h} {fmt} frame")
    info = format_info(fmt)
    if not info.yuv420:
        np.copyto(buf.array, compact.view(buf.array.dtype))
        return
    for dst, src in zip(_buffer_planes(info.planes, buf), _compact_planes(info.planes, compact, w, h)):
        np.copyto(dst, src)


def pack(buf: "VisionBuf", out: Optional[np.ndarray] = None) -> np.ndarray:
    """Copy ``buf``'s pixels into a compact image (``out``, C-contiguous, or a new one)."""
    fmt, w, h = buf.format, buf.width, buf.height
    if out is None:
        out = np.empty(compact_shape(fmt, w, h), compact_dtype(fmt))
    info = format_info(fmt)
    if not info.yuv420:
        np.copyto(out, buf.array)
        return out
    for dst, src in zip(_compact_planes(info.planes, out, w, h), _buffer_planes(info.planes, buf)):
        np.copyto(dst, src)
    return out


# What an image holds (a recording's ``stored_as``): a compact image's kind (``image_kind``),
# or BGR, the BGR image (``to_bgr``; what OpenCV's lossy recordings decode to).
PLANES, COLOR, GRAY, GRAY16, BGR = "planes", "color", "gray", "gray16", "bgr"


def image_kind(fmt: str) -> str:
    """What a compact image of ``fmt`` holds: ``PLANES`` (YUV 4:2:0), ``COLOR`` (several
    channels), ``GRAY`` (8-bit samples) or ``GRAY16``."""
    info = format_info(fmt)
    if info.yuv420:
        return PLANES
    if info.channels > 1:
        return COLOR
    return {1: GRAY, 2: GRAY16}[info.sample_bytes]


def to_8bit(image: np.ndarray, info: PixelFormat) -> np.ndarray:
    """Deeper samples as 8-bit ones: their high byte (a preview)."""
    return (image >> (8 * info.sample_bytes - 8)).astype(np.uint8) if info.sample_bytes > 1 else image


def full_scale(info: PixelFormat) -> int:
    """What 8-bit 0..255 is multiplied by to span the format's samples (257 for 16 bits)."""
    return ((1 << 8 * info.sample_bytes) - 1) // 255


def to_bgr(compact: np.ndarray, fmt: str) -> np.ndarray:
    """A BGR picture ``(h, w, 3)`` of a compact image of ``fmt`` (the image itself when it is one)."""
    info = format_info(fmt)
    if not info.cv_to_bgr:
        return compact
    cv2 = _cv2()
    return cv2.cvtColor(to_8bit(compact, info), getattr(cv2, f"COLOR_{info.cv_to_bgr}"))


class BgrWriter:
    """Converts BGR images of one stream's size into its buffers; keeps the one
    scratch image the conversions need, so no per-frame allocation."""

    def __init__(self, fmt: str, width: int, height: int) -> None:
        self.cv2 = _cv2()
        self.fmt, self.width, self.height = fmt, width, height
        self.info = info = format_info(fmt)
        self._code = getattr(self.cv2, f"COLOR_{info.cv_from_bgr}") if info.cv_from_bgr else None
        self._yuv = np.empty((height * 3 // 2, width), np.uint8) if info.yuv420 else None  # I420 planes
        self._gray = np.empty((height, width), np.uint8) if info.sample_bytes > 1 else None  # 8-bit first

    def write(self, bgr: np.ndarray, buf: "VisionBuf") -> None:
        cv2, info = self.cv2, self.info
        if info.yuv420:
            yuv = cv2.cvtColor(bgr, self._code, dst=self._yuv)
            self._yuv = yuv
            self.write_i420(yuv, buf)
        elif info.sample_bytes > 1:
            gray = cv2.cvtColor(bgr, self._code, dst=self._gray)
            np.multiply(gray, full_scale(info), out=buf.array, dtype=buf.array.dtype)  # 0..255 -> 0..65535
        elif self._code is None:
            np.copyto(buf.array, bgr)
        else:
            _into(cv2.cvtColor(bgr, self._code, dst=buf.array), buf.array)

    def write_i420(self, yuv: np.ndarray, buf: "VisionBuf") -> None:
        """An I420 compact image into a YUV buffer (interleaving U and V where it has 2 planes)."""
        w, h = self.width, self.height
        y, u, v = _compact_planes(3, yuv, w, h)  # OpenCV's BGR2YUV_I420
        np.copyto(buf.y, y)
        if self.info.planes == 3:
            np.copyto(buf.u, u)
            np.copyto(buf.v, v)
            return
        uv = buf.uv
        np.copyto(uv[..., 0], u)
        np.copyto(uv[..., 1], v)


def resize_into(
    cv2: types.ModuleType, image: np.ndarray, width: int, height: int, scratch: Optional[np.ndarray]
) -> np.ndarray:
    """``image`` at ``width`` x ``height`` (itself when it already is), reusing ``scratch``."""
    if image.shape[1] == width and image.shape[0] == height:
        return image
    return cv2.resize(image, (width, height), dst=scratch, interpolation=cv2.INTER_AREA)
