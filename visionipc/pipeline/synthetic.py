"""Synthetic recordings in the layout of docs/recording-format.md, written with
OpenCV and pyarrow alone: fixtures for tests and benchmarks of the pipeline
(recordings from ``vipc-record`` are the real thing; these let a test choose
exact pictures: black frames, frozen frames, blurred streams).
"""

from __future__ import annotations

import json
import os

import numpy as np

from visionipc.pipeline.read import INDEX_ARROW_SCHEMA

FPS_NS = 1_000_000_000


def pattern(frame_id: int, width: int, height: int, *, blur: int = 0) -> np.ndarray:
    """A gray (h, w) test picture: a moving checkerboard with a bright bar, ``blur`` > 0 blurs it."""
    import cv2

    y, x = np.mgrid[0:height, 0:width]
    shift = 3 * frame_id
    board = ((((x + shift) // 8) + (y // 8)) % 2 * 160 + 40).astype(np.uint8)
    bar = (frame_id * 7) % max(1, width - 16)
    board[:, bar:bar + 16] = 250
    if blur:
        board = cv2.GaussianBlur(board, (0, 0), blur)
    return board


def _planes(gray: np.ndarray, fmt: str) -> np.ndarray:
    if fmt in ("nv12", "i420"):
        h, w = gray.shape
        return np.vstack([gray, np.full((h // 2, w), 128, np.uint8)])
    return gray


def write_recording(path, streams: dict, *, name: str = "synthetic", status: str = "complete") -> str:
    """Write a lossless (FFV1) recording folder and return its path.

    ``streams``: ``{name: spec}`` where spec has ``frames``, ``width``, ``height`` and optionally
    ``format`` (nv12 or gray8), ``fps`` (30), ``segment_frames`` (frames per segment, 50),
    ``drop`` (frame ids never recorded), ``delay_ms`` ({frame_id: extra latency}),
    ``latency_ms`` (base receive - eof, 2), ``black`` / ``frozen`` (frame ids shown black /
    as a copy of the previous picture), ``blur`` (sigma, 0), ``start_ns``.
    """
    import cv2
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    meta = {"format_version": 1, "name": name, "streams": {}, "topics": [], "clock": "CLOCK_MONOTONIC",
            "start": {"monotonic_ns": 0, "wall_time": "2026-11-23T10:00:00Z"},
            "stop": {"monotonic_ns": 0, "wall_time": "2026-11-23T10:00:30Z"}, "status": status}
    for stream, spec in streams.items():
        w, h, fmt = spec["width"], spec["height"], spec.get("format", "nv12")
        period = FPS_NS // spec.get("fps", 30)
        seg_frames = spec.get("segment_frames", 50)
        drop, delay = set(spec.get("drop", ())), spec.get("delay_ms", {})
        black, frozen = set(spec.get("black", ())), set(spec.get("frozen", ()))
        start = spec.get("start_ns", 1_000_000_000_000)
        os.makedirs(os.path.join(path, "frames", stream), exist_ok=True)
        os.makedirs(os.path.join(path, "index", stream), exist_ok=True)
        kept = [i for i in range(spec["frames"]) if i not in drop]
        segments = [kept[i:i + seg_frames] for i in range(0, len(kept), seg_frames)]
        previous = None
        backlog = 0  # a delayed frame delays those after it, as a real publisher would
        for seg, ids in enumerate(segments):
            rel = f"frames/{stream}/{seg:06d}.mkv"
            plane_shape = (h * 3 // 2, w) if fmt in ("nv12", "i420") else (h, w)
            writer = cv2.VideoWriter(os.path.join(path, rel), cv2.VideoWriter_fourcc(*"FFV1"), 30,
                                     (plane_shape[1], plane_shape[0]), False)
            rows = {k: [] for k in ("frame_id", "timestamp_sof", "timestamp_eof", "publish_time", "receive_time")}
            for fid in ids:
                if fid in black:
                    gray = np.zeros((h, w), np.uint8)
                elif fid in frozen and previous is not None:
                    gray = previous
                else:
                    gray = pattern(fid, w, h, blur=spec.get("blur", 0))
                previous = gray
                writer.write(_planes(gray, fmt))
                eof = start + fid * period
                backlog = max(0, backlog - period) + int(delay.get(fid, 0) * 1e6)
                publish = eof + backlog + 100_000
                rows["frame_id"].append(fid)
                rows["timestamp_sof"].append(eof - period // 2)
                rows["timestamp_eof"].append(eof)
                rows["publish_time"].append(publish)
                rows["receive_time"].append(publish + int(spec.get("latency_ms", 2) * 1e6) - 100_000)
            writer.release()
            n = len(ids)
            table = pa.table({"stream": [stream] * n, **{k: np.asarray(v, np.int64) for k, v in rows.items()},
                              "width": np.full(n, w, np.int32), "height": np.full(n, h, np.int32),
                              "format": [fmt] * n, "segment": np.full(n, seg, np.int32),
                              "position": np.arange(n, dtype=np.int32), "segment_file": [rel] * n},
                             schema=INDEX_ARROW_SCHEMA)
            pq.write_table(table, os.path.join(path, "index", stream, f"{seg:06d}.parquet"))
        meta["streams"][stream] = {"width": w, "height": h, "format": fmt, "codec": "FFV1", "lossless": True,
                                   "segments": len(segments), "frames": len(kept)}
    with open(os.path.join(path, "recording.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return str(path)


def write_index(path, *, recordings: int, streams: int, frames: int, fps: int = 30,
                drop_every: int = 997, segment_frames: int = 1200, seed: int = 0) -> list:
    """Index-only recordings (no video) for benchmarks of the index jobs: ``recordings`` folders
    with ``streams`` streams of ``frames`` frames each; every ``drop_every``-th frame id is missing.
    Returns the recording paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    period = FPS_NS // fps
    ids_all = np.arange(frames, dtype=np.int64)
    ids_all = ids_all[ids_all % drop_every != drop_every - 1]
    out = []
    for r in range(recordings):
        rec = os.path.join(path, f"rec{r:05d}")
        for s in range(streams):
            stream = f"cam{s}"
            os.makedirs(os.path.join(rec, "index", stream), exist_ok=True)
            for seg, lo in enumerate(range(0, len(ids_all), segment_frames)):
                ids = ids_all[lo:lo + segment_frames]
                n = len(ids)
                eof = 10**12 + ids * period + rng.integers(0, 200_000, n)
                recv = eof + rng.gamma(2.0, 1_500_000, n).astype(np.int64)
                table = pa.table({"stream": [stream] * n, "frame_id": ids, "timestamp_sof": eof - period // 2,
                                  "timestamp_eof": eof, "publish_time": recv - 50_000, "receive_time": recv,
                                  "width": np.full(n, 1280, np.int32), "height": np.full(n, 720, np.int32),
                                  "format": ["nv12"] * n, "segment": np.full(n, seg, np.int32),
                                  "position": np.arange(n, dtype=np.int32),
                                  "segment_file": [f"frames/{stream}/{seg:06d}.mkv"] * n},
                                 schema=INDEX_ARROW_SCHEMA)
                pq.write_table(table, os.path.join(rec, "index", stream, f"{seg:06d}.parquet"))
        with open(os.path.join(rec, "recording.json"), "w") as f:
            json.dump({"format_version": 1, "name": f"rec{r}", "streams": {}, "status": "complete"}, f)
        out.append(rec)
    return out
