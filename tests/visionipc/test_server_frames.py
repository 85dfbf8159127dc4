"""The producer's per-frame calls, made native (issue 36): ``get_buffer`` returns a
VisionBuf that one native call filled (``acquire_frame``), and ``send(buf)`` publishes
it with one native call (``send_frame``). These check that the frame is the one the
Python-built VisionBuf was, field by field and view by view, that it matches what a
client receives for the same frame, and that bad input still says so in one line."""

import copy

import numpy as np
import pytest
from test_visionipc import pair  # noqa: F401  (the fixture: a server and its connected client)

from msgq.errors import ClosedError, InvalidArgumentError
from visionipc import VisionBuf, VisionIpcServer, _visionipc
from visionipc.frame import _FIELDS


def python_built(server, buf):
    """The VisionBuf get_buffer built in Python before it was native, for ``buf``'s checkout."""
    cache = server._views[buf.stream]
    return VisionBuf(cache.get(buf.idx), cache.geometry, buf.idx, buf.generation, owner=server, stream=buf.stream)


def same_view(a, b):
    assert type(a) is type(b) and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
    assert a.ctypes.data == b.ctypes.data and a.flags.writeable == b.flags.writeable


@pytest.mark.parametrize("fmt", ["nv12", "i420", "rgb8", "gray8", "raw16"])
@pytest.mark.parametrize("stream", [0, 5, "road"])
def test_get_buffer_gives_the_fields_and_views_the_python_built_frame_had(pair, fmt, stream):
    server, client = pair(stream, 3, 48, 30, fmt)
    key = str(stream)
    for round_ in range(5):  # the first checkout of each buffer makes its views, later ones reuse them
        buf = server.get_buffer(stream)
        old = python_built(server, buf)
        assert type(buf) is VisionBuf and buf.__dict__ == {}
        for name in _FIELDS:
            assert getattr(buf, name) == getattr(old, name), name
        assert buf._views is old._views and buf.geometry is old.geometry  # the server's cached views
        assert (buf.stream, buf.owner, buf.frame_id, buf.timestamp_sof, buf.timestamp_eof) == (key, server, 0, 0, 0)
        assert (buf.timestamp_publish, buf.timestamp_recv) == (0, 0) and buf.generation % 2 == 1
        assert buf.valid and server.frame_valid(buf)
        same_view(buf.array, old.array)
        assert buf.array is not buf.array  # a fresh view each time
        assert buf.data.nbytes == old.data.nbytes == len(buf) and not buf.data.readonly
        assert buf.data.format == "B" and buf.as_array().ctypes.data == old.as_array().ctypes.data
        assert repr(buf) == repr(old)
        pixels = np.arange(buf.len, dtype=np.uint8) + round_
        buf.data[:] = pixels.tobytes()
        server.send(buf, round_ + 10, 20 + round_, 30 + round_)
        assert (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof) == (round_ + 10, 20 + round_, 30 + round_)
        got = client.recv(1000)
        assert got is not None and got.idx == buf.idx and got.generation == buf.generation  # stepped by send
        assert got.geometry == buf.geometry and got.stream == buf.stream
        stamps = (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof)
        assert (got.frame_id, got.timestamp_sof, got.timestamp_eof) == stamps
        a, b = got.array, buf.array
        assert (a.shape, a.strides, a.dtype) == (b.shape, b.strides, b.dtype) and np.array_equal(a, b)
        assert bytes(got.data) == pixels.tobytes()
    clone = copy.copy(buf)
    assert all(getattr(clone, n) == getattr(buf, n) for n in _FIELDS)


def test_a_stream_reached_by_int_and_by_str_shares_one_pool_and_its_views(pair):
    server, _client = pair(3)
    by_int, by_str = server.get_buffer(3), server.get_buffer("3")
    assert by_int.stream == by_str.stream == "3" and by_int.idx != by_str.idx
    assert server._views["3"].made[by_int.idx] is by_int._views


def test_send_of_a_buffer_twice_or_of_another_servers_buffer_says_so_in_one_line(pair):
    server, _client = pair()
    other = VisionIpcServer("camframes2")
    other.create_buffers(0, 2, 64, 32)
    try:
        buf = server.get_buffer(0)
        server.send(buf, 1)
        generation = buf.generation
        with pytest.raises(InvalidArgumentError) as sent_twice:
            server.send(buf, 2)
        assert "\n" not in str(sent_twice.value) and (buf.generation, buf.frame_id) == (generation, 1)
        with pytest.raises(InvalidArgumentError, match="does not belong to this server"):
            server.send(other.get_buffer(0), 1)
        for bad in (-1, 2**64, 1.5, "1", True):
            with pytest.raises(InvalidArgumentError, match="frame_id must be an int"):
                server.send(server.get_buffer(0), bad)
    finally:
        other.close()


