"""naive-cuda: ``cupy.asarray(frame.array)`` (see vipc_cuda.py)."""

from visionipc.bench.transports.vipc_cuda import NaiveConsumer as Consumer
from visionipc.bench.transports.vipc_cuda import Producer

__all__ = ["Consumer", "Producer"]
