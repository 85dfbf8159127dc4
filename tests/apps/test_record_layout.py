"""A recording's layout (visionipc.apps.record.layout): the one segment lister, used by
vipc-record's reader and vipc-analyze's driver alike, lists exactly the segments
vipc-record completes; half-written (.partial) files and other names are never listed."""

import os
import shutil

from visionipc.apps.pipeline import synthetic
from visionipc.apps.pipeline.read import Recording
from visionipc.apps.record import layout
from visionipc.apps.record.index import read_index


def test_segment_names_are_what_the_recorder_writes():
    assert layout.segment_name(3, "parquet") == "000003.parquet"
    assert layout.segment_number("000003.parquet") == 3
    assert layout.segment_number("1000000.parquet") == 1000000  # past six digits
    assert layout.segment_number("000003.mkv", "mkv") == 3
    for name in ("3.parquet", "0000003.parquet", ".000003.partial.parquet", "000003.mkv", "notes.parquet", "٣.parquet"):
        assert layout.segment_number(name) is None, name
    assert layout.is_partial(os.path.basename(layout.partial_path("a/000003.mkv")))
    assert layout.media_file("road", 2, "mkv") == "frames/road/000002.mkv"
    assert layout.index_file("road", 2) == "index/road/000002.parquet"
    assert layout.topic_file("events", 2, "mcap") == "topics/events/000002.mcap"


def test_one_lister_for_reader_and_driver_skips_partial_and_foreign_files(tmp_path):
    rec = synthetic.write_recording(
        str(tmp_path / "rec"), {"road": {"frames": 6, "width": 64, "height": 48, "segment_frames": 3}}
    )
    road = os.path.join(rec, layout.INDEX, "road")
    assert sorted(os.listdir(road)) == ["000000.parquet", "000001.parquet"]
    first = os.path.join(road, "000000.parquet")
    for stray in (".000002.partial.parquet", "notes.parquet", "2.parquet"):  # a recorder killed mid-write, others'
        shutil.copy(first, os.path.join(road, stray))
    os.makedirs(os.path.join(rec, layout.INDEX, ".trash"))
    shutil.copy(first, os.path.join(rec, layout.INDEX, ".trash", "000000.parquet"))

    driver = Recording("rec", rec).index_files()  # vipc-analyze's listing (pipeline/read.py)
    assert driver == [
        ("road", 0, os.path.join(road, "000000.parquet")),
        ("road", 1, os.path.join(road, "000001.parquet")),
    ]
    assert layout.folder_segments(rec, layout.INDEX, "road") == [path for _, _, path in driver]
    table = read_index(rec, "road")  # the reader's (vipc-replay, iter_frames)
    assert table.column("frame_id").to_pylist() == list(range(6))
    assert sorted(set(table.column("segment").to_pylist())) == [0, 1]
    assert layout.folder_segments(rec, layout.INDEX, "nothing") == []
