"""vipc-analyze end to end: Parquet results, an HTML report with plots, clear errors."""

import os
import re
import shutil

import pandas as pd
import pytest
from pipeline_helpers import DROPS, FPS, camera_recordings, recordings, spark  # noqa: F401

from visionipc.apps.pipeline.cli import main


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
    health = pd.read_parquet(out / "health.parquet").set_index(["recording_id", "stream"])
    road = health.loc[("lossless", "road")]
    assert set(DROPS) <= set(road["dropped_frame_ids"]) and abs(road["fps"] - FPS) < 0.02 * FPS
    drops = pd.read_parquet(out / "drops.parquet")
    assert len(drops) == road["drop_gaps"] >= len(DROPS)
    m = pd.read_parquet(out / "metrics.parquet")
    assert len(m) == health["frames"].sum()
    assert sorted(m.loc[m.black, "frame_id"]) == [5]
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
    progress = capsys.readouterr().err
    assert "health:" in progress and "metrics:" in progress and "report:" in progress


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
    assert main([str(broken), "--out", str(tmp_path / "o4"), "--jobs", "metrics"]) == 1
    assert "cannot open" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([recordings["quality"], "--out", str(tmp_path / "o5"), "--jobs", "health,colour"])
    assert e.value.code == 2 and "unknown job" in capsys.readouterr().err
