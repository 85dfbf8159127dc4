"""How a stream's frames are stored in video segments in the OpenCV format, both ways: the
format_version 1 codecs (still read, and written by --codec mp4v; the PyAV codecs are in
codecs.py).

| format | lossless (FFV1 in .mkv) | lossy (mp4v in .mp4) |
|---|---|---|
| nv12, i420 | ``planes``: the compact ``(h*3/2, w)`` plane image as 8-bit gray | ``bgr``: decoded to BGR |
| gray8 | ``gray``: 8-bit gray | ``gray`` (lossy) |
| rgb8, bgr8 | ``color``: 3 channels in the format's own order | ``bgr`` |
| raw16 | ``gray16``: 16-bit gray (always lossless) | ``gray16`` (FFV1) |

The kind is what decoding gives. The lossy segments are coded as video-range BT.601 YUV
4:2:0 made from the compact image without a BGR detour (``codecs.Mp4vEncoder``) and decoded
by PyAV to those planes (``codecs.CodedPlanes``: the pipeline's metrics read their Y), which
reader.py converts to BGR with OpenCV. FFV1 segments are read by OpenCV.

``capture`` copies a received frame out of the pool into its compact image (the one copy
the recorder makes: the pool buffer is recycled after); ``restore`` writes a decoded image
back into a pool buffer (exactly, for lossless kinds).
"""

import argparse
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import numpy as np
import numpy.typing as npt

from visionipc import pixels
from visionipc.apps.record import codecs
from visionipc.apps.record.layout import MATROSKA, MCAP, MP4
from visionipc.formats import format_info

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf

LOSSLESS = ("FFV1", MATROSKA)
LOSSY = (codecs.LEGACY, MP4)


def quiet_opencv(cv2: Any) -> None:
    """OpenCV's FFmpeg and OpenCV itself print what they make of a broken video on stderr
    (raw lines, naming /proc/self/fd/N): the reader's own error is the one line. OpenCV
    reads its FFmpeg's level once, when it first starts FFmpeg (its first writer or
    reader), so this runs before either: whenever a Storage is made."""
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)


class Storage:
    """The OpenCV format (format_version 1, and --codec mp4v)."""

    uses_av = False

    def __init__(self, cv2: Any, fmt: str, width: int, height: int, lossless: bool) -> None:
        self.cv2, self.fmt, self.width, self.height = cv2, fmt, width, height
        quiet_opencv(cv2)
        info = format_info(fmt)
        self.lossless = lossless or info.sample_bytes > 1  # no lossy codec for deeper samples
        gray = info.channels == 1 and not info.yuv420
        self.kind = pixels.image_kind(fmt) if self.lossless or gray else pixels.BGR
        self.codec, self.ext = LOSSLESS if self.lossless else LOSSY
        shape = {pixels.BGR: (height, width, 3)}.get(self.kind, pixels.compact_shape(fmt, width, height))
        self.image_size = (shape[1], shape[0])  # the video's (width, height)
        self.is_color = len(shape) == 3
        self._bgr_writer: Optional[pixels.BgrWriter] = None

    def describe(self) -> Dict[str, Any]:
        return {"codec": self.codec, "lossless": self.lossless, "stored_as": self.kind}

    def open_writer(self, path: str, fps: float) -> Union[codecs.Mp4vEncoder, Any]:  # Any: a cv2.VideoWriter
        cv2 = self.cv2
        if not self.lossless:  # mp4v: PyAV, fed YUV (codecs.Mp4vEncoder)
            return codecs.Mp4vEncoder(path, self, fps)
        video = cv2.VideoWriter(
            path, cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*self.codec), fps, self.image_size, self.writer_params()
        )
        if not video.isOpened():
            raise RuntimeError(f"OpenCV cannot write {self.codec} video to {path}")
        return video

    def writer_params(self) -> List[int]:
        cv2 = self.cv2
        params = [cv2.VIDEOWRITER_PROP_IS_COLOR, int(self.is_color)]
        if self.kind == pixels.GRAY16:
            params += [cv2.VIDEOWRITER_PROP_DEPTH, cv2.CV_16U]
        return params

    def reader_params(self) -> List[int]:
        # 16-bit gray only survives decoding without the BGR conversion
        return [self.cv2.CAP_PROP_CONVERT_RGB, 0] if self.kind == pixels.GRAY16 else []

    def capture(self, frame: "VisionBuf") -> npt.NDArray[Any]:
        """A received VisionBuf -> a new image to encode: its compact image (the lossy
        writer codes it as YUV 4:2:0; ``kind`` is what decoding gives back)."""
        return pixels.pack(frame)

    def restore(self, image: np.ndarray, buf: "VisionBuf") -> None:
        """A decoded image -> ``buf`` (a pool buffer of this stream's format)."""
        if self.kind == pixels.BGR:
            if self._bgr_writer is None:
                self._bgr_writer = pixels.BgrWriter(self.fmt, self.width, self.height)
            self._bgr_writer.write(image, buf)
            return
        pixels.unpack(image, buf)

    @staticmethod
    def lossless_file(segment_file: str) -> bool:
        """Whether a segment file of this format is its lossless storage (by its extension)."""
        return segment_file.endswith("." + LOSSLESS[1])

    @classmethod
    def from_manifest(cls, cv2: Any, info: Dict[str, Any]) -> Union["Storage", codecs.AvStorage]:
        """The stream's storage; PyAV codecs (codecs.CODECS) give a codecs.AvStorage. Either
        must store the format as recording.json's ``stored_as`` says (where it says)."""
        storage: Union[Storage, codecs.AvStorage]
        if info.get("codec") in codecs.CODECS:
            storage = codecs.AvStorage.from_manifest(info)
        else:
            storage = cls(cv2, info["format"], info["width"], info["height"], info.get("lossless", False))
        if storage.kind != info.get("stored_as", storage.kind):
            raise ValueError(f"stored_as {info.get('stored_as')!r} does not match format {info['format']}")
        return storage


def storage_for(
    args: argparse.Namespace, cv2: Any, fmt: str, width: int, height: int
) -> Union[Storage, codecs.AvStorage]:
    """The storage of one stream as vipc-record's options ask (codecs.add_codec_args)."""
    codec = codecs.chosen_codec(args)
    if codec == codecs.LEGACY:
        return Storage(cv2, fmt, width, height, False)
    container = MCAP if args.format == MCAP else codecs.EXT
    return codecs.AvStorage(
        fmt, width, height, codec, args.crf, args.preset, args.gop, args.encoder_threads, None, container
    )
