"""VisionIpcServer.get_buffer and .send with a native front (issue 36): their per-frame
calls (a stream already served, given as an exact str or int; ``send(buf, ...)`` with a
buffer of this server's ``get_buffer``; the copying send of bytes to a stream already
sent to) run without the methods' Python frames, and every other call runs the Python
method as before, with its errors. The class still shows the Python methods (help,
signature), and a subclass's own get_buffer or send is the one called."""

import inspect
import os
import sys

import numpy as np
import pytest
from test_visionipc import pair  # noqa: F401  (the fixture: a server and its connected client)

from msgq.errors import ClosedError, InvalidArgumentError
from visionipc import VisionBuf, VisionIpcServer, _visionipc


def python_calls(fn):
    """The Python functions that ``fn()`` ran (a profile hook's 'call' events), with its result."""
    names = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name) if event == "call" else None)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return [n for n in names if n != "<lambda>"], result


@pytest.mark.parametrize("stream", [0, "road"])
def test_the_per_frame_calls_run_no_python_frame(pair, stream):
    server, client = pair(stream, 4)
    size = server.get_buffer(stream).len  # serves the stream (the Python path), then the views of each buffer
    for _ in range(4):
        server.send(server.get_buffer(stream), 0)
    server.send(stream, bytes(size), 0)
    while client.recv(100) is not None:
        pass
    calls = [
        lambda: server.send(server.get_buffer(stream), 1),
        lambda: server.send(server.get_buffer(stream), 2, 3, 4),
        lambda: server.send(server.get_buffer(stream), frame_id=5, timestamp_eof=6),
        lambda: server.send(stream, bytes(size), 7, 8, 9),
        lambda: server.send(stream, bytes(size), frame_id=10),
        lambda: server.send(buf=server.get_buffer(stream), frame_id=11),
    ]
    for call in calls:
        ran, _ = python_calls(call)
        assert ran == [], ran
    got = [client.recv(1000) for _ in calls]
    stamps = [(f.frame_id, f.timestamp_sof, f.timestamp_eof) for f in got]
    assert stamps == [(1, 0, 0), (2, 3, 4), (5, 0, 6), (7, 8, 9), (10, 0, 0), (11, 0, 0)]


def test_other_calls_run_the_python_methods(pair):
    server, _client = pair("road")
    ran, buf = python_calls(lambda: server.get_buffer("road"))  # the first: the stream is served here
    assert "get_buffer" in ran and "_first_buffer" in ran
    ran, _ = python_calls(lambda: server.send(buf, 1))
    assert ran == []
    ran, _ = python_calls(lambda: server.get_buffer(stream="road"))  # by keyword
    assert "get_buffer" in ran
    size = buf.len
    for data in (np.zeros(size, np.uint8), bytearray(size), memoryview(bytes(size))):  # not bytes
        ran, _ = python_calls(lambda data=data: server.send("road", data, 2))
        assert "send" in ran


@pytest.mark.parametrize("served_first", [False, True])
def test_bad_calls_give_the_python_methods_errors(pair, served_first):
    server, _client = pair("road")
    if served_first:
        server.send(server.get_buffer("road"), 1)
        server.send("road", bytes(server.get_buffer("road").len), 2)
    buf = server.get_buffer("road")
    for call, error, message in (
        (lambda: server.get_buffer(True), InvalidArgumentError, "^a stream id is an int or a str, not a bool$"),
        (lambda: server.get_buffer("nope"), InvalidArgumentError, "has no stream 'nope'"),
        (lambda: server.get_buffer(), TypeError, "missing 1 required positional argument: 'stream'"),
        (lambda: server.get_buffer("road", 1), TypeError, "takes 2 positional arguments but 3 were given"),
        (lambda: server.send(buf, frame_id=1, bogus=2), TypeError, "unexpected keyword argument 'bogus'"),
        (lambda: server.send(buf, 1, 2, 3, 4, 5), TypeError, "takes from 2 to 6 positional arguments but 7"),
        (lambda: server.send(buf, 1, buf=buf), TypeError, "multiple values for argument 'buf'"),
        (lambda: server.send(buf, -1), InvalidArgumentError, "^frame_id must be an int in \\[0, 2\\*\\*64\\), got -1$"),
        (lambda: server.send("road", b"12", 1), InvalidArgumentError, "frame data is 2 bytes"),
        (lambda: server.send("road"), InvalidArgumentError, "needs the frame data"),
        (lambda: server.send(True, b"12"), InvalidArgumentError, "not a bool"),
    ):
        with pytest.raises(error, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    server.send(buf, 3)  # still checked out: the bad calls left it alone


def test_a_closed_server_and_a_forked_child_say_closed(pair):
    server, _client = pair("road")
    buf = server.get_buffer("road")
    server.send("road", bytes(buf.len), 1)
    pid = os.fork()
    if pid == 0:  # the child: every form says ClosedError in one line
        code = 0
        for call in (
            lambda: server.get_buffer("road"),
            lambda: server.send(buf, 2),
            lambda: server.send("road", bytes(buf.len), 2),
        ):
            try:
                call()
                code = 1
            except ClosedError as e:
                code |= 2 if "inherited across fork" not in str(e) or "\n" in str(e) else 0
            except BaseException:
                code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    server.send(buf, 2)  # the parent's server is untouched
    server.close()
    for call in (
        lambda: server.get_buffer("road"),
        lambda: server.send(buf, 3),
        lambda: server.send("road", bytes(buf.len), 3),
    ):
        with pytest.raises(ClosedError, match="is closed") as err:
            call()
        assert "\n" not in str(err.value)


def test_the_class_shows_the_python_methods_and_subclasses_override_them(pair):
    for name in ("get_buffer", "send"):
        front = getattr(VisionIpcServer, name)
        assert front.__wrapped__.__name__ == front.__name__ == name and front.__qualname__ == f"VisionIpcServer.{name}"
        assert inspect.signature(front) == inspect.signature(front.__wrapped__)
        assert front.__doc__ == front.__wrapped__.__doc__ and front.__module__ == "visionipc.server"
    assert "buf, frame_id=0" in VisionIpcServer.send.__doc__
    server, _client = pair("road")
    bound = server.get_buffer
    assert bound.__self__ is server and str(inspect.signature(bound)).startswith("(stream")
    assert VisionIpcServer.get_buffer(server, "road").stream == "road"

    class Counting(VisionIpcServer):
        def get_buffer(self, stream):
            self.asked = getattr(self, "asked", 0) + 1
            return super().get_buffer(stream)

    sub = Counting("camsub")
    try:
        sub.create_buffers(0, 2, 16, 16)
        sub.get_buffer(0)
        sub.get_buffer(0)
        assert sub.asked == 2
    finally:
        sub.close()


def test_server_method_refuses_what_it_cannot_front():
    with pytest.raises(ValueError, match="no native front for 'recv'"):
        _visionipc.server_method("recv", lambda self: None)
    with pytest.raises(TypeError, match="wraps a function"):
        _visionipc.server_method("get_buffer", 5)
    with pytest.raises(TypeError, match="data is the VisionBuf class"):
        _visionipc.server_method("send", lambda self: None, 5)
    with pytest.raises(TypeError, match="server_method\\(kind, func, data=None\\)"):
        _visionipc.server_method("send")
    front = _visionipc.server_method("send", lambda self, *a, **k: ("python", a, k), VisionBuf)
    assert front(object(), 1, x=2) == ("python", (1,), {"x": 2})  # not a server: the function runs
