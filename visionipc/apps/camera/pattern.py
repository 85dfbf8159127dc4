"""The synthetic test pattern: scrolling colour bars over a gradient, the frame id
and capture time burned in as text, and a machine-readable stamp of the frame id.

The stamp is a row of ``STAMP_CELLS`` square cells at the top-left corner,
each black (0) or white (1): the 32-bit frame id, most significant bit first,
then an 8-bit check (the sum of the id's four bytes, xor 0xA5). Cells are at
least 2 pixels wide and even-sized, so NV12/I420 chroma subsampling and mild
lossy compression leave them readable; ``read_stamp`` returns the frame id or
None when no valid stamp is there.
"""

import time
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union, cast

import numpy as np
import numpy.typing as npt

from visionipc.formats import format_info
from visionipc.pixels import compact_dtype, full_scale, to_8bit

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf

STAMP_BITS = 32
STAMP_CELLS = STAMP_BITS + 8
MIN_WIDTH, MIN_HEIGHT = 2 * STAMP_CELLS, 24
SCROLL_PX = 4  # per frame; even, so chroma planes scroll by whole samples
_BARS_BGR = [
    (255, 255, 255),
    (0, 255, 255),
    (255, 255, 0),
    (0, 255, 0),
    (255, 0, 255),
    (0, 0, 255),
    (255, 0, 0),
    (0, 0, 0),
]


