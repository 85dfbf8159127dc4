"""``spark.read.format("vipc")``: the frame index of recordings as a PySpark Python
data source (PySpark 4+).

    spark.read.format("vipc").load("rec1")                     # a path, a glob, a folder, a URI
    spark.read.format("vipc").option("paths", "rec1,rec2").load()
    spark.read.format("vipc").load("fleet/").where("stream = 'road' AND frame_id >= 1000")

Same rows as ``read.read_index``. Partitions are runs of index files of about
``partition_bytes`` (option, default 64 MiB), not one per file. Filters on
``recording_id`` / ``stream`` (=, IN) drop whole files on the driver, filters on
``frame_id`` (<, <=, >, >=, =) are pushed into pyarrow's Parquet reader (row-group
statistics) where the PySpark version has filter pushdown (``pushFilters``, 4.1+;
``register`` turns on ``spark.sql.python.filterPushdown.enabled``); Spark applies
whatever is not pushed. Column pruning: a schema given with ``.schema("frame_id bigint,
stream string")`` (any subset of the columns) is all pyarrow reads. The reader holds only
strings: no open file or lock travels to the executors.

The picture metrics vipc-record measured as it captured (``brightness``, ``contrast``,
``sharpness``, ``motion``: lossy streams by default; null where a segment has none) are
columns too when asked for: ``.option("frame_metrics", "true")`` adds them to the default
schema, or name them in ``.schema(...)``. ``.option("event_time", "true")`` adds
``event_time`` (timestamp): when the recorder received the frame, as wall-clock time
(``receive_time`` on the recorder's clock, placed by recording.json's ``start``:
``wall_time`` + receive_time - ``monotonic_ns``; receive_time as Unix time where recording.json
has no start). ``spark.readStream.format("vipc")`` follows recordings as they grow (stream.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Sequence, Set, Tuple, Union

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from visionipc.apps.pipeline import fs
from visionipc.apps.pipeline.read import INDEX_ARROW_SCHEMA, INDEX_SPARK_SCHEMA, QUALITY_ARROW_SCHEMA, find_recordings
from visionipc.apps.record import layout
from visionipc.apps.record.quality import COLUMNS as METRIC_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import Filter
    from pyspark.sql.types import StructType

    from visionipc.apps.pipeline.read import Recording
    from visionipc.apps.pipeline.stream import VipcStreamReader

SCHEMA = INDEX_SPARK_SCHEMA + ", recording_id string, recording_path string"
SCHEMA_WITH_METRICS = SCHEMA + "".join(f", {c} double" for c in METRIC_COLUMNS)
EVENT_TIME = ", event_time timestamp"
PARTITION_BYTES = 64 << 20
_RANGE_OPS = {"GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<", "LessThanOrEqual": "<=", "EqualTo": "=="}


class FilesPartition(InputPartition):
    """A run of index files: ``[(recording_id, recording_path, index_file)]``; ``clocks``:
    {recording_path: ns to add to receive_time for wall-clock time} (for ``event_time``)."""

    def __init__(self, files: List[Tuple[str, str, str]], clocks: Dict[str, int] | None = None) -> None:
        super().__init__(len(files))
        self.files, self.clocks = files, clocks or {}


def _column(f: object) -> str:
    ref = getattr(f, "attribute", ())
    return ref[0] if isinstance(ref, tuple) and len(ref) == 1 else str(ref)


class VipcReader(DataSourceReader):
    def __init__(self, paths: List[str], skip_empty: bool, partition_bytes: int, columns: List[str]) -> None:
        self.paths, self.skip_empty, self.partition_bytes = paths, skip_empty, partition_bytes
        self.columns = columns  # the columns asked for, in their order
        self.keep: Dict[str, Set[Any]] = {}  # column -> allowed values (recording_id, stream)
        self.frame_filters: List[Tuple[str, int]] = []  # (op, value) on frame_id, for pyarrow

    def pushFilters(self, filters: List[Filter]) -> Iterable[Filter]:  # noqa: N802 - PySpark's name
        f: Any  # EqualTo, In, GreaterThan...: each with its value
        for f in filters:
            kind, column = type(f).__name__, _column(f)
            if column in ("recording_id", "stream") and kind in ("EqualTo", "In"):
                values = {f.value} if kind == "EqualTo" else set(f.value)
                self.keep[column] = self.keep.get(column, values) & values
            elif column == "frame_id" and kind in _RANGE_OPS and isinstance(f.value, int):
                self.frame_filters.append((_RANGE_OPS[kind], f.value))
            else:
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        recs = find_recordings(self.paths)
        if "recording_id" in self.keep:
            recs = [r for r in recs if r.recording_id in self.keep["recording_id"]]
        parts: List[FilesPartition] = []
        run: List[Tuple[str, str, str]] = []
        size = 0
        for rec in recs:
            root = fs.join(rec.path, layout.INDEX)
            listing = {rel: n for rel, is_dir, n in fs.listdir(root, recursive=True) if not is_dir}
            for stream, _, path in rec.index_files():
                if "stream" in self.keep and stream not in self.keep["stream"]:
                    continue
                run.append((rec.recording_id, rec.path, path))
                size += listing.get(path[len(root) + 1 :], 0)
                if size >= self.partition_bytes:
                    parts.append(FilesPartition(run))
                    run, size = [], 0
        if run:
            parts.append(FilesPartition(run))
        if "event_time" in self.columns:
            clocks = {rec.path: wall_clock_offset(rec) for rec in recs}
            parts = [FilesPartition(p.files, clocks) for p in parts]
        if not parts and not self.skip_empty and not self.keep:
            from visionipc.apps.pipeline.read import RecordingError

            raise RecordingError(f"no complete segment in {', '.join(self.paths)}")
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:  # Arrow record batches
        assert isinstance(partition, FilesPartition)  # made by partitions()
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from visionipc.apps.record.checks import reading

        filters = [("frame_id", op, v) for op, v in self.frame_filters] or None
        extra = {"recording_id", "recording_path", "event_time"}
        wanted = [c for c in self.columns if c not in extra]
        if "event_time" in self.columns and "receive_time" not in wanted:
            wanted.append("receive_time")
        # the metric columns are read where a file has them, null where not
        schema = QUALITY_ARROW_SCHEMA if set(wanted) & set(METRIC_COLUMNS) else INDEX_ARROW_SCHEMA
        for recording_id, recording_path, index_file in partition.files:
            filesystem, path = fs.resolve(index_file)
            with reading(index_file):
                table = pq.read_table(path, schema=schema, columns=wanted, filters=filters, filesystem=filesystem)
            n = len(table)
            if n == 0:
                continue
            names = {"recording_id": recording_id, "recording_path": recording_path}
            values = {c: pa.repeat(pa.scalar(v), n) for c, v in names.items()}
            if "event_time" in self.columns:
                ns = pc.add(table.column("receive_time"), partition.clocks.get(recording_path, 0))
                values["event_time"] = ns.cast(pa.timestamp("ns")).cast(pa.timestamp("us", tz="UTC"), safe=False)
            arrays = [values[c] if c in extra else table.column(c) for c in self.columns]
            yield from pa.table(arrays, names=self.columns).to_batches()


class VipcDataSource(DataSource):
    """Options: ``path`` (from ``load``) and/or ``paths`` (comma-separated), ``skip_empty``,
    ``partition_bytes``, ``frame_metrics`` (the recorder's metric columns in the default schema),
    ``event_time`` (the frame's wall-clock receive time in the default schema). Read in batches
    (``spark.read``) or as a stream of segments as recorders complete them (``spark.readStream``)."""

    @classmethod
    def name(cls) -> str:
        return "vipc"

    def schema(self) -> str:
        base = SCHEMA_WITH_METRICS if _true(self.options.get("frame_metrics")) else SCHEMA
        return base + (EVENT_TIME if _true(self.options.get("event_time")) else "")

    def streamReader(self, schema: StructType) -> VipcStreamReader:  # noqa: N802 - PySpark's name
        from visionipc.apps.pipeline.stream import VipcStreamReader

        return VipcStreamReader(self._paths(), _true(self.options.get("skip_empty", "true")), self._columns(schema))

    def _paths(self) -> List[str]:
        paths = [p for key in ("path", "paths") for p in self.options.get(key, "").split(",") if p]
        if not paths:
            raise ValueError('spark.read.format("vipc") needs a recording: .load(PATH) or .option("paths", "a,b")')
        return paths

    def _columns(self, schema: Union[StructType, str]) -> List[str]:
        columns = [f.name for f in schema.fields] if hasattr(schema, "fields") else _names(schema)
        unknown = set(columns) - set(_names(SCHEMA_WITH_METRICS + EVENT_TIME))
        if unknown:
            raise ValueError(
                f'spark.read.format("vipc"): no column(s) {sorted(unknown)} (the index has {SCHEMA_WITH_METRICS})'
            )
        return columns

    def reader(self, schema: StructType) -> VipcReader:
        return VipcReader(
            self._paths(),
            _true(self.options.get("skip_empty")),
            int(self.options.get("partition_bytes", PARTITION_BYTES)),
            self._columns(schema),
        )


def wall_clock_offset(recording: Recording) -> int:
    """ns to add to the recording's ``receive_time`` (the recorder's clock) for Unix time:
    recording.json's start ``wall_time`` - ``monotonic_ns``; 0 where it has no start."""
    import datetime

    from visionipc.apps.pipeline.read import recording_info

    start: Any = recording_info(recording).get("start")  # untrusted: checked by the except below
    try:
        wall = datetime.datetime.fromisoformat(start["wall_time"].replace("Z", "+00:00"))
        if wall.tzinfo is None:
            wall = wall.replace(tzinfo=datetime.timezone.utc)
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return (wall - epoch) // datetime.timedelta(microseconds=1) * 1000 - int(start["monotonic_ns"])
    except (TypeError, KeyError, ValueError, AttributeError):
        return 0


def _true(value: object) -> bool:
    return str(value).lower() == "true"


def _names(ddl: str) -> List[str]:
    return [part.split()[0] for part in ddl.split(",")]


def register(spark: SparkSession) -> None:
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(VipcDataSource)
