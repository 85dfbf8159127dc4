"""The vipc-analyze jobs as cluster work: each task reads its own index files and video
segments (Python-side I/O, fs.py: local paths and URIs alike), computes in parallel and
hands back small results (Arrow IPC payloads the driver collects) or writes its part of
a big result (per-frame metrics, exported images) into the run folder itself. Nothing is
squeezed into one task; the driver writes the small tables once.

``health_pass``: one task per few streams -> health, drops, fps timeline, latency
histogram (per recording x stream) in one read of the index. ``metrics_pass``: segments
in order, decoded where they run -> ``metrics/recording_id=R/stream=S/part-NNNNNN.parquet``
plus summaries and a sample. ``export_pass``: selected frames -> ``export/R/S/ID.jpg``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import quote

import numpy as np
import pandas as pd

from visionipc.apps.pipeline import fs, health, tasks
from visionipc.apps.pipeline.choices import DROPS, EVERY, IMAGE_FORMATS, SHARP
from visionipc.apps.pipeline.frames import Segment, iter_pictures, read_segment_index

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from visionipc.apps.pipeline.read import IndexFile

Columns = Dict[str, np.ndarray]  # a stream's int64 index columns in recorded order
Frames = Dict[str, Optional[pd.DataFrame]]  # kind -> its rows (None: no rows of that kind)

TASKS_PER_SLOT = 4
SAMPLE_ROWS = 50_000  # metric values kept for the report's distributions
# latency histogram bins: 0, then log-spaced 0.1 ms .. 10 s, the last bin everything above
LATENCY_EDGES_MS = np.r_[0.0, np.geomspace(0.1, 10_000.0, 60)]


# ---- health ---------------------------------------------------------------------------

TIMELINE_COLUMNS = health.TIMELINE_COLUMNS + [("fps_lowest", "float64", "double")]
LATENCY_COLUMNS = [
    ("recording_id", "object", "string"),
    ("stream", "object", "string"),
    ("bin", "int64", "bigint"),
    ("lo_ms", "float64", "double"),
    ("count", "int64", "bigint"),
]
EVENT_COLUMNS = [
    ("recording_id", "object", "string"),
    ("stream", "object", "string"),
    ("event", "object", "string"),
    ("frame_id", "int64", "bigint"),
    ("t_s", "float64", "double"),
    ("value_ms", "float64", "double"),
    ("typical_ms", "float64", "double"),
]
MAX_EVENTS = 1000  # per stream and kind: the worst ones
HEALTH_KINDS = {
    "health": health.HEALTH_COLUMNS,
    "drops": health.DROP_COLUMNS,
    "timeline": TIMELINE_COLUMNS,
    "latency": LATENCY_COLUMNS,
    "events": EVENT_COLUMNS,
}


def events_of(recording_id: str, stream: str, c: Columns) -> pd.DataFrame:
    """Stalls and delays of one stream, like drops: a ``stall`` is a receive interval between
    consecutive frame ids over twice the median interval (value: the interval), a ``delay``
    a frame whose latency exceeds the median latency by more than one median interval
    (value: its latency); typical_ms is the median they are compared with."""
    ids, eof, recv = c["frame_id"], c["timestamp_eof"], c["receive_time"]
    t0 = eof.min() if len(eof) else 0
    parts = []
    consecutive = np.flatnonzero(np.diff(ids) == 1)
    if len(consecutive):
        gap = (recv[consecutive + 1] - recv[consecutive]) / 1e6
        period = float(np.median(gap))
        lat = (recv - eof) / 1e6
        typical_lat = float(np.median(lat))
        for event, where, value, typical, limit in (
            ("stall", consecutive + 1, gap, period, 2 * period),
            ("delay", np.arange(len(ids)), lat, typical_lat, typical_lat + period),
        ):
            hit = np.flatnonzero(value > limit)
            hit = hit[np.argsort(-value[hit], kind="stable")[:MAX_EVENTS]]
            hit.sort()
            rows = where[hit]
            parts.append(
                pd.DataFrame(
                    {
                        "event": event,
                        "frame_id": ids[rows],
                        "t_s": (eof[rows] - t0) / 1e9,
                        "value_ms": value[hit],
                        "typical_ms": typical,
                    }
                )
            )
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[n for n, _, _ in EVENT_COLUMNS[2:]])
    out.insert(0, "stream", stream)
    out.insert(0, "recording_id", recording_id)
    return out.astype({name: dtype for name, dtype, _ in EVENT_COLUMNS})


def timeline_of(recording_id: str, stream: str, c: Columns) -> pd.DataFrame:
    """Frames per whole second since the stream's first frame, and the lowest frame rate
    within that second (1 / the longest frame interval ending in it: a 3-frame drop at 30
    fps shows as 7.5 fps there, where the count only dips to 27)."""
    eof = np.sort(c["timestamp_eof"])
    second = (eof - eof[0]) // 1_000_000_000
    seconds, counts = np.unique(second, return_counts=True)
    lowest = np.full(len(seconds), np.nan)
    if len(eof) > 1:
        interval = np.diff(eof)
        rate = np.where(interval > 0, 1e9 / np.maximum(interval, 1), np.nan)
        where = np.searchsorted(seconds, second[1:])
        lowest_by = pd.Series(rate).groupby(where).min()
        lowest[lowest_by.index.to_numpy()] = lowest_by.to_numpy()
    return pd.DataFrame(
        {
            "recording_id": pd.Series([recording_id] * len(seconds), dtype=object),
            "stream": pd.Series([stream] * len(seconds), dtype=object),
            "second": seconds.astype(np.int64),
            "frames": counts.astype(np.int64),
            "fps_lowest": lowest,
        }
    )


def latency_of(recording_id: str, stream: str, c: Columns) -> pd.DataFrame:
    lat = (c["receive_time"] - c["timestamp_eof"]) / 1e6
    b = np.clip(np.searchsorted(LATENCY_EDGES_MS, lat, side="right") - 1, 0, len(LATENCY_EDGES_MS) - 1)
    bins, counts = np.unique(b, return_counts=True)
    return pd.DataFrame(
        {
            "recording_id": pd.Series([recording_id] * len(bins), dtype=object),
            "stream": pd.Series([stream] * len(bins), dtype=object),
            "bin": bins.astype(np.int64),
            "lo_ms": LATENCY_EDGES_MS[bins],
            "count": counts.astype(np.int64),
        }
    )


def _read_stream(folder: str, files) -> dict:
    """The int64 columns health needs of one stream's index files, in recorded order; each
    file checked as it is read (read.read_index_file: the driver only listed it)."""
    import pyarrow as pa

    from visionipc.apps.pipeline.read import read_index_file
    from visionipc.apps.record.checks import reading

    tables = []
    for f in files:
        with reading(f):  # whatever reading it raises names the file (one line, exit 2)
            tables.append(read_index_file(f, folder, columns=health._ORDER))
    table = pa.concat_tables(tables)
    cols = {n: table.column(n).to_numpy().astype(np.int64, copy=False) for n in health._ORDER}
    order = health._recorded_order(cols["segment"], cols["position"])
    return cols if order is None else {n: col[order] for n, col in cols.items()}


def _concat(frames: list) -> pd.DataFrame:
    """One kind's per-stream frames (same columns and dtypes) as one frame; empty ones add no rows."""
    rows = [f for f in frames if len(f)]
    return pd.concat(rows, ignore_index=True) if rows else frames[0]


