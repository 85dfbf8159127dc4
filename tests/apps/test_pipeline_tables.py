"""vipc-analyze's tables that grow with the fleet (issue 33, item 3): stable recording ids,
Hive-partitioned tables replaced per recording by dynamic partition overwrite, --incremental
by content, --table, and the tables read with partition pruning by Spark, DuckDB, pyarrow/pandas."""

import glob
import json
import os
import shutil
import uuid

import pandas as pd
import pytest
from pipeline_helpers import camera_recordings, spark  # noqa: F401

from visionipc.apps.pipeline import runs, synthetic, tables
from visionipc.apps.pipeline.cli import main
from visionipc.apps.pipeline.read import find_recordings, recording_info

ROAD = dict(frames=90, width=32, height=24, drop=[7, 61], delay_ms={20: 40}, segment_frames=30)


def _recording(path, day: str, **road) -> str:
    return synthetic.write_recording(
        path, {"road": dict(ROAD, **road)}, name="car", wall_time=f"2026-11-{day}T08:00:00.000Z"
    )


def _rows(out, name: str, rid: str) -> pd.DataFrame:
    """One recording's rows of a table, read by pyarrow/pandas with a filter on the partition."""
    frame = pd.read_parquet(tables.location(str(out), name), filters=[("recording_id", "==", rid)])
    keys = ["stream", *tables.ORDER[name][1:]]
    where = [c for c in ("date", "recording_id", "recording", "recording_path") if c in frame]  # where it lay
    return frame.drop(columns=where).sort_values(keys, ignore_index=True)


def _files(out, name: str) -> list:
    return sorted(glob.glob(os.path.join(tables.location(str(out), name), "date=*", "recording_id=*", "*.parquet")))


def test_recorder_writes_a_recording_id_and_older_recordings_get_one_from_their_content(camera_recordings, tmp_path):
    recorded = json.loads(open(os.path.join(camera_recordings["lossless"], "recording.json")).read())
    assert uuid.UUID(recorded["recording_id"]).version == 4  # vipc-record, when recording starts
    (rec,) = find_recordings(camera_recordings["lossless"])
    assert tables.stable_id(rec, recording_info(rec)) == recorded["recording_id"]
    # an older recording (no recording_id): the same id alone and inside a fleet, and after it grew
    day1 = _recording(tmp_path / "day1", "03")
    for car in ("carA", "carB"):
        shutil.copytree(day1, tmp_path / "fleet" / car / "day1")
    (alone,) = find_recordings(day1)
    in_fleet = find_recordings(tmp_path / "fleet")
    assert alone.recording_id == "day1" and in_fleet[0].recording_id == "carA/day1"  # names differ
    ids = {tables.stable_id(r, recording_info(r)) for r in [alone, *in_fleet]}
    assert len(ids) == 1 and uuid.UUID(ids.pop()).version == 5
    grown = json.loads((tmp_path / "day1" / "recording.json").read_text())
    grown["streams"]["road"].update(segments=9, frames=999)
    (tmp_path / "day1" / "recording.json").write_text(json.dumps(grown))
    assert tables.stable_id(alone, recording_info(alone)) == tables.stable_id(in_fleet[0], recording_info(in_fleet[0]))


