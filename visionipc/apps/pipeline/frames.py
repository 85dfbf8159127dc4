"""Decoding recorded frames inside Spark executors.

The driver only lists segments (``segment_table``: one row per segment, no
frames); ``segments_df`` spreads them over a few partitions per task slot, and each task opens its
segment's video and index itself (``iter_segment``) so pixels never travel
through the driver. ``read_frames`` exposes the decoded frames as a DataFrame
(pixels as bytes) for jobs of your own; the built-in jobs decode and reduce in
the same task instead (``map_segments``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Tuple, TypedDict, Union

import numpy as np

from visionipc.apps.pipeline import fs
from visionipc.apps.pipeline.read import (
    INDEX_ARROW_SCHEMA,
    QUALITY_ARROW_SCHEMA,
    Recording,
    RecordingError,
    _recordings,
    index_files,
    read_index_file,
    recording_info,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from visionipc.apps.pipeline.read import IndexFile, Recordings
    from visionipc.apps.record.codecs import AvStorage, CodedPlanes
    from visionipc.apps.record.storage import Storage

Image = np.ndarray  # a stored image (storage.py's kinds) or a compact one
Row = Any  # an index row (a pandas Series)


class SegmentFile(TypedDict):
    """What decoding a segment needs: its recording and its index file."""

    recording_path: str
    index_file: str


class Segment(SegmentFile, total=False):
    """One complete segment of a stream (``SEGMENT_SCHEMA``): a ``segment_table`` row has every key."""

    recording_id: str
    stream: str
    segment: int
    previous_index_file: Optional[str]  # the stream's segment before it; None for its first


SEGMENT_SCHEMA = (
    "recording_id string, recording_path string, stream string, segment int, index_file string, "
    "previous_index_file string"
)
FRAME_SCHEMA = (
    "recording_id string, stream string, segment int, position int, frame_id bigint, "
    "timestamp_eof bigint, format string, width int, height int, "
    "shape array<int>, dtype string, pixels binary"
)


def segment_table(recordings: Recordings, *, skip_empty: bool = False, validate: bool = True) -> List[Segment]:
    """One dict per complete segment (``SEGMENT_SCHEMA``), listed on the driver from file names;
    ``previous_index_file`` is the stream's segment before it (None for its first)."""
    return segment_rows(index_files(_recordings(recordings), skip_empty=skip_empty, validate=validate))


def segment_rows(files: Iterable[IndexFile]) -> List[Segment]:
    """``segment_table`` of ``read.index_files`` rows already listed."""
    rows: List[Segment] = []
    before: Optional[Tuple[Tuple[str, str], str]] = None
    for rec, stream, seg, path in files:
        previous = before[1] if before is not None and before[0] == (rec.path, stream) else None
        rows.append(
            {
                "recording_id": rec.recording_id,
                "recording_path": rec.path,
                "stream": stream,
                "segment": seg,
                "index_file": path,
                "previous_index_file": previous,
            }
        )
        before = ((rec.path, stream), path)
    return rows


# Partitions per task slot in segments_df: a Spark task costs ~60 ms of
# overhead on a 2-core machine (JVM <-> Python worker hand-over), ~4 % of a
# 126-frame 720p segment; one task per segment paid it 8 times per slot in
# tools/bench_pipeline.py, two per slot keeps the slots balanced with ~4x less.
TASKS_PER_SLOT = 2


def segments_df(spark: SparkSession, recordings: Recordings, *, partitions: int | None = None, **kw: Any) -> DataFrame:
    """The segments as a DataFrame, spread over ``partitions`` tasks (default: two per task
    slot of the session, at most one per segment), consecutive segments together."""
    from visionipc.apps.pipeline import tasks

    rows = segment_table(recordings, **kw)
    if partitions is None:
        partitions = TASKS_PER_SLOT * tasks.parallelism(spark)
    return tasks.rows_df(spark, [tuple(r.values()) for r in rows], SEGMENT_SCHEMA, partitions)


