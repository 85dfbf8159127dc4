"""Frames decoded in Spark executors: per-frame OpenCV metrics and dataset export."""

import os

import cv2
import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import DROPS, H, W, recordings, spark  # noqa: F401

from visionipc.pipeline import export, health, metrics, synthetic
from visionipc.pipeline.frames import read_frames, segments_df
from visionipc.pipeline.read import RecordingError, read_index


def test_metrics_flag_black_and_frozen_frames_and_rank_sharpness(spark, recordings):
    segments = segments_df(spark, [recordings["quality"]])
    assert segments.rdd.getNumPartitions() == segments.count() == 4  # one task per segment
    m = metrics.metrics_job(segments).toPandas()
    sharp, blurry = m[m.stream == "sharp"], m[m.stream == "blurry"]
    assert sorted(sharp.loc[sharp.black, "frame_id"]) == [5]
    assert sorted(sharp.loc[sharp.frozen, "frame_id"]) == [12, 13]
    assert not blurry.black.any() and not blurry.frozen.any()
    assert sharp.loc[~sharp.black, "sharpness"].min() > 10 * blurry["sharpness"].max()
    assert sharp.loc[sharp.frame_id == 5, "brightness"].item() == 0.0
    first = sharp[(sharp.segment == 0) & (sharp.position == 0)]
    assert np.isnan(first["motion"].item())  # no previous frame inside the segment


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


def test_export_writes_images_and_a_manifest(spark, recordings, tmp_path):
    index = read_index(spark, [recordings["faults"]])
    out = tmp_path / "every"
    manifest = export.export_job(export.select_every_nth(index.where("stream = 'road'"), 25), out, "png")
    assert sorted(manifest["frame_id"]) == [0, 25, 50, 75, 100]
    for row in manifest.itertuples():
        picture = cv2.imread(str(out / row.path))
        nv12 = np.vstack([synthetic.pattern(row.frame_id, W, H), np.full((H // 2, W), 128, np.uint8)])
        assert np.array_equal(picture, cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12))  # PNG: exact
    around = export.export_job(export.select_around_drops(index, health.drops_job(index), 1), tmp_path / "drops")
    expected = sorted({i for d in DROPS for i in (d - 1, d + 1)})
    assert sorted(around["frame_id"]) == expected and set(around["reason"]) == {"around_drop"}
    assert all(os.path.getsize(tmp_path / "drops" / p) > 0 for p in around["path"])
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
