"""VisionIpcClient: attach to one stream of a server and receive frames without copying."""

import time
import types
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Set, Tuple, Union, cast

import numpy as np

from msgq._shared import INT32_MAX, INT32_MIN, Closeable, check_timeout_ms, disown_in_forked_child
from msgq.errors import ClosedError, InvalidArgumentError, IpcError, IpcTypeError
from visionipc import _visionipc
from visionipc.formats import Geometry
from visionipc.frame import ViewCache, VisionBuf
from visionipc.streams import ServerName, StreamId, run_options, server_name, stream_id, stream_key

if TYPE_CHECKING:
    from visionipc.cuda.device_frame import DeviceFrame, PoolTemplate
    from visionipc.cuda.device_pool import DevicePool
    from visionipc.cuda.link import CudaLink as _CudaLink

_LEASED, _NEEDS_VIEWS = _visionipc.RECV_LEASED, _visionipc.RECV_NEEDS_VIEWS
_IN_DEVICE = _visionipc.POOL_IN_DEVICE_MEMORY
_RETRY_S = 0.01  # how often a blocking connect or available_streams asks again
# A blocking connect the server keeps refusing (unknown stream, full, this
# process's share taken) raises after this long instead of waiting silently.
# (A stream the server is about to create, or a slot about to free, fits in it.)
_REFUSAL_GRACE_S = 2.0


