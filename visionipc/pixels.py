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
from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np

from msgq.errors import InvalidArgumentError
from visionipc.formats import format_info
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


def _chroma_planes(fmt: str, compact: np.ndarray, width: int, height: int) -> Tuple[np.ndarray, np.ndarray]:
    """I420 compact image -> (U, V) planes ``(h/2, w/2)`` as views."""
    cw, ch = width // 2, height // 2
    flat = compact.reshape(-1)
    u = flat[width * height : width * height + cw * ch].reshape(ch, cw)
    v = flat[width * height + cw * ch : width * height + 2 * cw * ch].reshape(ch, cw)
    return u, v


def unpack(compact: np.ndarray, buf: "VisionBuf") -> None:
    """Write a compact image (see module doc) into ``buf`` exactly."""
    fmt, w, h = buf.format, buf.width, buf.height
    if compact.shape != compact_shape(fmt, w, h):
        raise InvalidArgumentError(f"image of shape {compact.shape} does not fit a {w}x{h} {fmt} frame")
    if fmt == "nv12":
        np.copyto(buf.array[:, :w], compact)
    elif fmt == "i420":
        np.copyto(buf.y, compact[:h])
        u, v = _chroma_planes(fmt, compact, w, h)
        np.copyto(buf.u, u)
        np.copyto(buf.v, v)
    else:
        np.copyto(buf.array, compact.view(buf.array.dtype))


def pack(buf: "VisionBuf", out: Optional[np.ndarray] = None) -> np.ndarray:
    """Copy ``buf``'s pixels into a compact image (``out``, C-contiguous, or a new one)."""
    fmt, w, h = buf.format, buf.width, buf.height
    if out is None:
        out = np.empty(compact_shape(fmt, w, h), compact_dtype(fmt))
    if fmt == "nv12":
        np.copyto(out, buf.array[:, :w])
    elif fmt == "i420":
        np.copyto(out[:h], buf.y)
        u, v = _chroma_planes(fmt, out, w, h)
        np.copyto(u, buf.u)
        np.copyto(v, buf.v)
    else:
        np.copyto(out, buf.array)
    return out


class BgrWriter:
    """Converts BGR images of one stream's size into its buffers; keeps the one
    scratch image the YUV conversions need, so no per-frame allocation."""

    def __init__(self, fmt: str, width: int, height: int) -> None:
        self.cv2 = _cv2()
        self.fmt, self.width, self.height = fmt, width, height
        self._yuv = np.empty((height * 3 // 2, width), np.uint8) if fmt in ("nv12", "i420") else None
        self._gray = np.empty((height, width), np.uint8) if fmt == "raw16" else None

    def write(self, bgr: np.ndarray, buf: "VisionBuf") -> None:
        cv2, fmt = self.cv2, self.fmt
        if fmt == "bgr8":
            np.copyto(buf.array, bgr)
        elif fmt == "rgb8":
            _into(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB, dst=buf.array), buf.array)
        elif fmt == "gray8":
            _into(cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY, dst=buf.array), buf.array)
        elif fmt == "raw16":
            gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY, dst=self._gray)
            np.multiply(gray, 257, out=buf.array, dtype=np.uint16)  # 0..255 -> 0..65535
        else:
            yuv = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420, dst=self._yuv)
            self._yuv = yuv
            self.write_i420(yuv, buf)

    def write_i420(self, yuv: np.ndarray, buf: "VisionBuf") -> None:
        """An I420 compact image into an NV12 or I420 buffer (interleaving U and V for NV12)."""
        w, h = self.width, self.height
        if buf.format == "i420":
            unpack(yuv, buf)
            return
        np.copyto(buf.y, yuv[:h])
        u, v = _chroma_planes("i420", yuv, w, h)
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
