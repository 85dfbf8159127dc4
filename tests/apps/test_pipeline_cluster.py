"""vipc-analyze as a cluster citizen: a real standalone Spark master + worker (from the
installed PySpark) and a real S3-compatible server (moto's standalone server), both
started by this module once; vipc-analyze runs through spark-submit against s3://
recordings and must give the numbers of a local run, on the cluster it was given."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import DROPS, FPS, H, W
from stream_helpers import Recorder, follow_to_the_end, same_tables, windows_count_every_frame

from visionipc.apps.pipeline import fs, runs, synthetic
from visionipc.apps.pipeline.cli import main

BIN = os.path.dirname(sys.executable)
SUBMIT = [os.path.join(BIN, "spark-submit")]
ANALYZE = os.path.join(BIN, "vipc-analyze")
BUCKET = "fleet"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {port}")


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``{"env", "master", "s3_recordings", "local_recordings"}``: a moto S3 server with two
    recordings uploaded, and a standalone master + one worker (2 cores, 1.5 GiB)."""
    root = tmp_path_factory.mktemp("cluster")
    local = root / "recordings"
    synthetic.write_recording(
        local / "faults",
        {"road": dict(frames=90, width=W, height=H, fps=FPS, drop=DROPS, delay_ms={30: 50}, segment_frames=40)},
    )
    synthetic.write_recording(
        local / "lossy",
        {"cam": dict(frames=30, width=W, height=H, segment_frames=12, lossless=False)},
    )
    s3_port, master_port, ui_port = _port(), _port(), _port()
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_MASTER_WEBUI_PORT=str(ui_port),
        SPARK_LOG_DIR=str(root / "logs"),
        SPARK_WORKER_DIR=str(root / "work"),
    )
    log = open(root / "services.log", "wb")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
            env=env,
            stdout=log,
            stderr=log,
        )
    ]
    spark_class = os.path.join(BIN, "spark-class")
    procs.append(
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(master_port)]
            + ["--webui-port", str(ui_port)],
            env=env,
            stdout=log,
            stderr=log,
        )
    )
    master = f"spark://127.0.0.1:{master_port}"
    try:
        _wait_port(s3_port, procs[0])
        _wait_port(master_port, procs[1])
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1"]
                + ["--cores", "2", "--memory", "1536m", "--webui-port", str(_port()), "--work-dir", str(root / "work")],
                env=env,
                stdout=log,
                stderr=log,
            )
        )
        saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
        os.environ.update({k: env[k] for k in saved})
        fs._remote.cache_clear()
        import boto3

        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s3, _ = fs.resolve(f"s3://{BUCKET}")
        pafs.copy_files(
            str(local), f"{BUCKET}/recordings", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=s3
        )
        yield {"env": env, "master": master, "local": str(local), "root": root}
    finally:
        _stop(procs[::-1])
        log.close()
        for k, v in saved.items() if "saved" in locals() else ():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _submit(cluster, *args, conf=(), timeout=240):
    """spark-submit [options] $(vipc-analyze --submit-app) ARGS, as vipc-analyze --help shows it."""
    app = subprocess.run([ANALYZE, "--submit-app"], capture_output=True, text=True, check=True).stdout.strip()
    cmd = [*SUBMIT, "--master", cluster["master"], "--conf", "spark.executor.memory=512m", *conf, app, *args]
    return subprocess.run(cmd, env=cluster["env"], capture_output=True, text=True, timeout=timeout)


def _read(location):
    filesystem, path = fs.resolve(location)
    return pq.read_table(path, filesystem=filesystem).to_pandas()