class VisionIpcClient(Closeable):
    """``VisionIpcClient(name, stream, conflate)``; ``connect(blocking)``; ``recv(timeout_ms)``.

    Each ``recv`` leases the frame it returns (and drops the previous lease), so the
    server does not reuse that buffer while it is the client's newest frame, as long
    as the stream has more buffers than clients. ``frame.valid`` tells whether the
    frame is still intact; ``with client.recv() as frame:`` keeps the lease for the block
    and drops it at the end. A restarted server is picked up on its first frame.

    The client only talks to a server run by its own user or root, plus
    ``trusted_uids`` (checked with SO_PEERCRED); a server refusing this client's
    user raises :class:`msgq.IpcPermissionError` from ``connect``.

    A refused ``connect`` says why: ``connect(False)`` returns False and
    ``last_error`` names the reason (no server, unknown stream with the
    streams there are, server full, this process's share of slots taken);
    ``connect(True)`` waits for a missing server but raises
    :class:`msgq.IpcError` with that reason when a running server keeps
    refusing. A forked child cannot use an inherited client (ClosedError).

    ``cuda=True`` (or a device ordinal; ``pip install 'visionipc[cuda]'``) registers
    the mapped pool with the CUDA runtime, so ``frame.to_device()`` copies a frame
    into GPU memory at the link's speed (see :mod:`visionipc.cuda`). Without a
    driver or a device it raises :class:`visionipc.cuda.CudaUnavailableError`.
    """

    def __init__(
        self,
        name: ServerName,
        stream: StreamId,
        conflate: bool = False,
        context: None = None,
        trusted_uids: Iterable[int] = (),
        cuda: Union[bool, int] = False,
    ) -> None:
        if context is not None:
            raise IpcTypeError("OpenCL contexts are not supported; pass context=None (GPU frames: cuda=True)")
        self.name = server_name(name)
        self.stream = stream
        self._key = stream_key(stream)
        self._cuda: Optional[_CudaLink] = None  # a visionipc.cuda CudaLink with cuda=True
        # The mapped pool keeps its frames in device memory (memory="cuda"): its
        # DevicePool, mapped at the first frame (None until then, and for host pools).
        self._in_device = False
        self._device_pool: Optional[DevicePool] = None
        self._device_frames: Optional[PoolTemplate] = None  # what the pool's DeviceFrames share
        self._host_ptrs: Dict[int, int] = {}  # cuda=True: buffer index -> its address in the mapping now
        self._native: Optional[_visionipc.Client] = _visionipc.Client(
            self.name, self._key, bool(conflate), **run_options(), trusted_uids=[int(u) for u in trusted_uids]
        )
        if cuda is not False:
            from visionipc.cuda.link import CudaLink

            try:
                self._cuda = CudaLink(cuda)
            except BaseException:  # no CUDA here: the native client goes now, not at garbage collection
                native, self._native = self._native, None
                native.close()
                raise
        self._last: Any = None  # the newest frame received (after close, its numbers)
        self._blank: Optional[VisionBuf] = None  # the next frame's object, made before waiting (see recv)
        self._leased: Optional[VisionBuf] = None  # the frame (idx, generation) our lease slot holds, if any
        # Per mapping (native epoch): the ViewCache of the pool (None before the
        # first mapping), so recv() allocates only the VisionBuf.
        self._epoch: Optional[int] = None
        self._views: Optional[ViewCache] = None
        self.last_error = ""  # why the last connect() failed ("" after a success)
        disown_in_forked_child(self)

    def _client(self) -> _visionipc.Client:
        if self._native is None:
            raise ClosedError("VisionIpcClient is closed (or was inherited across fork: make one here)")
        return self._native

    def _forget_after_fork(self) -> None:
        if self._cuda is not None:
            self._cuda.forget()
        if self._device_pool is not None:
            self._device_pool.forget()
        self._device_pool, self._device_frames, self._in_device = None, None, False
        native, self._native = self._native, None
        self._epoch, self._views, self._last, self._leased = None, None, None, None
        if native is not None:
            native._forget_after_fork()

    def connect(self, blocking: bool = True) -> bool:
        native = self._client()
        refused_since: Optional[float] = None
        while not native.connect():
            self.last_error = native.last_error
            if not blocking:
                return False
            if native.last_refusal == "no server":
                refused_since = None
            elif refused_since is None:
                refused_since = time.monotonic()
            elif time.monotonic() - refused_since > _REFUSAL_GRACE_S:
                raise IpcError(self.last_error)
            time.sleep(_RETRY_S)
        self.last_error = ""
        self._check_frames_readable(native)
        return True

    def _check_frames_readable(self, native: _visionipc.Client) -> None:
        """A pool in device memory needs a client made with ``cuda=True``."""
        if native.pool_flags & _IN_DEVICE and self._cuda is None:
            self.last_error = (
                f"stream {self.stream!r} of VisionIPC server {self.name!r} keeps its frames in GPU memory "
                '(create_buffers(memory="cuda")): make the client with VisionIpcClient(..., cuda=True)'
            )
            raise InvalidArgumentError(self.last_error)

    def is_connected(self) -> bool:
        return self._native is not None and self._native.connected()

    def recv(self, timeout_ms: Optional[float] = 100) -> Optional[VisionBuf]:
        """The next frame as a VisionBuf, or None after ``timeout_ms`` (< 0: wait forever).
        A stream whose pool is in device memory gives :class:`visionipc.cuda.DeviceFrame`s
        (typed for host pools, the common case; ``recv_device()`` is typed for those)."""
        # Runs cold: the wait sleeps, and each step after the wake-up costs many times
        # what it costs warm (caches and TLBs are cold). So what does not need the
        # frame is done before waiting: the frame object is made, and the last
        # frame's next .array made ready; after the wake-up the native receive
        # stores the frame's fields and views (no Python runs for them).
        native = self._native
        if native is None:
            native = self._client()  # raises ClosedError
        if self._cuda is not None and self._cuda.inflight:
            self._cuda.finish()  # the lease this receive drops outlives the copies from its buffer
        last = self._last
        if last is not None:
            last._views.prepare()
        f = self._blank
        if f is None:
            f = self._blank = VisionBuf.blank(self, self._key)
        if type(timeout_ms) is not int or not INT32_MIN <= timeout_ms <= INT32_MAX:
            timeout_ms = check_timeout_ms(timeout_ms, "timeout_ms")  # NaN, 2**40, "1": InvalidArgumentError
        got = native.recv_into(f, self._views, self._epoch, timeout_ms)
        if got is None:
            return None
        self._blank = None
        self._leased = f if got & _LEASED else None
        if got & _NEEDS_VIEWS:
            self._attach_views(native, f)
        self._last = f
        if self._in_device:
            t = self._device_frames
            if t is None:
                t = self._map_device_pool(native, f)
            return t.cls.received(f, t)  # type: ignore[return-value]  # see the docstring
        return f

    def recv_device(self, timeout_ms: Optional[float] = 100) -> Optional["DeviceFrame"]:
        """``recv()`` of a stream whose pool is in device memory (``create_buffers(...,
        memory="cuda")``), typed as the :class:`visionipc.cuda.DeviceFrame` it returns;
        a frame of a host pool is refused (``to_device()`` copies one)."""
        frame = self.recv(timeout_ms)
        if frame is None or not isinstance(frame, VisionBuf):
            return frame
        raise InvalidArgumentError(
            f"stream {self.stream!r} keeps its frames in host memory: use recv() (and frame.to_device() to copy one)"
        )

    def _map_device_pool(self, native: _visionipc.Client, f: VisionBuf) -> "PoolTemplate":
        """At the first frame of a mapping whose pool is in device memory: map that memory
        into this process and make what its DeviceFrames share."""
        from visionipc.cuda.device_frame import DeviceFrame
        from visionipc.cuda.device_pool import import_pool, slot_size

        link = self._cuda
        assert link is not None  # _check_frames_readable refused the stream otherwise
        geometry = Geometry(*native.geometry())
        slot = slot_size(geometry.size)
        buffer0 = np.frombuffer(cast(Any, native.view(0)), np.uint8)  # a View: the buffer protocol
        pool = self._device_pool = import_pool(link.runtime, buffer0, native.count, slot)
        t = self._device_frames = DeviceFrame.template(f, pool, link.runtime)
        return t

    def _attach_views(self, native: _visionipc.Client, f: VisionBuf) -> None:
        """Give a received frame the views recv_into could not: the first frame of a
        mapping (a (re)connect mapped a pool), or the first of its buffer."""
        if native.epoch != self._epoch:
            self._remapped(native, native.epoch)
        views = self._views
        assert views is not None  # a frame came: its pool is mapped
        f._views, f._geometry = views.get(f.idx), views.geometry

    def _remapped(self, native: _visionipc.Client, epoch: int) -> None:
        """A (re)connect mapped a pool: drop what was cached for the old mapping
        (frames already handed out keep theirs alive)."""
        self._epoch = epoch
        self._views = ViewCache(Geometry(*native.geometry()), native.count, native.view) if native.count else None
        # a pool in device memory of the old mapping goes with its last frame (DeviceFrames keep it)
        self._device_pool, self._device_frames = None, None
        self._host_ptrs.clear()
        self._in_device = bool(native.pool_flags & _IN_DEVICE)
        self._check_frames_readable(native)
        if self._cuda is not None and native.count and not self._in_device:
            self._cuda.pin("pool", native.buffers_span(), native.view(0))  # the view keeps it mapped while registered

    # LeasingOwner: whether a frame is intact, and the read lease of `with frame:`
    def frame_valid(self, buf: VisionBuf) -> bool:
        return self._native is not None and self._native.is_valid(buf.idx, buf.generation)

    def _leases(self, buf: VisionBuf) -> bool:
        held = self._leased
        return held is not None and held.idx == buf.idx and held.generation == buf.generation

    def hold_frame(self, buf: VisionBuf) -> None:
        if self._native is not None and not self._leases(buf):
            self._leased = buf if self._native.take_lease(buf.idx, buf.generation) else None

    def release_frame(self, buf: VisionBuf) -> None:
        if self._native is not None and self._leases(buf):
            if self._cuda is not None:
                self._cuda.finish()
            self._native.release_lease()
            self._leased = None

    # visionipc.cuda (cuda=True)
    def cuda_host_device(self, buf: VisionBuf) -> Optional[int]:
        """0 if ``buf``'s bytes are registered with CUDA (DLPack's CUDA-host device), else None."""
        return None if self._cuda is None else self._cuda.host_device(buf)

    def frame_to_device(
        self, buf: VisionBuf, out: Any = None, stream: Any = None, source: Optional[Tuple[int, str]] = None
    ) -> "DeviceFrame":
        """``buf.to_device()``: lease the frame (if this client does not already), then
        copy it into device memory; the lease stays until the copy has completed.
        ``source``: (pointer, kind) of a frame of a pool in device memory."""
        link = self._cuda
        if link is None:
            raise InvalidArgumentError("to_device() needs a client made with VisionIpcClient(..., cuda=True)")
        self._client()  # ClosedError
        if not self._leases(buf):
            self.hold_frame(buf)
            if not self._leases(buf):
                raise IpcError(
                    f"frame {buf.frame_id} is no longer in its buffer (the server reused it): copy a newer frame"
                )
        if source is not None:
            return link.copy_to_device(buf, out, stream, src=source[0], kind=source[1])
        # the host address of the frame's buffer: asked once per buffer of a mapping
        views = self._views
        current = views is not None and buf._views is views.made[buf.idx]
        src = self._host_ptrs.get(buf.idx) if current else None
        if src is None:
            src = buf.as_array().ctypes.data
            if current:
                self._host_ptrs[buf.idx] = src
        return link.copy_to_device(buf, out, stream, src=src)

    def _geometry(self, field: str) -> Any:
        native = self._native
        if native is None or native.count == 0:
            return None
        if native.epoch != self._epoch:
            self._remapped(native, native.epoch)
        assert self._views is not None  # native.count buffers are mapped
        return getattr(self._views.geometry, field)

    @property
    def width(self) -> Optional[int]:
        return self._geometry("width")

    @property
    def height(self) -> Optional[int]:
        return self._geometry("height")

    @property
    def stride(self) -> Optional[int]:
        return self._geometry("stride")

    @property
    def uv_offset(self) -> Optional[int]:
        return self._geometry("uv_offset")

    @property
    def buffer_len(self) -> Optional[int]:
        return self._geometry("size")

    @property
    def format(self) -> Optional[str]:
        return self._geometry("format")

    @property
    def server_id(self) -> int:
        """The id of the server this client is connected to (its ``server_id``); 0 before
        it connects. A reconnection to a restarted server changes it."""
        return 0 if self._native is None else self._native.server_id

    @property
    def num_buffers(self) -> int:
        return 0 if self._native is None else self._native.count

    @property
    def frame_id(self) -> int:
        return self._last.frame_id if self._last else 0

    @property
    def timestamp_sof(self) -> int:
        return self._last.timestamp_sof if self._last else 0

    @property
    def timestamp_eof(self) -> int:
        return self._last.timestamp_eof if self._last else 0

    @property
    def valid(self) -> bool:
        return bool(self._last and self._last.valid)

    @staticmethod
    def available_streams(name: ServerName, block: bool = False) -> Set[Union[int, str]]:
        return available_streams(name, block)

    def close(self) -> None:
        """Drop the lease and the connection (frames already received stay readable)."""
        if self._native is not None and self._cuda is not None:
            self._cuda.close()  # copies finish and pages unregister before the lease and the mapping go
        if self._device_pool is not None:
            self._device_pool.close()  # its DeviceFrames refuse use from now on (ClosedError)
        self._device_pool, self._device_frames, self._in_device = None, None, False
        native, self._native = self._native, None
        # Drop what maps the pool (frames handed out keep their own views); the last
        # frame's numbers stay readable through the reference's properties.
        self._epoch, self._views, self._leased = None, None, None
        last = self._last
        if last is not None:
            self._last = types.SimpleNamespace(
                frame_id=last.frame_id, timestamp_sof=last.timestamp_sof, timestamp_eof=last.timestamp_eof, valid=False
            )
        if native is not None:
            native.close()


def available_streams(name: ServerName, block: bool = False) -> Set[Union[int, str]]:
    """The stream ids a server offers (ints where the name is an int). With
    ``block``, wait until the server answers; otherwise an empty set if it does not."""
    name = server_name(name)
    opts = run_options()
    while True:
        names = _visionipc.list_streams(name, opts["prefix"], opts["shm_dir"])
        if names is not None or not block:
            return {stream_id(n) for n in names or ()}
        time.sleep(_RETRY_S)


def get_endpoint_name(name: ServerName, stream: StreamId) -> str:
    """The msgq topic a stream's frames are announced on: ``visionipc_<name>_<stream>``."""
    if isinstance(name, bytes):
        name = name.decode()
    return _visionipc.endpoint_name(server_name(name), stream_key(stream))


__all__ = ["VisionIpcClient", "available_streams", "get_endpoint_name"]
