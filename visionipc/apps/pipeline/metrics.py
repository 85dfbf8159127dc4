"""Per-frame image metrics, computed with OpenCV where the frames are decoded.

``frame_metrics`` is the kernel (brightness, contrast, sharpness as the variance
of the Laplacian, motion as the mean absolute difference to the previous frame);
``segment_metrics`` runs it over one segment; ``metrics_job`` over all segments
in Spark executors (a run of segments per task) and ``metrics_pandas`` without Spark,
optionally on a process pool.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from visionipc.apps.pipeline.frames import iter_segment, last_frame, luma, map_segments, segment_table, segments_df

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
    without a previous frame. cv2.meanStdDev on a float Laplacian: 4x cheaper than np.var."""
    import cv2

    if gray.dtype != np.float32:
        gray = gray.astype(np.float32)
        previous = previous.astype(np.float32) if previous is not None else None
    mean, std = cv2.meanStdDev(gray)
    _, lap_std = cv2.meanStdDev(cv2.Laplacian(gray, cv2.CV_32F))
    motion = cv2.norm(gray, previous, cv2.NORM_L1) / gray.size if previous is not None else math.nan
    return float(mean[0, 0]), float(std[0, 0]), float(lap_std[0, 0]) ** 2, float(motion)


def segment_metrics(
    segment: dict,
    *,
    black_brightness: float = BLACK_BRIGHTNESS,
    black_contrast: float = BLACK_CONTRAST,
    frozen_motion: float = FROZEN_MOTION,
    carry: dict | None = None,
):
    """``METRIC_COLUMNS`` for every frame of one segment (a ``segment_table`` row). Motion
    carries across segments: the first frame is compared with the stream's previous segment's
    last frame (kept in ``carry`` when the segments come in order, decoded otherwise)."""
    import cv2
    import pandas as pd

    cv2.setNumThreads(1)
    carry = {} if carry is None else carry
    key = (segment["recording_path"], segment["stream"])
    rows, previous = [], None
    if carry.get("key") == key and carry.get("index_file") == segment.get("previous_index_file"):
        previous = carry["luma"]
    elif segment.get("previous_index_file"):
        before = last_frame(segment, segment["previous_index_file"], coded=True)
        if before is not None:
            row, image, storage = before
            previous = luma(image, storage.kind, row["format"], int(row["height"]))
    for row, image, storage in iter_segment(segment, coded=True):
        gray = luma(image, storage.kind, row["format"], int(row["height"]))
        b, c, s, m = frame_metrics(gray, previous)
        previous = gray
        rows.append(
            (
                segment["recording_id"],
                segment["recording_path"],
                segment["stream"],
                int(segment["segment"]),
                int(row["position"]),
                int(row["frame_id"]),
                int(row["timestamp_eof"]),
                b,
                c,
                s,
                m,
                b < black_brightness and c < black_contrast,
                bool(m <= frozen_motion),
            )
        )
    carry.update(key=key, index_file=segment["index_file"], luma=previous)
    return pd.DataFrame(rows, columns=[n for n, _ in METRIC_COLUMNS]).astype({"segment": "int32", "position": "int32"})


def _carrying(**thresholds):
    """segment_metrics with one ``carry`` per task: consecutive segments pass their last frame on."""
    carry = {}
    return lambda segment: segment_metrics(segment, carry=carry, **thresholds)


def metrics_job(segments, **thresholds):
    """Spark: segments (``segments_df``) -> one metrics row per frame, decoded in the executors."""
    return map_segments(segments, _carrying(**thresholds), METRICS_SCHEMA)


def _stream_metrics(segments, **thresholds):
    fn = _carrying(**thresholds)
    return [fn(s) for s in segments]


def metrics_pandas(recordings, *, processes: int = 0, pool=None, **thresholds):
    """``metrics_job`` without Spark; ``processes`` > 0 spreads segments over a spawn pool
    made for this call, ``pool`` over a ``multiprocessing`` pool of yours (kept open)."""
    import multiprocessing

    import pandas as pd

    by_stream = {}
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


def spark_metrics(spark, recordings, **thresholds):
    """``metrics_job`` over recordings (paths/globs/``Recording``s)."""
    return metrics_job(segments_df(spark, recordings), **thresholds)
