"""Per-frame image metrics: brightness, contrast, sharpness (the variance of the
Laplacian) and motion (the mean absolute difference to the previous frame) of the
luma, defined once in ``visionipc.apps.record.quality``.

A segment whose index holds the metrics vipc-record measured as it captured (lossy
streams by default) is read from its index, with no decoding: the numbers are those of
the frames before the codec changed them. Other segments are decoded and measured
where they are decoded. ``segment_metrics`` does one segment; ``metrics_job`` all
segments in Spark executors (a run of segments per task) and ``metrics_pandas`` without
Spark, optionally on a process pool.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from visionipc.apps.pipeline.frames import (
    Segment,
    iter_segment,
    last_frame,
    map_segments,
    read_segment_index,
    segment_table,
    segments_df,
)
from visionipc.apps.record.quality import COLUMNS, Luma, luma_of, measure

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from visionipc.apps.pipeline.read import Recordings

METRIC_COLUMNS = [
    ("recording_id", "string"),
    ("recording_path", "string"),
    ("stream", "string"),
    ("segment", "int"),
    ("position", "int"),
    ("frame_id", "bigint"),
    ("timestamp_eof", "bigint"),
    ("brightness", "double"),
    ("contrast", "double"),
    ("sharpness", "double"),
    ("motion", "double"),
    ("black", "boolean"),
    ("frozen", "boolean"),
]
METRICS_SCHEMA = ", ".join(f"{n} {t}" for n, t in METRIC_COLUMNS)
BLACK_BRIGHTNESS = 16.0  # below this mean luma and...
BLACK_CONTRAST = 4.0  # ...this standard deviation a frame counts as black
FROZEN_MOTION = 0.5  # mean |difference| to the previous frame (0..255) at or below which it is frozen


def frame_metrics(gray: np.ndarray, previous: np.ndarray | None = None) -> tuple:
    """``(brightness, contrast, sharpness, motion)`` of one luma plane (``frames.luma``:
    full-range BT.601 Y', 0..255; an 8-bit gray frame is taken as that); motion is NaN
    without a previous frame (``quality.measure``)."""
    return measure(Luma(gray), Luma(previous) if previous is not None else None)


def segment_metrics(
    segment: Segment,
    *,
    black_brightness: float = BLACK_BRIGHTNESS,
    black_contrast: float = BLACK_CONTRAST,
    frozen_motion: float = FROZEN_MOTION,
    carry: Dict[str, Any] | None = None,
) -> Any:
    """``METRIC_COLUMNS`` for every frame of one segment (a ``segment_table`` row). Motion
    carries across segments: the first frame is compared with the stream's previous segment's
    last frame (kept in ``carry`` when the segments come in order, decoded otherwise)."""
    import cv2
    import pandas as pd

    cv2.setNumThreads(1)
    carry = {} if carry is None else carry
    key = (segment["recording_path"], segment["stream"])
    stored = read_segment_index(segment["index_file"], segment["recording_path"], quality=True)
    if stored is not None:  # measured as captured: no decoding
        carry.clear()  # a next segment without stored metrics decodes this one's last frame
        measured: Any = zip(
            stored["position"], stored["frame_id"], stored["timestamp_eof"], *(stored[c] for c in COLUMNS)
        )
    else:
        measured = _decode_and_measure(segment, carry, key)
    rows = []
    for position, frame_id, eof, b, c, s, m in measured:
        b, c, s, m = float(b), float(c), float(s), float(m)
        rows.append(
            (segment["recording_id"], segment["recording_path"], segment["stream"], int(segment["segment"]))
            + (int(position), int(frame_id), int(eof), b, c, s, m)
            + (b < black_brightness and c < black_contrast, m <= frozen_motion)
        )
    return pd.DataFrame(rows, columns=[n for n, _ in METRIC_COLUMNS]).astype({"segment": "int32", "position": "int32"})


def _decode_and_measure(segment: Segment, carry: Dict[str, Any], key: Tuple[str, str]) -> Iterator[Tuple[Any, ...]]:
    """Yield ``(position, frame_id, timestamp_eof, brightness, contrast, sharpness, motion)``
    for the frames of one decoded segment; the last frame's luma is left in ``carry``."""
    previous: Optional[Luma] = None
    previous_file = segment.get("previous_index_file")
    if carry.get("key") == key and carry.get("index_file") == previous_file:
        previous = carry["luma"]
    elif previous_file:
        before = last_frame(segment, previous_file, coded=True)
        if before is not None:
            row, image, storage = before
            previous = luma_of(image, storage.kind, row["format"], int(row["height"]))
    for row, image, storage in iter_segment(segment, coded=True):
        luma = luma_of(image, storage.kind, row["format"], int(row["height"]))
        yield (row["position"], row["frame_id"], row["timestamp_eof"]) + measure(luma, previous)
        previous = luma
    carry.update(key=key, index_file=segment["index_file"], luma=previous)


def _carrying(**thresholds: float) -> Callable[[Segment], Any]:
    """segment_metrics with one ``carry`` per task: consecutive segments pass their last frame on."""
    carry: Dict[str, Any] = {}
    return lambda segment: segment_metrics(segment, carry=carry, **thresholds)


def metrics_job(segments: DataFrame, **thresholds: float) -> DataFrame:
    """Spark: segments (``segments_df``) -> one metrics row per frame, decoded in the executors."""
    return map_segments(segments, _carrying(**thresholds), METRICS_SCHEMA)


def _stream_metrics(segments: List[Segment], /, **thresholds: float) -> List[Any]:
    fn = _carrying(**thresholds)
    return [fn(s) for s in segments]


def metrics_pandas(recordings: Recordings, *, processes: int = 0, pool: Any = None, **thresholds: float) -> Any:
    """``metrics_job`` without Spark; ``processes`` > 0 spreads segments over a spawn pool
    made for this call, ``pool`` over a ``multiprocessing`` pool of yours (kept open)."""
    import multiprocessing

    import pandas as pd

    by_stream: Dict[Tuple[str, str], List[Segment]] = {}
    for s in segment_table(recordings):  # a stream's segments in order, on one worker
        by_stream.setdefault((s["recording_path"], s["stream"]), []).append(s)
    fn = partial(_stream_metrics, **thresholds)
    streams = list(by_stream.values())
    if pool is not None:
        parts = pool.map(fn, streams, chunksize=1)
    elif processes > 0:
        with multiprocessing.get_context("spawn").Pool(processes) as own:
            parts = own.map(fn, streams, chunksize=1)
    else:
        parts = [fn(s) for s in streams]
    return pd.concat([p for part in parts for p in part], ignore_index=True)


def spark_metrics(spark: SparkSession, recordings: Any, **thresholds: float) -> DataFrame:
    """``metrics_job`` over recordings (paths/globs/``Recording``s)."""
    return metrics_job(segments_df(spark, recordings), **thresholds)
