"""What vipc-replay publishes from the formats other tools write shows in vipc-view: an MCAP
recording made by the real vipc-camera -> vipc-record --format mcap, and a ROS 2 bag written
with mcap-ros2-support (test_record_ros2bag's). The view's snapshot of a frame is compared
with that very frame (its X-Frame-Id) decoded from the file, and with another one."""

import cv2
import numpy as np
from camera_helpers import CAMERA, RECORD, REPLAY, finish, reap, start
from test_record_ros2bag import _write_bag
from view_helpers import ViewProcess

from msgq.testing import unique_name
from visionipc.apps.record.reader import iter_frames


def _snapshot(view, stream):
    """(frame id, BGR image) of the view's newest frame of ``stream``."""
    view.wait_for(lambda s: stream in s["streams"] and s["streams"][stream]["live"], what=f"{stream} live")
    status, headers, body = view.get(f"/snapshot/{stream}.jpg")
    assert status == 200 and headers["Content-Type"] == "image/jpeg", body[:200]
    image = cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return int(headers["X-Frame-Id"]), image


def _diff(a, b):
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


def _replay_in_view(source, name, *args):
    """Start vipc-replay of ``source`` (looping) and vipc-view on its server; yields the view."""
    replay = start(REPLAY, source, "--name", name, "--loop", *args)
    return replay, ViewProcess("--name", name)


def test_an_mcap_recording_replays_into_vipc_view(tmp_path):
    name, out = unique_name("cam"), tmp_path / "rec"
    camera = start(CAMERA, "--name", name, "--stream", "road", "--width", 96, "--height", 64, "--fps", 30)
    recorder = start(RECORD, "--name", name, "--out", out, "--format", "mcap", "--frames", 40, "--crf", 18)
    try:
        rc, _, err = finish(recorder, timeout=60)
        assert rc == 0, err
        camera.terminate()
        finish(camera)
        assert sorted(p.suffix for p in (out / "frames" / "road").iterdir()) == [".mcap"]
        recorded = {
            row["frame_id"]: cv2.cvtColor(image, cv2.COLOR_YUV2BGR_NV12) for row, image in iter_frames(out, "road")
        }
        assert len(recorded) == 40

        replay_name = unique_name("rep")
        replay, view = _replay_in_view(str(out), replay_name)
        with view:
            frame_id, shown = _snapshot(view, "road")
        assert replay.poll() is None, "vipc-replay ended while looping"
        replay.terminate()
        assert finish(replay)[0] == 0
    finally:
        reap()
    assert shown.shape == (64, 96, 3) and frame_id in recorded
    ids = sorted(recorded)  # the recorder starts with the camera's frame then (not always 0, under load)
    other = recorded[ids[(ids.index(frame_id) + 20) % len(ids)]]  # the synthetic pattern has moved by then
    assert _diff(shown, recorded[frame_id]) < 12 < _diff(shown, other), (frame_id, _diff(shown, other))


def test_a_ros2_bag_replays_into_vipc_view(tmp_path):
    bag = str(tmp_path / "bag.mcap")
    mono, _ = _write_bag(bag)
    try:
        replay, view = _replay_in_view(bag, unique_name("bag"), "--topic-map", "/camera/image_raw=road")
        with view:
            frame_id, shown = _snapshot(view, "road")
        replay.terminate()
        assert finish(replay)[0] == 0
    finally:
        reap()
    gray = cv2.cvtColor(shown, cv2.COLOR_BGR2GRAY)
    assert gray.shape == mono[0].shape and 0 <= frame_id < len(mono)
    # the bag's pictures are noise: JPEG keeps the right one close, any other is far off
    right = _diff(gray, mono[frame_id])
    assert right < 30 and all(right * 2 < _diff(gray, m) for i, m in enumerate(mono) if i != frame_id)
