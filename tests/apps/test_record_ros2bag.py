"""vipc-replay of a ROS 2 bag (MCAP) that the test writes with mcap-ros2-support: raw and
compressed image topics published as VisionIPC streams, pixels and stamps intact."""

import numpy as np
from camera_helpers import REPLAY, connect, finish, reap, start

from msgq.testing import unique_name
from visionipc.apps.record.replay import main as replay_main

HEADER = """================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec"""
IMAGE_MSGDEF = (
    "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\n"
    "uint32 step\nuint8[] data\n" + HEADER
)
COMPRESSED_MSGDEF = "std_msgs/Header header\nstring format\nuint8[] data\n" + HEADER
W, H, N = 40, 24, 6
T0 = 1_700_000_000_000_000_000


def _header(i):
    t = T0 + i * 50_000_000
    return {"stamp": {"sec": t // 1_000_000_000, "nanosec": t % 1_000_000_000}, "frame_id": "cam"}


def _write_bag(path):
    import cv2
    from mcap_ros2.writer import Writer

    rng = np.random.default_rng(3)
    mono = [rng.integers(0, 256, (H, W), np.uint8) for _ in range(N)]
    color = [rng.integers(0, 256, (H, W, 3), np.uint8) for _ in range(N)]
    with open(path, "wb") as f:
        writer = Writer(output=f)
        image = writer.register_msgdef("sensor_msgs/msg/Image", IMAGE_MSGDEF)
        compressed = writer.register_msgdef("sensor_msgs/msg/CompressedImage", COMPRESSED_MSGDEF)
        for i in range(N):
            t = T0 + i * 50_000_000 + 1_000_000  # logged 1 ms after the stamp
            padded = np.zeros((H, W + 8), np.uint8)  # rows longer than the picture (step > width)
            padded[:, :W] = mono[i]
            raw = {"header": _header(i), "height": H, "width": W, "encoding": "mono8", "is_bigendian": 0}
            raw.update(step=W + 8, data=padded.tobytes())
            writer.write_message("/camera/image_raw", image, raw, log_time=t, publish_time=t)
            png = cv2.imencode(".png", color[i])[1].tobytes()
            msg = {"header": _header(i), "format": "png", "data": png}
            writer.write_message("/camera/color/compressed", compressed, msg, log_time=t + 1, publish_time=t + 1)
        writer.finish()
    return mono, color


def _frames(client, stream, count):
    got = []
    while len(got) < count:
        frame = client.recv(3000)
        assert frame is not None, f"{stream}: {len(got)} of {count} frames"
        with frame:
            got.append((frame.frame_id, frame.timestamp_eof, frame.format, frame.array.copy()))
    client.close()
    return got


def test_a_ros2_bag_replays_its_image_topics_as_streams(tmp_path):
    bag = str(tmp_path / "bag.mcap")
    mono, color = _write_bag(bag)
    name = unique_name("bag")
    replay = start(
        REPLAY, bag, "--name", name, "--topic-map", "/camera/image_raw=road",
        "--topic-map", "/camera/color/compressed=color", "--original-timestamps", "--wait-clients", 1,
    )  # fmt: skip
    try:
        clients = connect(name, "road"), connect(name, "color")  # both: the replay waits for every stream
        road, colour = _frames(clients[0], "road", N), _frames(clients[1], "color", N)
        rc, _, err = finish(replay)
    finally:
        reap()
    assert rc == 0, err
    assert [f[0] for f in road] == list(range(N)) and [f[0] for f in colour] == list(range(N))
    assert [f[1] for f in road] == [T0 + i * 50_000_000 for i in range(N)]  # the header stamps
    assert {f[2] for f in road} == {"gray8"} and {f[2] for f in colour} == {"bgr8"}
    assert all(np.array_equal(f[3], m) for f, m in zip(road, mono))
    assert all(np.array_equal(f[3], c) for f, c in zip(colour, color))


def test_bag_bad_input_is_a_clear_error(tmp_path, capsys):
    bag = str(tmp_path / "bag.mcap")
    _write_bag(bag)
    assert replay_main([bag, "--name", "x", "--topic-map", "/nope=road"]) == 2
    assert "no image topic /nope (it has: /camera/color/compressed, /camera/image_raw)" in capsys.readouterr().err
    assert replay_main([bag, "--name", "x", "--topic-map", "road"]) == 2
    assert "TOPIC=STREAM" in capsys.readouterr().err
    (tmp_path / "junk.mcap").write_bytes(b"not an mcap file at all")
    assert replay_main([str(tmp_path / "junk.mcap"), "--name", "x"]) == 2
    assert "not a readable MCAP file" in capsys.readouterr().err
    assert replay_main([str(tmp_path), "--name", "x", "--topic-map", "/a=b"]) == 2
    assert "--topic-map is for ROS 2 bags" in capsys.readouterr().err
