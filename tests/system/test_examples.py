"""The examples under examples/, run for real against a real producer."""

import os
import re
import signal
import subprocess
import sys
import time

from repo import ROOT
from view_helpers import Output, Producer


def test_the_consumer_example_processes_every_frame_and_stops_on_sigterm():
    from msgq.testing import unique_name

    name = unique_name("cam")
    consumer = subprocess.Popen(
        [
            sys.executable,
            "-P",
            os.path.join(ROOT, "examples", "opencv_consumer.py"),
            "--name",
            name,
            "--stream",
            "road",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = Output(consumer)
    try:
        out.wait_for("consumer: waiting for")
        # 16 buffers: a consumer stalled by a busy machine for half a second still finds its frames
        with Producer(name, ["road"], 320, 240, fps=30, texture=True, count=16) as producer:
            out.wait_for(r"consumer: +[\d.]+ fps  frame +\d+ .* 320x240  edges +[\d.]+%  motion +[\d.]+  drops \d+")
            time.sleep(0.5)
        sent = producer.sent
        time.sleep(0.3)  # the consumer finishes the last frames
        consumer.send_signal(signal.SIGTERM)
        assert consumer.wait(20) == 0
    finally:
        if consumer.poll() is None:
            consumer.kill()
    done = re.search(r"consumer: processed (\d+) frames \((\d+) dropped, (\d+) overwritten", out.text())
    assert done, out.text()
    processed, dropped, overwritten = map(int, done.groups())
    # Every frame is accounted for (processed, or counted as missed), from the first it saw:
    # the consumer may subscribe a few frames after the producer starts. It keeps up at 30 fps.
    assert sent - 5 <= processed + dropped + overwritten <= sent, (sent, out.text())
    assert processed >= sent * 0.8, (sent, out.text())
