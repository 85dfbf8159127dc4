"""A recording's tables (docs/recording-format.md; the file names are ``layout``'s): the
Parquet schemas, writing recording.json and the tables, and reading an index back.

Writes are atomic: a file is written under a hidden ``.partial`` name in the
same folder and renamed once complete, so readers (which skip hidden files)
never see a half-written one.
"""

import datetime
import json
import os
import time
from typing import Any, Dict, Iterable, List, Tuple, TypedDict

from msgq.tooling import printable
from visionipc.apps._cli import UsageError, need
from visionipc.apps.record import layout

FORMAT_VERSION = 2  # 2: PyAV codecs (recording.json's codec h264/hevc/av1/ffv1/*_nvenc, .mkv)
READABLE_VERSIONS = (1, 2)  # 1: OpenCV mp4v/FFV1, still read
INDEX_COLUMNS = (
    "stream",
    "frame_id",
    "timestamp_sof",
    "timestamp_eof",
    "publish_time",
    "receive_time",
    "width",
    "height",
    "format",
    "segment",
    "position",
    "segment_file",
)
MAX_ROWS = 10_000_000  # rows of one stream's index or one topic (about 4 days at 30 fps)
TOPIC_COLUMNS = ("topic", "seq", "receive_time", "data", "segment")
Columns = Dict[str, List[Any]]  # a table's rows, column by column
Rows = Iterable[Tuple[str, int]]  # (segment_file, position) of frames to decode, in index order
Table = Any  # a pyarrow.Table (pyarrow has no types)


class FrameMeta(TypedDict):
    """A frame's index row as the recorder hands it to its writer (CLOCK_MONOTONIC ns)."""

    frame_id: int
    timestamp_sof: int
    timestamp_eof: int
    publish_time: int
    receive_time: int


class ClockStamp(TypedDict):
    """recording.json's start and stop: both clocks at one moment."""

    monotonic_ns: int
    wall_time: str  # ISO 8601, UTC


def pa() -> Any:
    return need("pyarrow", "record")


def index_schema() -> Any:
    p = pa()
    return p.schema(
        [
            ("stream", p.string()),
            ("frame_id", p.int64()),
            ("timestamp_sof", p.int64()),
            ("timestamp_eof", p.int64()),
            ("publish_time", p.int64()),
            ("receive_time", p.int64()),
            ("width", p.int32()),
            ("height", p.int32()),
            ("format", p.string()),
            ("segment", p.int32()),
            ("position", p.int32()),
            ("segment_file", p.string()),
        ]
    )


def quality_schema() -> Any:
    """``index_schema`` and the picture metrics vipc-record measures as it captures
    (``quality.COLUMNS``, float64; motion NaN at a recording's first frame): the index of
    a stream recorded with --frame-metrics (lossy streams by default)."""
    from visionipc.apps.record.quality import COLUMNS

    p = pa()
    return p.schema(list(index_schema()) + [(name, p.float64()) for name in COLUMNS])


def topic_schema() -> Any:
    p = pa()
    return p.schema(
        [
            ("topic", p.string()),
            ("seq", p.int64()),
            ("receive_time", p.int64()),
            ("data", p.binary()),
            ("segment", p.int32()),
        ]
    )


def write_table(rows: Columns, schema: Any, path: str) -> None:
    """Columns ``rows`` -> Parquet at ``path``, atomically."""
    p = pa()
    import pyarrow.parquet as pq

    table = p.table({name: p.array(rows[name], type=schema.field(name).type) for name in schema.names}, schema=schema)
    tmp = layout.partial_path(path)
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_json(path: str, doc: Dict[str, Any]) -> None:
    tmp = layout.partial_path(path)
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def clock_now() -> ClockStamp:
    wall = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"monotonic_ns": time.monotonic_ns(), "wall_time": wall}


def read_manifest(folder: str) -> Dict[str, Any]:
    """recording.json, read safely and checked (checks.parse_manifest): RecordingError
    (a UsageError) if it is missing, not a regular file inside ``folder``, or hostile."""
    from visionipc.apps.record.checks import read_manifest_file

    if not os.path.isdir(folder):
        raise UsageError(f"'{printable(folder)}' is not a folder")
    if not os.path.lexists(layout.manifest_path(folder)):
        raise UsageError(f"'{printable(folder)}' is not a recording (no {layout.MANIFEST})")
    doc = read_manifest_file(folder)
    if doc.get("format_version") not in READABLE_VERSIONS:
        path = layout.manifest_path(folder)
        got = printable(repr(doc.get("format_version")))[:40]
        raise UsageError(f"{printable(path)}: format_version {got} is not one of {READABLE_VERSIONS}")
    return doc


def _read_tables(folder: str, kind: str, name: str, schema: Any) -> Table:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from visionipc.apps.record.checks import RecordingError, check_stream, open_file

    check_stream(name, folder)
    paths = layout.folder_segments(folder, kind, name)
    if not paths:
        return schema.empty_table()
    tables, rows = [], 0
    for path in paths:
        rel = os.path.relpath(path, folder).replace(os.sep, "/")
        with os.fdopen(open_file(folder, rel), "rb") as f:
            try:
                rows += pq.ParquetFile(f).metadata.num_rows
                if rows > MAX_ROWS:
                    raise RecordingError(f"{printable(path)}: more than {MAX_ROWS} rows in {kind}/{name}")
                f.seek(0)
                table = pq.read_table(f, schema=schema)
            except (OSError, pa().ArrowException) as e:
                raise RecordingError(f"corrupt {kind} file {printable(path)}: {printable(str(e))}") from None
        nulls = [c for c in schema.names if table.column(c).null_count]
        if nulls:
            raise RecordingError(f"{printable(path)}: empty (null) values in column(s) {', '.join(nulls)}")
        if "frame_id" in schema.names and len(table) and pc.min(table.column("frame_id")).as_py() < 0:
            raise RecordingError(f"{printable(path)}: negative frame_id (frame ids count up from 0)")
        tables.append(table)
    return pa().concat_tables(tables)


def read_index(folder: str, stream: str) -> Table:
    """The whole frame index of one stream (a pyarrow Table, rows in recorded order);
    every file opened by checks.open_file (a regular file inside ``folder``)."""
    return _read_tables(folder, layout.INDEX, stream, index_schema())


def read_topic(folder: str, topic: str) -> Table:
    return _read_tables(folder, layout.TOPICS, topic, topic_schema())
