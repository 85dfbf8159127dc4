"""Finding recordings and reading their frame indexes (docs/recording-format.md).

``find_recordings`` turns paths, globs and folders of recordings into a list of
``Recording`` (a short unique id + the folder); ``read_index`` gives the index of
all of them as one Spark DataFrame (Spark's own Parquet reader, in parallel),
``read_index_pandas`` the same rows as a pandas frame without Spark. Both add
``recording_id`` and ``recording_path`` to the index columns.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, TypeVar, Union

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

import pyarrow as pa

from msgq.tooling import printable
from visionipc.apps.pipeline import fs
from visionipc.apps.record import layout
from visionipc.apps.record.checks import RecordingError, check_relpath, check_stream, parse_manifest
from visionipc.apps.record.index import index_schema, quality_schema

INDEX_ARROW_SCHEMA = index_schema()  # the recorder's, docs/recording-format.md
QUALITY_ARROW_SCHEMA = quality_schema()  # with the metrics measured as captured (null where not)
INDEX_SPARK_SCHEMA = ", ".join(
    f"{f.name} {'string' if pa.types.is_string(f.type) else 'bigint' if f.type == pa.int64() else 'int'}"
    for f in INDEX_ARROW_SCHEMA
)


@dataclass(frozen=True)
class Recording:
    recording_id: str
    path: str  # absolute folder, or a URI (fs.py)

    def index_files(self) -> List[Tuple[str, int, str]]:
        """``[(stream, segment, path)]`` of the complete segments (hidden/.partial files ignored)."""
        root = fs.join(self.path, layout.INDEX)
        listing = [rel for rel, is_dir, _ in fs.listdir(root, recursive=True) if not is_dir]
        return [(stream, n, fs.join(root, rel)) for stream, n, rel in layout.complete_segments(listing)]


StrPath = Union[str, "os.PathLike[str]"]
T = TypeVar("T")
R = TypeVar("R")
IndexFile = Tuple[Recording, str, int, str]  # (recording, stream, segment, path) of an index file
Recordings = Union[StrPath, Sequence[StrPath], Sequence[Recording]]  # paths, globs, or find_recordings'


def _is_recording(path: str) -> bool:
    return os.path.isfile(layout.manifest_path(path)) or os.path.isdir(os.path.join(path, layout.INDEX))


def _expand_remote(item: str) -> List[str]:
    if not fs.exists(item):
        raise FileNotFoundError(f"no such recording: {item!r}")
    if fs.isfile(fs.join(item, layout.MANIFEST)) or fs.isdir(fs.join(item, layout.INDEX)):
        return [item]
    marks = {
        rel.rsplit("/", 1)[0] for rel, _, _ in fs.listdir(item, recursive=True) if rel.endswith("/" + layout.MANIFEST)
    }
    found = sorted(fs.join(item, rel) for rel in marks)
    if not found:
        raise RecordingError(f"no recordings under {item!r} (looked for folders with recording.json)")
    return [p for p in found if not any(p != q and p.startswith(q + "/") for q in found)]


def _expand(item: StrPath) -> List[str]:
    item = fs.normalize(item)
    if not fs.is_local(item):
        return _expand_remote(item)
    if glob.has_magic(item):
        found = sorted(p for p in glob.glob(item, recursive=True) if os.path.isdir(p))
        if not found:
            raise FileNotFoundError(f"no recording matches {item!r}")
        return [p for f in found for p in _expand(f)]
    if not os.path.exists(item):
        raise FileNotFoundError(f"no such recording: {item!r}")
    if not os.path.isdir(item):
        raise RecordingError(
            f"{item!r} is not a recording folder (a recording is a folder with recording.json and index/)"
        )
    if _is_recording(item):
        return [item]
    found = sorted(root for root, dirs, _ in os.walk(item) if _is_recording(root))
    if not found:
        raise RecordingError(f"no recordings under {item!r} (looked for folders with recording.json or index/)")
    return [p for p in found if not any(p != q and p.startswith(q + os.sep) for q in found)]


def find_recordings(inputs: Union[StrPath, Iterable[StrPath]]) -> List[Recording]:
    """Recordings from a path, a glob or a folder of recordings (or a list of those).

    Ids are the folder names, or the paths below the common parent where names repeat.
    """
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs
    paths = sorted({fs.normalize(p) for item in items for p in _expand(item)})
    if not paths:
        raise FileNotFoundError("no recordings given")
    names = [fs.basename(p) for p in paths]
    if len(set(names)) < len(names):
        split = [p.split("/") for p in paths]
        common = "/".join(os.path.commonprefix(split)) if len(paths) > 1 else fs.parent(paths[0])
        names = [p[len(common) :].strip("/") for p in paths]
    return [Recording(n, p) for n, p in zip(names, paths)]


def recording_info(recording: Recording) -> Dict[str, Any]:
    """recording.json as a dict ({} when the recorder has not written one yet), read and
    checked like every file a recording names (visionipc.apps.record.checks)."""
    from visionipc.apps.record.checks import MAX_MANIFEST_BYTES

    if not fs.member_exists(recording.path, layout.MANIFEST):
        return {}
    where = fs.join(recording.path, layout.MANIFEST)
    return parse_manifest(fs.read_member(recording.path, layout.MANIFEST, MAX_MANIFEST_BYTES), where)


def each(fn: Callable[[T], R], items: Iterable[T]) -> List[R]:
    """``[fn(item) for item in items]``, a few at once: the driver's listings and small reads
    of many recordings, local or on an object store (whose latency is then paid once per
    batch, not per recording); the first error in ``items``' order is raised."""
    from concurrent.futures import ThreadPoolExecutor

    listed = list(items)
    if len(listed) < 2:
        return [fn(item) for item in listed]
    with ThreadPoolExecutor(max_workers=_READ_THREADS) as pool:
        return list(pool.map(fn, listed))


