"""The pipeline as a cluster citizen: which master (or Spark Connect server), is it
reachable, how many task slots the executors have, and a warning when the cluster cannot
give what was asked.

A Spark Connect session (``--remote sc://host:port``, else ``SPARK_REMOTE`` unless a master
was chosen) has no SparkContext: what this module asks of a session it asks through the
session's configuration and the DataFrame API there, and the classic-only views (executors
registering, the web UI, log levels) are the server's business.

Master precedence (``resolve_master``): ``--master``; else what ``spark-submit`` chose
(``--master``, ``--conf spark.master`` or its ``spark-defaults.conf``: the session builder
then sets no master); else ``SPARK_MASTER``; else ``spark.master`` in
``$SPARK_CONF_DIR/spark-defaults.conf`` (or ``$SPARK_HOME/conf``); only then ``local[*]``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import urllib.request
from typing import TYPE_CHECKING, Any, Dict, List, Optional, TextIO, Tuple, cast

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# environment the executors need for Python-side object storage I/O (fs.py); copied to
# spark.executorEnv.* on a cluster (Spark redacts *SECRET*/*TOKEN* values in its UI)
FORWARDED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "GOOGLE_APPLICATION_CREDENTIALS",
)
REACH_TIMEOUT_S = 5.0
STARVED_AFTER_S = 30.0


class MasterError(ValueError):
    """The Spark master cannot be reached (bad input: exit 2)."""


CONNECT_PORT = 15002  # Spark Connect's default


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session (pyspark.sql.connect), False for a classic one."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def resolve_remote(explicit: str | None, master: str | None = None) -> Optional[str]:
    """The Spark Connect URL to use, or None for a classic session: ``--remote``; else
    ``SPARK_REMOTE`` unless a master was chosen (``--master``, spark-submit)."""
    remote = explicit or (None if master or under_spark_submit() else os.environ.get("SPARK_REMOTE"))
    if remote and not remote.startswith("sc://"):
        raise MasterError(f"Spark Connect URL {remote!r}: use sc://host:port")
    return remote or None


def _connect_hostport(remote: str) -> Tuple[str, int]:
    """(host, port) of ``sc://host[:port][/;param=value...]``."""
    hostport = remote[len("sc://") :].split("/", 1)[0].split(";", 1)[0]
    if hostport.startswith("["):  # [IPv6]:port
        host, _, rest = hostport[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else CONNECT_PORT
    host, _, port = hostport.partition(":")
    return host, int(port) if port else CONNECT_PORT


def under_spark_submit() -> bool:
    """True in a driver started by ``spark-submit`` (the JVM is already running and chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _defaults_master() -> Optional[str]:
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    path = os.path.join(conf_dir, "spark-defaults.conf") if conf_dir else None
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        for line in f:
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0] == "spark.master":
                return parts[1].strip()
    return None


def resolve_master(explicit: str | None) -> Optional[str]:
    """The master to set on the session builder, or None where spark-submit already chose one."""
    if explicit:
        return explicit
    if under_spark_submit():
        return None
    return os.environ.get("SPARK_MASTER") or _defaults_master() or "local[*]"


def submitted_master() -> Optional[str]:
    """The master spark-submit chose (its JVM is running: read from its configuration), or None."""
    if not under_spark_submit():
        return None
    from pyspark import SparkConf

    return SparkConf().get("spark.master", None)


def check_reachable(master: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise MasterError unless a ``spark://`` master or an ``sc://`` Spark Connect server
    accepts a TCP connection (Spark itself retries for ~60 s and prints Java stack traces,
    the Connect client for minutes); other masters are left to Spark."""
    if master and master.startswith("sc://"):
        try:
            host, port = _connect_hostport(master)
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except (OSError, ValueError) as e:
            raise MasterError(f"cannot reach the Spark Connect server {master} ({e})") from None
    if not master or not master.startswith("spark://"):
        return
    errors: List[str] = []
    for hostport in master[len("spark://") :].split(","):
        host, _, port_text = hostport.rpartition(":")
        try:
            with socket.create_connection((host, int(port_text)), timeout=timeout_s):
                return
        except (OSError, ValueError) as e:
            errors.append(f"{hostport}: {e}")
    raise MasterError(f"cannot reach the Spark master {master} ({'; '.join(errors)})")


def executor_env() -> Dict[str, str]:
    return {f"spark.executorEnv.{k}": os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}


def master_of(spark: SparkSession) -> str:
    """The session's master (on Spark Connect: the server's)."""
    return spark.conf.get("spark.master", None) or "unknown"


def application_id(spark: SparkSession) -> str:
    return spark.conf.get("spark.app.id", None) or "unknown"


def is_local(spark: SparkSession) -> bool:
    return master_of(spark).startswith("local")


def cancel_all(spark: SparkSession) -> None:
    """Cancel the session's running Spark jobs (on Spark Connect: its operations)."""
    if is_connect(spark):
        spark.interruptAll()
    else:
        spark.sparkContext.cancelAllJobs()


def set_log_level(spark: SparkSession, level: str) -> None:
    """Spark's log level in this driver (a Spark Connect server keeps its own)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)


def executor_count(spark: SparkSession) -> int:
    """Executors registered now (the driver excluded)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)


