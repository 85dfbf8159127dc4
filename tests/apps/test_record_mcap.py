"""MCAP segments (vipc-record --format mcap): files the plain `mcap` reader opens, messages
that decode with Foxglove's schemas (foxglove.RawImage / foxglove.CompressedVideo), frame
times in each message, a per-stream metadata record, bit-exact lossless storage of every
pixel format, and clear errors. Record -> replay -> analyse: test_record_codecs.py."""

import os
import time

import numpy as np
import pytest
from camera_helpers import CAMERA, RECORD, finish, reap, start
from mcap.reader import make_reader
from mcap_protobuf.decoder import DecoderFactory
from test_record_codecs import FORMATS, H, W, _decode, _noise, _smooth, _write

import msgq
from msgq.testing import unique_name, unique_topic
from visionipc.apps.record import codecs
from visionipc.apps.record.recorder import main as record_main


def _read(folder, segment_file):
    with open(folder / segment_file, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        summary = reader.get_summary()
        metadata = list(reader.iter_metadata())
        messages = [(s.name, c.topic, m, msg) for s, c, m, msg in reader.iter_decoded_messages()]
    return summary, metadata, messages


@pytest.mark.parametrize("fmt", FORMATS)
def test_lossless_mcap_holds_foxglove_raw_images_bit_exactly(fmt, tmp_path):
    storage = codecs.AvStorage(fmt, W, H, "ffv1", container="mcap")
    images = _noise(fmt, 3)
    rows = _write(tmp_path, storage, images)
    assert rows[0]["segment_file"] == "frames/s/000000.mcap"
    back = _decode(tmp_path, storage, rows)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(images, back))
    _, metadata, messages = _read(tmp_path, rows[0]["segment_file"])
    assert [m.name for m in metadata] == ["visionipc.stream"]
    info = dict(metadata[0].metadata)
    offset = int(info.pop("monotonic_to_epoch_ns"))
    assert info == {
        "stream": "s", "format": fmt, "width": str(W), "height": str(H), "codec": "ffv1", "clock": "unix epoch",
    }  # fmt: skip
    assert [(name, topic) for name, topic, _, _ in messages] == [("foxglove.RawImage", "/s")] * 3
    for row, (_, _, message, msg) in zip(rows, messages):
        # Unix-epoch nanoseconds, as MCAP and Foxglove expect; the index keeps CLOCK_MONOTONIC
        assert (message.log_time, message.publish_time) == (row["receive_time"] + offset, row["publish_time"] + offset)
        assert msg.timestamp.seconds * 10**9 + msg.timestamp.nanos == row["timestamp_eof"] + offset
        expect = {"gray8": "mono8", "raw16": "mono16", "rgb8": "rgb8", "bgr8": "bgr8"}.get(fmt, "nv12")
        assert (msg.width, msg.height, msg.encoding, msg.frame_id) == (W, H, expect, "s")
        assert len(msg.data) == msg.step * (H * 3 // 2 if expect == "nv12" else H)


@pytest.mark.parametrize("codec,foxglove_format", [("h264", "h264"), ("hevc", "h265"), ("av1", "av1")])
def test_lossy_mcap_holds_one_access_unit_per_compressed_video_message(codec, foxglove_format, tmp_path):
    storage = codecs.AvStorage("nv12", W, H, codec, crf=20, gop=4, container="mcap")
    images = _smooth("nv12", 9)
    rows = _write(tmp_path, storage, images)
    summary, metadata, messages = _read(tmp_path, rows[0]["segment_file"])
    offset = int(metadata[0].metadata["monotonic_to_epoch_ns"])
    assert [name for name, _, _, _ in messages] == ["foxglove.CompressedVideo"] * 9
    assert {msg.format for _, _, _, msg in messages} == {foxglove_format}
    assert [m.log_time for _, _, m, _ in messages] == [r["receive_time"] + offset for r in rows]  # in frame order
    if codec == "h264":  # Annex B; every keyframe (each 4th frame) carries its SPS (NAL type 7)
        for i in (0, 4, 8):
            data = messages[i][3].data
            assert data.startswith(b"\x00\x00\x00\x01") and any(data[j + 4] & 0x1F == 7 for j in _starts(data))
    back = _decode(tmp_path, storage, rows)
    assert len(back) == 9 and all(np.abs(a.astype(int) - b).mean() < 4 for a, b in zip(images, back))


def _starts(data):
    return [i for i in range(len(data) - 4) if data[i : i + 4] == b"\x00\x00\x00\x01"]


def test_mcap_format_errors_are_clear(tmp_path, capsys):
    args = ["--name", "nobody", "--out", str(tmp_path / "a"), "--format", "mcap"]
    assert record_main(args + ["--codec", "mp4v"]) == 2
    assert "--format mcap stores PyAV codecs, not mp4v" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_recorded_topics_get_mcap_segments_of_their_own(tmp_path):
    name, topic, out = unique_name("cam"), unique_topic("events"), tmp_path / "rec"
    camera = start(CAMERA, "--name", name, "--stream", "s", "--width", 96, "--height", 64, "--fps", 20)
    pub = msgq.pub_sock(topic)
    typed = unique_topic("typed")
    schema = msgq.Schema("jsonschema", "Reading", b'{"type": "object"}')
    typed_pub = msgq.pub_sock(typed, schema=schema)
    began = time.time_ns()
    recorder = start(
        RECORD, "--name", name, "--out", out, "--format", "mcap", "--topic", topic, "--topic", typed,
        "--idle-timeout", 30,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(out / "recording.json"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # the topic's subscriber is up
        for i in range(3):
            pub.send(b"m%d" % i)
            typed_pub.send(b'{"i": %d}' % i)
            time.sleep(0.05)
        recorder.terminate()
        rc, _, err = finish(recorder)
        ended = time.time_ns()
        assert rc == 0, err
    finally:
        pub.close()
        typed_pub.close()
        camera.terminate()
        finish(camera)
        reap()
    with open(out / "topics" / topic / "000000.mcap", "rb") as f:
        reader = make_reader(f)
        found = [(c.topic, c.message_encoding, m.data, m.log_time) for _, c, m in reader.iter_messages()]
    messages, topic_times = [m[:3] for m in found], [m[3] for m in found]
    assert messages == [(f"/{topic}", "msgq", b"m%d" % i) for i in range(3)]
    assert sorted(os.listdir(out / "frames" / "s"))[0] == "000000.mcap"
    with open(out / "topics" / typed / "000000.mcap", "rb") as f:  # a declared schema travels with the channel
        typed_found = [
            (s.name, s.encoding, s.data, c.message_encoding, m.data) for s, c, m in make_reader(f).iter_messages()
        ]
    assert typed_found == [("Reading", "jsonschema", schema.data, "json", b'{"i": %d}' % i) for i in range(3)]
    with open(out / "frames" / "s" / "000000.mcap", "rb") as f:
        frame_times = [m.log_time for _, _, m in make_reader(f).iter_messages()]
    # Foxglove places the recording at the wall-clock time it was made: epoch ns, within 1 s
    assert frame_times and all(began - 10**9 <= t <= ended + 10**9 for t in frame_times + topic_times)
