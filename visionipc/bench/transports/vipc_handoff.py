"""visionipc zero-copy with ``VisionIpcServer(wake="handoff")``: a send wakes one
sleeping client and that client wakes the others, so the server's CPU per frame
does not grow with the number of clients (the others wake one hop later)."""

from visionipc.bench.transports.vipc import Consumer
from visionipc.bench.transports.vipc import Producer as _WakeAllProducer

__all__ = ["Consumer", "Producer"]


class Producer(_WakeAllProducer):
    WAKE = "handoff"
