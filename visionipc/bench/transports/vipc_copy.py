"""visionipc with the reference's copying send: ``server.send(stream, frame, ...)`` copies
a frame the camera filled elsewhere into a free buffer (the ``reference`` transport's path)."""

import time
from typing import Callable

import numpy as np

from visionipc.bench.transports import END, FID, State, nv12, stamp
from visionipc.bench.transports.vipc import Consumer
from visionipc.bench.transports.vipc import Producer as _ZeroCopyProducer

__all__ = ["Consumer", "Producer"]


class Producer(_ZeroCopyProducer):
    def __init__(self, state: State, tag: str, w: int, h: int, nbuf: int, nclients: int) -> None:
        super().__init__(state, tag, w, h, nbuf, nclients)
        self.frame = np.zeros(nv12(w, h)[0], np.uint8)

    def send(self, fid: int, fill: bool, now: Callable[[], int] = time.monotonic_ns) -> int:  # type: ignore[override]
        stamp(self.frame, fid, fill)
        ts = now()
        self._send("s", self.frame, frame_id=fid, timestamp_eof=ts)
        return ts

    def end(self) -> None:
        FID.pack_into(self.frame, 0, END)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs: from Python 3.12)
        self._send("s", self.frame, frame_id=END, timestamp_eof=0)
