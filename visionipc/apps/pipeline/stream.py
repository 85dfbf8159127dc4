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
A batch takes the segments listed now that are inside its end offset's runs and not its
start's (runs_of/unranges: never expanded, so an offset edited by hand, "0-999999999999",
costs what the listing costs; a malformed one is a one-line RecordingError).
Every new index file is checked on the driver before it is read (read.check_index_file).
"""

from __future__ import annotations

import json
import re
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


RUN = re.compile(r"(\d+)(?:-(\d+))?")


def runs_of(text: str, where: str = "") -> List[Tuple[int, int]]:
    """``"0-2,5"`` -> ``[(0, 2), (5, 5)]``, never expanded; a malformed text (an offset
    edited by hand or corrupt) raises RecordingError, one line naming it."""
    out: List[Tuple[int, int]] = []
    for part in text.split(",") if text else ():
        found = RUN.fullmatch(part)
        lo, hi = (int(found.group(1)), int(found.group(2) or found.group(1))) if found else (0, -1)
        if hi < lo:
            raise RecordingError(
                f"malformed stream offset {text!r}{' for ' + where if where else ''}: expected runs of segment "
                f"numbers such as '0-41,43' (a checkpoint edited by hand or corrupt: start a new --checkpoint)"
            )
        out.append((lo, hi))
    return out


def unranges(text: str, listed: Iterable[int], where: str = "") -> Set[int]:
    """The numbers of ``listed`` inside ``text``'s runs: bounded by what was listed, so a
    range such as ``"0-999999999999"`` costs what the listing costs."""
    runs = runs_of(text, where)
    return {n for n in listed if any(lo <= n <= hi for lo, hi in runs)}


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


def _check_offset(offset: Any) -> Dict[str, Dict[str, str]]:
    """An offset's ``{path: {stream: runs}}``, or RecordingError (one line) if it has not that shape."""
    recordings = offset.get("recordings") if isinstance(offset, dict) else None
    if not isinstance(recordings, dict) or not all(
        isinstance(streams, dict) and all(isinstance(t, str) for t in streams.values())
        for streams in recordings.values()
    ):
        raise RecordingError(
            f"malformed stream offset {json.dumps(offset)[:200]}: expected "
            '{"recordings": {path: {stream: "0-41,43"}}} (a checkpoint edited by hand or corrupt: '
            "start a new --checkpoint)"
        )
    return recordings


def new_files(start: Optional[Offset], end: Offset) -> List[Tuple[str, str, int]]:
    """``[(recording_path, stream, segment)]`` complete at ``end`` and not at ``start``: of
    the segments listed now (a replayed batch's are still there), so the offsets' runs are
    never expanded; only the recordings whose runs changed are listed."""
    before, after = _check_offset(start or {"recordings": {}}), _check_offset(end)
    out: List[Tuple[str, str, int]] = []
    for path, streams in sorted(after.items()):
        changed = {s: t for s, t in streams.items() if before.get(path, {}).get(s) != t}
        if not changed:
            continue
        listed: Dict[str, List[int]] = {}
        for stream, segment, _ in Recording("", path).index_files():
            listed.setdefault(stream, []).append(segment)
        for stream, text in sorted(changed.items()):
            where = f"{path} {stream}"
            segments = listed.get(stream, [])
            seen = unranges(before.get(path, {}).get(stream, ""), segments, where)
            out += [(path, stream, s) for s in sorted(unranges(text, segments, where) - seen)]
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
