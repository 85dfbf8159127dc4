"""Per-stream counters of vipc-view: rates, latency and drops, from the frames it receives.

Written only by the stream's worker thread; ``snapshot()`` is read from the event
loop thread and returns a copy built under the lock, so a reader never sees a
half-updated set of numbers.
"""

import collections
import threading
import time
from typing import TYPE_CHECKING, Deque, List, Optional, Tuple, TypedDict

if TYPE_CHECKING:
    from visionipc.frame import VisionBuf

WINDOW_S = 1.0  # rates and mean latencies cover the frames of the last second


class StreamSnapshot(TypedDict, total=False):
    """``StreamStats.snapshot()``: every key is there (total=False: it is built in steps)."""

    frame_id: Optional[int]
    frames_received: int
    frames_encoded: int
    frames_torn: int
    drops: int
    restarts: int
    encode_ms: Optional[float]
    live: bool
    fps: float
    source_fps: float
    latency_ms: Optional[float]
    handoff_ms: Optional[float]
    width: Optional[int]
    height: Optional[int]
    format: Optional[str]


class StreamStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (receive time s, frame_id, eof latency ns or None, handoff ns or None)
        self._recent: Deque[Tuple[float, int, Optional[int], Optional[int]]] = collections.deque()
        self.frame_id: Optional[int] = None
        self.frames_received = 0
        self.frames_encoded = 0
        self.frames_torn = 0  # overwritten while we converted them; never shown
        self.drops = 0  # frame ids we never saw (gaps), over the whole run
        self.restarts = 0  # frame ids that went backwards: a restarted producer
        self.encode_ms: Optional[float] = None
        self.geometry: Optional[Tuple[int, int, str]] = None  # (width, height, format) of the newest frame

    def received(self, frame: "VisionBuf") -> None:
        """Count one frame (a VisionBuf just returned by recv)."""
        now = time.monotonic()
        recv_ns = frame.timestamp_recv
        eof = frame.timestamp_eof
        # timestamp_eof is the producer's CLOCK_MONOTONIC time; a producer that stores
        # something else there (or nothing) gets no end-to-end latency.
        eof_latency = recv_ns - eof if 0 < eof <= recv_ns else None
        handoff = recv_ns - frame.timestamp_publish if frame.timestamp_publish else None
        with self._lock:
            if self.frame_id is not None:
                if frame.frame_id > self.frame_id:
                    self.drops += frame.frame_id - self.frame_id - 1
                elif frame.frame_id < self.frame_id:
                    self.restarts += 1
            self.frame_id = frame.frame_id
            self.frames_received += 1
            self.geometry = (frame.width, frame.height, frame.format)
            self._recent.append((now, frame.frame_id, eof_latency, handoff))
            self._trim(now)

    def encoded(self, seconds: float) -> None:
        with self._lock:
            self.frames_encoded += 1
            ms = seconds * 1000
            self.encode_ms = ms if self.encode_ms is None else 0.9 * self.encode_ms + 0.1 * ms

    def torn(self) -> None:
        with self._lock:
            self.frames_torn += 1

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > WINDOW_S:
            self._recent.popleft()

    def snapshot(self) -> StreamSnapshot:
        with self._lock:
            self._trim(time.monotonic())
            recent = list(self._recent)
            out: StreamSnapshot = {
                "frame_id": self.frame_id,
                "frames_received": self.frames_received,
                "frames_encoded": self.frames_encoded,
                "frames_torn": self.frames_torn,
                "drops": self.drops,
                "restarts": self.restarts,
                "encode_ms": _round(self.encode_ms),
            }
            geometry = self.geometry
        out["live"] = bool(recent)
        out["fps"] = round(len(recent) / WINDOW_S, 1)
        # The producer's rate, from frame ids: what the stream runs at even when
        # this viewer (busy encoding) skips frames.
        if len(recent) >= 2 and recent[-1][0] > recent[0][0] and recent[-1][1] >= recent[0][1]:
            out["source_fps"] = round((recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0]), 1)
        else:
            out["source_fps"] = out["fps"]
        out["latency_ms"] = _mean_ms([r[2] for r in recent])
        out["handoff_ms"] = _mean_ms([r[3] for r in recent])
        out["width"], out["height"], out["format"] = geometry or (None, None, None)
        return out


def _mean_ms(values_ns: List[Optional[int]]) -> Optional[float]:
    values = [v for v in values_ns if v is not None]
    return round(sum(values) / len(values) / 1e6, 3) if values else None


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 3)
