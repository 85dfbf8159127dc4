"""VisionIpcServer: frame pools, zero-copy publish, and the socket clients attach through."""

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, Union, cast, overload

import numpy as np

from msgq._shared import Closeable, disown_in_forked_child, wake_choice
from msgq.errors import ClosedError, InvalidArgumentError
from visionipc import _visionipc
from visionipc.formats import Geometry, check_count, normalize_format
from visionipc.frame import FrameViews, ViewCache, VisionBuf
from visionipc.streams import ServerName, StreamId, run_options, server_name, stream_key

if TYPE_CHECKING:
    from msgq._shared import BufferLike
    from visionipc.cuda.device_frame import DeviceFrame
    from visionipc.cuda.device_pool import DevicePool
    from visionipc.cuda.link import CudaLink as _CudaLink

_U8 = np.dtype(np.uint8)
_F = TypeVar("_F", bound=Callable[..., Any])


def _native_front(kind: str, data: object = None) -> Callable[[_F], _F]:
    """The method with a native front for its per-frame calls (``_visionipc.server_method``,
    cpp/python/fast_method.h): they run without a Python frame; any other call runs the
    method as written."""
    return lambda func: _visionipc.server_method(kind, func, data)


class VisionIpcServer(Closeable):
    """``VisionIpcServer(name)``; then ``create_buffers`` per stream, ``start_listener()``,
    and per frame ``buf = get_buffer(stream)``, fill ``buf.array``, ``send(buf, frame_id, ...)``.

    Buffer choice: the least recently sent buffer no client holds a read lease on.
    When every buffer is leased the least recently sent one is reused anyway and its
    holder's ``valid`` turns False. ``get_buffer`` never blocks. Only clients of the
    same user connect, plus ``allowed_uids``.

    ``wake``: how ``send`` wakes clients asleep in ``recv``. ``"all"`` (the default,
    or ``MSGQ_WAKE``): one system call of the server wakes every sleeping client,
    each as early as it can, and the server's CPU per frame grows with the clients;
    ``"handoff"``: the server wakes one and that client wakes the others, so a frame
    costs the server what one client costs, and the others wake one hop later.

    Fork: a forked child (``multiprocessing`` forks by default on Linux) that
    inherits a server cannot use it (ClosedError); dropping or closing it there
    leaves the parent's listener, clients and topics untouched.

    ``cuda=True`` (or a device ordinal; :mod:`visionipc.cuda`) registers each pool with
    the CUDA runtime, so a GPU producer fills a buffer with one device-to-host copy at
    the link's speed: ``buf.copy_from_device(array)``, then ``send(buf, ...)``, which
    waits for that copy (its event), not for the whole device.

    ``create_buffers(..., memory="cuda")`` keeps a stream's pool in device memory (on
    the server's CUDA device, device 0 if it was made without ``cuda=``): the
    producer fills ``buf.device_array`` (or ``buf.copy_from_device(array)``, device to
    device), and the clients of this machine receive DeviceFrames of the same memory
    through CUDA IPC; no byte crosses the link.
    """

    def __init__(
        self,
        name: ServerName,
        allowed_uids: Iterable[int] = (),
        wake: Optional[str] = None,
        cuda: Union[bool, int] = False,
    ) -> None:
        self.name = server_name(name)
        self._cuda: Optional[_CudaLink] = None  # a visionipc.cuda CudaLink with cuda=True (or a pool in device memory)
        self._pin_host = cuda is not False  # register host pools (cuda=True), not only keep pools on the device
        if cuda is not False:
            from visionipc.cuda.link import CudaLink

            self._cuda = CudaLink(cuda)
        self._device_pools: Dict[str, DevicePool] = {}  # stream key -> its pool in device memory (memory="cuda")
        handoff = wake_choice(wake)
        self.wake = "handoff" if handoff else "all"  # what this server does (MSGQ_WAKE resolved)
        self._native: Optional[_visionipc.Server] = _visionipc.Server(
            self.name, allowed_uids=[int(u) for u in allowed_uids], handoff_wakes=handoff, **run_options()
        )
        disown_in_forked_child(self)
        # Per stream key: the ViewCache of its pool. A stream's pool never changes
        # once created, so these stay valid.
        self._views: Dict[str, ViewCache] = {}
        self._keys: Dict[Union[str, int], str] = {}  # streams (exact str or int) already validated -> key
        # Per stream (exact str or int) that get_buffer has served: what acquire_frame reads.
        # These dicts are emptied (never replaced) by close() and after fork: the native
        # front of get_buffer and send reads them, and finds nothing there then.
        self._ready: Dict[
            Union[str, int], Tuple[type, str, List[Optional[FrameViews]], Geometry, ViewCache, int, _visionipc.Server]
        ] = {}
        # Per stream (exact str or int) already sent or served: its native handle (the
        # per-frame calls skip the name lookup with it).
        self._handles: Dict[Union[str, int], int] = {}

    def _server(self) -> _visionipc.Server:
        if self._native is None:
            raise ClosedError(f"VisionIpcServer {self.name!r} is closed (or was inherited across fork: make one here)")
        return self._native

    def _forget_after_fork(self) -> None:
        if self._cuda is not None:
            self._cuda.forget()
        for pool in self._device_pools.values():
            pool.forget()
        self._device_pools.clear()
        native, self._native = self._native, None
        self._forget_streams()
        if native is not None:
            native._forget_after_fork()

    def _forget_streams(self) -> None:
        for known in (self._views, self._ready, self._handles):
            known.clear()

    def create_buffers(
        self, stream: StreamId, count: int, width: int, height: int, format: str = "nv12", memory: str = "host"
    ) -> None:
        """A pool of ``count`` buffers for ``stream``; ``memory="cuda"``: in device memory
        (see the class's documentation)."""
        key = stream_key(stream)
        count, width, height = (
            check_count("buffer count", count),
            check_count("width", width),
            check_count("height", height),
        )
        format = normalize_format(format)
        native = self._server()
        if self._in_device_memory(memory):
            geometry = Geometry(*_visionipc.geometry(format, width, height))
            self._create_in_device(
                key,
                count,
                geometry.size,
                lambda flags: native.create_buffers(key, count, width, height, format, pool_flags=flags),
            )
        else:
            native.create_buffers(key, count, width, height, format)
            self._pin(key)

    def _in_device_memory(self, memory: str) -> bool:
        """``memory=``: "host" (False) or "cuda" (True; a CUDA link made now if the server has none)."""
        from visionipc.cuda.device_pool import CUDA, HOST

        if memory == HOST:
            return False
        if memory != CUDA:
            raise InvalidArgumentError(f'memory must be "host" or "cuda", not {memory!r}')
        if self._cuda is None:
            from visionipc.cuda.link import CudaLink

            self._cuda = CudaLink(True)  # CudaUnavailableError without a driver or a device
        return True

    def _create_in_device(self, key: str, count: int, size: int, create: Callable[[int], None]) -> None:
        """The device allocation first (so a refusal leaves nothing), then the stream with
        the flag that tells its clients, then the descriptor they read at their first frame."""
        from visionipc.cuda.device_pool import export_pool, slot_size, write_descriptor

        link = self._cuda
        assert link is not None  # made by _in_device_memory
        slot = slot_size(size)
        pool, descriptor = export_pool(link.runtime, link.device, count, slot)
        try:
            create(_visionipc.POOL_IN_DEVICE_MEMORY)
        except BaseException:
            pool.close()
            raise
        self._device_pools[key] = pool
        write_descriptor(np.frombuffer(cast(Any, self._server().view(key, 0)), np.uint8), descriptor)

    def _pin(self, key: str) -> None:
        """cuda=True: register the new pool's pages (the view keeps them mapped meanwhile)."""
        if self._cuda is not None and self._pin_host:
            native = self._server()
            self._cuda.pin(key, native.buffers_span(key), native.view(key, 0))

    def create_buffers_with_sizes(
        self,
        stream: StreamId,
        count: int,
        width: int,
        height: int,
        size: int,
        stride: int,
        uv_offset: int,
        memory: str = "host",
    ) -> None:
        if isinstance(uv_offset, bool) or not hasattr(uv_offset, "__index__") or uv_offset < 0:
            raise InvalidArgumentError(f"uv_offset must be a non-negative int, got {uv_offset!r}")
        key = stream_key(stream)
        args = (
            key,
            check_count("buffer count", count),
            check_count("width", width),
            check_count("height", height),
            check_count("size", size),
            check_count("stride", stride),
            uv_offset.__index__(),
        )
        native = self._server()
        if self._in_device_memory(memory):
            self._create_in_device(
                key, args[1], args[4], lambda flags: native.create_buffers_with_sizes(*args, pool_flags=flags)
            )
        else:
            native.create_buffers_with_sizes(*args)
            self._pin(key)

    def start_listener(self) -> None:
        self._server().start_listener()

    def _key(self, stream: StreamId) -> str:
        """``stream_key(stream)``, validated once per str or int (not bool, whose hash is an int's)."""
        key = self._keys.get(stream) if type(stream) is str or type(stream) is int else None
        if key is None:
            key = stream_key(stream)
            if type(stream) is str or type(stream) is int:
                self._keys[stream] = key
        return key

    @_native_front("get_buffer")
    def get_buffer(self, stream: StreamId) -> VisionBuf:
        # The per-frame path, which a camera runs cold right after a sleep: a stream
        # served before (an exact str or int) goes from the native front straight to the
        # one native call that checks a buffer out and returns its VisionBuf, fields and
        # cached views filled (cpp/python/visionipc_module.cpp: get_buffer_hook,
        # acquire_frame); this Python body does the same when called otherwise.
        native = self._native
        if native is not None and (type(stream) is str or type(stream) is int):
            ready = self._ready.get(stream)
            if ready is not None:
                return native.acquire_frame(ready, self)  # type: ignore[return-value]
        return self._first_buffer(stream)

    def _first_buffer(self, stream: StreamId) -> VisionBuf:
        """``get_buffer`` the first time for ``stream`` (or a stream given otherwise than
        as an exact str or int): validates it, makes the pool's ViewCache and what
        ``acquire_frame`` reads, ``(VisionBuf, key, made, geometry, cache, handle, native)``."""
        key = self._key(stream)
        native = self._server()
        cache = self._views.get(key)
        if cache is None:
            cache = self._views[key] = ViewCache(
                Geometry(*native.geometry(key)), native.count(key), functools.partial(native.view, key)
            )
        ready = (VisionBuf, key, cache.made, cache.geometry, cache, self._handle(stream, key), native)
        if type(stream) is str or type(stream) is int:
            self._ready[stream] = ready
        return native.acquire_frame(ready, self)  # type: ignore[return-value]

    # send(buf, frame_id, timestamp_sof, timestamp_eof) positionally (the reference's), or by keyword
    @overload
    def send(self, buf: VisionBuf, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0, /) -> None: ...

    @overload
    def send(self, buf: VisionBuf, *, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0) -> None: ...

    @overload
    def send(
        self, buf: StreamId, data: "BufferLike", frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0
    ) -> None: ...

    @_native_front("send", VisionBuf)
    def send(
        self,
        buf: Union[VisionBuf, StreamId],
        data: Any = None,
        frame_id: int = 0,
        timestamp_sof: int = 0,
        timestamp_eof: int = 0,
    ) -> None:
        """``send(buf, frame_id=0, timestamp_sof=0, timestamp_eof=0)`` publishes a buffer
        from ``get_buffer`` (no copy); the reference's ``send(stream, data, frame_id, ...)``
        copies ``data`` (bytes or an array of the buffer's size) into a free buffer first.
        Frame ids and timestamps are ints in [0, 2**64) (checked by the native side).
        An adapter over the two: it only picks one."""
        # Per frame (run cold at a camera's pace): a buffer of get_buffer, or bytes or a
        # contiguous uint8 array for a stream already sent to, go straight to one native
        # call (the first and bytes from the native front, without this Python frame:
        # visionipc_module.cpp, send_hook); anything else takes _send_buf / _send_copy,
        # which check it first.
        native = self._native
        cuda = self._cuda
        if type(buf) is VisionBuf and native is not None and buf._owner is self and (cuda is None or not cuda.inflight):
            if data is None:
                native.send_frame(buf, frame_id, timestamp_sof, timestamp_eof)
            else:  # the reference's positional send(buf, frame_id, sof, eof)
                native.send_frame(buf, data, frame_id, timestamp_sof)
        elif data is None:
            self._send_buf(buf, frame_id, timestamp_sof, timestamp_eof)
        elif (
            native is not None
            and (type(buf) is str or type(buf) is int)
            and (type(data) is bytes or (type(data) is np.ndarray and data.dtype is _U8 and data.flags.c_contiguous))
            and (handle := self._handles.get(buf)) is not None
        ):
            native.send_copy(handle, data, frame_id, timestamp_sof, timestamp_eof)
        elif isinstance(buf, VisionBuf):  # the reference's positional send(buf, frame_id, sof, eof)
            self._send_buf(buf, data, frame_id, timestamp_sof)
        else:
            self._send_copy(buf, data, frame_id, timestamp_sof, timestamp_eof)

    def _send_buf(self, buf: Union[VisionBuf, StreamId], frame_id: int, timestamp_sof: int, timestamp_eof: int) -> None:
        """Publish a buffer of ``get_buffer``, no copy. The per-frame path, kept short: a
        camera daemon calls it cold, right after a sleep."""
        native = self._native
        if native is None or not isinstance(buf, VisionBuf) or buf._owner is not self:
            self._server()  # ClosedError
            if isinstance(buf, VisionBuf):
                raise InvalidArgumentError("this VisionBuf does not belong to this server (get it from get_buffer())")
            self._key(buf)  # a stream that is not one says so first
            raise InvalidArgumentError("send(stream, data, ...) needs the frame data")
        if self._cuda is not None and self._cuda.inflight:
            self._cuda.finish((buf.stream, buf.idx))  # copy_from_device into it has landed
        native.send_frame(buf, frame_id, timestamp_sof, timestamp_eof)

    def _send_copy(self, stream: StreamId, data: Any, frame_id: int, timestamp_sof: int, timestamp_eof: int) -> None:
        """The reference's copying send: ``data`` into a free buffer of ``stream``, published.
        (``send`` hands bytes or a contiguous uint8 array for a stream already sent to
        straight to the native copy, which checks the size.) Here ``data`` is checked
        and made contiguous first (``_frame_bytes``)."""
        native = self._server()
        key = self._key(stream)
        pool = self._device_pools.get(key)
        if pool is not None:
            return self._send_copy_in_device(stream, pool, data, frame_id, timestamp_sof, timestamp_eof)
        frame = _frame_bytes(data, Geometry(*native.geometry(key)))
        native.send_copy(self._handle(stream, key), frame, frame_id, timestamp_sof, timestamp_eof)

    def _send_copy_in_device(
        self, stream: StreamId, pool: "DevicePool", data: Any, frame_id: int, timestamp_sof: int, timestamp_eof: int
    ) -> None:
        """The copying send into a pool in device memory: a device array (device to
        device) or host bytes of the buffer's size (host to device), then published."""
        buf = self.get_buffer(stream)
        if hasattr(data, "__cuda_array_interface__"):
            self.frame_from_device(buf, data)
        else:
            assert self._cuda is not None  # a pool in device memory has its link
            self._cuda.copy_host_into(buf, _frame_bytes(data, buf.geometry), pool.ptr(buf.idx))
        self._send_buf(buf, frame_id, timestamp_sof, timestamp_eof)

    def _handle(self, stream: StreamId, key: str) -> int:
        """The native handle of stream ``key`` (kept for ``stream`` if an exact str or int,
        unless its pool is in device memory: the native copying send writes host pixels)."""
        handle = self._server().handle(key)
        if (type(stream) is str or type(stream) is int) and key not in self._device_pools:
            self._handles[stream] = handle
        return handle

    def frame_from_device(self, buf: VisionBuf, array: Any, stream: Any = None) -> None:
        """``buf.copy_from_device(array)``: submit the device-to-host copy into ``buf``."""
        if self._cuda is None:
            raise InvalidArgumentError("copy_from_device() needs VisionIpcServer(..., cuda=True)")
        self._server()
        if buf._owner is not self or not self.frame_valid(buf):
            raise InvalidArgumentError("copy_from_device() takes a buffer of this server's get_buffer(), not yet sent")
        from visionipc.cuda._runtime import DEVICE_TO_DEVICE

        pool = self._device_pools.get(buf.stream)
        dest = None if pool is None else (pool.ptr(buf.idx), DEVICE_TO_DEVICE)
        self._cuda.copy_from_device(buf, array, stream, dest)

    def frame_device_array(self, buf: VisionBuf) -> "DeviceFrame":
        """``buf.device_array``: the device memory of a buffer of a pool in device memory."""
        from visionipc.cuda.device_frame import DeviceFrame

        self._server()
        pool = self._device_pools.get(buf.stream)
        if pool is None or buf._owner is not self:
            raise InvalidArgumentError(
                f"stream {buf.stream!r} keeps its frames in host memory: write buf.array "
                '(device_array is for pools made with create_buffers(..., memory="cuda"))'
            )
        assert self._cuda is not None
        meta = (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.timestamp_publish, buf.timestamp_recv)
        ptr = pool.ptr(buf.idx)
        return DeviceFrame(ptr, buf.array, buf.geometry, pool.device, pool, None, 0, self._cuda.runtime, meta, pool)

    def cuda_host_device(self, buf: VisionBuf) -> Optional[int]:
        """0 if ``buf``'s bytes are registered with CUDA (DLPack's CUDA-host device), else None."""
        return None if self._cuda is None else self._cuda.host_device(buf)

    def frame_valid(self, buf: VisionBuf) -> bool:
        """FrameOwner: the buffer has not been sent since ``get_buffer`` handed it out
        (a producer's frame needs no lease)."""
        if self._native is None:
            return False
        return self._native.generation(buf.stream, buf.idx) == buf.generation

    @property
    def server_id(self) -> int:
        """This server's id, random per server: a client connected to it has the same
        ``server_id``, and one that reconnected to a restarted server sees a new one."""
        return self._server().id

    def streams(self) -> List[str]:
        return self._server().streams()

    def num_clients(self, stream: StreamId) -> int:
        return self._server().clients(stream_key(stream))

    def readers_woken(self, stream: StreamId) -> int:
        """Sleeping clients of ``stream`` that this server's own system calls have woken
        so far: about clients x frames with ``wake="all"``, at most one per frame with
        ``wake="handoff"`` (the clients woke the others)."""
        return self._server().readers_woken(stream_key(stream))

    def close(self) -> None:
        """Stop the listener and drop the pools (views handed out stay readable)."""
        if self._native is not None and self._cuda is not None:
            self._cuda.close()  # copies land and pages unregister before the pools can go
        for pool in self._device_pools.values():
            pool.close()  # frees the device memory (its DeviceArrays here refuse use)
        self._device_pools.clear()
        native, self._native = self._native, None
        self._forget_streams()  # frames handed out keep their own views
        if native is not None:
            native.close()  # in a forked child the native side only forgets its copies


def _frame_bytes(data: Any, geometry: Geometry) -> Union[np.ndarray, memoryview, bytes]:
    """The copying send's input: bytes-like of exactly the buffer size, or a
    C-contiguous array of uint8 (any shape) / the format's own sample type."""
    size = geometry.size
    if isinstance(data, np.ndarray):
        if data.dtype.kind != "u" or data.dtype.itemsize not in (1, geometry.info.sample_bytes):
            raise InvalidArgumentError(f"frame data must be uint8, not {data.dtype}")
        if data.nbytes != size:
            raise InvalidArgumentError(
                f"frame data has shape {data.shape} ({data.nbytes} bytes); the stream's buffers are {size} bytes"
            )
        return np.ascontiguousarray(data)
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidArgumentError(
            f"frame data must be bytes-like or a numpy array, not {type(data).__name__}"
        ) from None
    if view.nbytes != size:
        raise InvalidArgumentError(f"frame data is {view.nbytes} bytes; the stream's buffers are {size} bytes")
    return view if view.c_contiguous else view.tobytes()