def _health_task(rows):
    """A task's (recording_id, stream, recording folder, index_files) -> one (kind, frame) per
    kind: its streams are combined in the task, so the driver gets 5 small tables per task."""
    yield from health_of_streams((rid, stream, _read_stream(folder, files)) for rid, stream, folder, files in rows)


def health_of_streams(streams: Iterable[Tuple[str, str, Columns]]) -> Iterator[Tuple[str, pd.DataFrame]]:
    """``(recording_id, stream, int64 columns)`` of some streams -> ``(kind, frame)`` of each
    of ``HEALTH_KINDS`` (the streams' rows together; a kind none has is left out)."""
    found: Dict[str, List[pd.DataFrame]] = {kind: [] for kind in HEALTH_KINDS}
    for recording_id, stream, c in streams:
        if len(c["frame_id"]) == 0:
            continue
        args = (recording_id, stream, c)
        found["health"].append(health._health_of(*args))
        found["drops"].append(health._drops_of(*args))
        found["timeline"].append(timeline_of(*args))
        found["latency"].append(latency_of(*args))
        found["events"].append(events_of(*args))
    for kind, frames in found.items():
        if frames:
            yield kind, _concat(frames)


def _slices(n: int, slots: int) -> int:
    return max(1, min(n, slots * TASKS_PER_SLOT))


