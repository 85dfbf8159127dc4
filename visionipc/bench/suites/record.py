"""Camera + recorder throughput: vipc-camera publishing at a fixed rate and
vipc-record keeping up, lossless (FFV1) side by side with lossy (H.264, the default, with
and without the frame metrics it measures as it captures), per resolution. Prints, per
run: frames recorded and missed, recorder and camera CPU per frame, bytes per frame, and
how far the camera's timestamp_sof strayed from its absolute schedule; then the lossless /
lossy ratios and what the frame metrics cost the recorder.

    .venv/bin/python tools/bench_record.py            # 640x480 and 1280x720, 10 s each
    .venv/bin/python tools/bench_record.py --quick    # 640x480, 3 s
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Optional, Sequence

import numpy as np

from visionipc.apps.record import layout
from visionipc.apps.record.index import read_index
from visionipc.bench.harness import add_common_flags
from visionipc.bench.stats import format_table
from visionipc.bench.workers import read_loadavg


def _spawn(module, *args):
    return subprocess.Popen(
        [sys.executable, "-P", "-m", module, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _cpu_s(proc):
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


MODES = {  # mode -> vipc-record flags
    "lossy H.264": [],
    "lossy H.264, --frame-metrics none": ["--frame-metrics", "none"],
    "lossless FFV1": ["--lossless"],
}


def run_one(width: int, height: int, fps: float, seconds: float, mode: str, folder: str) -> Dict[str, Any]:
    name, frames = f"bench{os.getpid()}", int(fps * seconds)
    out = os.path.join(folder, f"{width}x{height}-{len(os.listdir(folder))}")
    camera = _spawn(
        "visionipc.apps.camera.daemon",
        "-q",
        "--name",
        name,
        "--stream",
        "road",
        "--width",
        width,
        "--height",
        height,
        "--fps",
        fps,
        "--frames",
        frames,
        "--wait-clients",
        1,
    )
    recorder = _spawn(
        "visionipc.apps.record.recorder",
        "-q",
        "--name",
        name,
        "--out",
        out,
        "--idle-timeout",
        1,
        *MODES[mode],
    )
    camera_cpu = _cpu_s(camera)
    recorder_cpu = _cpu_s(recorder)
    if camera.returncode or recorder.returncode:
        raise SystemExit(
            f"a process failed: camera {camera.returncode}, recorder {recorder.returncode}: "
            f"{recorder.stderr.read().decode()}"
        )
    info = json.load(open(layout.manifest_path(out)))["streams"]["road"]
    sof = np.array(read_index(out, "road").column("timestamp_sof").to_pylist(), np.int64)
    slots = (sof - sof[0]) * fps / 1e9
    size = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(out, layout.FRAMES)) for f in fs
    )
    return {
        "size": f"{width}x{height}",
        "mode": mode,
        "published": frames,
        "recorded": info["frames"],
        "missed": info["missed"] + info["gaps"],
        "rec_ms": recorder_cpu / max(1, info["frames"]) * 1e3,
        "cam_ms": camera_cpu / frames * 1e3,
        "kib": size / max(1, info["frames"]) / 1024,
        "sched_err_ns": float(np.abs(slots - np.round(slots)).max() * 1e9 / fps),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="640x480 only, 3 s per run")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--fps", type=float, default=30.0)
    args = p.parse_args(argv)
    sizes = [(640, 480)] if args.quick else [(640, 480), (1280, 720)]
    seconds = 3.0 if args.quick else args.seconds
    os.environ.setdefault("MSGQ_PREFIX", f"bench_record{os.getpid()}")
    print(f"load average at start: {read_loadavg()}; {args.fps:g} fps, {seconds:g} s per run, synthetic NV12")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for w, h in sizes:
            for mode in MODES:
                rows.append(run_one(w, h, args.fps, seconds, mode, folder))
    print(
        format_table(
            [
                "size",
                "mode",
                "published",
                "recorded",
                "missed",
                "recorder CPU ms/frame",
                "camera CPU ms/frame",
                "KiB/frame",
                "max |sof - schedule| ns",
            ],
            [
                [
                    r["size"],
                    r["mode"],
                    r["published"],
                    r["recorded"],
                    r["missed"],
                    f"{r['rec_ms']:.2f}",
                    f"{r['cam_ms']:.2f}",
                    f"{r['kib']:.1f}",
                    f"{r['sched_err_ns']:.1f}",
                ]
                for r in rows
            ],
            "llrrrrrrr",
        )
    )
    for i in range(0, len(rows), len(MODES)):
        lossy, unmeasured, exact = rows[i : i + len(MODES)]
        print(
            f"{lossy['size']}: lossless / lossy: recorder CPU x{exact['rec_ms'] / lossy['rec_ms']:.2f}, "
            f"bytes x{exact['kib'] / lossy['kib']:.1f}; the frame metrics cost the lossy recorder "
            f"{lossy['rec_ms'] - unmeasured['rec_ms']:+.2f} ms/frame (x{lossy['rec_ms'] / unmeasured['rec_ms']:.2f})"
        )
    print(f"load average at end: {read_loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
