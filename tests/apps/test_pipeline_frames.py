"""Frames decoded in Spark executors: per-frame OpenCV metrics and dataset export."""

import multiprocessing
import os

import cv2
import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import DROPS, H, W, camera_recordings, missing_ids, raw_index, recordings, spark  # noqa: F401

from visionipc.apps.pipeline import export, health, metrics, synthetic
from visionipc.apps.pipeline.frames import iter_pictures, read_frames, segment_table, segments_df
from visionipc.apps.pipeline.read import RecordingError, read_index
from visionipc.apps.record.reader import iter_frames


def test_metrics_flag_black_and_frozen_frames_and_rank_sharpness(spark, recordings):
    segments = segments_df(spark, [recordings["quality"]])
    slots = spark.sparkContext.defaultParallelism
    assert segments.count() == 5 and segments.rdd.getNumPartitions() == min(5, 2 * slots)
    assert segments_df(spark, [recordings["quality"]], partitions=100).rdd.getNumPartitions() == 5  # one per segment
    m = metrics.metrics_job(segments).toPandas()
    sharp, blurry, lossy = m[m.stream == "sharp"], m[m.stream == "blurry"], m[m.stream == "compressed"]
    assert len(lossy) == 12 and not lossy.black.any() and lossy["sharpness"].min() > 10 * blurry["sharpness"].max()
    assert sorted(sharp.loc[sharp.black, "frame_id"]) == [5]
    assert sorted(sharp.loc[sharp.frozen, "frame_id"]) == [12, 13]
    assert not blurry.black.any() and not blurry.frozen.any()
    assert sharp.loc[~sharp.black, "sharpness"].min() > 10 * blurry["sharpness"].max()
    assert sharp.loc[sharp.frame_id == 5, "brightness"].item() == 0.0
    first = sharp[(sharp.segment == 0) & (sharp.position == 0)]
    assert np.isnan(first["motion"].item())  # no previous frame inside the segment


def test_metrics_of_real_camera_recordings_nv12_and_gray(spark, camera_recordings):
    paths = [camera_recordings["lossless"], camera_recordings["gray"]]
    keys = ["recording_id", "stream", "segment", "position"]
    on_spark = metrics.spark_metrics(spark, paths).toPandas().sort_values(keys, ignore_index=True)
    alone = metrics.metrics_pandas(paths, processes=2).sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(on_spark, alone)  # the same function, in executors or a process pool
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # a pool of the caller's, kept open
        again = metrics.metrics_pandas(paths, pool=pool).sort_values(keys, ignore_index=True)
        assert pool.apply(sum, ([1, 2],)) == 3  # still usable afterwards
    pd.testing.assert_frame_equal(again, alone)
    for rid in ("lossless", "gray"):
        index = raw_index(camera_recordings[rid])
        got = on_spark[on_spark.recording_id == rid]
        assert sorted(got["frame_id"]) == sorted(index["frame_id"])  # every recorded frame, once
    assert not on_spark.black.any() and not on_spark.frozen.any()  # the pattern scrolls every frame
    assert (on_spark["contrast"] > 20).all() and (on_spark["sharpness"] > 100).all()


def test_spark_metrics_equal_the_same_function_without_spark(spark, recordings):
    keys = ["stream", "segment", "position"]
    on_spark = metrics.spark_metrics(spark, [recordings["quality"]]).toPandas().sort_values(keys, ignore_index=True)
    alone = metrics.metrics_pandas([recordings["quality"]]).sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(on_spark, alone)


