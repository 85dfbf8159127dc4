"""Stream health: frame rate, drops, latency, jitter and stalls of each stream.

The statistics are pure functions over the pandas frame index of one stream of
one recording (``stream_health``, ``find_drops``); ``health_job`` runs the same
function per recording x stream through Spark's ``applyInPandas`` and
``health_pandas`` runs it without Spark, so both give identical numbers.

Conventions: a stream's frames are taken in recorded order (segment, position);
frame rates come from ``timestamp_eof`` (the camera's clock, untouched by
delivery delays): ``fps`` is the producer's rate (1 / the median interval between
consecutive frame ids, robust to drops and to a late first frame),
``received_fps`` the frames recorded per second over the whole stream; latency is
``receive_time - timestamp_eof``, exposure is ``timestamp_eof - timestamp_sof``; percentiles are numpy's (linear
interpolation); times in ms unless a name says otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from visionipc.apps.pipeline.read import Recordings

KEYS = ["recording_id", "stream"]
PERCENTILES = (50, 95, 99)

# (name, numpy dtype, Spark SQL type) of every column stream_health returns
HEALTH_COLUMNS = [
    ("recording_id", "object", "string"),
    ("stream", "object", "string"),
    ("frames", "int64", "bigint"),
    ("first_frame_id", "int64", "bigint"),
    ("last_frame_id", "int64", "bigint"),
    ("start_eof_ns", "int64", "bigint"),
    ("duration_s", "float64", "double"),
    ("fps", "float64", "double"),
    ("received_fps", "float64", "double"),
    ("fps_min", "float64", "double"),
    ("dropped", "int64", "bigint"),
    ("drop_gaps", "int64", "bigint"),
    ("out_of_order", "int64", "bigint"),
    ("dropped_frame_ids", "object", "array<bigint>"),
    *[(f"latency_p{p}_ms", "float64", "double") for p in PERCENTILES],
    ("latency_max_ms", "float64", "double"),
    *[(f"exposure_p{p}_ms", "float64", "double") for p in PERCENTILES],
    ("exposure_max_ms", "float64", "double"),
    ("interval_mean_ms", "float64", "double"),
    ("jitter_ms", "float64", "double"),
    ("eof_jitter_ms", "float64", "double"),
    ("longest_stall_ms", "float64", "double"),
    ("stall_before_frame_id", "int64", "bigint"),
]
DROP_COLUMNS = [
    ("recording_id", "object", "string"),
    ("stream", "object", "string"),
    ("after_frame_id", "int64", "bigint"),
    ("next_frame_id", "int64", "bigint"),
    ("missing", "int64", "bigint"),
    ("t_s", "float64", "double"),
    ("segment", "int32", "int"),
    ("position", "int32", "int"),
]
TIMELINE_COLUMNS = [
    ("recording_id", "object", "string"),
    ("stream", "object", "string"),
    ("second", "int64", "bigint"),
    ("frames", "int64", "bigint"),
]


def spark_schema(columns: Sequence[Tuple[str, str, str]]) -> str:
    """``(name, pandas dtype, Spark SQL type)`` columns as a Spark DDL schema."""
    return ", ".join(f"{name} {sql}" for name, _, sql in columns)


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype, _ in columns})


_ORDER = ["frame_id", "timestamp_sof", "timestamp_eof", "receive_time", "segment", "position"]


def _recorded_order(segment: np.ndarray, position: np.ndarray, *keys: np.ndarray):
    """Indices that put rows in recorded order (``keys``..., segment, position; stable),
    or None when they already are (the common case: files are read in that order)."""
    cols = [*keys, segment, position]
    if len(segment) > 1:
        ok = np.zeros(len(segment) - 1, bool)  # row i+1 is after row i
        tie = np.ones(len(segment) - 1, bool)
        for col in cols:
            d = np.diff(col)
            ok |= tie & (d > 0)
            tie &= d == 0
        if (ok | tie).all():
            return None
        return np.lexsort(cols[::-1])
    return None


def _arrays(index: pd.DataFrame) -> dict:
    """The numeric columns of one stream as int64 numpy arrays, in recorded order."""
    cols = {name: index[name].to_numpy(np.int64) for name in _ORDER}
    order = _recorded_order(cols["segment"], cols["position"])
    return cols if order is None else {name: col[order] for name, col in cols.items()}


def _ms(ns) -> np.ndarray:
    return np.asarray(ns, dtype=np.int64) / 1e6


def _quantiles(values_ms: np.ndarray) -> list:
    if len(values_ms) == 0:
        return [np.nan] * (len(PERCENTILES) + 1)
    return [float(v) for v in np.percentile(values_ms, PERCENTILES)] + [float(values_ms.max())]


def _fps_min(eof_ns: np.ndarray, fallback: float) -> float:
    """The lowest rate over any run of ~one second of received frames (k = round(rate)
    intervals, so a steady stream gives exactly its rate and a drop or stall lowers it)."""
    k = int(round(fallback)) if np.isfinite(fallback) else 0
    if k < 1 or len(eof_ns) <= k:
        return fallback
    spans = eof_ns[k:] - eof_ns[:-k]
    return float(k * 1e9 / spans.max())


def _gaps(ids: np.ndarray) -> np.ndarray:
    """Positions i (in recorded order) where frame ids i and i+1 have a gap between them."""
    return np.flatnonzero(np.diff(ids) > 1)


def _missing_ids(after: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Every frame id strictly between after[k] and nxt[k], for all k, in order."""
    counts = nxt - after - 1
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64)
    starts = np.cumsum(counts) - counts  # where gap k's ids begin in the output
    return np.repeat(after + 1 - starts, counts) + np.arange(total, dtype=np.int64)


