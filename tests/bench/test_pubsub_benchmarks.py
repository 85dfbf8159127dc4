"""The msgq-vs-pyzmq and zmq-backend benchmark scripts, run for real (``--quick``, one
small size, one round) as a user runs them: both transports measured side by side in
spawned, pinned worker processes, the JSON report written, the ratios printed,
nothing left in shared memory. Asserts what the runs delivered and reported, never
how fast anything was: speed is for BENCHMARKS.md."""

import json
import subprocess
import sys

import pytest
import shm_watch
from repo import TOOLS


def _run(script, tmp_path, *flags):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-P", str(TOOLS / script), *flags, "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout, proc.stderr


@pytest.mark.timeout(300)
def test_bench_msgq_quick_measures_both_transports_and_reports_every_row(tmp_path):
    shm_before = shm_watch.listing()
    report, printed, stderr = _run("bench_msgq.py", tmp_path, "--quick", "--sizes", "64", "--rounds", "1", "-q")
    assert report["errors"] == []
    assert report["meta"]["quick"] is True and report["meta"]["rounds"] == 1 and report["meta"]["sizes"] == [64]
    rows = {row["metric"]: row for row in report["summary"]}
    for metric in (
        "round trip p50",
        "one-way blocking p50",
        "one-way busy p99.9",
        "throughput lossless msg/s (msgq receive_batch)",
        "throughput lossless msg/s (msgq receive())",
        "idle subscriber CPU (blocked in receive)",
        "throughput lossy msg/s received (receive() each)",
    ):
        assert rows[metric]["msgq"] is not None and rows[metric]["pyzmq"] is not None, metric
        assert rows[metric]["msgq"] >= 0 and rows[metric]["pyzmq"] >= 0, metric
    assert rows["round trip p50"]["advantage"] > 0 and rows["round trip p50"]["target"] == 5.0
    assert rows["round trip p50"]["met"] in (True, False)

    kinds = {(r["kind"], r["variant"]) for r in report["results"]}
    for variant in ("msgq", "pyzmq"):
        assert {("latency", variant), ("rtt", variant), ("throughput", variant), ("idle", variant)} <= kinds
    for variant in ("msgq-recv1", "msgq-lossy", "msgq-lossy-recv1", "pyzmq-lossy"):
        assert ("throughput", variant) in kinds
    for r in report["results"]:
        if r["kind"] == "latency":
            assert r["ended"] == "end" and r["stats"]["n"] == len(r["samples_ns"]) > 0, r["variant"]
        if r["kind"] == "throughput" and not r["lossy"]:  # credit / XPUB_NODROP: nothing may be lost
            assert r["lost"] == 0 and not r["timed_out"], r["variant"]
    assert report["calibrations"], "each throughput variant is sized by a calibration run first"

    assert "msgq better by" in printed and "throughput detail" in printed
    assert "WARNING: segments left behind" not in stderr
    assert not any(n.startswith("msgq@bench") for n in shm_watch.added(shm_before, "bench"))


@pytest.mark.timeout(300)
def test_bench_zmq_backend_quick_reports_every_row(tmp_path):
    report, printed, _ = _run("bench_zmq_backend.py", tmp_path, "--quick", "--sizes", "64", "--rounds", "1", "-q")
    assert not report["errors"]
    rows = {row["metric"]: row for row in report["summary"]}
    for metric in ("latency p50 (µs)", "delivered/s, credit window", "received/s, flat out lossy", "send() call (µs)"):
        assert rows[metric]["ours"] > 0 and rows[metric]["raw"] > 0, metric
    credit = [r for r in report["results"] if r["kind"] == "credit"]
    assert {r["variant"] for r in credit} == {"msgq zmq", "pyzmq"}
    for r in credit:  # the credit window keeps both lossless
        assert r["receiver"]["ended"] == "end" and r["receiver"]["received"] == r["sender"]["delivered"], r
    assert "overhead" in printed


def test_pubsub_benchmarks_reject_unknown_parts(tmp_path):
    for script in ("bench_msgq.py", "bench_zmq_backend.py"):
        proc = subprocess.run(
            [sys.executable, "-P", str(TOOLS / script), "--only", "nonsense"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "--only: unknown nonsense" in proc.stderr, proc.stderr


def test_bench_cold_times_every_step_warm_and_cold_and_leaves_nothing(tmp_path):
    before = shm_watch.listing()
    proc = subprocess.run(
        [sys.executable, "-P", str(TOOLS / "bench_cold.py"), "--rounds", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.endswith("x") and "µs" not in line]
    for step in ("pybind11 method", "msgq send 64 B", "VisionIPC server.send(buf)", "VisionIPC client.recv()"):
        (line,) = [r for r in rows if r.startswith(step)]
        warm, cold = (float(x) for x in line.split()[-3:-1])
        assert warm > 0 and cold > 0, line
    assert shm_watch.added(before, "cold") == set()
    cmd = [sys.executable, "-P", str(TOOLS / "bench_cold.py"), "--rounds", "0"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds must be at least 1" in bad.stderr