def health_pass(spark: SparkSession, files: Sequence[IndexFile], slots: int) -> Frames:
    """``files``: ``index_files`` rows. -> ``{"health", "drops", "timeline", "latency", "events"}`` pandas.

    One ``mapInArrow`` job over consecutive slices of the streams of about equal numbers of
    index files (tasks.map_rows, tasks.runs: a long recording's stream is not counted as one
    short one's, so no task of long streams is left alone at the end; the streams ride in the
    task's function, no Python rows go through the JVM), results collected as Arrow IPC
    payloads, one Python worker per task; the same on a classic session and on Spark Connect.
    (A ``createDataFrame`` of a Python RDD + ``mapInPandas`` spent 2.4-2.8 s of one core on a
    fresh session's driver before its first task, and a second Python worker per task:
    BENCHMARKS.md, issue 18.)"""
    by_stream: Dict[Tuple[str, str, str], List[str]] = {}
    for rec, stream, _, path in files:
        by_stream.setdefault((rec.recording_id, stream, rec.path), []).append(path)
    rows = [(rid, stream, folder, paths) for (rid, stream, folder), paths in sorted(by_stream.items())]
    weights = [len(paths) for _, _, _, paths in rows]  # a stream's work goes with its segments
    got = tasks.collect(tasks.map_rows(spark, rows, _slices(len(rows), slots), _health_task, weights), HEALTH_KINDS)
    return {k: (v if v is not None else health._empty(HEALTH_KINDS[k])) for k, v in got.items()}


# ---- metrics --------------------------------------------------------------------------


def partition_dir(root: str, recording_id: str, stream: str) -> str:
    """Hive-style partition folder (values URI-encoded, as pyarrow/Spark decode them)."""
    return fs.join(root, f"recording_id={quote(recording_id, safe='')}", f"stream={quote(stream, safe='')}")


def _metrics_task(out_root: str, dates: dict, sample_every: int, thresholds: dict):
    def run(segments):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from visionipc.apps.pipeline.metrics import _carrying

        fn = _carrying(**thresholds)
        summaries, samples = [], []
        for segment in segments:
            m = fn(segment)
            if not len(m):
                continue
            m["date"] = pd.Series([dates.get(segment["recording_id"])] * len(m), dtype="string")
            part = fs.join(
                partition_dir(out_root, segment["recording_id"], segment["stream"]),
                f"part-{int(segment['segment']):06d}.parquet",
            )
            filesystem, path = fs.resolve(part)
            fs.makedirs_below(out_root, part.rsplit("/", 1)[0])
            pq.write_table(
                pa.Table.from_pandas(m.drop(columns=["recording_id", "stream"]), preserve_index=False),
                path,
                filesystem=filesystem,
            )
            summary = pd.DataFrame(
                {
                    "recording_id": [segment["recording_id"]],
                    "stream": [segment["stream"]],
                    "frames": [len(m)],
                    "brightness_sum": [m["brightness"].sum()],
                    "contrast_sum": [m["contrast"].sum()],
                    "sharpness_sum": [m["sharpness"].sum()],
                    "motion_sum": [m["motion"].sum()],
                    "motion_frames": [int(m["motion"].notna().sum())],
                    "black_frames": [int(m["black"].sum())],
                    "frozen_frames": [int(m["frozen"].sum())],
                }
            )
            summaries.append(summary)
            samples.append(m.iloc[::sample_every][["stream", "brightness", "contrast", "sharpness", "motion"]])
        if summaries:  # one payload of each per task
            yield "summary", pd.concat(summaries, ignore_index=True)
            yield "sample", pd.concat(samples, ignore_index=True)

    return run


