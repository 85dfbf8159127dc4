"""Synthetic recordings for tests and benchmarks of the pipeline, written with
vipc-record's own segment writer (so the layout is the recorder's by
construction). Recordings of the real camera are the real thing; these let a
test choose exact pictures (black, frozen, blurred) and exact timings, and
``write_index`` makes index-only recordings of millions of rows quickly.

``write_fleet`` (and the command line) makes a fleet of N small recordings to try
vipc-analyze on: cars x days, each with a lossless NV12 stream and a lossy gray one,
some with drops, delays, black or frozen frames::

    python -m visionipc.apps.pipeline.synthetic fleet --recordings 12
    vipc-analyze fleet --out results --jobs health,metrics,export
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

import numpy as np

from visionipc.apps.record import layout
from visionipc.formats import format_info

if TYPE_CHECKING:
    from visionipc.apps.record.codecs import AvStorage
    from visionipc.apps.record.storage import Storage

StrPath = Union[str, "os.PathLike[str]"]
Spec = Dict[str, Any]  # one stream of a synthetic recording (write_recording's keys)

FPS_NS = 1_000_000_000


def pattern(frame_id: int, width: int, height: int, *, blur: int = 0) -> np.ndarray:
    """A gray (h, w) test picture: a moving checkerboard with a bright bar, ``blur`` > 0 blurs it."""
    import cv2

    y, x = np.mgrid[0:height, 0:width]
    shift = 3 * frame_id
    board = ((((x + shift) // 8) + (y // 8)) % 2 * 160 + 40).astype(np.uint8)
    bar = (frame_id * 7) % max(1, width - 16)
    board[:, bar : bar + 16] = 250
    if blur:
        board = cv2.GaussianBlur(board, (0, 0), blur)
    return board


def _planes(gray: np.ndarray, fmt: str) -> np.ndarray:
    """The stream's compact image of a gray picture (``pixels.pack``'s layout): Y as given and
    flat chroma for NV12/I420, R = G = B for RGB8/BGR8."""
    info = format_info(fmt)
    if info.yuv420:
        h, w = gray.shape
        return np.vstack([gray, np.full((h // 2, w), 128, np.uint8)])
    if info.channels > 1:
        return np.dstack([gray] * info.channels)
    return gray


def _storage(cv2: Any, spec: Spec, fmt: str, width: int, height: int) -> Union[Storage, AvStorage]:
    """vipc-record's storage for ``spec``'s ``lossless`` / ``codec``."""
    from visionipc.apps.record import codecs
    from visionipc.apps.record.storage import Storage

    codec = spec.get("codec")
    if codec is None or codec == codecs.LEGACY:
        return Storage(cv2, fmt, width, height, lossless=codec is None and spec.get("lossless", True))
    return codecs.AvStorage(fmt, width, height, codec, spec.get("crf"), container=spec.get("container", codecs.EXT))


def write_recording(
    path: StrPath,
    streams: Dict[str, Spec],
    *,
    name: str = "synthetic",
    status: str = layout.COMPLETE,
    wall_time: str | None = None,
) -> str:
    """Write a recording with vipc-record's own writer and return its path.

    ``streams``: ``{name: spec}`` where spec has ``frames``, ``width``, ``height`` and optionally
    ``format`` (nv12, i420, gray8, rgb8 or bgr8), ``fps`` (30), ``segment_frames`` (frames per segment, 50),
    ``drop`` (frame ids never recorded), ``delay_ms`` ({frame_id: extra latency; later frames
    queue behind it}), ``latency_ms`` (base receive - eof, 2), ``black`` / ``frozen`` (frame ids
    shown black / as a copy of the previous picture), ``blur`` (sigma, 0), ``start_ns``,
    ``lossless`` (True: FFV1; False: lossy mp4v, vipc-record --codec mp4v),
    ``codec`` (a vipc-record ``--codec``: mp4v, or a PyAV codec such as h264 fed the compact
    image, with ``crf``; it overrides ``lossless``), ``container`` (``mcap``: MCAP segments, as
    vipc-record --format mcap; default Matroska), ``frame_metrics`` (measure the frames as written
    and keep the numbers in the index, as vipc-record --frame-metrics; default: lossy streams).
    Formats rgb8/bgr8 store the picture as R = G = B. ``wall_time``: the recording's start
    (ISO 8601 UTC, ``2026-11-03T08:00:00.000Z``; default now), which gives its ``date``.
    """
    import cv2

    from visionipc.apps.record import index
    from visionipc.apps.record.writer import StreamWriter

    os.makedirs(path, exist_ok=True)
    start_clock = index.clock_now()
    if wall_time is not None:
        start_clock["wall_time"] = wall_time
    meta: Dict[str, Any] = {
        "format_version": index.FORMAT_VERSION,
        "name": name,
        "streams": {},
        "topics": [],
        "clock": "CLOCK_MONOTONIC",
        "start": start_clock,
        "stop": start_clock,
        "status": status,
    }
    for stream, spec in streams.items():
        w, h, fmt = spec["width"], spec["height"], spec.get("format", "nv12")
        period = FPS_NS // spec.get("fps", 30)
        drop, delay = set(spec.get("drop", ())), spec.get("delay_ms", {})
        black, frozen = set(spec.get("black", ())), set(spec.get("frozen", ()))
        start = spec.get("start_ns", 1_000_000_000_000)
        storage = _storage(cv2, spec, fmt, w, h)
        writer = StreamWriter(cv2, str(path), stream, storage, 0, spec.get("frame_metrics"))
        previous: Optional[np.ndarray] = None
        backlog, kept = 0, 0  # a delayed frame delays those after it, as a real publisher would
        for fid in range(spec["frames"]):
            backlog = max(0, backlog - period)
            if fid in drop:
                continue
            if fid in black:
                gray = np.zeros((h, w), np.uint8)
            elif fid in frozen and previous is not None:
                gray = previous
            else:
                gray = pattern(fid, w, h, blur=spec.get("blur", 0))
            previous = gray
            eof = start + fid * period
            backlog += int(delay.get(fid, 0) * 1e6)
            publish = eof + backlog + 100_000
            if kept and kept % spec.get("segment_frames", 50) == 0:
                writer.close_segment()
            writer.add(
                _planes(gray, fmt),  # the compact image, as Storage.capture gives it
                {
                    "frame_id": fid,
                    "timestamp_sof": eof - period // 2,
                    "timestamp_eof": eof,
                    "publish_time": publish,
                    "receive_time": publish + int(spec.get("latency_ms", 2) * 1e6) - 100_000,
                },
            )
            kept += 1
        writer.close_segment()
        meta["streams"][stream] = {
            "width": w,
            "height": h,
            "format": fmt,
            **storage.describe(),
            "frame_metrics": writer.measures,
            "segments": writer.segments,
            "frames": writer.frames,
            "missed": 0,
            "gaps": len(drop & set(range(spec["frames"]))),
        }
    index.write_json(layout.manifest_path(path), meta)
    return str(path)


def write_index(
    path: StrPath,
    *,
    recordings: int,
    streams: int,
    frames: int,
    fps: int = 30,
    drop_every: int = 997,
    segment_frames: int = 1200,
    seed: int = 0,
) -> List[str]:
    """Index-only recordings (no video) for benchmarks of the index jobs: ``recordings`` folders
    with ``streams`` streams of ``frames`` frames each; every ``drop_every``-th frame id is missing.
    Returns the recording paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from visionipc.apps.record.index import index_schema

    rng = np.random.default_rng(seed)
    period = FPS_NS // fps
    ids_all = np.arange(frames, dtype=np.int64)
    ids_all = ids_all[ids_all % drop_every != drop_every - 1]
    out = []
    for r in range(recordings):
        rec = os.path.join(path, f"rec{r:05d}")
        for s in range(streams):
            stream = f"cam{s}"
            os.makedirs(os.path.join(rec, layout.INDEX, stream), exist_ok=True)
            for seg, lo in enumerate(range(0, len(ids_all), segment_frames)):
                ids = ids_all[lo : lo + segment_frames]
                n = len(ids)
                eof = 10**12 + ids * period + rng.integers(0, 200_000, n)
                recv = eof + rng.gamma(2.0, 1_500_000, n).astype(np.int64)
                table = pa.table(
                    {
                        "stream": [stream] * n,
                        "frame_id": ids,
                        "timestamp_sof": eof - period // 2,
                        "timestamp_eof": eof,
                        "publish_time": recv - 50_000,
                        "receive_time": recv,
                        "width": np.full(n, 1280, np.int32),
                        "height": np.full(n, 720, np.int32),
                        "format": ["nv12"] * n,
                        "segment": np.full(n, seg, np.int32),
                        "position": np.arange(n, dtype=np.int32),
                        "segment_file": [layout.media_file(stream, seg, layout.MATROSKA)] * n,
                    },
                    schema=index_schema(),
                )
                pq.write_table(table, os.path.join(rec, layout.index_file(stream, seg)))
        with open(layout.manifest_path(rec), "w") as f:
            json.dump({"format_version": 1, "name": f"rec{r}", "streams": {}, "status": layout.COMPLETE}, f)
        out.append(rec)
    return out


