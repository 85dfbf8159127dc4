"""A failed run leaves nothing, even when one of its Spark tasks writes late: the driver
abandons the run (removes its folder) when the first task fails, while another task of
the same job may still be writing its part (a stress run saw ``o1/.run-*.tmp/metrics/
recording_id=broken/stream=sharp/part-000002.parquet`` after the failed run had gone).
Tasks make their folders only below the run's output folder (fs.makedirs_below), so a
late task's write fails instead of making the run's folder again."""

import subprocess
import sys

import pytest

from visionipc.apps.pipeline import fs, runs

LATE_TASK = """
import sys
from visionipc.apps.pipeline import fs
sys.stdin.readline()  # the driver has abandoned the run
try:
    fs.write_bytes(sys.argv[2], b"part", below=sys.argv[1])
except FileNotFoundError as e:
    print("refused:", e)
"""


def test_a_task_writing_after_the_run_was_abandoned_makes_nothing_again(tmp_path):
    out = tmp_path / "o1"
    run = runs.Run(str(out)).begin()
    metrics = run.path("metrics")
    fs.makedirs(metrics)  # metrics_pass makes it before its tasks start
    part = fs.join(metrics, "recording_id=broken", "stream=sharp", "part-000002.parquet")
    early = fs.join(metrics, "recording_id=good", "stream=road", "part-000000.parquet")
    fs.write_bytes(early, b"part", below=metrics)  # a task that wrote in time
    task = subprocess.Popen(
        [sys.executable, "-c", LATE_TASK, metrics, part], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    run.abandon()  # a task failed: the driver removes the run
    said, _ = task.communicate("go\n", timeout=60)
    assert task.returncode == 0 and said.startswith("refused:") and "the run's folder is gone" in said, said
    assert not out.exists()  # neither the run's folder nor --out, which the run made


def test_makedirs_below_makes_only_folders_below_an_existing_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fs.makedirs_below(str(root), str(root / "a" / "b"))
    assert (root / "a" / "b").is_dir()
    fs.makedirs_below(str(root), str(root))  # the root itself: nothing to make
    with pytest.raises(ValueError, match="is not below"):
        fs.makedirs_below(str(root), str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match="the run's folder is gone"):
        fs.makedirs_below(str(tmp_path / "gone"), str(tmp_path / "gone" / "a"))
    assert not (tmp_path / "gone").exists() and not (tmp_path / "elsewhere").exists()
