"""Stream health on Spark: fps, drops, latency, jitter, stalls; Spark and pandas agree."""

import os
import shutil

import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import (  # noqa: F401
    DELAYS_MS,
    DROPS,
    FPS,
    camera_recordings,
    missing_ids,
    numpy_latency,
    raw_index,
    recordings,
    spark,
)

from visionipc.apps.pipeline import health, read
from visionipc.apps.pipeline.read import RecordingError, find_recordings, read_index, read_index_pandas


def _sorted(df, keys):
    return df.sort_values(keys, ignore_index=True)


def test_health_of_real_camera_recordings_finds_rate_drops_and_numpy_latency(spark, camera_recordings):
    paths = [camera_recordings["lossless"], camera_recordings["gray"]]
    rows = health.health_job(read_index(spark, paths)).toPandas().set_index(["recording_id", "stream"])
    assert sorted(rows.index) == [("gray", "left"), ("gray", "right"), ("lossless", "road")]
    for (rid, stream), h in rows.iterrows():
        reference = raw_index(camera_recordings[rid])  # pyarrow + numpy, no pipeline code
        assert abs(h["fps"] - FPS) / FPS < 0.02, (rid, stream, h["fps"])
        found = list(h["dropped_frame_ids"])
        assert set(DROPS) <= set(found)  # every injected drop, at its frame id...
        assert found == missing_ids(reference, stream)  # ...and exactly the gaps in the index (the camera may skip
        # a slot under overload, and then it is a drop too)
        assert h["frames"] == (reference["stream"] == stream).sum()
        got = [h["latency_p50_ms"], h["latency_p95_ms"], h["latency_p99_ms"], h["latency_max_ms"]]
        assert got == numpy_latency(reference, stream)
        assert h["latency_max_ms"] >= max(DELAYS_MS.values()) * 0.9  # the 120 ms delay
        assert h["longest_stall_ms"] >= max(DELAYS_MS.values())
    drops = health.drops_job(read_index(spark, [camera_recordings["lossless"]])).toPandas()
    starts = {a + 1 for a in drops["after_frame_id"]}
    assert set(DROPS) <= starts and drops["missing"].sum() == rows.loc[("lossless", "road"), "dropped"]


def test_health_of_a_synthetic_recording_with_exact_timing(spark, recordings):
    rows = health.health_job(read_index(spark, [recordings["faults"]])).toPandas().set_index("stream")
    road = rows.loc["road"]
    assert road["fps"] == pytest.approx(FPS, rel=1e-6) and list(road["dropped_frame_ids"]) == DROPS
    assert road["longest_stall_ms"] > 120 and road["stall_before_frame_id"] == 40  # the 120 ms delay
    assert road["fps_min"] < FPS * 0.95 <= rows.loc["wide"]["fps_min"]
    assert rows.loc["wide"]["latency_p50_ms"] == pytest.approx(5.0)


def test_spark_and_pandas_give_identical_numbers(spark, recordings, camera_recordings):
    paths = [camera_recordings["lossless"], camera_recordings["gray"], recordings["faults"], recordings["quality"]]
    index_pd = read_index_pandas(paths)
    index_spark = read_index(spark, paths)
    streams = health.streams_df(spark, paths)
    for job, from_files, local, keys in (
        (health.health_job, health.health_from_files, health.health_pandas, health.KEYS),
        (health.drops_job, health.drops_from_files, health.drops_pandas, health.KEYS + ["after_frame_id"]),
        (health.timeline_job, health.timeline_from_files, health.timeline_pandas, health.KEYS + ["second"]),
    ):
        on_pandas = _sorted(local(index_pd), keys)
        assert len(on_pandas) > 0
        for on_spark in (_sorted(job(index_spark).toPandas(), keys), _sorted(from_files(streams).toPandas(), keys)):
            for column in on_pandas.columns:
                a, b = on_spark[column].tolist(), on_pandas[column].tolist()
                if column == "dropped_frame_ids":
                    a, b = [list(x) for x in a], [list(x) for x in b]
                assert a == b, column  # exact: the same function on the same rows


