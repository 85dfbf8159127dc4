"""visionipc zero-copy timed from the camera's side: the send time is stamped before
``get_buffer()`` (not before ``send(buf)`` as in ``visionipc``), so the latency includes
what the producer spends asking for a buffer and filling it (issue 36)."""

import time
from typing import Callable

from visionipc.bench.transports import FID
from visionipc.bench.transports.vipc import Consumer
from visionipc.bench.transports.vipc import Producer as _Producer

__all__ = ["Consumer", "Producer"]


class Producer(_Producer):
    def send(
        self,
        fid: int,
        fill: bool,
        now: Callable[[], int] = time.monotonic_ns,
        pack: Callable[..., None] = FID.pack_into,
    ) -> int:
        ts = now()  # before get_buffer: the whole per-frame path of a zero-copy camera
        buf = self._get("s")
        arr = buf.array
        if fill:
            arr.fill(fid & 0xFF)
        pack(arr, 0, fid)
        self._send(buf, frame_id=fid, timestamp_eof=ts)
        return ts
