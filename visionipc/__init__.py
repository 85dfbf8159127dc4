"""visionipc: zero-copy video frames over shared memory.

A :class:`VisionIpcServer` owns one sealed memfd frame pool per stream and
announces each frame (buffer index + metadata) on an msgq topic; a
:class:`VisionIpcClient` receives the pool's file descriptor over a Unix
socket, maps it once and hands out frames as numpy views
(:class:`VisionBuf`) without copying. See docs/visionipc.md.
"""

import enum
import typing as _typing  # private: visionipc's namespace holds only its own names

from msgq import _aliases
from visionipc.client import VisionIpcClient, available_streams, get_endpoint_name
from visionipc.formats import BUFFER_ALIGN, FORMATS, STRIDE_ALIGN, layout
from visionipc.frame import VisionBuf
from visionipc.server import VisionIpcServer

# DEPRECATED paths: the applications moved to visionipc.apps (docs/architecture.md)
_aliases.install({f"visionipc.{app}": f"visionipc.apps.{app}" for app in ("camera", "record", "view", "pipeline")})


__version__: str  # for type checkers, which see no module __getattr__ (see msgq/__init__.py)

if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> str:
        """``visionipc.__version__`` (the same as ``msgq.__version__``: one distribution)."""
        if name == "__version__":
            import msgq

            return msgq.__version__
        raise AttributeError(f"module 'visionipc' has no attribute {name!r}")


class VisionStreamType(enum.IntEnum):
    """The reference's stream ids (older code); any int or name works as a stream id."""

    ROAD = 0
    DRIVER = 1
    WIDE_ROAD = 2
    MAP = 3
    VISION_STREAM_ROAD = 0
    VISION_STREAM_DRIVER = 1
    VISION_STREAM_WIDE_ROAD = 2
    VISION_STREAM_MAP = 3


__all__ = [
    "VisionIpcServer",
    "VisionIpcClient",
    "VisionBuf",
    "VisionStreamType",
    "available_streams",
    "get_endpoint_name",
    "layout",
    "FORMATS",
    "STRIDE_ALIGN",
    "BUFFER_ALIGN",
]
