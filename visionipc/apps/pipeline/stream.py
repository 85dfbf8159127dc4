"""``spark.readStream.format("vipc")``: recordings followed as they grow, a Structured
Streaming source (PySpark 4 Python data source).

    rows = spark.readStream.format("vipc").option("event_time", "true").load("fleet/")
    rows.withWatermark("event_time", "5 minutes").groupBy(window("event_time", "1 minute"), "stream").count()

Each micro-batch holds the index rows (the batch source's columns, datasource.py) of the
segments recorders completed since the last one, in every recording found under the paths
(new recordings included), locally or on s3:// (fs.py). A segment is complete when its
index file ``index/<stream>/NNNNNN.parquet`` exists: vipc-record writes it under a hidden
``.partial`` name and renames it last, so a segment being written is never read half-done.

Offsets name the complete segments: ``{"recordings": {path: {stream: "0-41,43"}}}`` (runs
of segment numbers), so a batch is the difference of two listings, the same files when
Spark plans it again after a restart from its checkpoint: no segment read twice or lost.
Every new index file is checked on the driver before it is read (read.check_index_file).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from visionipc.apps.pipeline import fs
from visionipc.apps.pipeline.datasource import PARTITION_BYTES, FilesPartition, VipcReader, wall_clock_offset
from visionipc.apps.pipeline.read import Recording, find_recordings
from visionipc.apps.record import layout
from visionipc.apps.record.checks import RecordingError

FILES_PER_PARTITION = 64
Offset = Dict[str, Any]  # {"recordings": {path: {stream: ranges}}}


def ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: List[List[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def unranges(text: str) -> Set[int]:
    out: Set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def discover(paths: Iterable[str]) -> List[str]:
    """The recordings under ``paths`` now; a folder with none yet is not an error (a fleet
    folder before its first recording), a missing path is (FileNotFoundError)."""
    found: List[str] = []
    for item in paths:
        try:
            found += [r.path for r in find_recordings([item])]
        except RecordingError:
            if not fs.isdir(fs.normalize(item)):
                raise
    return sorted(set(found))


def snapshot(paths: Iterable[str]) -> Offset:
    """The offset of what is complete now: ``{"recordings": {path: {stream: ranges}}}``."""
    recordings: Dict[str, Dict[str, str]] = {}
    for path in discover(paths):
        streams: Dict[str, List[int]] = {}
        for stream, segment, _ in Recording("", path).index_files():
            streams.setdefault(stream, []).append(segment)
        if streams:
            recordings[path] = {s: ranges(segs) for s, segs in sorted(streams.items())}
    return {"recordings": recordings}


def new_files(start: Optional[Offset], end: Offset) -> List[Tuple[str, str, int]]:
    """``[(recording_path, stream, segment)]`` complete at ``end`` and not at ``start``."""
    before = (start or {}).get("recordings", {})
    out: List[Tuple[str, str, int]] = []
    for path, streams in sorted(end.get("recordings", {}).items()):
        for stream, text in sorted(streams.items()):
            seen = unranges(before.get(path, {}).get(stream, ""))
            out += [(path, stream, s) for s in sorted(unranges(text) - seen)]
    return out


def index_path(recording_path: str, stream: str, segment: int) -> str:
    return fs.join(recording_path, layout.index_file(stream, segment))


class VipcStreamReader(DataSourceStreamReader):
    """The stream reader of ``VipcDataSource`` (datasource.py); reads with its batch reader."""

    def __init__(self, paths: List[str], skip_empty: bool, columns: List[str]) -> None:
        for p in paths:
            if not fs.exists(fs.normalize(p)):
                raise FileNotFoundError(f"no such recording or folder: {p!r}")
        self.paths, self.columns = paths, columns
        self._batch = VipcReader(paths, skip_empty, PARTITION_BYTES, columns)

    def initialOffset(self) -> Offset:  # noqa: N802 - PySpark's names
        return {"recordings": {}}

    def latestOffset(self, start: Optional[Offset] = None, limit: Any = None) -> Offset:  # noqa: N802 - (start, limit): PySpark 4.2+
        return snapshot(self.paths)

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        from visionipc.apps.pipeline.read import check_index_file

        new = new_files(start, end)
        if not new:
            return []
        # the names a batch run gives the same recordings (read.find_recordings)
        names = {r.path: r.recording_id for r in find_recordings(sorted(end["recordings"]))}
        files = [(names[p], p, index_path(p, stream, seg)) for p, stream, seg in new]
        for _, path, f in files:
            check_index_file(f, path)
        clocks: Dict[str, int] = {}
        if "event_time" in self.columns:
            clocks = {p: wall_clock_offset(Recording(names[p], p)) for p in {p for _, p, _ in files}}
        return [
            FilesPartition(files[i : i + FILES_PER_PARTITION], clocks)
            for i in range(0, len(files), FILES_PER_PARTITION)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return self._batch.read(partition)

    def commit(self, end: Offset) -> None:
        """Nothing to release: recordings are only read."""