def recording_infos(recordings: Iterable[Recording]) -> List[Dict[str, Any]]:
    """``recording_info`` of each recording, a few read at once (``each``)."""
    return each(recording_info, recordings)


def _relative(folder: str, path: str) -> str:
    return os.path.relpath(path, folder).replace(os.sep, "/")


_READ_THREADS = min(8, (os.cpu_count() or 2) * 2)


# the columns that name things, checked in every index file read (_check_index_rows)
NAMING_COLUMNS = ["stream", "position", "segment_file"]


def read_index_file(path: str, folder: Optional[str] = None, columns: Optional[Sequence[str]] = None) -> Any:
    """The index file ``path`` (``folder/index/<stream>/NNNNNN.parquet``) as a pyarrow table
    (``columns``, all by default), checked as it is read: a regular file inside the recording
    ``folder`` (checks.open_file), a Parquet file with the index columns and types, whose
    ``stream`` column only names its own stream, positions 0..rows-1, segment files inside
    the recording; else RecordingError. One parse of the file's footer: the tasks that read
    the index call this, so each file is checked where it is read (no second pass)."""
    import pyarrow.parquet as pq

    folder = folder or fs.parent(fs.parent(fs.parent(path)))
    stream = fs.basename(fs.parent(path))
    check_stream(stream, folder)
    with fs.open_member(folder, fs.relative(folder, path)) as f:
        try:
            parquet = pq.ParquetFile(f)
            _check_index_schema(parquet.schema_arrow, path)
            wanted = None if columns is None else list(dict.fromkeys([*columns, *NAMING_COLUMNS]))
            table = parquet.read(columns=wanted)
        except (OSError, KeyError, pa.ArrowException) as e:  # KeyError: a column named twice
            raise RecordingError(f"corrupt index file {path}: {e}") from e
    _check_index_rows(table, path, stream, folder)
    return table if columns is None else table.select(list(columns))


def check_index_file(path: str, folder: Optional[str] = None) -> None:
    """Raise RecordingError unless ``path`` is an index file ``read_index_file`` accepts."""
    read_index_file(path, folder, columns=NAMING_COLUMNS)


_ACCEPTED_SCHEMAS: Set[Any] = set()  # a task reads many files written alike: each schema is checked once


def _check_index_schema(schema: Any, path: str) -> None:
    if schema in _ACCEPTED_SCHEMAS:
        return
    for field in INDEX_ARROW_SCHEMA:
        if field.name not in schema.names:
            raise RecordingError(f"index file {path} has no column {field.name!r} (docs/recording-format.md)")
        got = schema.field(field.name).type
        if got != field.type and not (pa.types.is_string(field.type) and pa.types.is_large_string(got)):
            raise RecordingError(f"index file {path}: column {field.name!r} is {got}, expected {field.type}")
    for field in QUALITY_ARROW_SCHEMA:  # the recorder's frame metrics, where there
        if field.name not in INDEX_ARROW_SCHEMA.names and field.name in schema.names:
            got = schema.field(field.name).type
            if not (pa.types.is_floating(got) or pa.types.is_integer(got) or pa.types.is_null(got)):
                raise RecordingError(f"index file {path}: column {field.name!r} is {got}, expected a number")
    if len(_ACCEPTED_SCHEMAS) < 64:
        _ACCEPTED_SCHEMAS.add(schema)


def _check_index_rows(table: Any, path: str, stream: str, folder: str) -> None:
    """The columns that name things: one stream (the folder's), positions 0..rows-1, and
    segment files that can only be inside the recording (opened later by checks.open_file)."""
    import pyarrow.compute as pc

    names = table.column("stream").unique().to_pylist()
    if names and names != [stream]:
        raise RecordingError(
            f"index file {path} names stream(s) {printable(repr(names[:3]))}, not only its folder's {stream!r}"
        )
    positions = table.column("position")
    if positions.null_count or (
        len(table) and not (pc.min(positions).as_py() >= 0 and pc.max(positions).as_py() < len(table))
    ):
        raise RecordingError(f"index file {path}: positions must be 0..{len(table) - 1} (one per row)")
    for segment_file in table.column("segment_file").unique().to_pylist():
        check_relpath(segment_file, folder)