class _OneThreadStorage:
    """vipc-record's Storage, decoding on one thread (Spark already runs one task per core)."""

    decode_threads = 1  # PyAV codecs (record/codecs.py)

    def __init__(self, storage: Union[Storage, AvStorage, CodedPlanes]) -> None:
        self._storage = storage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def reader_params(self) -> List[int]:
        storage: Any = self._storage  # an OpenCV format Storage: the others have no reader_params
        return storage.reader_params() + [storage.cv2.CAP_PROP_N_THREADS, 1]


def storage_of(recording_path: str, row: Row) -> Union[Storage, AvStorage]:
    """How the segment's pixels are stored, from recording.json (or the index row and the
    file's extension while the recorder has not described the stream yet)."""
    import cv2

    from visionipc.apps.record.layout import MANIFEST
    from visionipc.apps.record.storage import Storage

    info = recording_info(Recording("", recording_path)).get("streams", {}).get(row["stream"])
    if info is None:
        info = {
            "format": row["format"],
            "width": int(row["width"]),
            "height": int(row["height"]),
            "lossless": Storage.lossless_file(str(row["segment_file"])),
        }
    try:
        return Storage.from_manifest(cv2, info)
    except (KeyError, ValueError) as e:
        raise RecordingError(f"{recording_path}/{MANIFEST}: stream {row['stream']!r}: {e}") from e


def luma(image: np.ndarray, kind: str, fmt: str, height: int) -> np.ndarray:
    """The (h, w) full-range BT.601 luma plane (float32, 0..255) of a stored image
    (``kind``: Storage.kind); the definition is ``visionipc.apps.record.quality``'s."""
    from visionipc.apps.record.quality import luma_of

    return luma_of(image, kind, fmt, height).values()


def to_bgr(image: np.ndarray, kind: str, fmt: str, height: int) -> np.ndarray:
    """A (h, w, 3) BGR picture of a stored image, for writing JPEG/PNG."""
    from visionipc.pixels import BGR
    from visionipc.pixels import to_bgr as compact_to_bgr

    return image if kind == BGR else compact_to_bgr(image, fmt)  # else a compact image of fmt


def read_segment_index(index_file: str, recording_path: Optional[str] = None, *, quality: bool = False) -> Any:
    """The index rows of one segment, in position order (pandas), checked as they are read
    (read.read_index_file: a regular file inside the recording, its columns and the names in
    them). ``quality``: with the picture metrics the recorder measured as it captured
    (``quality.COLUMNS``), or None when the segment has none."""

    import pyarrow as pa

    folder = recording_path or fs.parent(fs.parent(fs.parent(index_file)))
    table = read_index_file(index_file, folder)
    schema = QUALITY_ARROW_SCHEMA if quality else INDEX_ARROW_SCHEMA
    try:  # the schema's columns and types (metrics a file lacks: null)
        table = pa.table(
            [
                table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
                for f in schema
            ],
            schema=schema,
        )
    except (ValueError, pa.ArrowException) as e:
        raise RecordingError(f"{index_file}: {e} (docs/recording-format.md)") from None
    if quality:
        from visionipc.apps.record.quality import COLUMNS

        if not len(table) or any(table.column(name).null_count for name in COLUMNS):
            return None  # not measured as captured (an older recording, --frame-metrics none)
    return table.to_pandas().sort_values("position", ignore_index=True)


