"""Python lists as Spark work, with nothing but the DataFrame API: the same code runs on
a classic session and on a Spark Connect one (no ``sparkContext``, no RDD).

``map_rows``: the driver's rows (segments, streams: small dicts of strings) split into
consecutive runs, one per task, each handed to a Python function in the executors
(``spark.range(n, numPartitions=k).mapInArrow``: the row numbers travel, the rows ride
in the function's closure, so no data goes from Python into the JVM and back). The
function yields ``(kind, pandas frame)`` pairs; ``collect`` brings them back to the
driver as Arrow IPC payloads and concatenates each kind. ``rows_df`` is the same split
as a DataFrame of the rows themselves, for jobs of your own.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Frame = Any  # a pandas DataFrame (pandas has no types)
Fn = Callable[[Iterator[Any]], Iterable[Tuple[str, Frame]]]  # one task's rows -> (kind, frame) pairs

PAYLOAD_SCHEMA = "kind string, payload binary"


def parallelism(spark: SparkSession) -> int:
    """The session's default parallelism (its executors' cores): ``spark.default.parallelism``
    when set, else the number of partitions Spark gives ``spark.range`` (a tiny JVM-only job)."""
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return max(1, int(configured))
    got = spark.range(1 << 14).selectExpr("spark_partition_id() AS p").selectExpr("max(p) + 1 AS n").toArrow()
    return max(1, int(got.column("n")[0].as_py()))


def _ids(n: int, partitions: int, spark: SparkSession) -> DataFrame:
    return spark.range(0, n, 1, max(1, min(n, int(partitions))))


def ipc(df: Frame) -> bytes:
    """A pandas frame as Arrow IPC stream bytes."""
    import pyarrow as pa

    table = pa.Table.from_pandas(df, preserve_index=False)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def runs(weights: Sequence[float], partitions: int) -> List[Tuple[int, int]]:
    """``[(start, stop)]``: the rows (in order) cut into at most ``partitions`` consecutive runs
    of about equal total weight, none empty (equal weights: equal counts). A task's time goes
    with its rows' work, so a fleet of long and short recordings does not leave one task of
    long ones running alone at the end."""
    import numpy as np

    total = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    n, k = len(weights), max(1, min(len(weights), int(partitions)))
    targets = total[-1] * np.arange(1, k) / k
    cuts = np.searchsorted(total, targets)  # the first prefix reaching each target, or the one before it if nearer
    nearer = (cuts > 0) & (targets - total[np.maximum(cuts - 1, 0)] < total[np.minimum(cuts, n)] - targets)
    bounds = sorted({0, n, *(cuts - nearer).tolist()})
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def map_rows(
    spark: SparkSession, rows: Sequence[Any], partitions: int, fn: Fn, weights: Optional[Sequence[float]] = None
) -> DataFrame:
    """A DataFrame (``PAYLOAD_SCHEMA``) of what ``fn`` yields, as ``(kind, pandas frame)``
    pairs, for each of ``partitions`` consecutive runs of ``rows`` (``fn`` gets one run,
    an iterable of rows, per task); ``weights``: each row's work, the runs cut to equal
    totals of it (``runs``; default: equal counts)."""
    rows = list(rows)
    cuts = runs([1.0] * len(rows) if weights is None else weights, partitions)

    def run(batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        mine = (rows[j] for batch in batches for i in batch.column(0).to_pylist() for j in range(*cuts[i]))
        for kind, frame in fn(mine):
            yield pa.RecordBatch.from_pydict(
                {"kind": [kind], "payload": [ipc(frame)]},
                schema=pa.schema([("kind", pa.string()), ("payload", pa.binary())]),
            )

    return _ids(len(cuts), len(cuts), spark).mapInArrow(run, PAYLOAD_SCHEMA)


def gather(pairs: Iterable[Tuple[str, bytes]], kinds: Iterable[str]) -> Dict[str, Optional[Frame]]:
    """(kind, Arrow IPC bytes) pairs -> each kind's tables concatenated (pandas; None if none)."""
    import pyarrow as pa

    parts: Dict[str, List[Any]] = {k: [] for k in kinds}  # kind -> its Arrow tables
    for kind, payload in pairs:
        parts[kind].append(pa.ipc.open_stream(payload).read_all())
    return {k: pa.concat_tables(v, promote_options="default").to_pandas() if v else None for k, v in parts.items()}


def collect(df: DataFrame, kinds: Iterable[str]) -> Dict[str, Optional[Frame]]:
    """Run a ``map_rows`` DataFrame; each kind's frames concatenated (pandas; None if none)."""
    table = df.toArrow()
    return gather(zip(table.column("kind").to_pylist(), table.column("payload").to_pylist()), kinds)


def rows_df(spark: SparkSession, rows: Sequence[Tuple[Any, ...]], schema: str, partitions: int) -> DataFrame:
    """``rows`` (tuples in ``schema``'s order) as a DataFrame of ``partitions`` partitions (at
    most one per row), consecutive rows together and in order: the row numbers of
    ``spark.range`` joined with the rows, broadcast (JVM-side, no Python worker)."""
    if not rows:
        return spark.createDataFrame([], schema)
    table = spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], f"_row bigint, {schema}")
    ids = _ids(len(rows), partitions, spark).withColumnRenamed("id", "_row")
    return ids.join(table.hint("broadcast"), "_row").select(*[c for c in table.columns if c != "_row"])