def _drops_of(recording_id, stream, c: dict) -> pd.DataFrame:
    ids, eof = c["frame_id"], c["timestamp_eof"]
    gap = _gaps(ids)
    out = pd.DataFrame(
        {
            "recording_id": pd.Series([recording_id] * len(gap), dtype=object),
            "stream": pd.Series([stream] * len(gap), dtype=object),
            "after_frame_id": ids[gap],
            "next_frame_id": ids[gap + 1],
            "missing": ids[gap + 1] - ids[gap] - 1,
            "t_s": (eof[gap] - eof.min()) / 1e9,
            "segment": c["segment"][gap + 1].astype(np.int32),
            "position": c["position"][gap + 1].astype(np.int32),
        }
    )
    return out.astype({name: dtype for name, dtype, _ in DROP_COLUMNS})


def find_drops(index: pd.DataFrame) -> pd.DataFrame:
    """One row per gap in ``frame_id`` of one stream: the frames around it, how many are
    missing, when (seconds after the stream's first frame) and where the frame after the
    gap lies in the recording (segment, position)."""
    if len(index) == 0:
        return _empty(DROP_COLUMNS)
    return _drops_of(index["recording_id"].iloc[0], index["stream"].iloc[0], _arrays(index))


def _health_of(recording_id, stream, c: dict) -> pd.DataFrame:
    """``stream_health`` on the int64 columns ``c`` of one non-empty stream in recorded order."""
    ids, sof, eof, recv = c["frame_id"], c["timestamp_sof"], c["timestamp_eof"], c["receive_time"]
    n = len(ids)
    step = np.diff(ids)
    consecutive = step == 1
    any_consecutive = bool(consecutive.any())
    eof_min = int(eof.min())
    duration_ns = int(eof.max()) - eof_min
    duration_s = duration_ns / 1e9
    received_fps = (n - 1) / duration_s if duration_ns > 0 else np.nan
    eof_gap_ns = np.diff(eof)[consecutive]
    median_gap = float(np.median(eof_gap_ns)) if len(eof_gap_ns) else np.nan
    fps = 1e9 / median_gap if len(eof_gap_ns) and median_gap > 0 else np.nan
    recv_gap_ms = _ms(np.diff(recv))
    gap = _gaps(ids)
    after, nxt = ids[gap], ids[gap + 1]
    stall = int(np.argmax(recv_gap_ms)) if n > 1 else -1
    sorted_eof = eof if n < 2 or (eof[1:] >= eof[:-1]).all() else np.sort(eof)
    row = {
        "recording_id": recording_id,
        "stream": stream,
        "frames": n,
        "first_frame_id": int(ids[0]),
        "last_frame_id": int(ids[-1]),
        "start_eof_ns": eof_min,
        "duration_s": duration_s,
        "fps": float(fps),
        "received_fps": float(received_fps),
        "fps_min": _fps_min(sorted_eof, float(received_fps)),
        "dropped": int((nxt - after - 1).sum()),
        "drop_gaps": len(gap),
        "out_of_order": int((step <= 0).sum()),
        "dropped_frame_ids": [_missing_ids(after, nxt)],
        **dict(zip([f"latency_p{p}_ms" for p in PERCENTILES] + ["latency_max_ms"], _quantiles(_ms(recv - eof)))),
        **dict(zip([f"exposure_p{p}_ms" for p in PERCENTILES] + ["exposure_max_ms"], _quantiles(_ms(eof - sof)))),
        "interval_mean_ms": float(recv_gap_ms[consecutive].mean()) if any_consecutive else np.nan,
        "jitter_ms": float(recv_gap_ms[consecutive].std()) if any_consecutive else np.nan,
        "eof_jitter_ms": float(_ms(eof_gap_ns).std()) if any_consecutive else np.nan,
        "longest_stall_ms": float(recv_gap_ms[stall]) if stall >= 0 else 0.0,
        "stall_before_frame_id": int(ids[stall + 1]) if stall >= 0 else int(ids[0]),
    }
    return pd.DataFrame(row, index=[0]).astype({name: dtype for name, dtype, _ in HEALTH_COLUMNS})


