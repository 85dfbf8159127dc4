"""Writes one stream of a recording as numbered segments: a video file plus its
Parquet frame index per segment, each written under a hidden ``.partial`` name
and renamed when complete (video first, then index), so a segment is complete
exactly when its index file exists.

Used by one thread (the stream's encoder thread in vipc-record).
"""

import os
from typing import Any, Optional, Tuple, Union

from visionipc.apps.record import codecs, index, layout, quality
from visionipc.apps.record.av_frames import Image
from visionipc.apps.record.codecs import AvStorage
from visionipc.apps.record.index import Columns, FrameMeta
from visionipc.apps.record.storage import Storage

NOMINAL_FPS = 30.0  # container frame rate when a segment holds a single frame
# A segment's container rate is nominal (whole frames per second, from its first two
# frames' timestamp_sof); the index holds the real times.


class StreamWriter:
    """``frame_metrics``: measure each frame as it is written (``quality.Meter``: the
    picture before the codec changes it) and keep the numbers in the index; None: for
    lossy storage only (vipc-record --frame-metrics lossy, the default)."""

    def __init__(
        self,
        cv2: Any,
        folder: str,
        stream: str,
        storage: Union[Storage, AvStorage],
        segment_seconds: float,
        frame_metrics: Optional[bool] = None,
    ) -> None:
        self.cv2, self.folder, self.stream, self.storage = cv2, folder, stream, storage
        if frame_metrics is None:
            frame_metrics = not storage.lossless
        # measured on the compact image (Storage.capture), whatever the storage makes of it
        kind = codecs.LAYOUT[storage.fmt][1]
        self._meter = quality.Meter(kind, storage.fmt, storage.height) if frame_metrics else None
        self._columns = index.INDEX_COLUMNS + (quality.COLUMNS if self._meter else ())
        self.measures = self._meter is not None
        self.segment_ns = int(segment_seconds * 1e9) if segment_seconds else 0
        self.video_dir = os.path.join(folder, layout.FRAMES, stream)
        self.index_dir = os.path.join(folder, layout.INDEX, stream)
        os.makedirs(self.video_dir, exist_ok=True)
        os.makedirs(self.index_dir, exist_ok=True)
        self.segments = 0  # complete segments
        self.frames = 0  # frames in complete segments
        self._video: Any = None  # the open segment writer (Storage.open_writer)
        # the segment's first frame, until the second one gives the frame rate
        self._held: Optional[Tuple[Image, FrameMeta]] = None
        self._start_ns = 0  # receive time of the segment's first frame
        self._rows: Optional[Columns] = None

    def _relative(self) -> str:
        return layout.media_file(self.stream, self.segments, self.storage.ext)

    def add(self, image: Image, meta: FrameMeta) -> None:
        """``meta``: frame_id, timestamp_sof, timestamp_eof, publish_time, receive_time."""
        if self._rows is not None and self.segment_ns and meta["receive_time"] - self._start_ns >= self.segment_ns:
            self.close_segment()
        if self._rows is None:
            self._rows = {name: [] for name in self._columns}
            self._start_ns = meta["receive_time"]
            self._held = (image, meta)
            return
        if self._video is None:
            assert self._held is not None  # the segment's first frame
            first = self._held[1]
            interval = meta["timestamp_sof"] - first["timestamp_sof"]
            self._open(1e9 / interval if interval > 0 else NOMINAL_FPS)
        self._write(image, meta)

    def _open(self, fps: float) -> None:
        self._final = os.path.join(self.folder, self._relative())
        self._tmp = layout.partial_path(self._final)
        # whole frames per second: MPEG-4 refuses time bases with denominators over 65535
        self._video = self.storage.open_writer(self._tmp, float(min(max(round(fps), 1), 1000)))
        held, self._held = self._held, None
        assert held is not None  # a segment opens with its first frame held
        self._write(*held)

    def _write(self, image: Image, meta: FrameMeta) -> None:
        measured = self._meter(image) if self._meter is not None else ()  # before the encoder sees it
        if getattr(self._video, "wants_meta", False):  # an MCAP segment logs each frame with its times
            self._video.write(image, meta)
        else:
            self._video.write(image)
        rows = self._rows  # a row only for a written frame: every column one value longer
        assert rows is not None  # the segment is open
        for key, value in zip(quality.COLUMNS, measured):
            rows[key].append(value)
        for key in ("frame_id", "timestamp_sof", "timestamp_eof", "publish_time", "receive_time"):
            rows[key].append(meta[key])  # type: ignore[literal-required]
        rows["position"].append(len(rows["stream"]))
        rows["stream"].append(self.stream)
        rows["width"].append(self.storage.width)
        rows["height"].append(self.storage.height)
        rows["format"].append(self.storage.fmt)
        rows["segment"].append(self.segments)
        rows["segment_file"].append(self._relative())

    def close_segment(self) -> None:
        if self._rows is None:
            return
        if self._video is None:
            self._open(NOMINAL_FPS)
        self._video.release()
        self._video = None
        if not os.path.exists(self._tmp):
            raise RuntimeError(f"the encoder did not write {self._tmp} ({self.storage.codec}); see its messages above")
        os.replace(self._tmp, self._final)
        schema = index.quality_schema() if self._meter else index.index_schema()
        index.write_table(self._rows, schema, os.path.join(self.folder, layout.index_file(self.stream, self.segments)))
        self.frames += len(self._rows["stream"])
        self.segments += 1
        self._rows = None