def write_fleet(
    path: StrPath, recordings: int, *, frames: int = 150, width: int = 160, height: int = 120, seed: int = 0
) -> List[str]:
    """``recordings`` recordings under ``path`` as ``carNN/2026-11-DD`` (N/3 cars, one
    recording a day each over up to 3 days), each with streams ``road`` (NV12, lossless) and ``cabin`` (gray,
    lossy mp4v, measured as recorded) of ``frames`` frames at 30 fps; drawn from ``seed``:
    most streams lose a few frames or have a delayed one, some show black or frozen
    pictures, a few are clean. Returns the recording paths."""
    import math

    rng = np.random.default_rng(seed)
    cars = max(1, math.ceil(recordings / 3))
    out = []
    for i in range(recordings):
        car, day = i % cars, 1 + i // cars
        spec: Spec = dict(frames=frames, width=width, height=height, segment_frames=60)
        kind = rng.integers(0, 4)  # 0: clean, 1: drops, 2: a delay, 3: drops and a delay
        road: Spec = dict(spec, latency_ms=float(rng.uniform(1, 8)))
        if kind in (1, 3):
            road["drop"] = sorted(int(f) for f in rng.choice(np.arange(5, frames - 5), size=3, replace=False))
        if kind in (2, 3):
            road["delay_ms"] = {int(rng.integers(5, frames - 5)): float(rng.uniform(40, 200))}
        cabin: Spec = dict(spec, format="gray8", lossless=False, latency_ms=0.05)  # a consumer on the same machine
        if rng.random() < 0.3:
            cabin["black"] = list(range(20, 26))
        if rng.random() < 0.3:
            cabin["frozen"] = list(range(40, 50))
        folder = os.path.join(path, f"car{car:02d}", f"2026-11-{day:02d}")
        out.append(
            write_recording(
                folder,
                {"road": road, "cabin": cabin},
                name=f"car{car:02d}",
                wall_time=f"2026-11-{day:02d}T08:00:00.000Z",
            )
        )
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m visionipc.apps.pipeline.synthetic",
        description="Write a synthetic fleet of recordings to try vipc-analyze on (carNN/2026-11-DD folders).",
    )
    p.add_argument("out", help="folder for the fleet (created)")
    p.add_argument("--recordings", "-n", type=int, default=12, metavar="N", help="how many recordings (default 12)")
    p.add_argument("--frames", type=int, default=150, help="frames per stream (default 150: 5 s at 30 fps)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = p.parse_args(argv)
    if args.recordings < 1:
        p.error("--recordings must be >= 1")
    if args.frames < 20:
        p.error("--frames must be >= 20")
    paths = write_fleet(args.out, args.recordings, frames=args.frames, seed=args.seed)
    print(f"{len(paths)} recording(s) in {args.out} (try: vipc-analyze {args.out} --out results)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
