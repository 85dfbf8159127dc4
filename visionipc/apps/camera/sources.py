"""Frame sources of the camera daemon. Each fills a pool buffer in place and
returns the frame's ``(timestamp_sof, timestamp_eof)`` (CLOCK_MONOTONIC ns),
or None when it has no more frames.

``paced`` sources are driven by the daemon's clock (synthetic, video files);
a device paces itself (``read`` blocks until the camera delivers a frame).
"""

import glob
import os
import time
from typing import Any, Optional, Protocol, Tuple

import numpy as np
import numpy.typing as npt

from visionipc.apps._cli import UsageError, need
from visionipc.apps.camera.pattern import Pattern
from visionipc.frame import VisionBuf
from visionipc.pixels import BgrWriter, resize_into

Stamps = Tuple[int, int]  # (timestamp_sof, timestamp_eof), CLOCK_MONOTONIC ns


class FrameSource(Protocol):
    """What the daemon's stream runner uses of a source."""

    paced: bool
    description: str

    def fill(self, buf: VisionBuf, frame_id: int, deadline_ns: int) -> Optional[Stamps]: ...

    def close(self) -> None: ...


class SyntheticSource:
    paced = True

    def __init__(self, fmt: str, width: int, height: int) -> None:
        try:
            self.pattern = Pattern(need("cv2", "cv"), fmt, width, height)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.description = "synthetic test pattern"

    def fill(self, buf: VisionBuf, frame_id: int, deadline_ns: int) -> Optional[Stamps]:
        self.pattern.render(buf, frame_id)
        return deadline_ns, time.monotonic_ns()

    def close(self) -> None:
        pass


class _CaptureSource:
    """Frames from an OpenCV VideoCapture (file or device), resized to the stream's
    size and converted into its format."""

    def __init__(self, cap: Any, fmt: str, width: int, height: int) -> None:
        self.cv2 = need("cv2", "cv")
        self.cap = cap
        self.width, self.height = width, height
        self.writer = BgrWriter(fmt, width, height)
        self._frame: Optional[npt.NDArray[np.uint8]] = None  # the decoder's output, reused
        self._resized = np.empty((height, width, 3), np.uint8)

    def _grab(self) -> Optional[npt.NDArray[np.uint8]]:
        ok, frame = self.cap.read(self._frame)
        if not ok:
            return None
        self._frame = frame
        return frame

    def fill(self, buf: VisionBuf, frame_id: int, deadline_ns: int) -> Optional[Stamps]:
        sof = time.monotonic_ns()
        frame = self._grab()
        if frame is None:
            return None
        if frame.ndim == 2:  # some devices deliver gray
            frame = self.cv2.cvtColor(frame, self.cv2.COLOR_GRAY2BGR)
        self.writer.write(resize_into(self.cv2, frame, self.width, self.height, self._resized), buf)
        return sof, time.monotonic_ns()

    def close(self) -> None:
        self.cap.release()


class VideoFileSource(_CaptureSource):
    paced = True

    def __init__(self, path: str, fmt: str, width: int, height: int, loop: bool = False) -> None:
        cv2 = need("cv2", "cv")
        cap = cv2.VideoCapture(path)
        if not cap.isOpened():
            raise UsageError(f"cannot open video file {path!r} (OpenCV could not decode it)")
        super().__init__(cap, fmt, width, height)
        self.path, self.loop = path, loop
        self.file_fps = cap.get(cv2.CAP_PROP_FPS) or 0.0
        self.description = f"video file {path}" + (" (looped)" if loop else "")

    def _grab(self) -> Optional[npt.NDArray[np.uint8]]:
        frame = super()._grab()
        if frame is None and self.loop:
            self.cap.set(self.cv2.CAP_PROP_POS_FRAMES, 0)
            frame = super()._grab()
        return frame


class DeviceSource(_CaptureSource):
    paced = False

    def __init__(self, device: str, fmt: str, width: int, height: int, fps: float) -> None:
        cv2 = need("cv2", "cv")
        if not os.path.exists(device):
            found = sorted(glob.glob("/dev/video*"))
            raise UsageError(f"no camera device {device} (found: {', '.join(found) or 'no /dev/video* devices'})")
        cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
        if not cap.isOpened():
            raise UsageError(f"cannot open camera device {device} (busy, no permission, or not a capture device)")
        cap.set(cv2.CAP_PROP_FRAME_WIDTH, width)
        cap.set(cv2.CAP_PROP_FRAME_HEIGHT, height)
        cap.set(cv2.CAP_PROP_FPS, fps)
        super().__init__(cap, fmt, width, height)
        self.description = f"camera {device}"


def open_source(spec: str, fmt: str, width: int, height: int, fps: float, loop: bool = False) -> FrameSource:
    """``synthetic``, ``/dev/videoN`` (or just ``N``), or a path to a video file."""
    if spec == "synthetic":
        return SyntheticSource(fmt, width, height)
    if spec.isdigit():
        spec = f"/dev/video{spec}"
    if spec.startswith("/dev/"):
        return DeviceSource(spec, fmt, width, height, fps)
    if not os.path.isfile(spec):
        raise UsageError(f"source {spec!r} is not 'synthetic', a /dev/videoN camera, or an existing video file")
    return VideoFileSource(spec, fmt, width, height, loop)