@pytest.mark.parametrize("served_first", [False, True])
def test_bad_streams_and_a_closed_server_give_the_same_one_line_errors(pair, served_first):
    server, _client = pair("road")
    if served_first:  # the stream's per-frame path is set up: bad ones still go the checked way
        server.send(server.get_buffer("road"), 1)
    for bad, message in (
        (True, "not a bool"),
        (1.0, "not float"),
        (None, "not NoneType"),
        ("nope", "has no stream 'nope'"),
        (7, "has no stream '7'"),
    ):
        with pytest.raises(InvalidArgumentError, match=message) as err:
            server.get_buffer(bad)
        assert "\n" not in str(err.value)
    server.close()
    for call in (lambda: server.get_buffer("road"), lambda: server.send("road", b"x")):
        with pytest.raises(ClosedError, match="is closed") as err:
            call()
        assert "\n" not in str(err.value)


def test_the_copying_send_takes_bytes_arrays_and_says_what_is_wrong(pair):
    server, client = pair()
    size = server.get_buffer(0).len
    for frame_id, data in enumerate(
        (bytes(size), np.full(size, 7, np.uint8), np.full((size // 64, 64), 8, np.uint8), bytearray(size)), 1
    ):
        server.send(0, data, frame_id, frame_id + 1, frame_id + 2)
        got = client.recv(1000)
        assert (got.frame_id, got.timestamp_sof, got.timestamp_eof) == (frame_id, frame_id + 1, frame_id + 2)
    for bad, message in (
        (bytes(size - 1), f"^frame data is {size - 1} bytes, stream '0' buffers are {size} bytes$"),
        (np.zeros(size + 1, np.uint8), f"^frame data is {size + 1} bytes, stream '0' buffers are {size} bytes$"),
        (np.zeros(size, np.float32), "must be uint8"),
        (np.zeros(size * 2, np.uint8)[::2], None),  # not contiguous: copied first, then sent
    ):
        if message is None:
            server.send(0, bad, 9)
            assert client.recv(1000).frame_id == 9
            continue
        with pytest.raises(InvalidArgumentError, match=message) as err:
            server.send(0, bad, 1)
        assert "\n" not in str(err.value)


def test_the_native_calls_refuse_what_is_not_theirs(pair):
    server, _client = pair()
    native = server._native
    with pytest.raises(TypeError, match="acquire_frame\\(\\) needs"):
        native.acquire_frame((object, "0", [], None, None), server)
    with pytest.raises(TypeError, match="acquire_frame\\(\\) needs"):
        native.acquire_frame("0", server)
    with pytest.raises(TypeError, match="send_frame\\(\\) needs a visionipc Frame"):
        native.send_frame(object(), 0, 0, 0)
    with pytest.raises(TypeError, match="send_frame\\(\\) needs a frame of get_buffer"):
        native.send_frame(_visionipc.Frame(), 0, 0, 0)


def test_buffers_go_out_least_recently_sent_first_whatever_order_they_are_sent_in(pair):
    server, _client = pair(count=4)
    first, second = server.get_buffer(0), server.get_buffer(0)
    assert (first.idx, second.idx) == (0, 1)  # never sent: by index
    server.send(second, 1)  # sent out of checkout order: 1 is now older than 0
    server.send(first, 2)
    held = [server.get_buffer(0), server.get_buffer(0)]
    assert [b.idx for b in held] == [2, 3]
    # 2 and 3 are checked out (not handed out again while another is free): 1, then 0
    again = server.get_buffer(0)
    assert again.idx == 1
    server.send(again, 3)
    assert [server.get_buffer(0).idx, server.get_buffer(0).idx] == [0, 1]
    # every buffer checked out: the least recently sent one is taken back (2, never sent)
    assert held[0].valid and server.get_buffer(0).idx == 2 and not held[0].valid


def test_the_native_calls_by_handle_match_the_ones_by_name_and_refuse_unknown_handles(pair):
    server, client = pair("road")
    native = server._native
    handle = native.handle("road")
    assert type(handle) is int
    index, generation = native.acquire(handle)
    native.send("road", index, generation, 1, 0, 0)
    got = client.recv(1000)
    assert (got.idx, got.generation, got.frame_id) == (index, generation + 1, 1)
    size = got.geometry.size
    assert native.send_copy(handle, bytes(size), 2, 0, 0) != index
    assert client.recv(1000).frame_id == 2
    for call in (
        lambda: native.acquire(handle + 1),
        lambda: native.acquire(999),
        lambda: native.send_copy(999, bytes(size), 3, 0, 0),
    ):
        with pytest.raises(InvalidArgumentError, match="has no stream of handle") as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="stream handle must be an int"):
        native.acquire(-1)
    with pytest.raises(InvalidArgumentError, match="has no stream 'nope'"):
        native.handle("nope")
    server.close()
    with pytest.raises(ClosedError, match="is closed"):
        native.acquire(handle)


def test_streams_past_the_lock_free_handles_are_served_the_same(pair):
    """Handles 0..63 are looked up without a lock, later ones under it: both serve."""
    server, _client = pair(0, count=2)
    for stream in range(1, 70):
        server.create_buffers(stream, 2, 16, 16, "gray8")
    for stream in (0, 63, 64, 69):
        assert server._native.handle(str(stream)) == stream
        buf = server.get_buffer(stream)
        buf.array[:] = stream
        server.send(buf, frame_id=stream)
        server.send(stream, bytes(buf.geometry.size), stream + 1)
        assert buf.stream == str(stream) and server.get_buffer(stream).idx == buf.idx
