"""vipc-analyze on Spark Connect: a real Spark Connect server, started once by this module
from the installed PySpark (``sbin/start-connect-server.sh``, the spark-connect jar PySpark
4 ships), runs every job; each run's results are identical to the classic session's on the
same recordings."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pyspark
import pytest
from pipeline_helpers import recordings, spark  # noqa: F401
from stream_helpers import Recorder, follow_to_the_end, same_tables, windows_count_every_frame

from visionipc.apps.pipeline import export, health, read, report, runs, tables
from visionipc.apps.pipeline.cli import main
from visionipc.apps.pipeline.session import DAEMON_MODULE, connect_session

SPARK_HOME = os.path.dirname(pyspark.__file__)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """``sc://127.0.0.1:PORT`` of a Spark Connect server on local[2] (its logs, pid and
    scratch files under pytest's tmp folder), stopped when the module's tests are done."""
    root = tmp_path_factory.mktemp("connect")
    port = _port()
    env = dict(
        os.environ,
        SPARK_HOME=SPARK_HOME,
        SPARK_LOG_DIR=str(root / "logs"),
        SPARK_PID_DIR=str(root / "pid"),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,  # the server's Python workers: visionipc installed
        TMPDIR=str(root),
    )
    env.pop("SPARK_REMOTE", None)
    cmd = [os.path.join(SPARK_HOME, "sbin", "start-connect-server.sh"), "--wait", "--master", "local[2]"]
    for key, value in {
        "spark.connect.grpc.binding.port": port,
        "spark.ui.enabled": "false",
        "spark.default.parallelism": 2,
        "spark.sql.shuffle.partitions": 2,
        "spark.python.daemon.module": DAEMON_MODULE,
        "spark.executorEnv.PYTHONSAFEPATH": 1,
    }.items():
        cmd += ["--conf", f"{key}={value}"]
    log = open(root / "server.log", "wb")
    server = subprocess.Popen(cmd, env=env, cwd=root, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Spark Connect server did not start in 180 s"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.3)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


# result tables of a run and the columns that order their rows
TABLES = {
    "health.parquet": ["recording_id", "stream"],
    "drops.parquet": ["recording_id", "stream", "after_frame_id"],
    "fps_timeline.parquet": ["recording_id", "stream", "second"],
    "latency_histogram.parquet": ["recording_id", "stream", "bin"],
    "events.parquet": ["recording_id", "stream", "event", "frame_id"],
    "metrics": ["recording_id", "stream", "segment", "position"],
    "metrics_summary.parquet": ["recording_id", "stream"],
    "export/manifest.parquet": ["recording_id", "stream", "frame_id"],
}


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """Comparable cells: arrays as lists, partition columns (categorical) as strings."""
    out = df.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(str)
        elif out[c].dtype == object:
            out[c] = [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in out[c]]
    return out


def _results(out) -> dict:
    """Every table and exported image of the newest run in ``out``, and its run.json."""
    run = runs.latest(str(out))
    got = {"run.json": json.loads(open(os.path.join(run, "run.json")).read())}
    for name, keys in TABLES.items():
        if os.path.exists(os.path.join(run, name)):
            got[name] = _plain(pd.read_parquet(os.path.join(run, name)).sort_values(keys, ignore_index=True))
    export = os.path.join(run, "export")
    for folder, _, files in os.walk(export):
        for f in files:
            if not f.endswith(".parquet"):
                path = os.path.join(folder, f)
                got[os.path.relpath(path, run)] = open(path, "rb").read()
    got["plots"] = sorted(os.listdir(os.path.join(run, "plots")))
    return got


def _same(connect: dict, classic: dict) -> None:
    assert connect.keys() == classic.keys()
    for name, value in classic.items():
        if name == "run.json":
            continue
        if isinstance(value, pd.DataFrame):
            assert len(value), name
            pd.testing.assert_frame_equal(connect[name], value, check_exact=True, obj=name)
        else:
            assert connect[name] == value, name


def test_every_job_on_spark_connect_gives_the_classic_sessions_results(spark, connect_server, recordings, tmp_path):
    paths = [recordings["faults"], recordings["quality"]]
    for i, jobs in enumerate(
        (
            ["--jobs", "health,metrics,export", "--export", "drops:1"],
            ["--jobs", "metrics,export", "--export", "sharp:100", "--image-format", "png"],
        )
    ):
        classic_out, connect_out = tmp_path / f"classic{i}", tmp_path / f"connect{i}"
        assert main([*paths, "--out", str(classic_out), *jobs, "-q"]) == 0  # the tests' classic session
        table = ["--table", "fleet"] if i == 0 else []  # registered in the server's catalog
        assert main([*paths, "--out", str(connect_out), "--remote", connect_server, *jobs, *table, "-q"]) == 0
        classic, connect = _results(classic_out), _results(connect_out)
        _same(connect, classic)
        for name in (*tables.HEALTH_TABLES, *tables.METRICS_TABLES):  # OUT/tables (issue 33, item 3)
            keys = ["recording_id", *tables.ORDER[name]]
            found = [tables.location(str(o), name) for o in (connect_out, classic_out)]
            if os.path.isdir(found[1]):
                a, b = (_plain(pd.read_parquet(f).sort_values(keys, ignore_index=True)) for f in found)
                pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)
        assert connect["run.json"]["remote"] == connect_server and "remote" not in classic["run.json"]
        assert connect["run.json"]["master"] == "local[2]"  # the server's master
        assert any(name.startswith("export/") and name != "export/manifest.parquet" for name in connect)

    # the library's DataFrames on Connect: the vipc data source, the per-stream health job
    remote = connect_session(connect_server)
    try:
        for session in (remote, spark):
            index = session.read.format("vipc").load(recordings["faults"]).where("frame_id >= 30")
            rows = health.health_from_files(health.streams_df(session, paths)).toPandas()
            hist = report.latency_histogram(index, 100.0, bins=20)
            by_group = health.health_job(read.read_index(session, paths)).toPandas()  # Spark's reader, applyInPandas
            nth = export.select_every_nth(read.read_index(session, paths), 10).toPandas()
            got = [
                g.sort_values(keys, ignore_index=True)
                for g, keys in (
                    (index.toPandas(), ["stream", "frame_id"]),
                    (rows, health.KEYS),
                    (hist, ["stream", "bin"]),
                    (by_group, health.KEYS),
                    (nth, ["recording_id", "stream", "frame_id"]),
                )
            ]
            if session is remote:
                on_connect = got
        for a, b in zip(on_connect, got):
            pd.testing.assert_frame_equal(_plain(a), _plain(b), check_exact=True)
        assert on_connect[0]["frame_id"].min() == 30 and len(on_connect[1]) == 5
        assert on_connect[2]["count"].sum() == len(on_connect[0]) and on_connect[2]["bin"].max() == 20  # 120 ms: over
        pd.testing.assert_frame_equal(_plain(on_connect[3]), _plain(on_connect[1]), check_exact=True)
        assert len(on_connect[4]) and set(on_connect[4]["frame_id"] % 10) == {0}
        assert remote.table("fleet_health").count() == 5  # --table: in the server's catalog, for its sessions
    finally:
        remote.stop()


def test_spark_remote_and_bad_input_on_spark_connect(connect_server, recordings, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPARK_REMOTE", connect_server)  # no --remote: the environment's server
    assert main([recordings["faults"], "--out", str(tmp_path / "env"), "--jobs", "health"]) == 0
    assert "Spark Connect server " + connect_server in capsys.readouterr().err
    assert json.loads(open(os.path.join(runs.latest(str(tmp_path / "env")), "run.json")).read())["remote"]
    # a task on the server meets a broken recording: bad input, one line, nothing published
    broken = tmp_path / "broken"
    shutil.copytree(recordings["quality"], broken)
    os.remove(broken / "frames" / "sharp" / "000000.mkv")
    assert main([str(broken), "--out", str(tmp_path / "o1"), "--jobs", "metrics", "-q"]) == 2
    err = capsys.readouterr().err
    assert "cannot open" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "o1").exists()  # the failed run removed the folders it made
    monkeypatch.delenv("SPARK_REMOTE")
    started = time.monotonic()
    assert main([recordings["faults"], "--out", str(tmp_path / "o2"), "--remote", "sc://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Spark Connect server sc://127.0.0.1:9" in err and time.monotonic() - started < 20
    assert main([recordings["faults"], "--out", str(tmp_path / "o3"), "--remote", "http://host:15002"]) == 2
    assert "use sc://host:port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([recordings["faults"], "--out", str(tmp_path / "o4"), "--remote", connect_server, "--master", "local[1]"])
    assert e.value.code == 2 and "choose one" in capsys.readouterr().err


def test_follow_on_spark_connect_gives_the_batch_tables(spark, connect_server, tmp_path):  # noqa: F811 - fixture
    """--follow --remote: the streaming query (the vipc streaming source, the windows, foreachBatch)
    runs on the server; the tables it streams equal a classic batch run's (and so the classic
    follow's: test_pipeline_stream)."""
    rec, out = Recorder(tmp_path), str(tmp_path / "live")
    follow_to_the_end(rec, out, str(tmp_path / "follow.log"), ("--remote", connect_server))
    assert f"starting Spark ({connect_server})" in open(tmp_path / "follow.log").read()
    reference = str(tmp_path / "batch")
    assert main([rec.fleet, "--out", reference, "--jobs", "health", "-q"]) == 0  # the tests' classic session
    same_tables(out, reference)
    windows_count_every_frame(out, reference)
