"""Per-frame picture metrics: one definition wherever a frame is measured.

vipc-record measures the frames of lossy streams as captured, before the codec changes
them, and stores the numbers in the frame index (``COLUMNS``; docs/recording-format.md);
the pipeline (vipc-analyze's metrics job) uses those and measures decoded frames where a
recording has none, with the same code (docs/pipeline.md, "One meaning per metric").

Luma is full-range BT.601 Y' in 0..255, the brightness of the picture as displayed:

| stored as | luma |
|---|---|
| YUV planes (nv12, i420; video range, Y 16..235) | (clip(Y, 16, 235) - 16) * 255/219 |
| BGR / RGB | 0.299 R + 0.587 G + 0.114 B |
| gray8 | as is (full range) |
| raw16 | value / 257 |

brightness is the mean luma, contrast its standard deviation, sharpness the variance of its
Laplacian (3x3 aperture [0 1 0; 1 -4 1; 0 1 0], borders reflected), motion the mean
absolute difference to the previous frame's luma (NaN without one).

8-bit planes are measured as they are, with the scale and offset applied to the results
(exact: the Laplacian of a constant is 0 and the clip is done in 8 bits): about 3x cheaper
than a float copy, which is what makes measuring every frame in the recorder affordable.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import numpy as np

from visionipc import pixels
from visionipc.formats import format_info

COLUMNS = ("brightness", "contrast", "sharpness", "motion")
VIDEO_RANGE = 255.0 / 219.0  # video-range Y (16..235) -> full range (0..255)


class Luma(NamedTuple):
    """A frame's luma as ``(plane - offset) * scale``; ``plane`` is uint8 or float32."""

    plane: np.ndarray
    scale: float = 1.0
    offset: float = 0.0

    def values(self) -> np.ndarray:
        """The luma itself, (h, w) float32 in 0..255."""
        if self.plane.dtype == np.float32 and self.scale == 1.0 and self.offset == 0.0:
            return self.plane
        return (self.plane.astype(np.float32) - np.float32(self.offset)) * np.float32(self.scale)


def luma_of(image: np.ndarray, kind: str, fmt: str, height: int) -> Luma:
    """The luma of a compact or stored image (``kind``: storage.py's ``planes``, ``gray``,
    ``gray16``, ``color`` in the format's channel order, ``bgr``)."""
    import cv2

    if kind == pixels.PLANES:
        return Luma(np.clip(image[:height], 16, 235), VIDEO_RANGE, 16.0)
    if kind == pixels.GRAY:  # a copy: the caller may reuse its image, and this one is kept as the previous
        return Luma(image.copy() if image.dtype == np.uint8 else image.astype(np.float32))
    if kind == pixels.GRAY16:
        return Luma(image.astype(np.float32) / np.float32(257.0))
    rgb = kind == pixels.COLOR and format_info(fmt).cv_to_bgr  # a colour image not in BGR order: RGB
    code = cv2.COLOR_RGB2GRAY if rgb else cv2.COLOR_BGR2GRAY
    return Luma(cv2.cvtColor(image.astype(np.float32), code))


def measure(luma: Luma, previous: Luma | None = None) -> Tuple[float, float, float, float]:
    """``(brightness, contrast, sharpness, motion)`` of one frame's luma; motion is NaN
    without a previous frame (or when the previous one has another size)."""
    import cv2

    plane, scale, offset = luma
    if plane.dtype not in (np.uint8, np.float32):
        plane = plane.astype(np.float32)
    n = plane.size
    mean, std = cv2.meanStdDev(plane)
    # the variance of the Laplacian from its sum and sum of squares: one pass each, 4x
    # cheaper than meanStdDev on the 16-bit/float image (exact integers for 8-bit planes)
    lap = cv2.Laplacian(plane, cv2.CV_16S if plane.dtype == np.uint8 else cv2.CV_32F)
    lap_mean = cv2.sumElems(lap)[0] / n
    sharpness = max(cv2.norm(lap, cv2.NORM_L2SQR) / n - lap_mean * lap_mean, 0.0) * scale * scale
    motion = math.nan
    if previous is not None and previous.plane.shape == luma.plane.shape:
        if previous.plane.dtype == plane.dtype and (previous.scale, previous.offset) == (scale, offset):
            motion = cv2.norm(plane, previous.plane, cv2.NORM_L1) / n * scale
        else:
            motion = cv2.norm(luma.values(), previous.values(), cv2.NORM_L1) / n
    return (float(mean[0, 0]) - offset) * scale, float(std[0, 0]) * scale, float(sharpness), float(motion)


class Meter:
    """Measures one stream's frames in order (motion against the frame before)."""

    def __init__(self, kind: str, fmt: str, height: int) -> None:
        self.kind, self.fmt, self.height = kind, fmt, height
        self.previous: Optional[Luma] = None

    def __call__(self, image: np.ndarray) -> Tuple[float, float, float, float]:
        luma = luma_of(image, self.kind, self.fmt, self.height)
        result = measure(luma, self.previous)
        self.previous = luma
        return result
