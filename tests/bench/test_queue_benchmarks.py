"""The broadcast and ordered-topic benchmark scripts, run for real (``--quick``)
as a user runs them: every transport and producer count measured side by
side, every message checked by its readers (the scripts exit 1 on a lost or
reordered one), nothing left in shared memory (``isolated_prefix`` raises on
a leftover segment), the ratios printed. Asserts what the runs delivered and
reported, never how fast anything was: speed is for BENCHMARKS.md."""

import json
import subprocess
import sys

from repo import TOOLS


def _run(script, tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-P", str(TOOLS / script), "--quick", "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_bench_broadcast_measures_every_transport_and_prints_ratios(tmp_path):
    report, printed = _run("bench_broadcast.py", tmp_path)
    summary = report["summary"]
    assert set(summary) == {"msgq", "msgq-defaults", "seed-py", "mp.Queue"}
    for kind, row in summary.items():
        assert row["msgs_per_s"] > 0 and row["cpu_us_per_msg"] > 0, (kind, row)
        assert 0 < row["p50_us"] <= row["p99_us"], (kind, row)
        assert 0 <= row["idle_reader_cpu_pct"] <= 100 * 1.05, (kind, row)
    # a BroadcastQueue reader whose queue went quiet sleeps (polls at most 1 ms of the 0.5 s)
    assert summary["msgq"]["idle_reader_cpu_pct"] < 25 and summary["msgq-defaults"]["idle_reader_cpu_pct"] < 25
    assert "msgq / mp.Queue: throughput x" in printed and "msgq / seed-py: throughput x" in printed
    assert "msgq-defaults / mp.Queue: throughput x" in printed  # what BroadcastQueue(n_readers) gives


def test_bench_ordered_measures_one_to_four_producers(tmp_path):
    report, printed = _run("bench_ordered.py", tmp_path)
    summary = report["summary"]
    assert set(summary) == {"work", "publish"}, summary.keys()
    for mode, by_producers in summary.items():
        assert sorted(by_producers) == ["1", "2", "3", "4"], (mode, by_producers.keys())
        assert by_producers["1"]["ratio"] == 1.0
        for n, row in by_producers.items():
            assert row["msgs_per_s"] > 0 and row["ratio"] > 0, (mode, n, row)
    assert "publish only" in printed
