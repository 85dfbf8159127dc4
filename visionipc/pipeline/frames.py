"""Decoding recorded frames inside Spark executors.

The driver only lists segments (``segment_table``: one row per segment, no
frames); ``segments_df`` spreads them one per partition, and each task opens its
segment's video and index itself (``iter_segment``) so pixels never travel
through the driver. ``read_frames`` exposes the decoded frames as a DataFrame
(pixels as bytes) for jobs of your own; the built-in jobs decode and reduce in
the same task instead (``map_segments``).
"""

from __future__ import annotations

import os

import numpy as np

from visionipc.pipeline.read import INDEX_ARROW_SCHEMA, RecordingError, _recordings, index_files

SEGMENT_SCHEMA = "recording_id string, recording_path string, stream string, segment int, index_file string"
FRAME_SCHEMA = ("recording_id string, stream string, segment int, position int, frame_id bigint, "
                "timestamp_eof bigint, format string, width int, height int, "
                "shape array<int>, dtype string, pixels binary")
PLANAR = ("nv12", "i420")


def segment_table(recordings, *, skip_empty: bool = False, validate: bool = True) -> list:
    """One dict per complete segment (``SEGMENT_SCHEMA``), listed on the driver from file names."""
    return [{"recording_id": rec.recording_id, "recording_path": rec.path, "stream": stream,
             "segment": seg, "index_file": path}
            for rec, stream, seg, path in index_files(_recordings(recordings), skip_empty=skip_empty, validate=validate)]


def segments_df(spark, recordings, **kw):
    """The segments as a DataFrame with exactly one segment per partition (one task each)."""
    rows = segment_table(recordings, **kw)
    rdd = spark.sparkContext.parallelize([tuple(r.values()) for r in rows], numSlices=max(1, len(rows)))
    return spark.createDataFrame(rdd, SEGMENT_SCHEMA)


def open_video(path: str):
    """An OpenCV capture decoding on one thread (Spark runs one task per core already)."""
    import cv2

    cv2.setNumThreads(1)
    cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    if not cap.isOpened():
        raise RecordingError(f"cannot open segment video {path}")
    return cap


def planes(decoded: np.ndarray, fmt: str, width: int, height: int) -> np.ndarray:
    """A decoded picture in the recorded format's layout: NV12/I420 as their (h*3/2, w) plane
    image, gray8 as (h, w), others as decoded. Lossless recordings store planes as gray video,
    which OpenCV returns as 3 equal channels."""
    stored_as_planes = fmt == "gray8" or (fmt in PLANAR and decoded.shape[0] == height * 3 // 2)
    if stored_as_planes and decoded.ndim == 3:
        return decoded[..., 0]
    return decoded  # a picture (compressed recordings of YUV store BGR)


def luma(image: np.ndarray, fmt: str, height: int) -> np.ndarray:
    """The (h, w) 8-bit brightness plane of ``planes(...)``'s output (or a decoded BGR picture)."""
    import cv2

    if image.ndim == 2:
        return image[:height] if image.dtype == np.uint8 else (image[:height] >> 8).astype(np.uint8)
    if fmt == "rgb8":
        return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    return cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)


def to_bgr(image: np.ndarray, fmt: str, height: int) -> np.ndarray:
    """A (h, w, 3) BGR picture of ``planes(...)``'s output, for writing JPEG/PNG."""
    import cv2

    if image.ndim == 2 and image.shape[0] == height * 3 // 2 and fmt in PLANAR:
        return cv2.cvtColor(image, cv2.COLOR_YUV2BGR_NV12 if fmt == "nv12" else cv2.COLOR_YUV2BGR_I420)
    if image.ndim == 2:
        return cv2.cvtColor(luma(image, fmt, height), cv2.COLOR_GRAY2BGR)
    return cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if fmt == "rgb8" else image


def read_segment_index(index_file: str):
    """The index rows of one segment, in position order (pandas)."""
    import pyarrow.parquet as pq

    return pq.read_table(index_file, schema=INDEX_ARROW_SCHEMA).to_pandas().sort_values("position", ignore_index=True)


def iter_segment(segment: dict, positions=None):
    """Yield ``(index_row, picture)`` for the frames of one segment (``planes`` layout), in
    order; with ``positions`` only those frames are converted (the rest are skipped over)."""
    index = read_segment_index(segment["index_file"])
    if len(index) == 0:
        return
    wanted = None if positions is None else set(int(p) for p in positions)
    last = int(index["position"].max()) if wanted is None else max(wanted, default=-1)
    video = os.path.join(segment["recording_path"], index["segment_file"].iloc[0])
    cap = open_video(video)
    try:
        rows = index.set_index("position", drop=False)
        for pos in range(last + 1):
            if wanted is not None and pos not in wanted:
                if not cap.grab():
                    raise RecordingError(f"{video} ends after {pos} frames, its index lists {last + 1}")
                continue
            ok, decoded = cap.read()
            if not ok:
                raise RecordingError(f"{video} ends after {pos} frames, its index lists {last + 1}")
            if pos in rows.index:
                row = rows.loc[pos]
                yield row, planes(decoded, row["format"], int(row["width"]), int(row["height"]))
    finally:
        cap.release()


def map_segments(segments, fn, schema: str):
    """``segments`` (``segments_df``) -> ``fn(segment_dict)`` (a pandas frame) for each segment,
    run in the executors with ``mapInPandas``."""
    import pandas as pd

    def run(batches):
        for batch in batches:
            for segment in batch.to_dict("records"):
                out = fn(segment)
                if len(out):
                    yield pd.DataFrame(out)

    return segments.mapInPandas(run, schema)


def _frame_rows(segment: dict):
    import pandas as pd

    rows = []
    for row, image in iter_segment(segment):
        rows.append({"recording_id": segment["recording_id"], "stream": segment["stream"],
                     "segment": int(segment["segment"]), "position": int(row["position"]),
                     "frame_id": int(row["frame_id"]), "timestamp_eof": int(row["timestamp_eof"]),
                     "format": row["format"], "width": int(row["width"]), "height": int(row["height"]),
                     "shape": list(image.shape), "dtype": str(image.dtype),
                     "pixels": np.ascontiguousarray(image).tobytes()})
    return pd.DataFrame(rows)


def read_frames(spark, recordings, **kw):
    """Every recorded frame as a row with its pixels (``FRAME_SCHEMA``), decoded lazily in the
    executors, one task per segment: ``np.frombuffer(pixels, dtype).reshape(shape)``."""
    return map_segments(segments_df(spark, recordings, **kw), _frame_rows, FRAME_SCHEMA)
