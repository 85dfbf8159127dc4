"""vipc-foxglove: a real camera served over the Foxglove WebSocket protocol, read by a
WebSocket client (the `websockets` package) that subscribes like Foxglove does and decodes
the frames (JPEG and H.264) and a msgq topic's raw messages."""

import asyncio
import base64
import json
import re
import struct
import time

import numpy as np
import pytest
from camera_helpers import CAMERA, finish, reap, start

import msgq
from msgq.testing import unique_name, unique_topic
from visionipc.apps.camera.pattern import read_stamp
from visionipc.apps.foxglove.bridge import main as foxglove_main

FOXGLOVE = "visionipc.apps.foxglove.bridge"


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    reap()


def _message_class(schema_b64, name):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for fd in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(schema_b64)).file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


async def _subscribe(url, topics, count):
    """Subscribe to ``topics`` like a Foxglove client; ``count`` messages of each:
    {topic: [(log_time, payload)]}, and the advertised channels."""
    import websockets

    got, channels = {t: [] for t in topics}, {}
    async with websockets.connect(url, subprotocols=["foxglove.sdk.v1", "foxglove.websocket.v1"]) as ws:
        subs = {}
        while any(len(v) < count for v in got.values()):
            raw = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(raw, str):
                msg = json.loads(raw)
                if msg.get("op") == "advertise":
                    for ch in msg["channels"]:
                        channels[ch["topic"]] = ch
                        if ch["topic"] in topics and ch["topic"] not in subs.values():
                            sid = len(subs) + 1
                            subs[sid] = ch["topic"]
                            await ws.send(
                                json.dumps({"op": "subscribe", "subscriptions": [{"id": sid, "channelId": ch["id"]}]})
                            )
                continue
            if raw[0] == 1:  # message data: opcode, subscription id, log time, payload
                sid, log_time = struct.unpack_from("<IQ", raw, 1)
                got[subs[sid]].append((log_time, raw[13:]))
    return got, channels


def _subscribe_while_publishing(url, topics, pub, message):
    """``_subscribe(url, topics, 3)`` while ``pub`` sends ``message(i)`` every 20 ms."""

    async def both():
        async def publish():
            for i in range(200):
                pub.send(message(i))
                await asyncio.sleep(0.02)

        task = asyncio.create_task(publish())
        try:
            return await _subscribe(url, topics, 3)
        finally:
            task.cancel()

    return asyncio.run(both())


def _serve(tmp_path, *extra):
    name = unique_name("cam")
    camera = start(CAMERA, "--name", name, "--stream", "road", "--width", 96, "--height", 64, "--fps", 30)
    bridge = start(FOXGLOVE, "--name", name, "--port", 0, *extra)
    line = ""
    while "ws://" not in line:
        line = bridge.stderr.readline()
        assert line, "vipc-foxglove exited early"
    return camera, bridge, re.search(r"ws://\S+", line).group(0)


def test_frames_as_jpeg_and_a_topic_as_raw_bytes(tmp_path):
    topic = unique_topic("events")
    camera, bridge, url = _serve(tmp_path, "--topic", topic, "--quality", 95)
    pub = msgq.pub_sock(topic)

    got, channels = _subscribe_while_publishing(url, ["/road", f"/{topic}"], pub, lambda i: b"event %d" % i)
    pub.close()
    bridge.terminate()
    camera.terminate()
    assert finish(bridge)[0] == 0
    finish(camera)
    import cv2

    road = channels["/road"]
    assert road["schemaName"] == "foxglove.CompressedImage" and road["encoding"] == "protobuf"
    cls = _message_class(road["schema"], "foxglove.CompressedImage")
    for log_time, payload in got["/road"]:
        msg = cls.FromString(payload)
        assert msg.format == "jpeg" and msg.frame_id == "road"
        assert msg.timestamp.seconds * 10**9 + msg.timestamp.nanos == log_time  # the frame's timestamp_eof
        # ... in Unix-epoch nanoseconds, as Foxglove expects (issue 34: it was CLOCK_MONOTONIC, 1970)
        assert abs(log_time - time.time_ns()) < 10 * 10**9
        image = cv2.imdecode(np.frombuffer(msg.data, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (64, 96, 3) and read_stamp(image, "bgr8") is not None
    assert all(p.startswith(b"event ") for _, p in got[f"/{topic}"])
    assert all(abs(t - time.time_ns()) < 10 * 10**9 for t, _ in got[f"/{topic}"])


def test_frames_as_h264_decode(tmp_path):
    import av

    camera, bridge, url = _serve(tmp_path, "--encoding", "h264")
    got, channels = asyncio.run(_subscribe(url, ["/road"], 5))
    bridge.terminate()
    camera.terminate()
    assert finish(bridge)[0] == 0
    finish(camera)
    assert channels["/road"]["schemaName"] == "foxglove.CompressedVideo"
    cls = _message_class(channels["/road"]["schema"], "foxglove.CompressedVideo")
    decoder = av.CodecContext.create("h264", "r")
    frames, keyframe_seen = [], False
    for _, payload in got["/road"]:
        msg = cls.FromString(payload)
        assert msg.format == "h264"
        # a subscriber that joins mid-GOP waits for the next keyframe (it starts with an SPS
        # NAL unit), as Foxglove does: the stream has one every 30 frames
        keyframe_seen = keyframe_seen or b"\x00\x00\x01\x67" in msg.data[:64]
        if keyframe_seen:
            frames += decoder.decode(av.Packet(msg.data))
    assert frames and (frames[0].width, frames[0].height) == (96, 64)


def test_bad_input_is_a_clear_error(capsys):
    assert foxglove_main(["--name", unique_name("none"), "--connect-timeout", "0.2"]) == 2
    assert "no VisionIPC server" in capsys.readouterr().err
    assert foxglove_main(["--name", "x", "--quality", "0"]) == 2
    assert "--quality must be in 1..100" in capsys.readouterr().err


def test_a_typed_topic_is_advertised_with_its_schema_and_decodes_in_a_client(tmp_path):
    """A topic declared with a protobuf schema (msgq.pub_sock(schema=)) is advertised
    with the schema's name, encoding and FileDescriptorSet, so a Foxglove client decodes
    its messages; it was msgq.raw without a schema."""
    from google.protobuf import api_pb2

    topic = unique_topic("apis")
    pub = msgq.pub_sock(topic, schema=msgq.protobuf_schema(api_pb2.Api))
    camera, bridge, url = _serve(tmp_path, "--topic", topic)

    message = lambda i: api_pb2.Api(name=f"api {i}", version="v2").SerializeToString()  # noqa: E731
    got, channels = _subscribe_while_publishing(url, [f"/{topic}"], pub, message)
    pub.close()
    bridge.terminate()
    camera.terminate()
    assert finish(bridge)[0] == 0
    finish(camera)
    channel = channels[f"/{topic}"]
    assert (channel["encoding"], channel["schemaName"], channel["schemaEncoding"]) == (
        "protobuf", "google.protobuf.Api", "protobuf",
    )  # fmt: skip
    cls = _message_class(channel["schema"], channel["schemaName"])
    decoded = [cls.FromString(payload) for _, payload in got[f"/{topic}"]]
    assert all(m.name.startswith("api ") and m.version == "v2" for m in decoded)
