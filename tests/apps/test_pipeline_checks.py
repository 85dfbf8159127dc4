"""vipc-analyze's checks of its inputs (issue 33, fixed costs): the driver lists the
files and checks recording.json and the names before Spark starts; each index file's
contents are checked by the task that reads it (read.read_index_file), so a bad file
among many is still refused with one line (exit 2, nothing published), and the results
are those of a plain one-process computation."""

import glob
import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import spark  # noqa: F401

from visionipc.apps.pipeline import health, jobs, runs, synthetic, tables
from visionipc.apps.pipeline.cli import main
from visionipc.apps.pipeline.read import (
    RecordingError,
    find_recordings,
    index_files,
    read_index_file,
    read_index_pandas,
)

TABLES = {"health": "health", "drops": "drops", "timeline": "fps_timeline", "latency": "latency_histogram"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """4 index-only recordings x 2 streams x 5 segments of 400 frames (40 index files)."""
    root = tmp_path_factory.mktemp("fleet")
    synthetic.write_index(str(root), recordings=4, streams=2, frames=2000, segment_frames=400, drop_every=97)
    return root


def _one_process(*roots) -> dict:
    """The same tables computed without Spark (read.read_index_pandas + jobs.health_of_streams)."""
    index = read_index_pandas(list(roots), columns=health._NEEDED)
    return dict(jobs.health_of_streams(health._streams(index)))


def _sorted(frame, keys):
    return frame.sort_values(keys, ignore_index=True)


def test_the_results_equal_one_process_and_no_file_is_opened_on_the_driver(spark, fleet, tmp_path):
    files = index_files(find_recordings([fleet]), contents=False)
    assert len(files) == 40
    expected = _one_process(fleet)
    assert main([str(fleet), "--out", str(tmp_path / "out"), "--jobs", "health", "-q"]) == 0
    done = runs.latest(str(tmp_path / "out"))
    for kind, name in TABLES.items():
        got = pd.read_parquet(os.path.join(done, f"{name}.parquet")).drop(columns=["date"])
        keys = [c for c in ("recording_id", "stream", "after_frame_id", "second", "bin") if c in got.columns]
        pd.testing.assert_frame_equal(_sorted(got, keys), _sorted(expected[kind], keys), check_dtype=False)
        # the fleet's tables, written by every slot: still one file per recording
        parts = glob.glob(os.path.join(tables.location(str(tmp_path / "out"), name), "date=*", "recording_id=*", "*"))
        files = [p for p in parts if p.endswith(".parquet")]
        assert len(files) == len({os.path.dirname(p) for p in files}) == expected[kind]["recording_id"].nunique()
    # the driver only lists: a file that is not Parquet at all passes its checks...
    broken = tmp_path / "broken"
    synthetic.write_index(str(broken), recordings=2, streams=1, frames=800, segment_frames=400)
    victim = sorted((broken / "rec00001" / "index" / "cam0").iterdir())[1]
    victim.write_bytes(b"not parquet")
    assert len(index_files(find_recordings([broken]), contents=False)) == 4
    # ...and is refused where it is read, as by the full check of the library's readers
    with pytest.raises(RecordingError, match=f"corrupt index file {victim}"):
        index_files(find_recordings([broken]))
    with pytest.raises(RecordingError, match=f"corrupt index file {victim}"):
        read_index_file(str(victim))


@pytest.mark.parametrize("damage", ["truncated", "other stream", "escaping segment file", "positions"])
def test_a_bad_index_file_among_many_is_refused_with_one_line(spark, fleet, tmp_path, capsys, damage):
    bad = tmp_path / "fleet"
    synthetic.write_index(str(bad), recordings=4, streams=2, frames=2000, segment_frames=400, drop_every=97)
    victim = bad / "rec00002" / "index" / "cam1" / "000003.parquet"
    if damage == "truncated":  # the recorder's disk filled up, a copy stopped half-way
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])
        reason = f"corrupt index file {victim}"
    else:
        table = pq.read_table(victim).to_pandas()
        if damage == "other stream":
            table["stream"] = "cam0"
            reason = f"index file {victim} names stream(s) ['cam0'], not only its folder's 'cam1'"
        elif damage == "escaping segment file":
            table["segment_file"] = "../../../etc/passwd"
            reason = "../../../etc/passwd"
        else:
            table["position"] = table["position"] + 5
            reason = f"index file {victim}: positions must be 0..399"
        pq.write_table(pa.Table.from_pandas(table, preserve_index=False), victim)
    out = tmp_path / "out"
    assert main([str(bad), "--out", str(out), "--jobs", "health", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vipc-analyze: error: "), err
    assert reason in err and "Traceback" not in err
    assert not os.path.isdir(out) or runs.completed_runs(str(out)) == []  # nothing published


def test_tasks_get_streams_of_about_equal_work_and_the_same_results(spark, tmp_path):
    from visionipc.apps.pipeline import tasks
    from visionipc.apps.pipeline.cluster import task_slots

    # equal weights: equal counts, in order; never an empty run, never more runs than rows
    assert tasks.runs([1] * 200, 8) == [(25 * i, 25 * i + 25) for i in range(8)]
    assert tasks.runs([1] * 3, 8) == [(0, 1), (1, 2), (2, 3)] and tasks.runs([], 8) == []
    # a long recording's streams (20 segments) among short ones (1 segment): not 3 streams a task
    weights = [20, 20] + [1] * 10
    cuts = tasks.runs(weights, 4)
    assert cuts == [(0, 1), (1, 2), (2, 12)]
    assert max(sum(weights[a:b]) for a, b in cuts) == 20  # by count, one task would hold 20 + 20 + 1
    # such a fleet through health_pass: the numbers of one process
    synthetic.write_index(str(tmp_path / "long"), recordings=1, streams=2, frames=2000, segment_frames=100)
    synthetic.write_index(str(tmp_path / "short"), recordings=5, streams=2, frames=100, segment_frames=100)
    roots = [tmp_path / "long", tmp_path / "short"]
    got = jobs.health_pass(spark, index_files(find_recordings(roots), contents=False), task_slots(spark))
    expected = _one_process(*roots)
    assert len(expected["health"]) == 12
    for kind in TABLES:
        keys = [c for c in ("recording_id", "stream", "after_frame_id", "second", "bin") if c in got[kind].columns]
        pd.testing.assert_frame_equal(_sorted(got[kind], keys), _sorted(expected[kind], keys), check_dtype=False)
