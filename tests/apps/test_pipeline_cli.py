"""vipc-analyze end to end: Parquet results, an HTML report with plots, clear errors."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest
from pipeline_helpers import DROPS, FPS, camera_recordings, recordings, spark  # noqa: F401

from visionipc.apps.pipeline import runs
from visionipc.apps.pipeline.cli import main

FLEET_COMMAND = [sys.executable, "-m", "visionipc.apps.pipeline.synthetic", "fleet", "--recordings", "4"]


def test_vipc_analyze_writes_parquet_results_and_a_report_with_plots(
    spark, camera_recordings, recordings, tmp_path, capsys
):
    out = tmp_path / "out"
    rc = main(
        [
            camera_recordings["lossless"],
            recordings["quality"],
            "--out",
            str(out),
            "--jobs",
            "health,metrics,export",
            "--export",
            "drops:1",
        ]
    )
    assert rc == 0
    run = out / open(out / "LATEST").read().strip()
    assert (run / "_SUCCESS").is_file() and sorted(os.listdir(out)) == ["LATEST", run.name, "tables"]  # no staging left
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["master"].startswith("local") and manifest["jobs"] == ["health", "metrics", "export"]
    assert {i["recording_id"] for i in manifest["inputs"]} == {"lossless", "quality"} and manifest["command"]
    out, first = run, run
    health = pd.read_parquet(out / "health.parquet").set_index(["recording_id", "stream"])
    road = health.loc[("lossless", "road")]
    assert set(DROPS) <= set(road["dropped_frame_ids"]) and abs(road["fps"] - FPS) < 0.02 * FPS
    drops = pd.read_parquet(out / "drops.parquet")
    assert len(drops) == road["drop_gaps"] >= len(DROPS)
    m = pd.read_parquet(out / "metrics")  # partitioned by recording_id, stream
    assert len(m) == health["frames"].sum() and m["date"].notna().all()
    assert sorted(m.loc[m.black, "frame_id"]) == [5]
    assert m["motion"].isna().sum() == len(health)  # only each stream's first frame has no motion
    events = pd.read_parquet(out / "events.parquet")
    delays = events[(events.recording_id == "lossless") & (events.event == "delay")]
    assert {30, 40} <= set(delays["frame_id"])  # the camera's injected delays
    manifest = pd.read_parquet(out / "export" / "manifest.parquet")
    assert len(manifest) >= 2 * len(DROPS) and all((out / "export" / p).is_file() for p in manifest["path"])
    assert set(manifest["recording_id"]) == {"lossless"}
    page = (out / "report.html").read_text()
    images = re.findall(r"src='(plots/[^']+\.png)'", page)
    assert {
        "plots/fps_over_time.png",
        "plots/latency_histogram.png",
        "plots/drop_timeline.png",
        "plots/metric_distributions.png",
    } <= set(images)
    for img in images:
        assert (out / img).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lossless" in page and "road" in page
    assert "Fleet summary" in page and "<details>" in page and "Stall and delay events" in page
    assert page.count("<img src='export/") == min(len(manifest), 48)  # thumbnails of the exported frames
    timeline = pd.read_parquet(out / "fps_timeline.parquet")
    road = timeline[(timeline.recording_id == "lossless") & (timeline.stream == "road")]
    assert road["fps_lowest"].min() < FPS / 1.9  # a single lost frame halves the rate where it happened
    progress = capsys.readouterr().err
    assert "health:" in progress and "metrics:" in progress and "report:" in progress

    # a second run: a new run folder beside the first; --incremental: nothing new
    root = first.parent
    assert main([recordings["quality"], "--out", str(root), "--jobs", "health", "-q"]) == 0
    assert len(runs.completed_runs(str(root))) == 2 and (root / "LATEST").read_text().strip() != first.name
    assert main([recordings["quality"], "--out", str(root), "--jobs", "health", "--incremental"]) == 0
    assert "nothing to analyse" in capsys.readouterr().err and len(runs.completed_runs(str(root))) == 2


def test_vipc_analyze_reports_bad_input_clearly(spark, recordings, tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "o1")]) == 2
    assert "no such recording" in capsys.readouterr().err
    empty = tmp_path / "empty"
    (empty / "index").mkdir(parents=True)
    assert main([str(empty), "--out", str(tmp_path / "o2"), "--jobs", "health"]) == 2
    assert "without any complete segment" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(recordings["quality"], broken)
    (broken / "index" / "sharp" / "000001.parquet").write_bytes(b"garbage")
    assert main([str(broken), "--out", str(tmp_path / "o3"), "--jobs", "health"]) == 2
    assert "corrupt index file" in capsys.readouterr().err
    os.remove(broken / "index" / "sharp" / "000001.parquet")
    os.remove(broken / "frames" / "sharp" / "000000.mkv")
    # a Spark task meets the broken recording: bad input, as on the driver (issue 31)
    assert main([str(broken), "--out", str(tmp_path / "o4"), "--jobs", "metrics"]) == 2
    assert "cannot open" in capsys.readouterr().err
    assert not (tmp_path / "o4").exists()  # the failed run removed the folders it made: nothing looks finished
    (broken / "recording.json").write_text("{not json")
    for jobs in ("health", "metrics"):
        assert main([str(broken), "--out", str(tmp_path / "o6"), "--jobs", jobs]) == 2
        assert "recording.json: not JSON" in capsys.readouterr().err  # checks.parse_manifest
    (tmp_path / "afile").write_text("x")
    assert main([recordings["quality"], "--out", str(tmp_path / "afile")]) == 2
    assert "existing file" in capsys.readouterr().err
    started = time.monotonic()
    assert main([recordings["quality"], "--out", str(tmp_path / "o7"), "--master", "spark://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Spark master" in err and "Traceback" not in err and time.monotonic() - started < 20
    live = tmp_path / "live"
    shutil.copytree(recordings["quality"], live)
    info = json.loads((live / "recording.json").read_text())
    (live / "recording.json").write_text(json.dumps(dict(info, status="recording")))
    assert main([str(live), recordings["quality"], "--out", str(tmp_path / "o8"), "--jobs", "health", "-q"]) == 0
    assert "skipping 1 recording(s) still being recorded" in capsys.readouterr().err
    done = runs.latest(str(tmp_path / "o8"))
    assert set(pd.read_parquet(os.path.join(done, "health.parquet"))["recording_id"]) == {"quality"}
    for bad in ("every:0", "drops:-1", "drops:x", "sharp:3"):
        with pytest.raises(SystemExit) as e:
            main([recordings["quality"], "--out", str(tmp_path / "o9"), "--jobs", "health,export", "--export", bad])
        assert e.value.code == 2 and "--export" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([recordings["quality"], "--out", str(tmp_path / "o5"), "--jobs", "health,colour"])
    assert e.value.code == 2 and "unknown job" in capsys.readouterr().err


def test_metrics_of_lossy_streams_without_recorder_metrics_are_flagged(spark, tmp_path, capsys):
    from visionipc.apps.pipeline import synthetic

    spec = dict(frames=4, width=64, height=48, codec="h264")
    measured = synthetic.write_recording(tmp_path / "measured", {"s": spec})
    decoded = synthetic.write_recording(tmp_path / "decoded", {"s": dict(spec, frame_metrics=False)})
    assert main([measured, "--out", str(tmp_path / "a"), "--jobs", "metrics"]) == 0
    assert "measured decoded" not in capsys.readouterr().err
    assert main([measured, decoded, "--out", str(tmp_path / "b"), "--jobs", "metrics"]) == 0
    note = [line for line in capsys.readouterr().err.splitlines() if "measured decoded" in line]
    assert len(note) == 1 and "1 lossy stream(s)" in note[0] and note[0].endswith("/s")


def test_a_synthetic_fleet_from_the_readme_command_and_the_latency_axis(spark, tmp_path, capsys):
    r = subprocess.run([*FLEET_COMMAND, "--frames", "60"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "4 recording(s) in fleet" in r.stdout, r.stderr
    fleet = tmp_path / "fleet"
    assert sorted(p.relative_to(fleet).as_posix() for p in fleet.glob("*/*")) == [
        "car00/2026-11-01",
        "car00/2026-11-02",
        "car01/2026-11-01",
        "car01/2026-11-02",
    ]
    out = tmp_path / "out"
    assert main([str(fleet / "*" / "2026-11-02"), "--out", str(out), "--jobs", "health", "-q"]) == 0  # a glob
    day2 = pd.read_parquet(os.path.join(runs.latest(str(out)), "health.parquet"))
    assert len(day2) == 4 and set(day2["date"]) == {"2026-11-02"}
    assert main([str(fleet), "--out", str(out), "--jobs", "health,metrics,export", "-q"]) == 0
    run = runs.latest(str(out))
    health = pd.read_parquet(os.path.join(run, "health.parquet"))
    assert len(health) == 8 and set(health["stream"]) == {"road", "cabin"}
    assert health["dropped"].sum() > 0 and (health["longest_stall_ms"] > 40).any()  # something to find
    metrics = pd.read_parquet(os.path.join(run, "metrics"))
    assert metrics["black"].any() or metrics["frozen"].any()

    # the report's latency axis starts at 0 ms, never below (issue 33: it showed negative ticks);
    # a stream whose every frame is in the first bin (a consumer on the same machine) drew -0.055
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from visionipc.apps.pipeline.report import latency_figure

    hist = pd.read_parquet(os.path.join(run, "latency_histogram.parquet"))
    cabin = hist[hist.stream == "cabin"]
    assert set(cabin["lo_ms"]) == {0.0}  # 0.05 ms: the first bin
    for shown in (hist, cabin[cabin.recording_id == cabin.recording_id.iloc[0]]):
        fig = latency_figure(plt, shown)
        fig.canvas.draw()
        lo, hi = fig.axes[0].get_xlim()
        ticks = [t for t in fig.axes[0].get_xticks() if lo <= t <= hi]
        plt.close(fig)
        assert lo == 0 and len(ticks) >= 2 and min(ticks) >= 0, ticks

    r = subprocess.run([*FLEET_COMMAND[:-1], "0"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("--recordings must be >= 1")


def test_spark_submit_command_shown_by_the_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    shown = capsys.readouterr().out
    assert e.value.code == 0 and "spark-submit --master spark://head:7077 $(vipc-analyze --submit-app)" in shown
    assert "$(which vipc-analyze)" not in shown  # spark-submit takes a .py file, not the console script
    with pytest.raises(SystemExit) as e:
        main(["--submit-app"])
    app = capsys.readouterr().out.strip()
    assert e.value.code == 0 and app.endswith("submit.py") and os.path.isfile(app)  # run: test_pipeline_cluster
