"""Stream health on Spark: fps, drops, latency, jitter, stalls; Spark and pandas agree."""

import os
import shutil

import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import DROPS, FPS, numpy_latency, raw_index, recordings, spark  # noqa: F401

from visionipc.pipeline import health
from visionipc.pipeline.read import RecordingError, find_recordings, read_index, read_index_pandas


def _sorted(df, keys):
    return df.sort_values(keys, ignore_index=True)


def test_health_finds_rate_every_drop_and_numpy_latency_percentiles(spark, recordings):
    index = read_index(spark, [recordings["faults"]])
    rows = health.health_job(index).toPandas().set_index("stream")
    reference = raw_index(recordings["faults"])
    for stream, expected_drops in (("road", DROPS), ("wide", [])):
        h = rows.loc[stream]
        assert abs(h["fps"] - FPS) / FPS < 0.02
        assert list(h["dropped_frame_ids"]) == expected_drops
        assert h["frames"] == (reference["stream"] == stream).sum()
        got = [h["latency_p50_ms"], h["latency_p95_ms"], h["latency_p99_ms"], h["latency_max_ms"]]
        assert got == numpy_latency(reference, stream)
    drops = _sorted(health.drops_job(index).toPandas(), ["after_frame_id"])
    assert [a + 1 for a in drops["after_frame_id"]] == DROPS and list(drops["missing"]) == [1, 1, 1]
    road = rows.loc["road"]
    assert road["longest_stall_ms"] > 120 and road["stall_before_frame_id"] == 40  # the 120 ms delay
    assert road["fps_min"] < FPS * 0.95 <= rows.loc["wide"]["fps_min"]


def test_spark_and_pandas_give_identical_numbers(spark, recordings):
    paths = [recordings["faults"], recordings["quality"]]
    index_pd = read_index_pandas(paths)
    index_spark = read_index(spark, paths)
    for job, local, keys in ((health.health_job, health.health_pandas, health.KEYS),
                             (health.drops_job, health.drops_pandas, health.KEYS + ["after_frame_id"]),
                             (health.timeline_job, health.timeline_pandas, health.KEYS + ["second"])):
        on_spark, on_pandas = _sorted(job(index_spark).toPandas(), keys), _sorted(local(index_pd), keys)
        assert len(on_pandas) > 0
        for column in on_pandas.columns:
            a, b = on_spark[column].tolist(), on_pandas[column].tolist()
            if column == "dropped_frame_ids":
                a, b = [list(x) for x in a], [list(x) for x in b]
            assert a == b, column  # exact: the same function on the same rows


def test_stream_health_is_a_pure_function_of_a_pandas_frame():
    ids = np.array([0, 1, 2, 5, 6, 7], np.int64)
    eof = 10**9 + ids * 100_000_000  # 10 fps
    recv = eof + np.array([1, 1, 1, 300, 1, 2]) * 1_000_000
    frame = pd.DataFrame({"recording_id": "r", "stream": "s", "frame_id": ids, "timestamp_sof": eof - 5_000_000,
                          "timestamp_eof": eof, "receive_time": recv, "segment": np.int32(0),
                          "position": np.arange(6, dtype=np.int32)})
    h = health.stream_health(frame.iloc[::-1]).iloc[0]  # any row order: recorded order is (segment, position)
    assert h["fps"] == pytest.approx(10.0) and h["received_fps"] == pytest.approx(5 / 0.7)
    assert list(h["dropped_frame_ids"]) == [3, 4] and h["drop_gaps"] == 1 and h["dropped"] == 2
    assert h["exposure_p50_ms"] == 5.0 and h["latency_max_ms"] == 300.0
    assert h["longest_stall_ms"] == pytest.approx(599.0) and h["stall_before_frame_id"] == 5
    d = health.find_drops(frame).iloc[0]
    assert (d["after_frame_id"], d["next_frame_id"], d["missing"], d["position"]) == (2, 5, 2, 3)
    assert len(health.stream_health(frame.iloc[:0])) == 0


def test_recordings_from_paths_globs_and_parent_folders(recordings, tmp_path):
    root = recordings["root"]
    assert [r.recording_id for r in find_recordings(root)] == ["faults", "quality"]
    assert [r.recording_id for r in find_recordings(os.path.join(root, "*"))] == ["faults", "quality"]
    for fleet in ("car1", "car2"):  # same folder names in two places get their paths as ids
        shutil.copytree(recordings["quality"], tmp_path / fleet / "quality")
    assert [r.recording_id for r in find_recordings(tmp_path)] == ["car1/quality", "car2/quality"]
    index = read_index_pandas([tmp_path / "car1", recordings["faults"]])
    assert sorted(index["recording_id"].unique()) == ["faults", "quality"]


def test_bad_input_gives_clear_errors(spark, recordings, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such recording"):
        find_recordings(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no recording matches"):
        find_recordings(str(tmp_path / "nothing*"))
    empty = tmp_path / "empty"
    (empty / "index").mkdir(parents=True)
    (empty / "recording.json").write_text('{"format_version": 1, "status": "recording"}')
    with pytest.raises(RecordingError, match="without any complete segment"):
        read_index(spark, [empty])
    assert read_index(spark, [empty, recordings["quality"]], skip_empty=True).count() == 36
    broken = tmp_path / "broken"
    shutil.copytree(recordings["quality"], broken)
    (broken / "index" / "blurry" / "000000.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RecordingError, match=r"corrupt index file .*blurry/000000\.parquet"):
        read_index(spark, [broken])
    pd.DataFrame({"stream": ["x"], "frame_id": [1]}).to_parquet(broken / "index" / "blurry" / "000000.parquet")
    with pytest.raises(RecordingError, match="has no column 'timestamp_sof'"):
        read_index_pandas([broken])