def test_read_frames_gives_the_recorded_pixels(spark, recordings):
    frames = read_frames(spark, [recordings["quality"]]).where("stream = 'sharp' AND frame_id = 3").collect()
    assert len(frames) == 1
    f = frames[0]
    image = np.frombuffer(f.pixels, f.dtype).reshape(f.shape)
    assert image.shape == (H * 3 // 2, W)  # NV12 planes, stored losslessly
    assert np.array_equal(image[:H], synthetic.pattern(3, W, H))


def test_export_writes_images_and_a_manifest(spark, camera_recordings, tmp_path):
    rec = camera_recordings["lossless"]
    index = read_index(spark, [rec])
    out = tmp_path / "every"
    manifest = export.export_job(export.select_every_nth(index, 25), out, "png")
    recorded = {row["frame_id"]: image for row, image in iter_frames(rec, "road")}  # vipc-record's reader
    assert sorted(manifest["frame_id"]) == sorted(i for i in recorded if i % 25 == 0)
    for row in manifest.itertuples():
        picture = cv2.imread(str(out / row.path))
        assert picture.shape == (row.height, row.width, 3)
        assert np.array_equal(picture, cv2.cvtColor(recorded[row.frame_id], cv2.COLOR_YUV2BGR_NV12))  # PNG: exact
    around = export.export_job(export.select_around_drops(index, health.drops_job(index), 1), tmp_path / "drops")
    gaps = missing_ids(raw_index(rec), "road")
    expected = sorted({i for d in gaps for i in (d - 1, d + 1)} - set(gaps))
    assert set(DROPS) <= set(gaps) and sorted(around["frame_id"]) == expected
    assert set(around["reason"]) == {"around_drop"}
    assert all(cv2.imread(str(tmp_path / "drops" / p)) is not None for p in around["path"])
    with pytest.raises(ValueError, match="image format"):
        export.export_frames(index, tmp_path, "gif")


def test_a_video_shorter_than_its_index_is_a_clear_error(spark, recordings, tmp_path):
    rec = synthetic.write_recording(tmp_path / "cut", {"s": dict(frames=6, width=W, height=H)})
    video = os.path.join(rec, "frames", "s", "000000.mkv")
    with open(video, "r+b") as f:
        f.truncate(os.path.getsize(video) // 3)
    with pytest.raises(RecordingError, match="ends before|cannot open"):
        metrics.metrics_pandas([rec])
    with pytest.raises(Exception, match="RecordingError"):
        metrics.spark_metrics(spark, [rec]).collect()


def test_lossy_recordings_carry_the_metrics_of_the_frames_as_captured(spark, tmp_path):
    """Default lossy storage (H.264 crf 23, which softens edges by several %): the recorder's
    writer measures each frame before the codec and the metrics job reports exactly the
    lossless numbers, on Spark too, black/frozen flags and motion across segments included."""
    import pyarrow.parquet as pq

    keys, names = ["frame_id"], ["brightness", "contrast", "sharpness", "motion"]
    for fmt, codec in (("nv12", "h264"), ("bgr8", "hevc"), ("gray8", "mp4v")):
        spec = dict(frames=9, width=W, height=H, segment_frames=4, format=fmt, black=[2], frozen=[6])
        lossless = synthetic.write_recording(tmp_path / f"{fmt}-lossless", {"s": spec})
        rec = synthetic.write_recording(tmp_path / f"{fmt}-{codec}", {"s": dict(spec, codec=codec)})
        index = pq.read_table(os.path.join(rec, "index", "s", "000001.parquet"))
        assert index.column_names[-4:] == names and index.column("sharpness").null_count == 0
        assert not any(n in pq.read_schema(os.path.join(lossless, "index", "s", "000000.parquet")).names for n in names)
        a = metrics.metrics_pandas([lossless]).sort_values(keys, ignore_index=True)
        b = metrics.metrics_pandas([rec]).sort_values(keys, ignore_index=True)
        pd.testing.assert_frame_equal(b[names], a[names], rtol=1e-6)
        assert b["black"].tolist() == a["black"].tolist() and a.loc[a.black, "frame_id"].tolist() == [2]
        assert b["frozen"].tolist() == a["frozen"].tolist() and a.loc[a.frozen, "frame_id"].tolist() == [6]
        assert b["motion"].isna().tolist() == [True] + [False] * 8  # segments 1 and 2 carry it on
        # decoded instead, the codec's loss shows (what the stored numbers avoid)
        decoded = synthetic.write_recording(
            tmp_path / f"{fmt}-{codec}-decoded", {"s": dict(spec, codec=codec, frame_metrics=False)}
        )
        c = metrics.metrics_pandas([decoded]).sort_values(keys, ignore_index=True)
        assert not np.allclose(c["sharpness"], a["sharpness"], rtol=1e-3)
    on_spark = metrics.spark_metrics(spark, [rec, lossless]).toPandas()
    pd.testing.assert_frame_equal(on_spark[on_spark.recording_path == rec].sort_values(keys, ignore_index=True), b)


def test_stored_metrics_of_the_wrong_type_are_a_clear_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rec = synthetic.write_recording(tmp_path / "r", {"s": dict(frames=4, width=W, height=H, codec="h264")})
    path = os.path.join(rec, "index", "s", "000000.parquet")
    table = pq.read_table(path)
    at = table.column_names.index("sharpness")
    for bad in (pa.array(["sharp"] * len(table)), pa.array([[1.0]] * len(table))):
        pq.write_table(table.set_column(at, "sharpness", bad), path)
        with pytest.raises(RecordingError, match="000000.parquet: column 'sharpness' is .*, expected a number"):
            metrics.metrics_pandas([rec])


def _coded_planes(rec: str, segments: int) -> list:
    """The I420 planes of a lossy recording's segments as coded, decoded by PyAV (no conversion)."""
    import av

    planes = []
    for seg in range(segments):
        with av.open(os.path.join(rec, "frames", "s", f"{seg:06d}.mp4")) as container:
            planes += [f.to_ndarray() for f in container.decode(video=0)]
    return planes


def test_one_meaning_per_metric_lossless_or_lossy_and_motion_across_segments(spark, tmp_path):
    spec = dict(frames=8, width=W, height=H, segment_frames=3)
    lossless = synthetic.write_recording(tmp_path / "lossless", {"s": spec})
    keys, names = ["frame_id"], ["brightness", "contrast", "sharpness"]

    def lossy(codec, **kw):
        rec = synthetic.write_recording(tmp_path / f"{codec}{kw}", {"s": dict(spec, codec=codec, **kw)})
        return rec, metrics.metrics_pandas([rec]).sort_values(keys, ignore_index=True)

    a = metrics.metrics_pandas([lossless]).sort_values(keys, ignore_index=True)
    # the decoded path (a recording without the recorder's metrics): no conversion error
    # anywhere: H.264 at --crf 0 (x264 codes losslessly) gives the lossless numbers
    _, exact = lossy("h264", crf=0, frame_metrics=False)
    pd.testing.assert_frame_equal(exact[names + ["motion"]], a[names + ["motion"]], rtol=1e-6)
    # mp4v (OpenCV's format, default quality): the metrics measure the coded Y plane as it decodes...
    rec, b = lossy("mp4v", frame_metrics=False)
    coded = _coded_planes(rec, 3)
    luma = [np.clip((p[:H].astype(np.float32) - 16) * 255 / 219, 0, 255) for p in coded]  # docs/pipeline.md
    assert np.allclose(b[names].to_numpy(), [metrics.frame_metrics(y)[:3] for y in luma], rtol=1e-5)
    # ...so what differs from lossless is mpeg4's own loss: brightness/contrast within 1 %; its
    # quantisation softens edges, sharpness by up to 1.1 % here (docs/pipeline.md, "Luma")
    for name in names:
        rtol = 0.02 if name == "sharpness" else 0.01
        assert np.allclose(a[name], b[name], rtol=rtol), (name, a[name].tolist(), b[name].tolist())
    # exported pictures: the coded planes through the lossless path's conversion (FFmpeg's
    # YUV -> BGR, which cv2.VideoCapture uses, is 1-2 levels dark on most grays)
    pictures = [p for segment in segment_table([rec]) for _, p in iter_pictures(segment)]
    assert all(np.array_equal(p, cv2.cvtColor(c, cv2.COLOR_YUV2BGR_I420)) for p, c in zip(pictures, coded))
    # BGR8 through H.264: OpenCV's BT.601 conversion both ways (FFmpeg's bgr24 paths are 1-2 levels
    # dark); left: 8-bit video-range Y moving each gray by up to half a level (+0.4 % contrast here)
    color = dict(spec, format="bgr8")
    exact_bgr = metrics.metrics_pandas([synthetic.write_recording(tmp_path / "bgr", {"s": color})])
    rec, d = lossy("h264", crf=0, format="bgr8", frame_metrics=False)
    assert np.allclose(exact_bgr.sort_values(keys)[names], d[names], rtol=0.01)
    replayed = np.array([image for _, image in iter_frames(rec, "s")], np.float32)  # vipc-replay's reader
    shown = np.array([synthetic.pattern(i, W, H) for i in range(8)], np.float32)[..., None]
    assert abs(np.mean(replayed - shown)) < 0.25 and np.mean(np.abs(replayed - shown)) < 1.0
    # motion carries across segments: only the recording's first frame has none
    assert a["motion"].isna().tolist() == [True] + [False] * 7
    luma = [(synthetic.pattern(i, W, H).astype(np.float32) - 16) * 255 / 219 for i in range(8)]
    luma = [np.clip(y, 0, 255) for y in luma]
    for i in (3, 6):  # the first frames of segments 1 and 2
        assert a.loc[i, "segment"] == i // 3 and a.loc[i, "position"] == 0
        assert a.loc[i, "motion"] == pytest.approx(np.abs(luma[i] - luma[i - 1]).mean(), rel=1e-5)
    on_spark = metrics.spark_metrics(spark, [lossless]).toPandas().sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(on_spark, a)