def cell_size(width: int) -> int:
    return int(min(16, max(2, (width // STAMP_CELLS) & ~1)))


def _check(frame_id: int) -> int:
    return (sum((frame_id >> s) & 0xFF for s in (0, 8, 16, 24)) & 0xFF) ^ 0xA5


def stamp_bits(frame_id: int) -> np.ndarray:
    value = ((frame_id & 0xFFFFFFFF) << 8) | _check(frame_id & 0xFFFFFFFF)
    return np.array([(value >> (STAMP_CELLS - 1 - i)) & 1 for i in range(STAMP_CELLS)], np.uint8)


def luma(image: np.ndarray, fmt: str) -> np.ndarray:
    """An 8-bit brightness view or image of a frame's top rows, enough to read the stamp."""
    info = format_info(fmt)
    if info.channels > 1 and not info.yuv420:
        return image.max(axis=2)  # bgr8 / rgb8: white cells are white in every channel
    return to_8bit(image, info)


def read_stamp(
    frame: Union["VisionBuf", npt.NDArray[Any]], fmt: Optional[str] = None, width: Optional[int] = None
) -> Optional[int]:
    """The frame id stamped into a frame, or None. ``frame`` is a VisionBuf or an
    image (a compact or BGR image: pass ``fmt``, e.g. ``"bgr8"`` for BGR)."""
    image: npt.NDArray[Any]
    if fmt is None:  # a VisionBuf
        buf = cast("VisionBuf", frame)
        fmt, width = buf.format, buf.width
        image = buf.y if format_info(fmt).yuv420 else buf.array
    else:
        image = cast("npt.NDArray[Any]", frame)
        width = width or image.shape[1]
    c = cell_size(width)
    if image.shape[0] < c or image.shape[1] < c * STAMP_CELLS:
        return None
    centres = luma(image[:c, : c * STAMP_CELLS], fmt)[c // 2, c // 2 :: c][:STAMP_CELLS]
    bits = (centres >= 128).astype(np.int64)
    value = int((bits << np.arange(STAMP_CELLS - 1, -1, -1)).sum())
    frame_id, check = value >> 8, value & 0xFF
    return frame_id if check == _check(frame_id) else None


class Pattern:
    """Renders frame ``n`` of the pattern straight into a pool buffer of one format.

    The background (bars over a vertical gradient, a dark header band for the
    stamp and the text) is computed once at twice the width in the target
    format's own planes; each frame copies a scrolled window of it into the
    buffer, then draws the text and the stamp into the luma (or gray/colour)
    plane. No per-frame colour conversion.
    """

    def __init__(self, cv2: Any, fmt: str, width: int, height: int) -> None:
        if width < MIN_WIDTH or height < MIN_HEIGHT:
            raise ValueError(
                f"the synthetic pattern needs at least {MIN_WIDTH}x{MIN_HEIGHT} pixels, got {width}x{height}"
            )
        self.cv2, self.fmt, self.width, self.height = cv2, fmt, width, height
        self.info = format_info(fmt)
        self.level = 255 * full_scale(self.info)  # white
        self.cell = cell_size(width)
        self.text_top = self.cell + 2
        self.font_scale, self.text_h = self._fit_text()
        self.band = min(height, self.text_top + self.text_h + 6) & ~1
        self._bg = self._background()

    def _fit_text(self):
        cv2 = self.cv2
        sample = "#00000000 00:00:00.000"
        (tw, th), base = cv2.getTextSize(sample, cv2.FONT_HERSHEY_SIMPLEX, 1.0, 1)
        scale = max(0.25, min(2.0, (self.width - 8) / tw, (self.height / 4) / (th + base)))
        return scale, int((th + base) * scale) + 1

    def _background(self):
        cv2, w, h = self.cv2, self.width, self.height
        ww = 2 * w
        bar = np.zeros((1, ww, 3), np.uint8)
        edges = np.linspace(0, w, len(_BARS_BGR) + 1).astype(int)
        for i, colour in enumerate(_BARS_BGR):
            bar[0, edges[i] : edges[i + 1]] = colour
            bar[0, w + edges[i] : w + edges[i + 1]] = colour
        fade = np.linspace(1.0, 0.25, h, dtype=np.float32)[:, None, None]
        bgr = (bar.astype(np.float32) * fade).astype(np.uint8)
        bgr[: self.band] = 16  # the header band: stamp and text on dark grey, neutral chroma
        code = getattr(cv2, f"COLOR_{self.info.cv_from_bgr}") if self.info.cv_from_bgr else None
        if self.info.yuv420:
            yuv = cv2.cvtColor(bgr, code)  # I420 planes
            cw, ch = w, h // 2  # chroma planes of the double-width image are (h/2, w)
            flat = yuv.reshape(-1)
            u = flat[ww * h : ww * h + cw * ch].reshape(ch, cw)
            v = flat[ww * h + cw * ch :].reshape(ch, cw)
            return yuv[:h], u, v
        if code is None:
            return (bgr,)
        image = cv2.cvtColor(bgr, code)
        return (image.astype(compact_dtype(self.fmt)) * full_scale(self.info),)

    def render(self, buf: "VisionBuf", frame_id: int, wall_time: Optional[float] = None) -> None:
        w = self.width
        off = (frame_id * SCROLL_PX) % w
        white: Union[int, Tuple[int, int, int]]
        if self.info.yuv420:
            y, u, v = self._bg
            np.copyto(buf.y, y[:, off : off + w])
            c0, cw = off // 2, w // 2
            if self.info.planes == 2:
                uv = buf.uv
                np.copyto(uv[..., 0], u[:, c0 : c0 + cw])
                np.copyto(uv[..., 1], v[:, c0 : c0 + cw])
            else:
                np.copyto(buf.u, u[:, c0 : c0 + cw])
                np.copyto(buf.v, v[:, c0 : c0 + cw])
            plane, white = buf.y, 255
        else:
            np.copyto(buf.array, self._bg[0][:, off : off + w])
            plane = buf.array
            white = (self.level,) * 3 if plane.ndim == 3 else self.level
        self._overlay(plane, frame_id, time.time() if wall_time is None else wall_time, white)

    def _overlay(self, plane, frame_id, wall_time, white) -> None:
        cv2, c = self.cv2, self.cell
        text = (
            f"#{frame_id:08d} {time.strftime('%H:%M:%S', time.localtime(wall_time))}.{int(wall_time * 1000) % 1000:03d}"
        )
        target = plane
        if self.info.sample_bytes > 1:  # OpenCV draws text on 8-bit images only: draw the band in 8 bits
            target, white = np.full((self.band, self.width), 16, np.uint8), 255
        out = cv2.putText(
            target,
            text,
            (4, self.text_top + self.text_h - 2),
            cv2.FONT_HERSHEY_SIMPLEX,
            self.font_scale,
            white,
            1,
            cv2.LINE_AA,
        )
        if out is not target or target is not plane:  # drawn on a copy or on the 8-bit band: bring it in
            np.multiply(out, full_scale(self.info), out=plane[: out.shape[0]], dtype=plane.dtype)
        bits = stamp_bits(frame_id)
        cells = plane[:c, : c * STAMP_CELLS]
        level = self.level
        pixels = np.repeat(bits.astype(np.uint32) * level, c).astype(plane.dtype)
        if cells.ndim == 3:
            cells[:] = pixels[None, :, None]
        else:
            cells[:] = pixels[None, :]
