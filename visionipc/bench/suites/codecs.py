"""Recording codecs compared in one run: vipc-record's own segment writer encoding the same
NV12 frames with each codec (PyAV: H.264, HEVC, AV1, FFV1; OpenCV: the older mp4v, which
first converts to BGR as the recorder did), one encoder thread each. Per codec and size:
encode frames per second per CPU core (frames / process CPU seconds of the encoding,
encoder threads included), bytes per frame and Mbit/s at 30 fps, and PSNR / SSIM of the
decoded luma against the source.

The source is a camera-like scene: a textured picture panning a few pixels per frame
with sensor noise (flat synthetic patterns compress unrealistically well).

    .venv/bin/python tools/bench_codecs.py             # 1080p (60 frames) and 4K (20 frames)
    .venv/bin/python tools/bench_codecs.py --quick     # 1080p 20 frames, 4K 6 frames
"""

import argparse
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from visionipc.bench.harness import add_common_flags
from visionipc.bench.stats import format_table
from visionipc.bench.workers import read_loadavg

SIZES = {"1080p": (1920, 1080), "4K": (3840, 2160)}
# (label, --codec, crf): H.264 at two qualities, to compare sizes at equal PSNR
RUNS = (("mp4v (OpenCV)", "mp4v", None), ("h264 crf23", "h264", 23), ("h264 crf28", "h264", 28),
        ("hevc crf28", "hevc", 28), ("av1 crf35", "av1", 35), ("ffv1 (lossless)", "ffv1", None))  # fmt: skip


def scene(width: int, height: int, frames: int, seed: int = 1) -> List[np.ndarray]:
    """NV12 compact images ``(h*3/2, w)`` of a panning textured scene with noise."""
    import cv2

    rng = np.random.default_rng(seed)
    pad = 4 * frames + 8
    big = (height + pad, width + pad)

    def texture(shape, cells, amp):
        low = rng.random((max(2, shape[0] // cells), max(2, shape[1] // cells))).astype(np.float32)
        return cv2.resize(low, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC) * amp

    y = texture(big, 64, 140) + texture(big, 8, 50) + 30
    uv = texture((big[0] // 2, big[1]), 64, 60) + 98
    out = []
    for i in range(frames):
        dx, dy = 3 * i, 2 * i
        noise = rng.normal(0, 2.0, (height, width))
        luma = np.clip(y[dy : dy + height, dx : dx + width] + noise, 0, 255).astype(np.uint8)
        chroma = np.clip(uv[dy // 2 : dy // 2 + height // 2, dx & ~1 : (dx & ~1) + width], 0, 255).astype(np.uint8)
        out.append(np.vstack([luma, chroma]))
    return out


def _ssim(a, b):
    import cv2

    a, b = a.astype(np.float64), b.astype(np.float64)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def blur(x):
        return cv2.GaussianBlur(x, (11, 11), 1.5)

    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma * ma, blur(b * b) - mb * mb, blur(a * b) - ma * mb
    return float(np.mean(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))))


def _psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


class _FakeFrame:
    """What Storage.capture reads: a pool buffer's NV12 planes (the recorder's first copy is
    the same for every codec and not timed)."""

    format, array = "nv12", None

    def __init__(self, image, width, height):
        self.width, self.height, self.image = width, height, image

    def to_bgr(self):
        import cv2

        return cv2.cvtColor(self.image, cv2.COLOR_YUV2BGR_NV12)


def run_one(
    label: str, codec: str, crf: Optional[int], images: Sequence[np.ndarray], width: int, height: int, folder: str
) -> Dict[str, Any]:
    import cv2

    from visionipc.apps.record import codecs
    from visionipc.apps.record.index import read_index
    from visionipc.apps.record.reader import iter_segment_frames
    from visionipc.apps.record.storage import Storage
    from visionipc.apps.record.writer import StreamWriter

    out = os.path.join(folder, f"{codec}-{crf}-{width}")
    storage: Union[Storage, codecs.AvStorage]
    if codec == "mp4v":
        storage = Storage(cv2, "nv12", width, height, False)
    else:
        storage = codecs.AvStorage("nv12", width, height, codec, crf=crf, threads=1)
    writer = StreamWriter(cv2, out, "s", storage, 0)
    cpu = time.process_time()
    for i, image in enumerate(images):
        stored = _FakeFrame(image, width, height).to_bgr() if codec == "mp4v" else image
        t = i * 33_333_333
        writer.add(stored, dict(frame_id=i, timestamp_sof=t, timestamp_eof=t, publish_time=t, receive_time=t))
    writer.close_segment()
    cpu = time.process_time() - cpu
    rows = read_index(out, "s").to_pylist()
    size = sum(os.path.getsize(os.path.join(out, f)) for f in {r["segment_file"] for r in rows})
    psnr, ssim = [], []
    decoded = iter_segment_frames(cv2, out, [(r["segment_file"], r["position"]) for r in rows], storage)
    for src, image in zip(images, decoded):
        luma = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)[:height] if codec == "mp4v" else image[:height]
        psnr.append(_psnr(src[:height], luma))
        ssim.append(_ssim(src[:height], luma))
    n = len(images)
    return {
        "codec": label,
        "fps_per_core": n / cpu,
        "kib_frame": size / n / 1024,
        "mbit_s_30": size / n * 30 * 8 / 1e6,
        "psnr": float(np.mean(psnr)),
        "ssim": float(np.mean(ssim)),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_flags(p, quick="1080p 20 frames, 4K 6 frames", quiet=True)
    p.add_argument("--frames", type=int, default=60, help="frames at 1080p (4K: a third of them)")
    p.add_argument("--codec", action="append", help="only these runs (label prefix, e.g. h264); repeatable")
    args = p.parse_args(argv)
    frames = 20 if args.quick else args.frames
    import cv2

    cv2.setNumThreads(1)
    print(f"load average at start: {read_loadavg()}; {os.cpu_count()} CPUs; NV12 panning scene")
    for size, (w, h) in SIZES.items():
        n = max(2, frames if size == "1080p" else frames // 3)
        images = scene(w, h, n)
        rows = []
        with tempfile.TemporaryDirectory() as folder:
            for label, codec, crf in RUNS:
                if args.codec and not any(label.startswith(c) for c in args.codec):
                    continue
                r = run_one(label, codec, crf, images, w, h, folder)
                rows.append(r)
                if not args.quiet:
                    print(f"  {size} {label}: {r['fps_per_core']:.1f} fps/core", flush=True)
        print(f"\n{size} ({w}x{h}), {n} frames:")
        headers = ["codec", "encode fps/core", "KiB/frame", "Mbit/s @30fps", "PSNR-Y dB", "SSIM-Y"]
        print(
            format_table(
                headers,
                [
                    [
                        r["codec"],
                        f"{r['fps_per_core']:.1f}",
                        f"{r['kib_frame']:.0f}",
                        f"{r['mbit_s_30']:.1f}",
                        "lossless" if r["psnr"] == float("inf") else f"{r['psnr']:.1f}",
                        f"{r['ssim']:.4f}",
                    ]
                    for r in rows
                ],
            )
        )
    print(f"load average at end: {read_loadavg()}")
    return 0
