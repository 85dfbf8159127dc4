"""Cutting datasets out of recordings: select frames, write them as JPEG/PNG.

Selections are DataFrame -> DataFrame filters that keep ``recording_id``,
``recording_path``, ``stream``, ``segment``, ``position``, ``frame_id`` and add a
``reason``. ``export_frames`` writes the selected frames from the executors (one
task per segment; the folder must be reachable from every executor) and returns
the manifest; ``export_job`` also writes it as ``manifest.parquet`` beside the
images.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Tuple

from visionipc.apps.pipeline.choices import IMAGE_FORMATS, SHARP
from visionipc.apps.pipeline.frames import Segment, iter_pictures
from visionipc.apps.record import layout
from visionipc.apps.record.checks import RecordingError, check_stream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

KEEP = ["recording_id", "recording_path", "stream", "segment", "position", "frame_id"]
MANIFEST_COLUMNS = [
    ("path", "string"),
    ("recording_id", "string"),
    ("stream", "string"),
    ("segment", "int"),
    ("position", "int"),
    ("frame_id", "bigint"),
    ("timestamp_eof", "bigint"),
    ("width", "int"),
    ("height", "int"),
    ("format", "string"),
    ("reason", "string"),
]
MANIFEST_SCHEMA = ", ".join(f"{n} {t}" for n, t in MANIFEST_COLUMNS)


def _with_reason(df, reason: str):
    return df.selectExpr(*KEEP, f"'{reason}' AS reason")


# (SQL text, no pyspark.sql.functions: the same on a classic and a Spark Connect session)


def select_sharp(metrics_df: DataFrame, min_sharpness: float) -> DataFrame:
    """Frames whose sharpness (variance of the Laplacian) is at least ``min_sharpness``."""
    return _with_reason(metrics_df.where(f"sharpness >= {float(min_sharpness)!r} AND NOT black"), SHARP)


def select_every_nth(index_df: DataFrame, n: int) -> DataFrame:
    """Every ``n``-th frame of each stream, by frame id (frame ids divisible by n)."""
    if n < 1:
        raise ValueError(f"every-nth needs n >= 1, got {n}")
    return _with_reason(index_df.where(f"frame_id % {int(n)} = 0"), f"every_{int(n)}")


def select_around_drops(index_df: DataFrame, drops_df: DataFrame, window: int = 2) -> DataFrame:
    """The ``window`` frames recorded before and after each gap in frame_id."""
    w = int(window)
    d = drops_df.select("recording_id", "stream", "after_frame_id", "next_frame_id")
    near = (
        f"(frame_id > after_frame_id - {w} AND frame_id <= after_frame_id) "
        f"OR (frame_id >= next_frame_id AND frame_id < next_frame_id + {w})"
    )
    return _with_reason(
        index_df.join(d.hint("broadcast"), ["recording_id", "stream"])
        .where(near)
        .dropDuplicates(["recording_id", "stream", "frame_id"]),
        "around_drop",
    )


def image_name(recording_id: str, stream: str, frame_id: int, image_format: str) -> str:
    """Where a frame goes, relative to the export folder (a stream name from a recording is
    checked first: never ``/`` or ``..``; the recording id is a folder path found below the
    common parent of the recordings, so it has no ``..``)."""
    if os.path.isabs(recording_id) or ".." in recording_id.split(os.sep):
        raise RecordingError(f"recording id {recording_id!r} is not a relative path")
    return os.path.join(recording_id, check_stream(stream, recording_id), f"{frame_id:09d}.{image_format}")


def inside(out_dir: str, rel: str) -> str:
    """``out_dir/rel``, or RecordingError if it would resolve outside ``out_dir``."""
    root = os.path.realpath(out_dir)
    dest = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, dest]) != root:
        raise RecordingError(f"{rel!r} would be written outside {out_dir!r}")
    return dest


def export_segment(selected: Any, out_dir: str, image_format: str) -> Any:
    """Write the selected frames of one segment (a pandas group) and return their manifest rows."""
    import cv2

    first = selected.iloc[0]
    segment: Segment = {
        "recording_path": first["recording_path"],
        "segment": int(first["segment"]),
        "index_file": os.path.join(
            first["recording_path"],
            layout.index_file(check_stream(first["stream"], first["recording_path"]), int(first["segment"])),
        ),
    }
    reasons = dict(zip(selected["position"].astype(int), selected["reason"]))
    rows = []
    for row, picture in iter_pictures(segment, positions=reasons):
        rel = image_name(first["recording_id"], first["stream"], int(row["frame_id"]), image_format)
        dest = inside(out_dir, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not cv2.imwrite(dest, picture):
            raise OSError(f"could not write {dest}")
        rows.append(manifest_row(rel, first["recording_id"], first["stream"], row, reasons[int(row["position"])]))
    return manifest_frame(rows)


def manifest_row(rel: str, recording_id: str, stream: str, row: Any, reason: str) -> Tuple[Any, ...]:
    """One ``MANIFEST_COLUMNS`` row for a written frame (``row``: its index row)."""
    return (
        rel,
        recording_id,
        stream,
        int(row["segment"]),
        int(row["position"]),
        int(row["frame_id"]),
        int(row["timestamp_eof"]),
        int(row["width"]),
        int(row["height"]),
        row["format"],
        reason,
    )


def manifest_frame(rows: Iterable[Tuple[Any, ...]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows, columns=[n for n, _ in MANIFEST_COLUMNS]).astype(
        {"segment": "int32", "position": "int32", "width": "int32", "height": "int32"}
    )


def export_frames(selection_df: DataFrame, out_dir: str, image_format: str = IMAGE_FORMATS[0]) -> DataFrame:
    """Spark: write the selected frames under ``out_dir`` and return the manifest DataFrame
    (lazy: the images are written when the manifest is computed)."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {IMAGE_FORMATS}, not {image_format!r}")
    out_dir = os.path.abspath(os.fspath(out_dir))

    def fn(selected: Any) -> Any:  # a plain function: Spark inspects its signature
        return export_segment(selected, out_dir, image_format)

    return (
        selection_df.select(*KEEP, "reason")
        .dropDuplicates(["recording_id", "stream", "frame_id"])
        .groupBy("recording_path", "stream", "segment")
        .applyInPandas(fn, MANIFEST_SCHEMA)
    )


def export_job(selection_df: DataFrame, out_dir: str, image_format: str = IMAGE_FORMATS[0]) -> Any:
    """``export_frames`` then ``out_dir/manifest.parquet``; returns the manifest as pandas."""
    import pandas as pd

    manifest = export_frames(selection_df, out_dir, image_format)
    path = os.path.join(os.path.abspath(os.fspath(out_dir)), "manifest.parquet")
    manifest.coalesce(1).write.mode("overwrite").parquet(path)
    return pd.read_parquet(path)
