"""pinned-staging: a copy into a pinned buffer, then an async host-to-device copy (see vipc_cuda.py)."""

from visionipc.bench.transports.vipc_cuda import PinnedConsumer as Consumer
from visionipc.bench.transports.vipc_cuda import Producer

__all__ = ["Consumer", "Producer"]
