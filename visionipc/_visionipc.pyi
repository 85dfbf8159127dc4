"""Stubs of the private native module (use the visionipc package)."""

from typing import Any, Callable, Optional, Sequence, SupportsIndex, TypeVar

import numpy as np
from typing_extensions import CapsuleType, TypeAlias, disjoint_base

STRIDE_ALIGN: int
BUFFER_ALIGN: int
MAX_BUFFERS: int
MAX_CLIENTS: int
MAX_CLIENTS_PER_PEER: int  # the slots one process (one peer) may take of a stream's MAX_CLIENTS
POOL_IN_DEVICE_MEMORY: int  # Client.pool_flags: the stream's frames are in GPU memory (visionipc.cuda)
MAX_NAME_LENGTH: int  # the longest server or stream name (the socket address and topic are built from it)
# The C++ format table (vipc::kFormats), in enum order:
# (name, code, aliases (space-separated), bytes_per_pixel, channels, yuv420, selectable, planes,
#  cv_to_bgr, cv_from_bgr, av_format): visionipc.formats.PixelFormat's fields
FORMAT_TABLE: tuple[tuple[str, int, str, int, int, bool, bool, int, str, str, str], ...]

_F = TypeVar("_F", bound=Callable[..., Any])

# (format, width, height, stride, uv_offset, size): visionipc.formats.Geometry's fields
_GeometryTuple: TypeAlias = tuple[str, int, int, int, int, int]

def geometry(format: str, width: int, height: int, /) -> _GeometryTuple: ...
def endpoint_name(name: str, stream: str, /) -> str: ...
def list_streams(name: str, prefix: str, shm_dir: str, trusted_uids: list[int] = ...) -> Optional[list[str]]: ...
def dlpack_capsule(
    owner: object,
    data: SupportsIndex,
    shape: Sequence[SupportsIndex],
    strides: Sequence[SupportsIndex],
    type_code: SupportsIndex,
    bits: SupportsIndex,
    device_type: SupportsIndex,
    device_id: SupportsIndex,
) -> CapsuleType: ...  # a DLPack 'dltensor' capsule over memory `owner` keeps alive (strides in elements)

# `func` (VisionIpcServer.get_buffer or .send, by `kind`) behind a native front that runs their per-frame calls
# without a Python frame (data: send's VisionBuf class)
def server_method(kind: str, func: _F, data: object = None, /) -> _F: ...

class View:
    """A buffer-protocol view of one buffer (made by Server/Client.view and get_buffer)."""

    def __len__(self) -> int: ...

class Server:
    @property
    def id(self) -> int: ...
    def __init__(
        self,
        name: str,
        prefix: str = "",
        shm_dir: str = "/dev/shm",
        allowed_uids: list[int] = ...,
        handoff_wakes: bool = False,
    ) -> None: ...
    def readers_woken(self, stream: str, /) -> int: ...
    def create_buffers(
        self, stream: str, count: int, width: int, height: int, format: str, pool_flags: int = 0
    ) -> None: ...
    def create_buffers_with_sizes(
        self,
        stream: str,
        count: int,
        width: int,
        height: int,
        size: int,
        stride: int,
        uv_offset: int,
        pool_flags: int = 0,
    ) -> None: ...
    def get_buffer(self, stream: str, /) -> tuple[int, int, View]: ...
    def acquire(self, stream: str | int, /) -> tuple[int, int]: ...  # get_buffer without the view (name or handle)
    def view(self, stream: str, index: int, /) -> View: ...
    def buffers_span(self, stream: str, /) -> tuple[int, int]: ...  # (address, length) of the pool's pages
    def send(
        self, stream: str, index: int, generation: int, frame_id: int, timestamp_sof: int, timestamp_eof: int, /
    ) -> None: ...
    def send_copy(
        self, stream: str | int, data: object, frame_id: int, timestamp_sof: int, timestamp_eof: int, /
    ) -> int: ...
    # get_buffer's per-frame call: ready = (Frame subclass, stream, the ViewCache's made list, geometry, the cache,
    # the stream's handle, this Server)
    def acquire_frame(
        self, ready: tuple[type[Frame], str, list[Any], Any, Any, int, Server], owner: object, /
    ) -> Frame: ...
    def send_frame(self, frame: Frame, frame_id: int, timestamp_sof: int, timestamp_eof: int, /) -> None: ...
    def start_listener(self) -> None: ...
    def close(self) -> None: ...
    def streams(self) -> list[str]: ...
    def geometry(self, stream: str, /) -> _GeometryTuple: ...
    def count(self, stream: str, /) -> int: ...
    def handle(self, stream: str, /) -> int: ...  # the stream's handle for acquire / send_copy / acquire_frame
    def clients(self, stream: str, /) -> int: ...
    def generation(self, stream: str, index: int, /) -> int: ...
    def _forget_after_fork(self) -> None: ...

@disjoint_base
class Frame:
    """The fields of one frame: the C base of visionipc.VisionBuf (Client.recv_into fills them)."""

    idx: int
    generation: int
    frame_id: int
    timestamp_sof: int
    timestamp_eof: int
    timestamp_publish: int  # CLOCK_MONOTONIC ns of the server's send (0: not received)
    timestamp_recv: int  # CLOCK_MONOTONIC ns of this client's receive (0: not received)
    stream: Any  # the stream's key (a str) or id, as the owner names it
    _views: Any  # visionipc.frame.FrameViews
    _geometry: Any  # visionipc.formats.Geometry
    _owner: Any  # visionipc.frame.FrameOwner, or None
    @property
    def array(self) -> np.ndarray: ...  # a fresh numpy view (a prepared one of _views.spares first)

# Client.recv_into's flags
RECV_LEASED: int  # the client leases the frame
RECV_NEEDS_VIEWS: int  # the frame's _views/_geometry were not set: the caller sets them

class Client:
    @property
    def count(self) -> int: ...
    @property
    def pool_flags(self) -> int: ...  # POOL_IN_DEVICE_MEMORY: the mapped pool's frames are in GPU memory
    @property
    def server_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...  # bumped by every (re)connect that maps a pool
    @property
    def dropped(self) -> int: ...
    @property
    def last_error(self) -> str: ...  # why the last connect() failed, in words ("" after a success)
    @property
    def last_refusal(self) -> str: ...  # "", "no server", "unknown stream", "full" or "peer limit"
    def __init__(
        self,
        name: str,
        stream: str,
        conflate: bool = False,
        prefix: str = "",
        shm_dir: str = "/dev/shm",
        trusted_uids: list[int] = ...,
    ) -> None: ...
    def connect(self) -> bool: ...
    def connected(self) -> bool: ...
    # cache: the client's visionipc.frame.ViewCache of mapping `epoch`, or None; None on timeout, else RECV_* flags
    def recv_into(self, frame: Frame, cache: Any, epoch: Optional[int], timeout_ms: int, /) -> Optional[int]: ...
    def take_lease(self, index: int, generation: int, /) -> bool: ...
    def release_lease(self) -> None: ...
    def is_valid(self, index: int, generation: int, /) -> bool: ...
    def view(self, index: int, /) -> View: ...
    def geometry(self) -> _GeometryTuple: ...
    def buffers_span(self) -> tuple[int, int]: ...  # (address, length) of the mapped pool's pages
    def close(self) -> None: ...
    def _forget_after_fork(self) -> None: ...
