"""vipc-record on a file system that fills up (issue 31, item 9): a real ENOSPC from the
kernel, on a 2 MiB tmpfs mounted in a user namespace of the test's own (``unshare -Urm``:
no root needed where user namespaces are allowed, and nothing mounted outside it).
On main 2d8d5c3 the recorder died with a 26-line traceback, exit 1, and left recording.json
saying "recording", so vipc-analyze skipped the complete segments before the failure. Now:
one line, exit status 3, recording.json "failed" with the reason, and the complete
segments are analysed without --allow-partial."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from camera_helpers import CAMERA, connect, finish, reap, start
from pipeline_helpers import spark  # noqa: F401

from msgq.testing import unique_name
from visionipc.apps.pipeline.cli import main as analyze_main
from visionipc.apps.record.recorder import EXIT_DISK_FULL

# inside the namespace: mount a small tmpfs, record into it until it is full, copy the
# recording out (the tmpfs ends with the namespace), and exit with the recorder's status
INSIDE = """
mount -t tmpfs -o size=2m visionipc-full "$DISK" || exit 97
"$PYTHON" -P -m visionipc.apps.record.recorder --name "$NAME" --out "$DISK/rec" --lossless \\
    --segment-seconds 0.3 --duration 20 2>"$ERR"
rc=$?
cp -a "$DISK/rec" "$COPY"
exit $rc
"""


def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    run = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True)
    return run.returncode == 0


def test_a_full_disk_stops_the_recording_with_one_line_and_keeps_what_was_complete(tmp_path, capsys, spark):  # noqa: F811
    if not _can_mount():
        pytest.skip("no user namespaces here (unshare -Urm): cannot mount a small file system")
    name = unique_name("full")
    camera = start(CAMERA, "--name", name, "--stream", "road", "--source", "synthetic", "--width", 320,
                   "--height", 240, "--fps", 30, "--format", "nv12")  # fmt: skip
    try:
        connect(name, "road").close()
        (tmp_path / "disk").mkdir()
        env = dict(os.environ, DISK=str(tmp_path / "disk"), COPY=str(tmp_path / "rec"), ERR=str(tmp_path / "err"),
                   NAME=name, PYTHON=sys.executable)  # fmt: skip
        run = subprocess.run(["unshare", "-Urm", "sh", "-c", INSIDE], env=env, capture_output=True, timeout=60)
    finally:
        camera.terminate()
        finish(camera)
        reap()
    err = (tmp_path / "err").read_text()
    assert run.returncode == EXIT_DISK_FULL, (run.returncode, err, run.stderr)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "disk is full" in lines[0], err
    assert "No space left on device" in lines[0], err
    manifest = json.loads((tmp_path / "rec" / "recording.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"].startswith("disk full: "), manifest
    assert manifest["stop"] is not None and manifest["streams"]["road"]["segments"] >= 1, manifest
    hidden = [n for _, _, names in os.walk(tmp_path / "rec") for n in names if n.startswith(".")]
    assert hidden == [], hidden  # the dropped segment's partial files are gone
    # the complete segments are analysed without --allow-partial
    out = tmp_path / "out"
    assert analyze_main([str(tmp_path / "rec"), "--out", str(out), "--jobs", "health", "-q"]) == 0
    health = __import__("pandas").read_parquet(next(out.glob("*/health.parquet")))
    assert int(health["frames"].sum()) == manifest["streams"]["road"]["frames"] > 0