def iter_segment(
    segment: SegmentFile, positions: Optional[Iterable[int]] = None, *, coded: bool = False
) -> Iterator[Tuple[Row, Image, Union[Storage, AvStorage, CodedPlanes]]]:
    """Yield ``(index_row, stored_image, storage)`` for the frames of one segment in order
    (all of them, or those at ``positions``), decoded by vipc-record's reader; ``coded``:
    lossy video as its coded YUV planes (``codecs.CodedPlanes``, the storage yielded), not
    converted to the stored layout (the metrics read Y so)."""
    import cv2

    from visionipc.apps.record.codecs import coded_planes
    from visionipc.apps.record.reader import iter_segment_frames

    index = read_segment_index(segment["index_file"], segment["recording_path"])
    if positions is not None:
        index = index[index["position"].isin([int(p) for p in positions])]
    if len(index) == 0:
        return
    stored = storage_of(segment["recording_path"], index.iloc[0])
    storage: Union[Storage, AvStorage, CodedPlanes] = (coded_planes(stored) or stored) if coded else stored
    cv2.setNumThreads(1)
    wanted = list(zip(index["segment_file"], index["position"].astype(int)))
    try:
        # a remote segment is fetched by the executor that decodes it
        with fs.local_copy(segment["recording_path"], *sorted(set(index["segment_file"]))) as folder:
            frames = iter_segment_frames(cv2, folder, wanted, _OneThreadStorage(storage))
            with contextlib.closing(frames):  # its decoder freed here, not by the garbage collector
                for (_, row), image in zip(index.iterrows(), frames):
                    yield row, image, storage
    except FileNotFoundError as e:
        raise RecordingError(f"{segment['recording_path']}: cannot open {e}") from e
    except RuntimeError as e:  # the reader's "cannot open" / "ends before"
        raise RecordingError(f"{segment['recording_path']}: {e}") from e


def iter_pictures(segment: SegmentFile, positions: Optional[Iterable[int]] = None) -> Iterator[Tuple[Row, Image]]:
    """Yield ``(index_row, bgr_picture)`` for JPEG/PNG export: lossy video from its coded planes,
    converted by OpenCV as lossless planes are (a frame looks the same stored either way)."""
    for row, image, storage in iter_segment(segment, positions, coded=True):
        yield row, to_bgr(image, storage.kind, storage.fmt, int(row["height"]))


def last_frame(
    segment: SegmentFile, index_file: str, *, coded: bool = False
) -> Optional[Tuple[Row, Image, Union[Storage, AvStorage, CodedPlanes]]]:
    """``(index_row, stored_image, storage)`` of the last frame of another segment of the same
    stream (``index_file``), or None when it has no frames (``coded``: as ``iter_segment``)."""
    index = read_segment_index(index_file)
    if len(index) == 0:
        return None
    other: SegmentFile = {**segment, "index_file": index_file}
    return next(iter_segment(other, positions=[int(index["position"].max())], coded=coded), None)


def map_segments(segments: DataFrame, fn: Callable[[Segment], Any], schema: str) -> DataFrame:
    """``segments`` (``segments_df``) -> ``fn(segment_dict)`` (a pandas frame) for each segment,
    run in the executors with ``mapInPandas``."""
    import pandas as pd

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            for segment in batch.to_dict("records"):
                out = fn(segment)
                if len(out):
                    yield pd.DataFrame(out)

    return segments.mapInPandas(run, schema)


def _frame_rows(segment: Segment) -> Any:
    import pandas as pd

    rows = []
    for row, image, _ in iter_segment(segment):
        rows.append(
            {
                "recording_id": segment["recording_id"],
                "stream": segment["stream"],
                "segment": int(segment["segment"]),
                "position": int(row["position"]),
                "frame_id": int(row["frame_id"]),
                "timestamp_eof": int(row["timestamp_eof"]),
                "format": row["format"],
                "width": int(row["width"]),
                "height": int(row["height"]),
                "shape": list(image.shape),
                "dtype": str(image.dtype),
                "pixels": np.ascontiguousarray(image).tobytes(),
            }
        )
    return pd.DataFrame(rows)


def read_frames(spark: SparkSession, recordings: Recordings, **kw: Any) -> DataFrame:
    """Every recorded frame as a row with its pixels (``FRAME_SCHEMA``), decoded lazily in the
    executors (a run of segments per task): ``np.frombuffer(pixels, dtype).reshape(shape)``."""
    return map_segments(segments_df(spark, recordings, **kw), _frame_rows, FRAME_SCHEMA)
