"""Stream health: frame rate, drops, latency, jitter and stalls of each stream.

The statistics are pure functions over the pandas frame index of one stream of
one recording (``stream_health``, ``find_drops``); ``health_job`` runs the same
function per recording x stream through Spark's ``applyInPandas`` and
``health_pandas`` runs it without Spark, so both give identical numbers.

Conventions: a stream's frames are taken in recorded order (segment, position);
frame rates come from ``timestamp_eof`` (the camera's clock, untouched by
delivery delays): ``fps`` is the producer's rate (1 / the median interval between
consecutive frame ids, robust to drops and to a late first frame),
``received_fps`` the frames recorded per second over the whole stream; latency is ``receive_time - timestamp_eof``, exposure is
``timestamp_eof - timestamp_sof``; percentiles are numpy's (linear
interpolation); times in ms unless a name says otherwise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ["recording_id", "stream"]
PERCENTILES = (50, 95, 99)

# (name, numpy dtype, Spark SQL type) of every column stream_health returns
HEALTH_COLUMNS = [
    ("recording_id", "object", "string"), ("stream", "object", "string"),
    ("frames", "int64", "bigint"), ("first_frame_id", "int64", "bigint"), ("last_frame_id", "int64", "bigint"),
    ("start_eof_ns", "int64", "bigint"), ("duration_s", "float64", "double"),
    ("fps", "float64", "double"), ("received_fps", "float64", "double"), ("fps_min", "float64", "double"),
    ("dropped", "int64", "bigint"), ("drop_gaps", "int64", "bigint"), ("out_of_order", "int64", "bigint"),
    ("dropped_frame_ids", "object", "array<bigint>"),
    *[(f"latency_p{p}_ms", "float64", "double") for p in PERCENTILES], ("latency_max_ms", "float64", "double"),
    *[(f"exposure_p{p}_ms", "float64", "double") for p in PERCENTILES], ("exposure_max_ms", "float64", "double"),
    ("interval_mean_ms", "float64", "double"), ("jitter_ms", "float64", "double"), ("eof_jitter_ms", "float64", "double"),
    ("longest_stall_ms", "float64", "double"), ("stall_before_frame_id", "int64", "bigint"),
]
DROP_COLUMNS = [
    ("recording_id", "object", "string"), ("stream", "object", "string"),
    ("after_frame_id", "int64", "bigint"), ("next_frame_id", "int64", "bigint"), ("missing", "int64", "bigint"),
    ("t_s", "float64", "double"), ("segment", "int32", "int"), ("position", "int32", "int"),
]
TIMELINE_COLUMNS = [
    ("recording_id", "object", "string"), ("stream", "object", "string"),
    ("second", "int64", "bigint"), ("frames", "int64", "bigint"),
]


def spark_schema(columns) -> str:
    return ", ".join(f"{name} {sql}" for name, _, sql in columns)


def _empty(columns) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype, _ in columns})


def _in_order(index: pd.DataFrame) -> pd.DataFrame:
    return index.sort_values(["segment", "position"], kind="stable", ignore_index=True)


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


def find_drops(index: pd.DataFrame) -> pd.DataFrame:
    """One row per gap in ``frame_id`` of one stream: the frames around it, how many are
    missing, when (seconds after the stream's first frame) and where the frame after the
    gap lies in the recording (segment, position)."""
    if len(index) == 0:
        return _empty(DROP_COLUMNS)
    df = _in_order(index)
    ids = df["frame_id"].to_numpy(np.int64)
    eof = df["timestamp_eof"].to_numpy(np.int64)
    gap = np.flatnonzero(np.diff(ids) > 1)
    out = pd.DataFrame({
        "recording_id": df["recording_id"].iloc[0], "stream": df["stream"].iloc[0],
        "after_frame_id": ids[gap], "next_frame_id": ids[gap + 1],
        "missing": ids[gap + 1] - ids[gap] - 1,
        "t_s": (eof[gap] - eof.min()) / 1e9,
        "segment": df["segment"].to_numpy(np.int32)[gap + 1], "position": df["position"].to_numpy(np.int32)[gap + 1],
    })
    return out.astype({name: dtype for name, dtype, _ in DROP_COLUMNS})


def stream_health(index: pd.DataFrame) -> pd.DataFrame:
    """The health of one stream of one recording, as a one-row frame (``HEALTH_COLUMNS``)."""
    if len(index) == 0:
        return _empty(HEALTH_COLUMNS)
    df = _in_order(index)
    ids = df["frame_id"].to_numpy(np.int64)
    sof = df["timestamp_sof"].to_numpy(np.int64)
    eof = df["timestamp_eof"].to_numpy(np.int64)
    recv = df["receive_time"].to_numpy(np.int64)
    n = len(df)
    step = np.diff(ids)
    consecutive = step == 1
    duration_ns = int(eof.max() - eof.min())
    duration_s = duration_ns / 1e9
    received_fps = (n - 1) / duration_s if duration_ns > 0 else np.nan
    eof_gap_ns = np.diff(eof)[consecutive]
    fps = 1e9 / float(np.median(eof_gap_ns)) if len(eof_gap_ns) and np.median(eof_gap_ns) > 0 else np.nan
    recv_gap_ms = _ms(np.diff(recv))
    drops = find_drops(df)
    stall = int(np.argmax(recv_gap_ms)) if n > 1 else -1
    row = {
        "recording_id": df["recording_id"].iloc[0], "stream": df["stream"].iloc[0],
        "frames": n, "first_frame_id": int(ids[0]), "last_frame_id": int(ids[-1]),
        "start_eof_ns": int(eof.min()), "duration_s": duration_s,
        "fps": float(fps), "received_fps": float(received_fps),
        "fps_min": _fps_min(np.sort(eof), float(received_fps)),
        "dropped": int(drops["missing"].sum()), "drop_gaps": len(drops), "out_of_order": int((step <= 0).sum()),
        "dropped_frame_ids": [np.concatenate([np.arange(a + 1, b, dtype=np.int64)
                                              for a, b in zip(drops["after_frame_id"], drops["next_frame_id"])]
                                             or [np.empty(0, np.int64)])],
        **dict(zip([f"latency_p{p}_ms" for p in PERCENTILES] + ["latency_max_ms"], _quantiles(_ms(recv - eof)))),
        **dict(zip([f"exposure_p{p}_ms" for p in PERCENTILES] + ["exposure_max_ms"], _quantiles(_ms(eof - sof)))),
        "interval_mean_ms": float(recv_gap_ms[consecutive].mean()) if consecutive.any() else np.nan,
        "jitter_ms": float(recv_gap_ms[consecutive].std()) if consecutive.any() else np.nan,
        "eof_jitter_ms": float(_ms(eof_gap_ns).std()) if consecutive.any() else np.nan,
        "longest_stall_ms": float(recv_gap_ms[stall]) if stall >= 0 else 0.0,
        "stall_before_frame_id": int(ids[stall + 1]) if stall >= 0 else int(ids[0]),
    }
    return pd.DataFrame(row, index=[0]).astype({name: dtype for name, dtype, _ in HEALTH_COLUMNS})


def fps_timeline(index: pd.DataFrame, start_eof_ns: int | None = None) -> pd.DataFrame:
    """Frames per whole second (by ``timestamp_eof``) since the stream's first frame."""
    if len(index) == 0:
        return _empty(TIMELINE_COLUMNS)
    eof = index["timestamp_eof"].to_numpy(np.int64)
    start = eof.min() if start_eof_ns is None else start_eof_ns
    seconds, counts = np.unique((eof - start) // 1_000_000_000, return_counts=True)
    return pd.DataFrame({"recording_id": index["recording_id"].iloc[0], "stream": index["stream"].iloc[0],
                         "second": seconds.astype(np.int64), "frames": counts.astype(np.int64)})


def _per_stream(index: pd.DataFrame, fn, columns) -> pd.DataFrame:
    parts = [fn(group) for _, group in index.groupby(KEYS, sort=True)]
    return pd.concat(parts, ignore_index=True) if parts else _empty(columns)


def health_pandas(index: pd.DataFrame) -> pd.DataFrame:
    """``stream_health`` of every recording x stream in a pandas index (no Spark)."""
    return _per_stream(index, stream_health, HEALTH_COLUMNS)


def drops_pandas(index: pd.DataFrame) -> pd.DataFrame:
    return _per_stream(index, find_drops, DROP_COLUMNS)


def timeline_pandas(index: pd.DataFrame) -> pd.DataFrame:
    return _per_stream(index, fps_timeline, TIMELINE_COLUMNS)


_NEEDED = ["recording_id", "stream", "frame_id", "timestamp_sof", "timestamp_eof", "receive_time", "segment", "position"]


def health_job(index_df):
    """Spark: index DataFrame -> one health row per recording x stream (``stream_health``)."""
    return index_df.select(*_NEEDED).groupBy(*KEYS).applyInPandas(stream_health, spark_schema(HEALTH_COLUMNS))


def drops_job(index_df):
    """Spark: index DataFrame -> one row per gap in frame_id (``find_drops``)."""
    return index_df.select(*_NEEDED).groupBy(*KEYS).applyInPandas(find_drops, spark_schema(DROP_COLUMNS))


def timeline_job(index_df):
    """Spark: index DataFrame -> frames per second per recording x stream (``fps_timeline``)."""
    return (index_df.select("recording_id", "stream", "timestamp_eof").groupBy(*KEYS)
            .applyInPandas(lambda index: fps_timeline(index), spark_schema(TIMELINE_COLUMNS)))


def _per_stream_files(fn):
    """A mapInPandas body: each input row names one recording x stream and its index files;
    ``fn`` runs on that stream's whole index (read here, with pyarrow)."""

    def run(streams):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from visionipc.pipeline.read import INDEX_ARROW_SCHEMA

        for batch in streams:
            for row in batch.itertuples(index=False):
                table = pa.concat_tables([pq.read_table(f, schema=INDEX_ARROW_SCHEMA, columns=_NEEDED[1:])
                                          for f in row.index_files])
                index = table.to_pandas()
                index.insert(0, "recording_id", row.recording_id)
                out = fn(index)
                if len(out):
                    yield out

    return run


def streams_df(spark, recordings, *, skip_empty: bool = False, validate: bool = True):
    """One row per recording x stream with its index files, spread over a few tasks per core."""
    from visionipc.pipeline.read import _recordings, index_files

    by_stream = {}
    for rec, stream, _, path in index_files(_recordings(recordings), skip_empty=skip_empty, validate=validate):
        by_stream.setdefault((rec.recording_id, stream), []).append(path)
    rows = [(rid, stream, files) for (rid, stream), files in sorted(by_stream.items())]
    slices = max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4))
    return spark.createDataFrame(spark.sparkContext.parallelize(rows, slices),
                                 "recording_id string, stream string, index_files array<string>")


def health_from_files(streams):
    """``health_job`` without a shuffle: each task reads its streams' index files itself
    (``streams_df``) and runs ``stream_health``. Same rows; several times faster on big
    indexes, since the index never goes through Spark's shuffle."""
    return streams.mapInPandas(_per_stream_files(stream_health), spark_schema(HEALTH_COLUMNS))


def drops_from_files(streams):
    """``drops_job`` without a shuffle (see ``health_from_files``)."""
    return streams.mapInPandas(_per_stream_files(find_drops), spark_schema(DROP_COLUMNS))


def timeline_from_files(streams):
    """``timeline_job`` without a shuffle (see ``health_from_files``)."""
    return streams.mapInPandas(_per_stream_files(fps_timeline), spark_schema(TIMELINE_COLUMNS))