def stream_health(index: pd.DataFrame) -> pd.DataFrame:
    """The health of one stream of one recording, as a one-row frame (``HEALTH_COLUMNS``)."""
    if len(index) == 0:
        return _empty(HEALTH_COLUMNS)
    return _health_of(index["recording_id"].iloc[0], index["stream"].iloc[0], _arrays(index))


def fps_timeline(index: pd.DataFrame, start_eof_ns: int | None = None) -> pd.DataFrame:
    """Frames per whole second (by ``timestamp_eof``) since the stream's first frame."""
    if len(index) == 0:
        return _empty(TIMELINE_COLUMNS)
    eof = index["timestamp_eof"].to_numpy(np.int64)
    start = eof.min() if start_eof_ns is None else start_eof_ns
    seconds, counts = np.unique((eof - start) // 1_000_000_000, return_counts=True)
    return pd.DataFrame(
        {
            "recording_id": index["recording_id"].iloc[0],
            "stream": index["stream"].iloc[0],
            "second": seconds.astype(np.int64),
            "frames": counts.astype(np.int64),
        }
    )


def _streams(index: pd.DataFrame):
    """(recording_id, stream, int64 columns in recorded order) of every recording x stream,
    in key order, like ``groupby(KEYS, sort=True)`` but one pass of numpy over the index."""
    rec_codes, rec_names = pd.factorize(index["recording_id"], sort=True)
    stream_codes, stream_names = pd.factorize(index["stream"], sort=True)
    key = rec_codes.astype(np.int64) * max(1, len(stream_names)) + stream_codes
    cols = {name: index[name].to_numpy(np.int64) for name in _ORDER}
    keep = (rec_codes >= 0) & (stream_codes >= 0)  # groupby drops rows with a missing key
    if not keep.all():
        key = key[keep]
        cols = {name: col[keep] for name, col in cols.items()}
    order = _recorded_order(cols["segment"], cols["position"], key)
    if order is not None:
        key = key[order]
        cols = {name: col[order] for name, col in cols.items()}
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)]
    width = max(1, len(stream_names))
    for lo, hi in zip(starts, ends):
        k = int(key[lo])
        yield rec_names[k // width], stream_names[k % width], {name: col[lo:hi] for name, col in cols.items()}


def _per_stream(index: pd.DataFrame, fn, columns) -> pd.DataFrame:
    parts = [fn(group) for _, group in index.groupby(KEYS, sort=True)]
    return pd.concat(parts, ignore_index=True) if parts else _empty(columns)


def _per_stream_arrays(index: pd.DataFrame, fn, columns) -> pd.DataFrame:
    parts = [fn(rid, stream, c) for rid, stream, c in _streams(index)] if len(index) else []
    return pd.concat(parts, ignore_index=True) if parts else _empty(columns)


def health_pandas(index: pd.DataFrame) -> pd.DataFrame:
    """``stream_health`` of every recording x stream in a pandas index (no Spark)."""
    return _per_stream_arrays(index, _health_of, HEALTH_COLUMNS)


def drops_pandas(index: pd.DataFrame) -> pd.DataFrame:
    return _per_stream_arrays(index, _drops_of, DROP_COLUMNS)


def timeline_pandas(index: pd.DataFrame) -> pd.DataFrame:
    return _per_stream(index, fps_timeline, TIMELINE_COLUMNS)


_NEEDED = [
    "recording_id",
    "stream",
    "frame_id",
    "timestamp_sof",
    "timestamp_eof",
    "receive_time",
    "segment",
    "position",
]


def health_job(index_df: DataFrame) -> DataFrame:
    """Spark: index DataFrame -> one health row per recording x stream (``stream_health``)."""
    return index_df.select(*_NEEDED).groupBy(*KEYS).applyInPandas(stream_health, spark_schema(HEALTH_COLUMNS))


def drops_job(index_df: DataFrame) -> DataFrame:
    """Spark: index DataFrame -> one row per gap in frame_id (``find_drops``)."""
    return index_df.select(*_NEEDED).groupBy(*KEYS).applyInPandas(find_drops, spark_schema(DROP_COLUMNS))


def timeline_job(index_df: DataFrame) -> DataFrame:
    """Spark: index DataFrame -> frames per second per recording x stream (``fps_timeline``)."""
    return (
        index_df.select("recording_id", "stream", "timestamp_eof")
        .groupBy(*KEYS)
        .applyInPandas(lambda index: fps_timeline(index), spark_schema(TIMELINE_COLUMNS))
    )


def _per_stream_files(fn, arrays_fn=None):
    """A mapInPandas body: each input row names one recording x stream and its index files;
    ``fn`` runs on that stream's whole index (read here, with pyarrow), or ``arrays_fn``
    (recording_id, stream, int64 columns in recorded order) when given: then only those
    columns are read and no pandas frame of the index is made."""

    def run(streams):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from visionipc.apps.pipeline.read import INDEX_ARROW_SCHEMA

        columns = ["stream", *_ORDER] if arrays_fn else _NEEDED[1:]
        for batch in streams:
            for row in batch.itertuples(index=False):
                table = pa.concat_tables(
                    [pq.read_table(f, schema=INDEX_ARROW_SCHEMA, columns=columns) for f in row.index_files]
                )
                if arrays_fn is None:
                    index = table.to_pandas()
                    index.insert(0, "recording_id", row.recording_id)
                    out = fn(index)
                elif table.num_rows:
                    stream = table.column("stream")[0].as_py()  # as stream_health would see it
                    cols = {name: table.column(name).to_numpy().astype(np.int64, copy=False) for name in _ORDER}
                    order = _recorded_order(cols["segment"], cols["position"])
                    if order is not None:
                        cols = {name: col[order] for name, col in cols.items()}
                    out = arrays_fn(row.recording_id, stream, cols)
                else:
                    continue
                if len(out):
                    yield out

    return run


def streams_df(
    spark: SparkSession, recordings: Recordings, *, skip_empty: bool = False, validate: bool = True
) -> DataFrame:
    """One row per recording x stream with its index files, spread over a few tasks per core."""
    from visionipc.apps.pipeline.read import _recordings, index_files

    by_stream: Dict[Tuple[str, str], List[str]] = {}  # (recording id, stream) -> its index files
    for rec, stream, _, path in index_files(_recordings(recordings), skip_empty=skip_empty, validate=validate):
        by_stream.setdefault((rec.recording_id, stream), []).append(path)
    from visionipc.apps.pipeline import tasks

    rows = [(rid, stream, files) for (rid, stream), files in sorted(by_stream.items())]
    schema = "recording_id string, stream string, index_files array<string>"
    return tasks.rows_df(spark, rows, schema, tasks.parallelism(spark) * 4)


def health_from_files(streams: DataFrame) -> DataFrame:
    """``health_job`` without a shuffle: each task reads its streams' index files itself
    (``streams_df``) and runs ``stream_health``. Same rows; several times faster on big
    indexes, since the index never goes through Spark's shuffle."""
    return streams.mapInPandas(_per_stream_files(stream_health, _health_of), spark_schema(HEALTH_COLUMNS))


def drops_from_files(streams: DataFrame) -> DataFrame:
    """``drops_job`` without a shuffle (see ``health_from_files``)."""
    return streams.mapInPandas(_per_stream_files(find_drops, _drops_of), spark_schema(DROP_COLUMNS))


def timeline_from_files(streams: DataFrame) -> DataFrame:
    """``timeline_job`` without a shuffle (see ``health_from_files``)."""
    return streams.mapInPandas(_per_stream_files(fps_timeline), spark_schema(TIMELINE_COLUMNS))