def test_vipc_data_source_reads_the_same_index(spark, camera_recordings, recordings):
    paths = [camera_recordings["gray"], recordings["faults"]]
    via_source = spark.read.format("vipc").option("paths", ",".join(paths)).load()
    assert via_source.rdd.getNumPartitions() == 1  # partitions of ~64 MiB of index files, not one per file
    one_each = spark.read.format("vipc").option("paths", ",".join(paths)).option("partition_bytes", 1).load()
    assert one_each.rdd.getNumPartitions() == len(read.index_files(read.find_recordings(paths)))
    keys = ["recording_id", "stream", "frame_id"]
    a = via_source.toPandas().sort_values(keys, ignore_index=True)
    b = read_index(spark, paths).select(*via_source.columns).toPandas().sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(a, b)
    # filters pushed into the reader (files by stream, row groups by frame id); columns pruned by a schema
    q = via_source.where("stream = 'road' AND frame_id >= 50 AND frame_id < 80").toPandas()
    expected = a[(a.stream == "road") & (a.frame_id >= 50) & (a.frame_id < 80)]
    assert sorted(q["frame_id"]) == sorted(expected["frame_id"]) and len(q)
    pruned = spark.read.format("vipc").schema("frame_id bigint, recording_id string").load(paths[1]).toPandas()
    assert list(pruned.columns) == ["frame_id", "recording_id"] and set(pruned["recording_id"]) == {"faults"}
    with pytest.raises(Exception, match="needs a recording"):
        spark.read.format("vipc").load().count()


def test_vipc_data_source_reads_the_recorders_frame_metrics(spark, tmp_path):
    from visionipc.apps.pipeline import metrics, synthetic

    names = ["brightness", "contrast", "sharpness", "motion"]
    spec = dict(frames=5, width=64, height=48, segment_frames=2)
    lossy = synthetic.write_recording(tmp_path / "lossy", {"s": dict(spec, codec="h264")})
    lossless = synthetic.write_recording(tmp_path / "lossless", {"s": spec})
    source = spark.read.format("vipc").option("paths", f"{lossy},{lossless}")
    assert not set(names) & set(source.load().columns)  # only when asked for
    df = source.option("frame_metrics", "true").load()
    assert df.columns[-4:] == names
    got = df.toPandas().set_index("recording_id")
    measured = got.loc["lossy"].sort_values("frame_id")
    expected = metrics.metrics_pandas([lossless]).sort_values("frame_id")
    np.testing.assert_allclose(measured[names].to_numpy(float), expected[names].to_numpy(float), rtol=1e-6)
    assert got.loc["lossless", names].isna().all().all()  # not measured by the recorder: null
    assert df.where("sharpness > 0").count() == 5
    pruned = spark.read.format("vipc").schema("frame_id bigint, sharpness double").load(lossy).toPandas()
    assert list(pruned.columns) == ["frame_id", "sharpness"] and pruned["sharpness"].notna().all()


def test_stream_health_is_a_pure_function_of_a_pandas_frame():
    ids = np.array([0, 1, 2, 5, 6, 7], np.int64)
    eof = 10**9 + ids * 100_000_000  # 10 fps
    recv = eof + np.array([1, 1, 1, 300, 1, 2]) * 1_000_000
    frame = pd.DataFrame(
        {
            "recording_id": "r",
            "stream": "s",
            "frame_id": ids,
            "timestamp_sof": eof - 5_000_000,
            "timestamp_eof": eof,
            "receive_time": recv,
            "segment": np.int32(0),
            "position": np.arange(6, dtype=np.int32),
        }
    )
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
    assert read_index(spark, [empty, recordings["quality"]], skip_empty=True).count() == 48
    broken = tmp_path / "broken"
    shutil.copytree(recordings["quality"], broken)
    (broken / "index" / "blurry" / "000000.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(RecordingError, match=r"corrupt index file .*blurry/000000\.parquet"):
        read_index(spark, [broken])
    pd.DataFrame({"stream": ["x"], "frame_id": [1]}).to_parquet(broken / "index" / "blurry" / "000000.parquet")
    with pytest.raises(RecordingError, match="has no column 'timestamp_sof'"):
        read_index_pandas([broken])