def test_a_recording_analysed_partially_then_again_after_it_grew(spark, tmp_path, capsys):
    full = _recording(tmp_path / "full" / "day1", "03")
    other = _recording(tmp_path / "other" / "day2", "04", drop=[50])
    # day1 while it was recorded: its first segment only, recording.json still saying so
    partial = tmp_path / "live" / "carA" / "day1"
    shutil.copytree(full, partial)
    for f in glob.glob(str(partial / "*" / "road" / "00000[12].*")):
        os.remove(f)
    info = json.loads((partial / "recording.json").read_text())
    (partial / "recording.json").write_text(json.dumps(dict(info, status="recording")))
    out = tmp_path / "out"
    args = ["--out", str(out), "--jobs", "health,metrics", "--incremental", "-q"]
    assert main([str(partial), other, *args, "--allow-partial"]) == 0
    (rec,) = find_recordings(partial)
    rid = tables.stable_id(rec, recording_info(rec))
    assert _rows(out, "health", rid)["frames"].tolist() == [30]
    # nothing changed: nothing to analyse (by content)
    assert main([str(tmp_path / "live"), other, *args, "--allow-partial"]) == 0
    assert len(runs.completed_runs(str(out))) == 1
    # it grew and completed, and is now given as part of a fleet (another name, same id)
    for f in glob.glob(os.path.join(full, "*", "road", "00000[12].*")):
        shutil.copy(f, str(f).replace(full, str(partial)))
    shutil.copy(os.path.join(full, "recording.json"), partial / "recording.json")
    assert main([str(tmp_path / "live"), other, *args]) == 0
    latest = runs.latest(str(out))
    assert [i["recording_id"] for i in json.loads(open(os.path.join(latest, "run.json")).read())["inputs"]] == [
        "day1"
    ]  # only the recording that changed was analysed again

    # its partitions hold the full recording's numbers (as a run of the full recording alone
    # gives them) and nothing of the partial run; the other recording's are untouched
    reference = tmp_path / "reference"
    assert main([full, "--out", str(reference), "--jobs", "health,metrics", "-q"]) == 0
    for name in (*tables.HEALTH_TABLES, *tables.METRICS_TABLES):
        got, want = _rows(out, name, rid), _rows(reference, name, rid)
        pd.testing.assert_frame_equal(got, want, check_dtype=False, check_categorical=False)
    assert _rows(out, "health", rid)["frames"].tolist() == [88]
    assert len(_rows(out, "metrics", rid)) == 88 and len(_rows(out, "drops", rid)) == 2
    # one file per recording and table (three segments, one metrics file), under its date
    metrics = _files(out, "metrics")
    assert len(metrics) == 2 and f"date=2026-11-03{os.sep}recording_id={rid}" in metrics[0]
    assert all(len(_files(out, name)) == 2 for name in (*tables.HEALTH_TABLES, "metrics_summary"))
    run_metrics = os.path.join(runs.latest(str(reference)), "metrics")  # the run folder's too
    assert len(glob.glob(os.path.join(run_metrics, "recording_id=day1", "stream=road", "*.parquet"))) == 1
    assert len(pd.read_parquet(run_metrics)) == 88
    # LATEST holds the whole tables (both recordings), not only what this run analysed
    health = pd.read_parquet(os.path.join(latest, "health.parquet"))
    assert sorted(health["recording"]) == ["day1", "day2"] and sorted(health["frames"]) == [88, 89]
    assert "day2" in open(os.path.join(latest, "report.html")).read()


def test_tables_read_with_partition_pruning_by_spark_duckdb_and_pandas(spark, tmp_path, capsys):
    duckdb = pytest.importorskip("duckdb")
    a = _recording(tmp_path / "fleet" / "a", "03")
    b = _recording(tmp_path / "fleet" / "b", "04", drop=[50])
    out = tmp_path / "out"
    assert main([str(tmp_path / "fleet"), "--out", str(out), "--jobs", "health,metrics", "--table", "fleet"]) == 0
    assert "registered fleet_health, fleet_drops" in capsys.readouterr().err
    ids = {}
    for path in (a, b):
        (rec,) = find_recordings(path)
        ids[rec.recording_id] = tables.stable_id(rec, recording_info(rec))
    # the catalog tables (the tests' session: the default local catalog)
    assert spark.table("fleet_metrics").where(f"recording_id = '{ids['a']}'").count() == 88
    assert {r.recording for r in spark.table("fleet_health").collect()} == {"a", "b"}
    # pruning proved: b's files are made unreadable; a reader that opened them would fail
    for f in _files(out, "metrics") + _files(out, "health"):
        if ids["b"] in f:
            open(f, "wb").write(b"not parquet")
    where = tables.location(str(out), "metrics")
    spark.catalog.refreshTable("fleet_metrics")
    by_spark = spark.table("fleet_metrics").where(f"recording_id = '{ids['a']}'").toPandas()
    files = os.path.join(where, "**", "*.parquet")
    by_duckdb = duckdb.sql(
        f"SELECT * FROM read_parquet('{files}', hive_partitioning = true) WHERE recording_id = '{ids['a']}'"
    ).df()
    by_pandas = pd.read_parquet(where, filters=[("date", "==", "2026-11-03"), ("recording_id", "==", ids["a"])])
    for frame in (by_spark, by_duckdb, by_pandas):
        frame = frame.sort_values(["stream", "segment", "position"], ignore_index=True)
        assert len(frame) == 88 and set(frame["recording"]) == {"a"}
        assert frame["brightness"].tolist() == by_pandas.sort_values(["segment", "position"])["brightness"].tolist()
    assert duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{files}', hive_partitioning = true) WHERE date = '2026-11-03'"
    ).fetchall() == [(88,)]


def test_bad_recording_ids_and_table_names_are_one_line(tmp_path, capsys):
    rec = _recording(tmp_path / "r", "03", frames=5)
    info = json.loads(open(os.path.join(rec, "recording.json")).read())
    for bad in ("../../etc", 7):
        open(os.path.join(rec, "recording.json"), "w").write(json.dumps(dict(info, recording_id=bad)))
        assert main([rec, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "'recording_id' must be" in err and len(err.strip().splitlines()) == 1
    open(os.path.join(rec, "recording.json"), "w").write(json.dumps(info))
    shutil.copytree(rec, tmp_path / "copy")
    assert main([rec, str(tmp_path / "copy"), "--out", str(tmp_path / "o")]) == 2
    assert "are the same recording" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([rec, "--out", str(tmp_path / "o"), "--table", "bad name"])
    assert e.value.code == 2 and "--table 'bad name'" in capsys.readouterr().err