def test_spark_submit_on_a_standalone_cluster_reads_and_writes_s3_like_a_local_run(cluster, tmp_path):
    out = f"s3://{BUCKET}/results"
    r = _submit(
        cluster, f"s3://{BUCKET}/recordings", "--out", out, "--jobs", "health,metrics,export", "--export", "every:10"
    )
    assert r.returncode == 0, r.stderr[-1000:] + r.stdout[-2500:]
    run = runs.latest(out)
    manifest = json.loads(fs.read_bytes(fs.join(run, "run.json")))
    assert manifest["master"] == cluster["master"]  # spark-submit's master, not local[*]
    assert manifest["application_id"].startswith("app-")  # a standalone application, not local-...
    assert sorted(i["path"] for i in manifest["inputs"]) == [
        f"s3://{BUCKET}/recordings/faults",
        f"s3://{BUCKET}/recordings/lossy",
    ]
    assert fs.isfile(fs.join(run, "_SUCCESS")) and fs.isfile(fs.join(run, "report.html"))
    assert "2 task slot(s)" in r.stdout + r.stderr  # the worker's cores (spark-submit relays the driver's stderr)
    executors = "".join(p.read_text() for p in (cluster["root"] / "work").glob("app-*/*/stderr"))
    assert "daemon module in PySpark is set to [visionipc.apps.pipeline.daemon]" in executors
    assert "using pyspark.daemon" not in executors  # the pipeline's daemon served the executors' Python workers

    # the same recordings from local disk on local[1]: the same numbers
    local_out = tmp_path / "local"
    env = dict(cluster["env"])
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", cluster["local"], "--out", str(local_out)]
    cmd += ["--master", "local[1]", "--jobs", "health,metrics,export", "--export", "every:10"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-1000:] + r.stdout[-2500:]
    local_run = runs.latest(str(local_out))
    for name, order in (
        ("health.parquet", []),
        ("drops.parquet", ["after_frame_id"]),
        ("metrics_summary.parquet", []),
        ("fps_timeline.parquet", ["second"]),
    ):
        keys = ["recording_id", "stream", *order]
        a = _read(fs.join(run, name)).sort_values(keys, ignore_index=True)
        b = _read(fs.join(local_run, name)).sort_values(keys, ignore_index=True)
        pd.testing.assert_frame_equal(a, b)
    health = _read(fs.join(run, "health.parquet")).set_index("stream")
    assert sorted(health.loc["road", "dropped_frame_ids"]) == DROPS
    metrics = _read(fs.join(run, "metrics"))  # partitioned by recording_id, stream
    assert len(metrics) == health["frames"].sum() and metrics["motion"].isna().sum() == 2  # one first frame per stream
    assert metrics["date"].notna().all()  # recording.json's start, UTC
    export = _read(fs.join(run, "export", "manifest.parquet"))
    assert len(export) and all(fs.isfile(fs.join(run, "export", p)) for p in export["path"])

    # --incremental: nothing new -> no new run; s3a:// (as Spark users write it) names the same objects
    assert main([f"s3://{BUCKET}/recordings", "--out", out, "--jobs", "health", "--incremental"]) == 0
    assert main([f"s3a://{BUCKET}/recordings", "--out", f"s3a://{BUCKET}/results", "--incremental"]) == 0
    assert runs.completed_runs(out) == [fs.basename(run)]
    s3a_out = f"s3a://{BUCKET}/s3a-results"
    args = [f"s3a://{BUCKET}/recordings/faults", "--out", s3a_out, "--jobs", "health", "--master", "local[1]", "-q"]
    # As its own process, as a user runs it (in this pytest process an earlier test's JVM
    # would keep its Python workers, started without the S3 settings)
    r = subprocess.run(
        [sys.executable, "-m", "visionipc.apps.pipeline.cli", *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s3a_run = runs.latest(f"s3://{BUCKET}/s3a-results")  # written where s3:// finds it
    inputs = json.loads(fs.read_bytes(fs.join(s3a_run, "run.json")))["inputs"]
    assert [i["path"] for i in inputs] == [f"s3://{BUCKET}/recordings/faults"]
    a = _read(fs.join(s3a_run, "health.parquet"))
    b = _read(fs.join(run, "health.parquet"))
    pd.testing.assert_frame_equal(a, b[b.recording_id == "faults"].reset_index(drop=True))


def test_starved_application_is_reported_and_ctrl_c_is_one_line(cluster, tmp_path):
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", "--master", cluster["master"]]
    cmd += ["--conf", "spark.executor.memory=64g", cluster["local"], "--out", str(tmp_path / "o"), "--jobs", "health"]
    cmd += ["--starved-after", "2"]
    p = subprocess.Popen(cmd, env=cluster["env"], stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        for line in p.stderr:
            lines.append(line)
            if "no executor has started" in line:
                break
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group (the driver's JVM ignores it)
        rest = p.communicate(timeout=60)[1]
    finally:
        if p.poll() is None:
            p.kill()
    warning = next(line for line in lines if "no executor has started" in line)
    assert "spark.executor.memory=64g" in warning and "1536 MiB free memory" in warning and "2 free core" in warning
    assert p.returncode == 130, rest[-2000:]
    assert "Traceback" not in rest and rest.strip().splitlines()[-1].startswith("vipc-analyze: interrupted")
    assert not os.path.exists(tmp_path / "o") or os.listdir(tmp_path / "o") == []  # nothing that looks finished


def test_master_precedence_flag_then_spark_submit_then_env_then_defaults_file(monkeypatch, tmp_path):
    from visionipc.apps.pipeline.cluster import resolve_master

    for k in ("SPARK_MASTER", "SPARK_CONF_DIR", "SPARK_HOME", "PYSPARK_GATEWAY_PORT", "SPARK_REMOTE"):
        monkeypatch.delenv(k, raising=False)
    assert resolve_master(None) == "local[*]"
    (tmp_path / "spark-defaults.conf").write_text("# cluster\nspark.master   spark://from-defaults:7077\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert resolve_master(None) == "spark://from-defaults:7077"
    monkeypatch.setenv("SPARK_MASTER", "spark://from-env:7077")
    assert resolve_master(None) == "spark://from-env:7077"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # a driver spark-submit started: its choice stands
    assert resolve_master(None) is None
    assert resolve_master("local[3]") == "local[3]"


def test_spark_connect_url_precedence_flag_then_master_then_env(monkeypatch):
    from visionipc.apps.pipeline.cluster import resolve_remote

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert resolve_remote(None) is None  # a classic session
    monkeypatch.setenv("SPARK_REMOTE", "sc://from-env:15002")
    assert resolve_remote(None) == "sc://from-env:15002"
    assert resolve_remote("sc://flag:1") == "sc://flag:1"
    assert resolve_remote(None, "local[2]") is None  # --master chose a classic session
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # spark-submit started this driver: classic
    assert resolve_remote(None) is None


def test_follow_picks_up_a_recording_written_under_s3(cluster, tmp_path):
    """--follow over s3://: recordings whose segments are uploaded one at a time are followed to
    the end; the streamed tables equal a batch run's over the same s3:// recordings."""
    fleet, out = f"s3://{BUCKET}/live", str(tmp_path / "live")
    follow_to_the_end(
        Recorder(tmp_path, fleet), out, str(tmp_path / "follow.log"), ("--master", "local[1]"), cluster["env"]
    )
    reference = str(tmp_path / "batch")
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", fleet, "--out", reference, "--jobs", "health"]
    r = subprocess.run(
        [*cmd, "--master", "local[1]", "-q"], env=cluster["env"], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    same_tables(out, reference)
    windows_count_every_frame(out, reference)


def test_follow_with_out_on_s3_without_hadoops_s3_connector_is_one_line(cluster, tmp_path):
    """Spark writes the checkpoint and the tables itself: with OUT on s3:// and no hadoop-aws in
    this Spark, --follow stops at once with one line saying what to give it instead."""
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", f"s3://{BUCKET}/recordings", "--follow"]
    cmd += ["--out", f"s3://{BUCKET}/live-out", "--master", "local[1]", "--idle-timeout", "5"]
    r = subprocess.run(cmd, env=cluster["env"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert errors[0].startswith(f"vipc-analyze: error: --follow: Spark cannot write its checkpoint (s3://{BUCKET}/")
    assert "Class org.apache.hadoop.fs.s3a." in errors[0] and "local or HDFS folder" in errors[0], errors[0]
