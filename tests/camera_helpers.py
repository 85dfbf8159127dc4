"""Helpers for the camera / record / replay tests: run the commands as real processes
(under the test's MSGQ_PREFIX, inherited through the environment) and receive frames."""

import subprocess
import sys
import time

from visionipc import VisionIpcClient
from visionipc.apps.camera.pattern import read_stamp

CAMERA = "visionipc.apps.camera.daemon"
RECORD = "visionipc.apps.record.recorder"
REPLAY = "visionipc.apps.record.replay"


STARTED = []  # every process a test started; reap() kills those still running


def start(module, *args):
    """``python -P -m module args`` (the installed package, not the source tree)."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", module, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    STARTED.append(proc)
    return proc


def reap():
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def receive(name, stream, idle_ms=1500, count=None, client=None):
    """Frames of one stream until none arrives for ``idle_ms`` (or ``count`` frames):
    dicts of frame_id, the stamp read from the pixels, the timestamps."""
    client = client or connect(name, stream)
    frames = []
    while count is None or len(frames) < count:
        frame = client.recv(idle_ms)
        if frame is None:
            break
        with frame:
            frames.append(
                dict(
                    frame_id=frame.frame_id,
                    stamp=read_stamp(frame),
                    sof=frame.timestamp_sof,
                    eof=frame.timestamp_eof,
                    publish=frame.timestamp_publish,
                    recv=frame.timestamp_recv,
                    width=frame.width,
                    height=frame.height,
                    format=frame.format,
                    mean=float(frame.array.mean()),
                    valid=frame.valid,
                )
            )
    client.close()
    return frames


def connect(name, stream, timeout=20.0):
    """A connected client, or AssertionError when no server shows up in time."""
    client = VisionIpcClient(name, stream)
    deadline = time.monotonic() + timeout
    while not client.connect(False):
        assert time.monotonic() < deadline, f"no VisionIPC server {name!r} after {timeout} s"
        time.sleep(0.01)
    return client


def run_without(module_blocked, entry, argv):
    """Run ``entry``'s main(argv) in a fresh interpreter where ``module_blocked`` cannot
    be imported (as when an optional extra is not installed): (exit status, stderr)."""
    mod, func = entry.rsplit(":", 1)
    code = (
        f"import sys; sys.modules[{module_blocked!r}] = None\n"
        f"from {mod} import {func}; sys.exit({func}({list(map(str, argv))!r}))"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stderr