def metrics_pass(
    spark: SparkSession, segments: List[Segment], slots: int, out_root: str, dates: Dict[str, Any], **thresholds: float
) -> Frames:
    """Per-frame metrics of every segment, written by the tasks under ``out_root``
    (partitioned by recording and stream); returns ``{"summary", "sample"}`` pandas."""
    every = max(1, (len(segments) * 200) // SAMPLE_ROWS)  # ~SAMPLE_ROWS of a typical 200-frame segment
    fs.makedirs(out_root)  # the tasks make their folders only below it (fs.makedirs_below)
    task = _metrics_task(out_root, dates, every, thresholds)
    got = tasks.collect(tasks.map_rows(spark, segments, _slices(len(segments), slots), task), ("summary", "sample"))
    s = got["summary"]
    if s is None:
        return {"summary": None, "sample": None}
    s = s.groupby(["recording_id", "stream"], as_index=False, sort=True).sum()
    summary = pd.DataFrame(
        {
            "recording_id": s["recording_id"],
            "stream": s["stream"],
            "frames": s["frames"],
            "brightness_mean": s["brightness_sum"] / s["frames"],
            "contrast_mean": s["contrast_sum"] / s["frames"],
            "sharpness_mean": s["sharpness_sum"] / s["frames"],
            "motion_mean": s["motion_sum"] / s["motion_frames"].where(s["motion_frames"] > 0),
            "black_frames": s["black_frames"],
            "frozen_frames": s["frozen_frames"],
        }
    )
    return {"summary": summary, "sample": got["sample"]}


# ---- export ---------------------------------------------------------------------------


def _positions(segment: dict, rule: tuple, drops: dict, metrics_root: str | None):
    """``{position: reason}`` of the frames of a segment the export rule selects."""
    kind, value = rule
    if kind == SHARP:
        import pyarrow.parquet as pq

        assert metrics_root is not None  # the sharp rule reads the metrics job's output
        part = fs.join(
            partition_dir(metrics_root, segment["recording_id"], segment["stream"]),
            f"part-{int(segment['segment']):06d}.parquet",
        )
        filesystem, path = fs.resolve(part)
        try:
            m = pq.read_table(path, columns=["position", "sharpness", "black"], filesystem=filesystem).to_pandas()
        except FileNotFoundError:
            return {}
        keep = m[(m["sharpness"] >= value) & ~m["black"]]
        return {int(p): SHARP for p in keep["position"]}
    index = read_segment_index(segment["index_file"])
    ids = index["frame_id"].to_numpy(np.int64)
    if kind == EVERY:
        keep = ids % int(value) == 0
        reason = f"every_{int(value)}"
    else:
        gaps = drops.get((segment["recording_id"], segment["stream"]), [])
        keep = np.zeros(len(ids), bool)
        for after, nxt in gaps:
            keep |= ((ids > after - value) & (ids <= after)) | ((ids >= nxt) & (ids < nxt + value))
        reason = "around_drop"
    return {int(p): reason for p in index["position"].to_numpy()[keep]}


def _export_task(out_root: str, rule: tuple, drops: dict, metrics_root, image_format: str):
    def run(segments):
        import cv2

        from visionipc.apps.pipeline.export import image_name, manifest_frame, manifest_row

        rows = []
        for segment in segments:
            reasons = _positions(segment, rule, drops, metrics_root)
            if not reasons:
                continue
            for row, picture in iter_pictures(segment, positions=reasons):
                rel = image_name(segment["recording_id"], segment["stream"], int(row["frame_id"]), image_format)
                ok, data = cv2.imencode(f".{image_format}", picture)
                if not ok:
                    raise OSError(f"could not encode frame {int(row['frame_id'])} as {image_format}")
                fs.write_bytes(fs.join(out_root, rel.replace("\\", "/")), data.tobytes(), below=out_root)
                rows.append(
                    manifest_row(rel, segment["recording_id"], segment["stream"], row, reasons[int(row["position"])])
                )
        if rows:  # one manifest per task
            yield "manifest", manifest_frame(rows)

    return run


def export_pass(
    spark: SparkSession,
    segments: List[Segment],
    slots: int,
    out_root: str,
    rule: Tuple[str, Any],
    *,
    drops: Optional[pd.DataFrame] = None,
    metrics_root: Optional[str] = None,
    image_format: str = IMAGE_FORMATS[0],
) -> pd.DataFrame:
    """Write the frames ``rule`` selects (``("drops", W)``, ``("every", N)``, ``("sharp", S)``)
    under ``out_root``; returns the manifest (pandas)."""
    from visionipc.apps.pipeline.export import MANIFEST_COLUMNS

    gaps: Dict[Tuple[str, str], List[Tuple[int, int]]] = {}
    if drops is not None:
        for r in drops.itertuples(index=False):
            gaps.setdefault((r.recording_id, r.stream), []).append((int(r.after_frame_id), int(r.next_frame_id)))
    if rule[0] == DROPS:
        segments = [s for s in segments if (s["recording_id"], s["stream"]) in gaps]
    if not segments:
        return pd.DataFrame({n: pd.Series(dtype=object) for n, _ in MANIFEST_COLUMNS})
    fs.makedirs(out_root)  # the tasks make their folders only below it (fs.makedirs_below)
    task = _export_task(out_root, rule, gaps, metrics_root, image_format)
    got = tasks.collect(tasks.map_rows(spark, segments, _slices(len(segments), slots), task), ["manifest"])
    m = got["manifest"]
    if m is None:
        return pd.DataFrame({n: pd.Series(dtype=object) for n, _ in MANIFEST_COLUMNS})
    return m.sort_values(["recording_id", "stream", "frame_id"], ignore_index=True)
