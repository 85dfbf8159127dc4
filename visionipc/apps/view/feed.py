"""StreamFeed: one stream of vipc-view, received once and JPEG-encoded once per frame.

A worker thread per stream receives with a conflating client (always the newest
frame), counts it, and converts + encodes it only while someone wants pictures
(a browser viewer, a snapshot request or the OpenCV window). Viewers never get a
queue: each takes the newest encoded frame whenever it is ready for one, so a
slow viewer skips frames and never slows the worker, the other viewers or the
producer.

Thread contract:
- ``latest`` (an ``Encoded``) and ``latest_bgr`` are written only by the worker, each
  replaced whole by one reference assignment (atomic under the GIL); readers take
  the reference once and use that object.
- ``viewers``, ``snapshot_waiters``, ``frames_sent``, ``frames_skipped`` and the
  asyncio event are touched only by the event-loop thread; the worker only reads
  the two demand counters (a stale read costs at most one frame encoded or skipped).
- The worker wakes the loop with ``call_soon_threadsafe`` after publishing ``latest``,
  so a waiter that sees an old ``latest`` always gets a later wake-up.
"""

import asyncio
import logging
import threading
import time
from typing import NamedTuple, Optional

import cv2
import numpy as np
import numpy.typing as npt

from visionipc.apps.view.stats import StreamSnapshot, StreamStats
from visionipc.client import VisionIpcClient

log = logging.getLogger("vipc-view")

BOUNDARY = "vipcframe"  # of the MJPEG multipart responses
RECV_TIMEOUT_MS = 100  # how often the worker looks at its stop flag
ERROR_BACKOFF_S = 1.0


class Encoded(NamedTuple):
    seq: int  # 1, 2, ... per feed: order of encoding
    frame_id: int
    jpeg: bytes
    part: bytes  # the jpeg as one part of a multipart/x-mixed-replace (MJPEG) response


def mjpeg_part(frame_id: int, jpeg: bytes) -> bytes:
    head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\nX-Frame-Id: {frame_id}\r\n\r\n"
    return head.encode() + jpeg + b"\r\n"


class FeedReport(StreamSnapshot, total=False):
    """A stream in vipc-view's ``/stats``: its counters and its viewers'."""

    viewers: int
    frames_sent: int
    frames_skipped: int


class StreamFeed:
    def __init__(self, server: str, stream: str, quality: int = 80, keep_bgr: bool = False) -> None:
        self.server = server
        self.stream = stream
        self.stats = StreamStats()
        self.keep_bgr = keep_bgr
        self.latest: Optional[Encoded] = None
        self.latest_bgr: Optional[npt.NDArray[np.uint8]] = None
        self.viewers = 0
        self.snapshot_waiters = 0
        self.frames_sent = 0
        self.frames_skipped = 0
        self.stopping = False
        self._params = [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)]
        self._seq = 0
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"vipc-view:{stream}", daemon=True)
        self._thread.start()

    # -- worker thread --------------------------------------------------------

    def _run(self) -> None:
        client = VisionIpcClient(self.server, self.stream, conflate=True)
        last_error = None
        try:
            while not self._stop.is_set():
                try:
                    frame = client.recv(RECV_TIMEOUT_MS)
                    if frame is None:
                        continue
                    self.stats.received(frame)
                    if self.viewers or self.snapshot_waiters or self.keep_bgr:
                        self._convert(frame)
                    last_error = None
                except Exception as exc:  # keep serving the other streams; say what broke, once
                    if repr(exc) != last_error:
                        log.warning(f"stream {self.stream!r}: {exc}")
                        last_error = repr(exc)
                    self._stop.wait(ERROR_BACKOFF_S)
        finally:
            client.close()

    def _convert(self, frame):
        start = time.perf_counter()
        with frame:  # hold the read lease while we read the pixels
            bgr = frame.to_bgr()
            intact = frame.valid
        if not intact:  # overwritten under us: never show a torn frame
            self.stats.torn()
            return
        if self.keep_bgr:
            self.latest_bgr = bgr
        if not (self.viewers or self.snapshot_waiters):
            return
        ok, jpeg = cv2.imencode(".jpg", bgr, self._params)
        if not ok:
            raise RuntimeError(f"OpenCV could not JPEG-encode a {frame.width}x{frame.height} frame")
        self.stats.encoded(time.perf_counter() - start)
        self._seq += 1
        jpeg = jpeg.tobytes()
        self.latest = Encoded(self._seq, frame.frame_id, jpeg, mjpeg_part(frame.frame_id, jpeg))
        try:
            self._loop.call_soon_threadsafe(self._notify)
        except RuntimeError:  # the loop is closing
            pass

    # -- event-loop thread ------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def newer_than(self, seq: int, timeout: float) -> Optional[Encoded]:
        """The newest encoded frame if its seq is above ``seq``, waiting up to
        ``timeout`` s for one; None on timeout or when the feed stops."""
        deadline = self._loop.time() + timeout
        while not self.stopping:
            latest = self.latest
            if latest is not None and latest.seq > seq:
                return latest
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        return None

    def report(self) -> FeedReport:
        return {
            **self.stats.snapshot(),
            "viewers": self.viewers,
            "frames_sent": self.frames_sent,
            "frames_skipped": self.frames_skipped,
        }

    def close(self) -> None:
        """Tell the worker to stop (it closes its client) and wake every waiting viewer."""
        self.stopping = True
        self._stop.set()
        self._notify()

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)
