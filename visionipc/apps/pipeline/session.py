"""A SparkSession with sensible defaults for analysing recordings.

The master as ``cluster.resolve_master`` says (``local[*]`` only when nothing chose
one); on a local master shuffle partitions and parallelism sized to its cores (a
handful of tiny shuffles is the common case here, not 200), on a cluster Spark's
own (the executors' cores); the web UI off unless asked for; the workers run the
same Python as the driver, forked from the pipeline's daemon (``daemon.py``: PySpark
from bytecode, the task-side modules loaded once per executor).

``remote="sc://host:port"``: a Spark Connect session instead (``connect_session``): a thin
client, no JVM here; the server runs the jobs with its own master, executors and Python
(which must have visionipc installed, as a cluster's executors must).
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any, Dict, Union, cast

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql import SparkSession as ClassicSession  # its name where connect's shadows it

Setting = Union[bool, float, int, str, None]  # a Spark configuration value

# glibc malloc settings for the Python workers. Decoding allocates several
# MB per frame (the image, its gray plane, a 16-bit Laplacian); in a worker
# forked from PySpark's daemon, glibc kept returning those blocks to the OS
# and faulting them in again (~25k page faults and ~20 % more CPU per 126-frame
# 720p segment than the same code in a plain process). Serving them from the
# heap instead brings the workers to within a few % of a plain process.
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}

# C1-only JIT and the serial GC: the driver JVM starts ~20 % faster, and the
# pipeline's heavy lifting happens in Python workers and the Parquet reader.
FAST_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# PySpark's worker daemon, started ready for the pipeline's tasks (daemon.py); it falls
# back to PySpark's own by itself. ``conf={"spark.python.daemon.module": "pyspark.daemon"}``
# (``--conf`` of vipc-analyze) switches it off.
DAEMON_MODULE = "visionipc.apps.pipeline.daemon"


def master_cores(master: str) -> int:
    """How many tasks a ``local[...]`` master runs at once (the machine's cores otherwise)."""
    machine = os.cpu_count() or 2
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master.strip())
    if m is None or m.group(1) == "*":
        return machine
    return 1 if m.group(1) is None else max(1, int(m.group(1)))


# runtime settings of every session, classic or Spark Connect
SQL_SETTINGS: Dict[str, Setting] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
}


def _pyspark():
    try:
        import pyspark.sql  # noqa: F401
    except ImportError as e:  # optional dependency
        raise ImportError(
            "the Spark pipeline needs PySpark: pip install 'visionipc[spark]' (and a Java 17+ runtime)"
        ) from e


def connect_session(remote: str, app_name: str = "vipc-analyze", *, conf: Dict[str, Any] | None = None) -> SparkSession:
    """A new Spark Connect session on the server at ``remote`` (``sc://host:port``), with the
    runtime settings of ``spark_session`` and ``conf`` (settings the server fixed at its start,
    such as ``spark.executor.memory``, are the server's and are left as they are)."""
    _pyspark()
    try:
        from pyspark.sql.connect.session import SparkSession
    except ImportError as e:  # grpcio & co: pyspark[connect], in visionipc[spark]
        raise ImportError(f"Spark Connect needs PySpark's client packages: pip install 'visionipc[spark]' ({e})") from e
    settings: Dict[str, Setting] = {
        **SQL_SETTINGS,
        "spark.app.name": app_name,
        **{k: str(v) for k, v in (conf or {}).items()},
    }
    # create(): a session of its own, never a notebook's (its temporary views, its data sources)
    connected = SparkSession.builder.remote(remote).config(map=settings).create()
    # typed as the classic session: Spark Connect's has its API (what the jobs use of it)
    spark = cast("ClassicSession", connected)
    from visionipc.apps.pipeline import datasource

    datasource.register(spark)  # spark.read.format("vipc")
    return spark


def spark_session(
    master: str | None = None,
    app_name: str = "vipc-analyze",
    *,
    remote: str | None = None,
    ui: bool = False,
    progress: bool = False,
    shuffle_partitions: int | None = None,
    java_options: str = FAST_START_JAVA_OPTIONS,
    conf: Dict[str, Any] | None = None,
) -> SparkSession:
    """Start (or get) a SparkSession; with ``remote`` (``sc://host:port``) a new Spark Connect
    session on that server (``connect_session``; the other arguments but ``conf`` are the
    server's business).

    ``master``: a Spark master URL (``spark://host:7077``, ``yarn``, ``local[2]``...); None:
    what spark-submit / ``SPARK_MASTER`` / spark-defaults.conf chose, else ``local[*]``.
    ``progress``: Spark's console progress bar on stderr. ``conf``: more ``spark.*`` settings,
    applied last. On a local master the workers always run ``sys.executable``; on a
    cluster ``PYSPARK_PYTHON`` is kept if set (the executors' Python may live elsewhere).
    """
    if remote:
        return connect_session(remote, app_name, conf=conf)
    _pyspark()
    from pyspark.sql import SparkSession

    from visionipc.apps.pipeline.cluster import executor_env, resolve_master

    master = resolve_master(master)  # None: spark-submit chose it
    local = master is not None and master.startswith("local")
    if local or "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder if master is None else SparkSession.builder.master(master)
    if (
        local and master is not None
    ):  # a cluster's parallelism is its executors' cores (Spark's default), not the driver's
        cores = master_cores(master)
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions or cores)).config(
            "spark.default.parallelism", str(cores)
        )
    else:
        for key, value in executor_env().items():
            builder = builder.config(key, value)
    builder = (
        builder.appName(app_name)
        .config("spark.ui.enabled", str(bool(ui)).lower())
        .config("spark.ui.showConsoleProgress", str(bool(progress)).lower())
        .config(map=SQL_SETTINGS)
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .config("spark.sql.debug.maxToStringFields", "200")
        # workers import installed packages, never a source tree that happens to be their cwd
        .config("spark.executorEnv.PYTHONSAFEPATH", "1")
    )
    for key, value in WORKER_MALLOC_ENV.items():
        builder = builder.config(f"spark.executorEnv.{key}", os.environ.get(key, value))
    if java_options and master is not None:  # under spark-submit the driver JVM is already running
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # no DNS needed: the driver and its executors talk over loopback
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from visionipc.apps.pipeline import datasource

    datasource.register(spark)  # spark.read.format("vipc")
    return spark
