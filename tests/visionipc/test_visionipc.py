"""VisionIPC in one process: formats and plane views, zero-copy views, leases,
conflate, bad input. tests/visionipc/test_visionipc_processes.py runs real processes."""

import copy
import gc

import numpy as np
import pytest
from vipc_helpers import stamp, stamp_problem

from msgq.errors import ClosedError, InvalidArgumentError, InvalidNameError, IpcTypeError
from visionipc import (
    BUFFER_ALIGN,
    STRIDE_ALIGN,
    VisionBuf,
    VisionIpcClient,
    VisionIpcServer,
    VisionStreamType,
    available_streams,
    get_endpoint_name,
    layout,
)
from visionipc.formats import Geometry


@pytest.fixture
def pair():
    """pair(stream, count, w, h, format) -> (server, connected client); closed afterwards."""
    made = []

    def make(stream=0, count=4, width=64, height=32, fmt="nv12", conflate=False, name="cam"):
        server = VisionIpcServer(name)
        server.create_buffers(stream, count, width, height, fmt)
        server.start_listener()
        client = VisionIpcClient(name, stream, conflate)
        assert client.connect(False)
        made.append((server, client))
        return server, client

    yield make
    for server, client in made:
        client.close()
        server.close()


EXPECTED = {  # format -> (array shape, dtype, bytes a pixel in the stride)
    "nv12": (lambda w, h, s: (h * 3 // 2, s), np.uint8, 1),
    "i420": (lambda w, h, s: (h * 3 // 2, s), np.uint8, 1),
    "gray8": (lambda w, h, s: (h, w), np.uint8, 1),
    "rgb8": (lambda w, h, s: (h, w, 3), np.uint8, 3),
    "bgr8": (lambda w, h, s: (h, w, 3), np.uint8, 3),
    "raw16": (lambda w, h, s: (h, w), np.uint16, 2),
}


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
@pytest.mark.parametrize("width,height", [(64, 32), (100, 50), (2, 2)])
def test_every_format_has_its_documented_geometry_and_array_shape(pair, fmt, width, height):
    server, client = pair(count=2, width=width, height=height, fmt=fmt)
    shape_of, dtype, bpp = EXPECTED[fmt]
    geo = layout(fmt, width, height)
    stride = -(-width * bpp // STRIDE_ALIGN) * STRIDE_ALIGN
    assert geo.stride == stride == client.stride
    planes = 3 / 2 if fmt in ("nv12", "i420") else 1
    assert geo.size == int(stride * height * planes) == client.buffer_len
    assert (geo.format, geo.width, geo.height, geo.uv_offset) == (fmt, width, height, client.uv_offset)
    assert geo["stride"] == stride and dict(geo)["size"] == geo.size  # the dict spelling layout() had
    assert client.uv_offset == (stride * height if fmt in ("nv12", "i420") else 0)
    assert (client.width, client.height, client.format) == (width, height, fmt)

    buf = server.get_buffer(0)
    assert buf.array.shape == shape_of(width, height, stride) and buf.array.dtype == dtype
    assert buf.array.ctypes.data % BUFFER_ALIGN == 0  # buffers start page-aligned in the pool
    pattern = (np.arange(buf.array.size, dtype=np.uint32) % 251).astype(dtype).reshape(buf.array.shape)
    buf.array[...] = pattern
    server.send(buf, frame_id=3)

    frame = client.recv(1000)
    assert frame is not None and frame.valid and frame.frame_id == 3
    assert frame.array.shape == shape_of(width, height, stride) and frame.array.dtype == dtype
    np.testing.assert_array_equal(frame.array, pattern)
    assert frame.array.flags.writeable  # as in the reference; every client sees the same bytes
    assert frame.data.nbytes == client.buffer_len
    if fmt in ("nv12", "i420"):
        np.testing.assert_array_equal(frame.y, frame.array[:height, :width])
    if fmt == "nv12":
        assert frame.uv.shape == (height // 2, width // 2, 2)
        np.testing.assert_array_equal(frame.uv.reshape(height // 2, width), frame.array[height:, :width])
    if fmt == "i420":
        assert frame.u.shape == frame.v.shape == (height // 2, width // 2)


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_to_bgr_converts_every_format(pair, fmt):
    pytest.importorskip("cv2")
    server, client = pair(width=64, height=32, fmt=fmt)
    buf = server.get_buffer(0)
    buf.array[...] = 128 if fmt != "raw16" else 128 << 8
    server.send(buf)
    bgr = client.recv(1000).to_bgr()
    assert bgr.shape == (32, 64, 3) and bgr.dtype == np.uint8
    assert abs(int(bgr[5, 5, 0]) - 128) < 4


def test_numpy_views_keep_the_mapping_alive_after_client_and_server_are_gone():
    server = VisionIpcServer("cam")
    server.create_buffers("road", 2, 64, 32, "gray8")
    server.start_listener()
    client = VisionIpcClient("cam", "road", False)
    assert client.connect(False)
    buf = server.get_buffer("road")
    buf.array[...] = 42
    server.send(buf, frame_id=1)
    frame = client.recv(1000)
    array, data = frame.array, frame.data
    assert array.base is not None
    client.close()
    server.close()
    del client, server, buf, frame
    gc.collect()
    assert int(array.sum()) == 42 * 64 * 32
    assert data[0] == 42 and len(data) == 64 * 32  # the memoryview keeps it alive too


def _pool_mappings():
    with open("/proc/self/maps") as maps:
        return sum("memfd:vipc-pool-" in line for line in maps)


def test_close_unmaps_the_pools_once_no_frame_is_held_even_while_the_objects_live():
    before = _pool_mappings()
    server = VisionIpcServer("cam")
    server.create_buffers("road", 3, 64, 32, "nv12")
    server.start_listener()
    client = VisionIpcClient("cam", "road", False)
    assert client.connect(False)
    for i in range(3):  # every buffer: the server and client cache a view of each
        buf = server.get_buffer("road")
        buf.array[...] = i
        server.send(buf, frame_id=i)
        frame = client.recv(1000)
        assert int(frame.array[0, 0]) == i
    assert _pool_mappings() > before
    frame = buf = None
    client.close()
    server.close()
    gc.collect()
    assert _pool_mappings() == before  # server and client objects are still referenced here
    assert client.width is None and not client.is_connected()


def test_copying_send_accepts_bytes_and_arrays_of_the_buffer_size(pair):
    server, client = pair(fmt="gray8", width=64, height=2)
    server.send(0, bytes(range(128)), frame_id=1)
    server.send(0, np.arange(128, dtype=np.uint8).reshape(2, 64)[::-1].copy(), 2, 20, 21)
    first, second = client.recv(1000), client.recv(1000)
    assert first.data.tolist() == list(range(128))
    assert (second.frame_id, second.timestamp_sof, second.timestamp_eof) == (2, 20, 21)
    assert second.array[0, 0] == 64
    # once a stream was sent to, the same checks hold on the short path a camera's loop takes
    for stream in (0, "0"):
        with pytest.raises(InvalidArgumentError, match="127 bytes"):
            server.send(stream, bytes(127))
        with pytest.raises(InvalidArgumentError, match="uint8"):
            server.send(stream, np.zeros(32, np.float32))
        with pytest.raises(InvalidArgumentError, match="frame_id must be an int"):
            server.send(stream, bytes(128), frame_id=-1)
    strided = np.arange(256, dtype=np.uint8).reshape(2, 128)[:, ::2]  # not contiguous: copied first
    server.send(0, strided, frame_id=3)
    server.send("0", memoryview(bytes(range(128, 256))), frame_id=4)
    third, fourth = client.recv(1000), client.recv(1000)
    assert third.array.tolist() == strided.tolist() and third.frame_id == 3
    assert fourth.data.tolist() == list(range(128, 256)) and fourth.frame_id == 4


def test_frames_arrive_in_order_without_conflate_and_newest_only_with_it(pair):
    server, client = pair(count=4)
    _, latest = pair(count=4, name="cam2", conflate=True)
    latest_server = _
    for fid in (1, 2, 3):
        for srv in (server, latest_server):
            buf = srv.get_buffer(0)
            stamp(buf.data, fid)
            srv.send(buf, frame_id=fid)
    got = [client.recv(1000) for _ in range(3)]
    assert [f.frame_id for f in got] == [1, 2, 3]
    assert all(stamp_problem(f.data, f.frame_id) is None for f in got[-1:])
    assert client.recv(10) is None
    newest = latest.recv(1000)
    assert newest.frame_id == 3 and latest.frame_id == 3
    assert latest.recv(10) is None


def test_frames_carry_the_servers_publish_time_and_the_clients_receive_time(pair):
    import time

    server, client = pair()
    before = time.monotonic_ns()
    buf = server.get_buffer(0)
    server.send(buf, frame_id=7, timestamp_sof=5, timestamp_eof=6)
    frame = client.recv(1000)
    after = time.monotonic_ns()
    assert (frame.frame_id, frame.timestamp_sof, frame.timestamp_eof) == (7, 5, 6)
    assert before <= frame.timestamp_publish <= frame.timestamp_recv <= after


def test_a_leased_frame_is_not_reused_while_other_buffers_are_free(pair):
    server, client = pair(count=2)
    buf = server.get_buffer(0)
    server.send(buf, frame_id=1)
    with client.recv(1000) as held:
        for fid in range(2, 8):
            nxt = server.get_buffer(0)
            assert nxt.idx != held.idx
            server.send(nxt, frame_id=fid)
        assert held.valid
    # Outside the block the lease is gone: the buffer comes back into use.
    assert {server.get_buffer(0).idx for _ in range(2)} >= {held.idx}


def test_the_next_buffer_is_never_the_frame_just_sent_while_another_is_free(pair):
    server, client = pair(count=2)
    buf = server.get_buffer(0)
    stamp(buf.data, 1)
    server.send(buf, frame_id=1)
    with client.recv(1000) as held:  # frame 1's buffer leased
        nxt = server.get_buffer(0)
        assert nxt.idx != held.idx
        stamp(nxt.data, 2)
        server.send(nxt, frame_id=2)
        assert held.valid and stamp_problem(held.data, 1) is None
    newest = client.recv(1000)
    assert newest.frame_id == 2 and newest.valid and stamp_problem(newest.data, 2) is None
    with newest:
        following = server.get_buffer(0)  # the one the lease left free
        assert following.idx != newest.idx and newest.valid


def test_with_every_buffer_leased_the_producer_takes_one_and_its_holder_is_told(pair):
    server, client = pair(count=1)
    server.send(server.get_buffer(0), frame_id=1)
    with client.recv(1000) as held:
        assert held.valid and client.valid
        again = server.get_buffer(0)  # never blocks
        assert again.idx == held.idx
        assert not held.valid and not client.valid


def test_a_stale_or_foreign_buffer_cannot_be_sent(pair):
    server, _ = pair(count=2)
    other, _ = pair(count=2, name="other")
    buf = server.get_buffer(0)
    server.send(buf, frame_id=1)
    with pytest.raises(InvalidArgumentError):
        server.send(buf, frame_id=2)  # sent already
    with pytest.raises(InvalidArgumentError):
        other.send(server.get_buffer(0))
    single, _ = pair(count=1, name="single")
    old = single.get_buffer(0)
    assert old.valid
    newer = single.get_buffer(0)  # the only buffer is checked out: recycled under `old`
    assert newer.idx == old.idx and not old.valid
    with pytest.raises(InvalidArgumentError):
        single.send(old)
    single.send(newer)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "7", True, None])
@pytest.mark.parametrize("field", ["frame_id", "timestamp_sof", "timestamp_eof"])
def test_frame_ids_and_timestamps_are_checked_on_both_sends(pair, field, bad):
    server, client = pair(count=2)
    buf = server.get_buffer(0)
    with pytest.raises(InvalidArgumentError, match=f"{field} must be an int in"):
        server.send(buf, **{field: bad})
    with pytest.raises(InvalidArgumentError, match=f"{field} must be an int in"):
        server.send(0, bytes(len(buf)), **{field: bad})
    server.send(buf, **{field: np.uint64(2**64 - 1)})  # anything with __index__ in range; buf was not spent above
    f = client.recv(1000)
    assert getattr(f, field) == 2**64 - 1 and f.idx == buf.idx
    server.close()
    with pytest.raises(ClosedError):
        server.send(buf, frame_id=1)


def test_every_array_of_a_frame_is_a_fresh_view_of_the_same_pixels(pair):
    # recv() makes the next .array of each buffer ahead of time: still one new view per call
    server, client = pair(count=2, width=64, height=32)
    for i in range(6):
        buf = server.get_buffer(0)
        buf.array[:] = i
        server.send(buf, frame_id=i)
        f = client.recv(1000)
        a, b = f.array, f.array
        assert a is not b and a.base is b.base and (a == i).all() and f.frame_id == i
        a.flags.writeable = False
        a.shape = (-1,)
        assert b.flags.writeable and b.shape == (48, 64) and f.array.flags.writeable


@pytest.mark.parametrize(
    "args",
    [(0, 64, 32), (-1, 64, 32), (2, 0, 32), (2, 64, -5), (2, 63, 32), (2, 1.5, 2), (100000, 64, 32), (2, 1 << 20, 2)],
)
def test_bad_sizes_and_counts_raise_invalid_argument(args):
    server = VisionIpcServer("cam")
    with pytest.raises(InvalidArgumentError):
        server.create_buffers(0, *args)
    server.close()


def test_bad_formats_streams_names_and_data_raise_clear_errors(pair):
    server, client = pair(fmt="gray8", width=64, height=2)
    with pytest.raises(InvalidArgumentError, match="format"):
        server.create_buffers(1, 2, 64, 32, "yuv9")
    with pytest.raises(InvalidArgumentError, match="already"):
        server.create_buffers(0, 2, 64, 32)
    with pytest.raises(InvalidArgumentError, match="no stream"):
        server.get_buffer(7)
    with pytest.raises(InvalidArgumentError):
        server.send(0, np.zeros(127, np.uint8))  # wrong size
    with pytest.raises(InvalidArgumentError, match="uint8"):
        server.send(0, np.zeros((2, 64), np.float32))  # wrong dtype
    with pytest.raises(InvalidArgumentError):
        server.send(0, "not bytes")
    with pytest.raises(InvalidArgumentError):
        server.create_buffers_with_sizes(5, 2, 100, 100, 100, 100, 0)  # stride * height > size
    with pytest.raises(InvalidNameError):
        VisionIpcServer("../etc")
    with pytest.raises(InvalidNameError):
        VisionIpcClient("cam", "bad/stream", False)
    with pytest.raises(IpcTypeError):  # and so a TypeError
        VisionIpcClient("cam", 0, False, context=object())
    # timeouts: NaN and 2**40 ms were a plain ValueError and TypeError
    for bad in (float("nan"), 2**40, "100", True):
        with pytest.raises(InvalidArgumentError, match="timeout_ms"):
            client.recv(bad)
    with pytest.raises(IpcTypeError):  # the native methods too
        client._native.recv_into(None, None, 0, 0)
    client.close()
    with pytest.raises(ClosedError):
        client.recv()
    server.close()
    with pytest.raises(ClosedError):
        server.get_buffer(0)


def test_connect_to_a_missing_server_or_stream_returns_false():
    lonely = VisionIpcClient("nobody_here", 0, False)
    assert not lonely.connect(False)
    assert not lonely.is_connected()
    assert lonely.width is None and lonely.num_buffers == 0
    assert lonely.recv(10) is None
    lonely.close()
    assert available_streams("nobody_here", False) == set()
    with VisionIpcServer("cam") as server:
        server.create_buffers(VisionStreamType.ROAD, 1, 64, 32)
        server.start_listener()
        with VisionIpcClient("cam", VisionStreamType.DRIVER, False) as wrong:
            assert not wrong.connect(False)


def test_a_client_knows_its_servers_id_and_a_restarted_server_has_a_new_one(pair):
    server, client = pair(name="ids")
    assert server.server_id == client.server_id != 0
    first = server.server_id
    client.close()
    server.close()
    with pytest.raises(ClosedError):
        server.server_id  # noqa: B018 (the property is the call)
    with VisionIpcClient("ids", 0, False) as lonely:
        assert lonely.server_id == 0  # not connected yet
    again, client = pair(name="ids")
    assert again.server_id == client.server_id not in (0, first)


def test_streams_may_be_ints_enum_members_or_names(pair):
    server, client = pair(stream="wide_left", count=2)
    server.create_buffers(VisionStreamType.DRIVER, 2, 64, 32)
    server.create_buffers(7, 2, 64, 32)
    assert available_streams("cam", True) == {"wide_left", VisionStreamType.DRIVER, 7}
    assert get_endpoint_name("cam", VisionStreamType.DRIVER) == "visionipc_cam_1"
    assert get_endpoint_name("cam", "wide_left") == "visionipc_cam_wide_left"
    server.send(server.get_buffer("wide_left"), frame_id=9)
    assert client.recv(1000).frame_id == 9


def test_format_knowledge_comes_from_the_native_format_table():
    from visionipc import FORMATS, _visionipc, formats

    table = _visionipc.FORMAT_TABLE
    assert [row[1] for row in table] == list(range(len(table)))  # indexed by the C++ enum value
    assert FORMATS == tuple(row[0] for row in table if row[6]) == ("nv12", "i420", "gray8", "rgb8", "bgr8", "raw16")
    assert formats.format_info("raw16").sample_bytes == 2 and formats.format_info("rgb8").channels == 3
    assert formats.format_info("grey").name == "gray8" and formats.normalize_format("Bayer16") == "raw16"
    assert formats.format_info("custom").yuv420 and "custom" not in FORMATS


def test_layout_returns_a_frozen_geometry_that_still_reads_like_the_dict_it_was():
    geo = layout("rgb", 100, 3)
    assert isinstance(geo, Geometry) and geo.format == "rgb8" and geo.stride == 320 and geo.size == 960
    assert dict(geo) == {"format": "rgb8", "width": 100, "height": 3, "stride": 320, "uv_offset": 0, "size": 960}
    assert geo["size"] == 960 and "stride" in geo and list(geo) == list(dict(geo))
    with pytest.raises(KeyError):
        geo["bytes"]
    with pytest.raises(AttributeError):
        geo.stride = 1  # frozen
    assert geo == layout("rgb8", 100, 3) and hash(geo) == hash(layout("rgb8", 100, 3))


def test_frame_owners_implement_the_typed_owner_protocols(pair):
    from visionipc.frame import FrameOwner, LeasingOwner

    server, client = pair()
    assert isinstance(server, FrameOwner) and not isinstance(server, LeasingOwner)  # producers need no lease
    assert isinstance(client, LeasingOwner)
    buf = server.get_buffer(0)
    assert buf.owner is server and buf.valid
    with buf:  # no lease to take: nothing happens
        pass
    server.send(buf, frame_id=1)
    assert buf.valid  # the buffer holds the frame just sent, until the producer reuses it
    frame = client.recv(1000)
    assert frame.owner is client and frame.valid and frame.geometry == layout("nv12", 64, 32)


def test_the_native_receive_fills_a_frame_without_python(pair):
    # recv_into stores a received frame's fields and its buffer's views straight into
    # the frame object (the C base of VisionBuf); the Python side only sets views the
    # first time a buffer is seen.
    from visionipc import _visionipc

    server, client = pair()
    server.send(0, bytes(client.buffer_len), frame_id=9, timestamp_sof=3, timestamp_eof=4)
    assert client.recv(1000).frame_id == 9  # maps the pool and makes the ViewCache
    native, cache = client._native, client._views
    for idx in range(client.num_buffers):
        cache.get(idx)
    server.send(0, bytes(client.buffer_len), frame_id=10, timestamp_sof=5, timestamp_eof=6)
    frame = VisionBuf.blank(client, client._key)
    flags = native.recv_into(frame, cache, client._epoch, 1000)
    assert flags == _visionipc.RECV_LEASED  # views set natively: the buffer's views exist
    assert (frame.frame_id, frame.timestamp_sof, frame.timestamp_eof) == (10, 5, 6)
    assert frame._views is cache.made[frame.idx] and frame.geometry is cache.geometry
    assert 0 < frame.timestamp_publish <= frame.timestamp_recv and 0 <= frame.idx < client.num_buffers
    assert native.recv_into(frame, cache, client._epoch, 0) is None  # nothing there: the frame is untouched
    assert frame.frame_id == 10
    server.send(0, bytes(client.buffer_len), frame_id=11)
    other = VisionBuf.blank(client, client._key)
    assert native.recv_into(other, cache, client._epoch + 1, 1000) & _visionipc.RECV_NEEDS_VIEWS  # another mapping
    assert not hasattr(other, "_views") and other.frame_id == 11
    with pytest.raises(TypeError, match="needs a visionipc Frame"):
        native.recv_into(object(), cache, client._epoch, 0)
    for bad in ("1", 1.5, None):
        with pytest.raises(TypeError, match="timeout_ms must be an int"):
            native.recv_into(frame, cache, client._epoch, bad)


def test_a_frame_without_views_says_so():
    frame = VisionBuf.blank(None, "0")
    with pytest.raises(AttributeError, match="no buffer yet"):
        _ = frame.array
    frame._views = ("not", "frame views")
    with pytest.raises(TypeError, match="must be a FrameViews"):
        _ = frame.array
    frame.note = "annotations still go to __dict__"
    assert frame.note.startswith("annotations") and frame.stream == "0"


def test_a_copied_frame_shares_the_pixels_and_keeps_the_numbers(pair):
    server, client = pair()
    server.send(0, bytes(client.buffer_len), frame_id=7, timestamp_sof=1, timestamp_eof=2)
    frame = client.recv(1000)
    frame.note = "kept"
    other = copy.copy(frame)
    assert other is not frame and type(other) is VisionBuf and other.note == "kept"
    assert (other.idx, other.generation, other.frame_id, other.timestamp_eof) == (frame.idx, frame.generation, 7, 2)
    assert other.owner is client and other.valid
    other.array[0, 0] = 99  # the same bytes
    assert frame.array[0, 0] == 99


def test_create_buffers_with_sizes_keeps_the_callers_layout(pair):
    server = VisionIpcServer("custom")
    server.create_buffers_with_sizes(0, 3, 100, 50, 128 * 80, 128, 128 * 56)
    server.start_listener()
    client = VisionIpcClient("custom", 0, False)
    assert client.connect(False)
    assert (client.width, client.height, client.stride, client.uv_offset, client.buffer_len) == (
        100,
        50,
        128,
        128 * 56,
        128 * 80,
    )
    buf = server.get_buffer(0)
    assert isinstance(buf, VisionBuf) and buf.data.nbytes == 128 * 80
    client.close()
    server.close()


def test_eight_clients_in_one_process_all_get_every_frame(pair):
    server, first = pair(count=10)
    clients = [first] + [VisionIpcClient("cam", 0, False) for _ in range(7)]
    assert all(c.connect(False) for c in clients[1:])
    assert server.num_clients(0) == 8
    for fid in range(1, 6):
        buf = server.get_buffer(0)
        stamp(buf.data, fid)
        server.send(buf, frame_id=fid)
        for c in clients:
            frame = c.recv(1000)
            assert frame.frame_id == fid and frame.valid and stamp_problem(frame.data, fid) is None
    for c in clients[1:]:
        c.close()


def test_a_second_server_of_the_same_name_fails_before_touching_the_first():
    from msgq.errors import IpcError

    first = VisionIpcServer("cam")
    first.create_buffers(0, 2, 64, 32)
    first.start_listener()
    with pytest.raises(IpcError, match="another VisionIPC server"):
        VisionIpcServer("cam")
    first.send(first.get_buffer(0), frame_id=1)  # still the topic's publisher
    first.close()
    again = VisionIpcServer("cam")  # the name is free once the first is closed
    again.close()
