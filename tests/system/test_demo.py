"""The main job, run for real: tools/demo.py starts vipc-camera, the OpenCV consumer
example and vipc-view, and stops all of them cleanly (bounded run and Ctrl-C)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import cv2
import numpy as np
import pytest
from repo import ROOT
from view_helpers import Output

from visionipc.apps.camera.pattern import read_stamp

DEMO = [
    sys.executable,
    "-P",
    os.path.join(ROOT, "tools", "demo.py"),
    "--port",
    "0",
    "--width",
    "640",
    "--height",
    "360",
    "--fps",
    "30",
]


class Demo:
    def __init__(self, *args):
        self.proc = subprocess.Popen([*DEMO, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.out = Output(self.proc)

    def pids(self):
        return [int(p) for p in re.findall(r"demo: started \w+ \(pid (\d+)\)", self.out.text())]


def at(url, path):
    """``path`` of the printed page URL ``http://host:port/?token=...`` (the token kept)."""
    base, _, query = url.partition("?")
    return f"{base}{path}?{query}"


def stats_when_live(url, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(at(url, "stats"), timeout=10) as r:
            stats = json.loads(r.read())
        road = stats["streams"].get("road")
        if road and road["live"]:
            return stats
        assert time.monotonic() < deadline, f"the demo's stream never got live: {stats}"
        time.sleep(0.2)


def assert_ran_and_stopped_cleanly(demo, code):
    out = demo.out.text()
    assert code == 0, out
    assert "demo: stopped cleanly" in out, out
    assert "{'foxglove': 0, 'view': 0, 'consumer': 0, 'camera': 0}" in out, out
    assert re.search(
        r"demo: Foxglove / Lichtblick: open connection -> Foxglove WebSocket -> ws://127\.0\.0\.1:\d+/\?token=\S+", out
    ), out
    processed = int(re.search(r"\[consumer\] consumer: processed (\d+) frames", out).group(1))
    assert processed > 0, out
    assert re.search(r"\[consumer\] consumer: +[\d.]+ fps  frame +\d+", out), out
    assert len(demo.pids()) == 4  # camera, consumer, vipc-view, vipc-foxglove
    for pid in demo.pids():
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} of the demo is still there"


@pytest.fixture
def start_demo():
    """Start the demo; whatever a failed test leaves running is killed (its children
    follow: they get SIGTERM when the demo dies)."""
    started = []
    yield lambda *args: started.append(Demo(*args)) or started[-1]
    for demo in started:
        if demo.proc.poll() is None:
            demo.proc.kill()
            demo.proc.wait()


def test_a_bounded_demo_runs_all_three_and_stops_cleanly(start_demo):
    demo = start_demo("--seconds", "6")
    url = demo.out.wait_for(r"demo: open (http://\S+) in a browser").group(1)
    stats = stats_when_live(url)
    assert stats["server"] == "demo"
    assert (stats["streams"]["road"]["width"], stats["streams"]["road"]["height"]) == (640, 360)
    assert "?token=" in url  # the owner's per-run secret is in the URL the demo prints
    with urllib.request.urlopen(at(url, "snapshot/road.jpg"), timeout=10) as r:
        frame_id, jpeg = int(r.headers["X-Frame-Id"]), r.read()
    picture = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert picture.shape == (360, 640, 3)
    assert read_stamp(picture, "bgr8") == frame_id  # the camera's frame id, burned into the picture
    assert_ran_and_stopped_cleanly(demo, demo.proc.wait(60))


def test_ctrl_c_stops_the_demo_and_everything_it_started(start_demo):
    demo = start_demo()
    url = demo.out.wait_for(r"demo: open (http://\S+) in a browser").group(1)
    demo.out.wait_for(r"\[consumer\] consumer: +[\d.]+ fps")
    stats_when_live(url)
    demo.proc.send_signal(signal.SIGINT)
    assert_ran_and_stopped_cleanly(demo, demo.proc.wait(60))