def index_files(
    recordings: Sequence[Recording], *, skip_empty: bool = False, validate: bool = True, contents: bool = True
) -> List[IndexFile]:
    """``[(recording, stream, segment, path)]`` of every complete segment; an empty recording
    raises RecordingError unless ``skip_empty``. ``validate``: recording.json and the stream
    names checked, and with ``contents`` every file's (``check_index_file``, a few at once);
    ``contents=False`` leaves those to the tasks that read the files (``read_index_file``:
    vipc-analyze's jobs), so the driver does no per-file I/O beyond the listing."""
    out: List[IndexFile] = []
    empty: List[str] = []
    for rec, files in zip(recordings, each(Recording.index_files, recordings)):
        if not files:
            empty.append(rec.path)
        out.extend((rec, stream, seg, path) for stream, seg, path in files)
    if empty and (not skip_empty or not out):
        raise RecordingError(
            f"recording(s) without any complete segment (no index/<stream>/NNNNNN.parquet): "
            f"{', '.join(empty)}" + ("" if skip_empty else " (skip them with skip_empty / --skip-empty)")
        )
    if validate:
        recording_infos(recordings)  # recording.json checked (visionipc.apps.record.checks)
        for rec, stream in dict.fromkeys((rec, stream) for rec, stream, _, _ in out):
            check_stream(stream, rec.path)
        if contents:
            _check_all(out)
    return out


def _check_all(files: Sequence[IndexFile]) -> None:
    """``check_index_file`` of every file, a few at once (``each``; pyarrow reads without the
    GIL); the first bad file in ``files``' order is the one reported, as a serial check would."""
    each(lambda item: check_index_file(item[3], item[0].path), files)


def _recordings(recordings: Recordings) -> List[Recording]:
    if isinstance(recordings, (str, os.PathLike)) or (recordings and not isinstance(recordings[0], Recording)):
        return find_recordings(recordings)  # type: ignore[arg-type]  # paths and globs
    return list(recordings)  # type: ignore[arg-type]  # Recordings


def read_index(
    spark: SparkSession, recordings: Recordings, *, skip_empty: bool = False, validate: bool = True
) -> DataFrame:
    """The frame index of many recordings as one Spark DataFrame (index columns +
    ``recording_id``, ``recording_path``). ``recordings``: paths/globs or ``Recording``s."""
    recs = _recordings(recordings)
    files = index_files(recs, skip_empty=skip_empty, validate=validate)
    owners = spark.createDataFrame(
        [(rec.recording_id, rec.path, path) for rec, _, _, path in files],
        "recording_id string, recording_path string, _file string",
    )
    df = spark.read.schema(INDEX_SPARK_SCHEMA).parquet(*[path for _, _, _, path in files])
    # _metadata.file_path is a percent-encoded URI ('+' stays literal, url_decode would make it a space)
    # (SQL text, no pyspark.sql.functions: the same on a classic and a Spark Connect session)
    df = df.selectExpr(
        "*", "url_decode(replace(regexp_replace(_metadata.file_path, '^file:(//)?', ''), '+', '%2B')) AS _file"
    )
    return df.join(owners.hint("broadcast"), "_file").drop("_file")


def read_index_pandas(
    recordings: Recordings, *, skip_empty: bool = False, validate: bool = True, columns: Optional[Sequence[str]] = None
) -> Any:
    """``read_index`` without Spark: one pandas frame (pyarrow reads the files, a few at
    once). ``columns``: only these index columns (all by default); ``recording_id`` and
    ``recording_path`` are always added."""
    import pyarrow.dataset as ds

    recs = _recordings(recordings)
    files = index_files(recs, skip_empty=skip_empty, validate=validate)
    names = None if columns is None else [c for c in columns if c not in ("recording_id", "recording_path")]

    # one pyarrow dataset per recording: its files read by pyarrow's own threads
    by_recording: Dict[str, Tuple[Recording, List[str]]] = {}
    for rec, _, _, path in files:
        by_recording.setdefault(rec.path, (rec, []))[1].append(path)

    def read(rec_paths: Tuple[Recording, List[str]]) -> Any:
        rec, paths = rec_paths
        filesystem, _ = fs.resolve(paths[0])
        inner = [fs.resolve(p)[1] for p in paths]
        t = ds.dataset(inner, format="parquet", schema=INDEX_ARROW_SCHEMA, filesystem=filesystem).to_table(
            columns=names
        )  # in file order
        return t.append_column(
            "recording_id", pa.repeat(pa.scalar(rec.recording_id, pa.string()), len(t))
        ).append_column("recording_path", pa.repeat(pa.scalar(rec.path, pa.string()), len(t)))

    return pa.concat_tables(each(read, by_recording.values())).to_pandas()  # in file order
