"""Pixel formats and how a frame buffer is laid out (the C++ core computes it;
see cpp/visionipc/format.h for the table, which the binding exports: nothing
about a format is listed again here).

Rows start on 64-byte boundaries (``STRIDE_ALIGN``), buffers on 4096-byte
boundaries in the pool (``BUFFER_ALIGN``). ``layout(format, width, height)``
returns the :class:`Geometry` (stride, ``uv_offset``, size...) a server would use.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Iterator, NamedTuple, Tuple, Union

from msgq._shared import check_int
from msgq.errors import InvalidArgumentError
from visionipc import _visionipc


class PixelFormat(NamedTuple):
    """One row of the C++ format table (``vipc::kFormats``)."""

    name: str
    code: int  # the enum value (what travels in headers and trailers)
    aliases: Tuple[str, ...]  # other names the API accepts ("gray" for "gray8"...)
    bytes_per_pixel: int  # in the first (Y or only) plane
    channels: int  # samples a pixel in that plane
    yuv420: bool  # a Y plane, then 2x2-subsampled chroma at uv_offset
    selectable: bool  # create_buffers takes it ("custom" comes from create_buffers_with_sizes)
    # the compact image (visionipc.pixels) in the converters' vocabulary:
    planes: int  # 1; yuv420: 2 (Y, interleaved UV: NV12's) or 3 (Y, U, V: I420's)
    cv_to_bgr: str  # OpenCV's conversion to BGR (cv2.COLOR_<it>); "" when it is BGR
    cv_from_bgr: str  # and from BGR (YUV: to I420 planes, interleaved where 2 planes)
    av_format: str  # FFmpeg's pixel format of the same bytes

    @property
    def sample_bits(self) -> int:
        return 8 * self.sample_bytes

    @property
    def sample_bytes(self) -> int:
        return self.bytes_per_pixel // self.channels


FORMAT_TABLE = tuple(
    PixelFormat._make((name, code, tuple(aliases.split()), *rest))
    for name, code, aliases, *rest in _visionipc.FORMAT_TABLE
)  # indexed by code
_BY_NAME = {f.name: f for f in FORMAT_TABLE}
_ALIASES = {alias: f.name for f in FORMAT_TABLE for alias in f.aliases}

FORMATS = tuple(f.name for f in FORMAT_TABLE if f.selectable)
STRIDE_ALIGN = _visionipc.STRIDE_ALIGN
BUFFER_ALIGN = _visionipc.BUFFER_ALIGN
MAX_BUFFERS = _visionipc.MAX_BUFFERS
MAX_CLIENTS = _visionipc.MAX_CLIENTS


def format_info(name: str) -> PixelFormat:
    """The table row of a format: a Geometry's canonical name, or any name the API accepts."""
    info = _BY_NAME.get(name)
    return info if info is not None else _BY_NAME[normalize_format(name)]


@dataclass(frozen=True, slots=True)
class Geometry(Mapping):
    """The layout of one buffer: ``format`` (a canonical name), ``width``, ``height``,
    ``stride`` (bytes a row), ``uv_offset`` (chroma start; 0 for one-plane formats)
    and ``size`` (bytes). Read-only Mapping access (``geo["stride"]``, ``dict(geo)``)
    works too, as when ``layout()`` returned a dict."""

    format: str
    width: int
    height: int
    stride: int
    uv_offset: int
    size: int

    @property
    def info(self) -> PixelFormat:
        return _BY_NAME[self.format]

    def __getitem__(self, key: str) -> Union[str, int]:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


_FIELDS = tuple(f.name for f in fields(Geometry))


def normalize_format(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise InvalidArgumentError(f"format must be a str like 'nv12', not {type(fmt).__name__}")
    name = _ALIASES.get(fmt.lower(), fmt.lower())
    if name not in FORMATS:
        raise InvalidArgumentError(f"unknown pixel format {fmt!r} (one of {', '.join(FORMATS)})")
    return name


def check_count(what: str, value: Any) -> int:
    """A positive int that fits 32 bits, else InvalidArgumentError (bool and floats are refused too)."""
    return check_int(what, value, 1, (1 << 32) - 1)


def layout(fmt: str, width: int, height: int) -> Geometry:
    """The :class:`Geometry` of one buffer of ``fmt`` at ``width`` x ``height``."""
    return Geometry(
        *_visionipc.geometry(normalize_format(fmt), check_count("width", width), check_count("height", height))
    )
