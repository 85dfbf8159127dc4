"""Pixel formats and how a frame buffer is laid out (the C++ core computes it;
see cpp/visionipc/format.h for the table).

Rows start on 64-byte boundaries (``STRIDE_ALIGN``), buffers on 4096-byte
boundaries in the pool (``BUFFER_ALIGN``). ``layout(format, width, height)``
returns the stride, ``uv_offset`` and size a server would use.
"""

from msgq.errors import InvalidArgumentError
from visionipc import _visionipc

FORMATS = ("nv12", "i420", "gray8", "rgb8", "bgr8", "raw16")
STRIDE_ALIGN = _visionipc.STRIDE_ALIGN
BUFFER_ALIGN = _visionipc.BUFFER_ALIGN
MAX_BUFFERS = _visionipc.MAX_BUFFERS
MAX_CLIENTS = _visionipc.MAX_CLIENTS

_ALIASES = {"gray": "gray8", "grey": "gray8", "rgb": "rgb8", "bgr": "bgr8", "raw": "raw16", "bayer16": "raw16"}


def normalize_format(fmt) -> str:
    if not isinstance(fmt, str):
        raise InvalidArgumentError(f"format must be a str like 'nv12', not {type(fmt).__name__}")
    name = _ALIASES.get(fmt.lower(), fmt.lower())
    if name not in FORMATS:
        raise InvalidArgumentError(f"unknown pixel format {fmt!r} (one of {', '.join(FORMATS)})")
    return name


def check_count(what: str, value) -> int:
    """A positive int, else InvalidArgumentError (bool and floats are refused too)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{what} must be an int, not {type(value).__name__}")
    value = value.__index__()
    if value <= 0:
        raise InvalidArgumentError(f"{what} must be positive, got {value}")
    if value >= 1 << 32:
        raise InvalidArgumentError(f"{what} {value} is too large")
    return value


def layout(fmt: str, width: int, height: int) -> dict:
    """``{"format", "width", "height", "stride", "uv_offset", "size"}`` of one buffer."""
    return _visionipc.geometry(normalize_format(fmt), check_count("width", width), check_count("height", height))