def task_slots(spark: SparkSession, settle_s: float = 2.0) -> int:
    """Tasks the executors run at once: Spark's default parallelism, which on a cluster is
    the executors' total cores; waits (up to ``settle_s`` after the first executor) for the
    executors asked for to register, so work is not split for the driver's cores. On Spark
    Connect: the parallelism the server gives (its executors are its own business)."""
    from visionipc.apps.pipeline.tasks import parallelism

    if is_connect(spark) or is_local(spark):
        return parallelism(spark)
    sc = spark.sparkContext
    want = int(sc.getConf().get("spark.executor.instances", "0") or 0)
    deadline: Optional[float] = None
    while True:
        n = executor_count(spark)
        if n and (n >= want > 0 or (deadline is not None and time.monotonic() > deadline)):
            return sc.defaultParallelism
        if n and deadline is None:
            deadline = time.monotonic() + settle_s
        time.sleep(0.2)


def _cluster_resources(master: str) -> str:
    """What a standalone master says it has (its web UI's JSON), or why that is unknown."""
    if not master.startswith("spark://"):
        return "unknown for this cluster manager (see its UI)"
    host = master[len("spark://") :].split(",")[0].rpartition(":")[0]
    port = os.environ.get("SPARK_MASTER_WEBUI_PORT", "8080")
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/json/", timeout=3) as r:
            state = json.load(r)
    except (OSError, ValueError) as e:
        return f"unknown (the master's UI at {host}:{port}: {e})"
    workers = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
    if not workers:
        return "no alive worker"
    each = ", ".join(
        f"{w.get('coresfree', w['cores'] - w.get('coresused', 0))} free core(s) and "
        f"{w.get('memoryfree', w['memory'] - w.get('memoryused', 0))} MiB free memory"
        for w in workers
    )
    return f"{len(workers)} alive worker(s): {each}"


def _asked(conf: Any) -> str:
    keys = ("spark.executor.memory", "spark.executor.cores", "spark.cores.max", "spark.executor.instances")
    got = [f"{k}={conf.get(k)}" for k in keys if conf.get(k, None)]
    return ", ".join(got) or "Spark's defaults (spark.executor.memory=1g, all free cores)"


class StarvationWatch:
    """Warns once on stderr when no executor has registered ``after_s`` seconds after the
    session started, naming what was asked and what the cluster has."""

    def __init__(self, spark: SparkSession, after_s: float = STARVED_AFTER_S, out: Optional[TextIO] = None) -> None:
        self.spark, self.after_s, self.out = spark, after_s, out or sys.stderr
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vipc-starvation-watch", daemon=True)

    def __enter__(self) -> "StarvationWatch":
        if not is_connect(self.spark) and not is_local(self.spark):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        if self._stop.wait(self.after_s):
            return
        try:
            if executor_count(self.spark):
                return
            sc = self.spark.sparkContext
            message = (
                f"vipc-analyze: warning: no executor has started after {self.after_s:g} s: the application asks for "
                f"{_asked(sc.getConf())}; the cluster has {_cluster_resources(cast(str, sc.master))}"  # set: it runs
            )
        except Exception as e:  # the session went away meanwhile
            message = f"vipc-analyze: warning: no executor has started after {self.after_s:g} s ({e})"
            if self._stop.is_set():
                return
        self.warned = True
        print(message, file=self.out, flush=True)


def ui_url(spark: SparkSession) -> str | None:
    """The web UI's address (None on Spark Connect: the server's own UI)."""
    return None if is_connect(spark) else spark.sparkContext.uiWebUrl
