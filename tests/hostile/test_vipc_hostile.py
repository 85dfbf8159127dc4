"""VisionIPC against hostile and careless peers (issue 16: items 1, 4, 9, 15, 16).

Forked children that close, drop or use an inherited server or client; one
process taking every slot; misspelled streams; pools larger than the memory
the process may use; a SIGKILLed server; names at and past the limit.
Children are forked (cheap) and always leave through ``os._exit``.
"""

import gc
import itertools
import os
import signal
import socket
import time

import pytest
import shm_watch

from msgq.errors import ClosedError, InvalidArgumentError, InvalidNameError, IpcError, NoSpaceError
from msgq.names import segment_dir
from visionipc import VisionIpcClient, VisionIpcServer, _visionipc
from visionipc import client as client_module
from visionipc.streams import run_options

pytestmark = pytest.mark.timeout(60)


def in_child(fn):
    """Run ``fn()`` in a forked child; return what it wrote (its report), or
    raise if it failed. The child never returns into pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            os.write(w, str(fn()).encode())
        except BaseException as exc:  # reported to the parent, never raised here
            os.write(w, f"FAILED {type(exc).__name__}: {exc}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


def serving(name="cam", stream="road", count=4):
    server = VisionIpcServer(name)
    server.create_buffers(stream, count, 64, 32)
    server.start_listener()
    return server


def round_trip(server, client, frame_id):
    """One frame from server to client: the pair still works."""
    buf = server.get_buffer("road")
    buf.data[:8] = frame_id.to_bytes(8, "little")
    server.send(buf, frame_id=frame_id)
    frame = client.recv(5000)
    while frame is not None and frame.frame_id < frame_id:  # frames sent to the others first
        frame = client.recv(5000)
    assert frame is not None and frame.frame_id == frame_id and bytes(frame.data[:8]) == frame_id.to_bytes(8, "little")


def raises(exc_type, fn):
    try:
        fn()
    except exc_type as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no exception"


# ---------------------------------------------------------------- item 1: fork


def test_a_forked_child_that_uses_closes_or_drops_an_inherited_server_leaves_the_parents_running():
    raw = _visionipc.Server("raw_cam", **run_options())  # the native object alone: its C++ destructor runs in the child
    raw.create_buffers("road", 2, 64, 32, "nv12")
    raw.start_listener()
    held = {"server": serving(), "raw": raw}
    del raw
    try:
        report = in_child(lambda: raises(ClosedError, lambda: held["server"].get_buffer("road")))
        assert report.startswith("ClosedError") and "fork" in report
        in_child(lambda: held["server"].close())
        in_child(lambda: held["raw"].close())
        in_child(lambda: (held.clear(), gc.collect()))  # dropped: the destructors run in the child
        for name in ("cam", "raw_cam"):
            with VisionIpcClient(name, "road", False) as client:
                assert client.connect(False), client.last_error
                if name == "cam":
                    round_trip(held["server"], client, 7)
    finally:
        for obj in held.values():
            obj.close()


def test_a_forked_child_closing_an_inherited_client_keeps_the_lock_and_the_lease_of_the_parent():
    server = serving()
    client = VisionIpcClient("cam", "road", False)
    try:
        assert client.connect(False)
        round_trip(server, client, 1)
        raw = _visionipc.Client("cam", "road", False, **run_options())
        assert raw.connect()
        report = in_child(lambda: raises(ClosedError, lambda: client.recv(10)))
        assert report.startswith("ClosedError")
        in_child(lambda: client.close())
        in_child(lambda: raw.close())  # C++ pid check: no lease store, no segment lock
        assert server.num_clients("road") == 2
        with VisionIpcClient("cam", "road", False) as other:  # would block forever on a held attach lock
            assert other.connect(False)
            round_trip(server, other, 2)
        round_trip(server, client, 3)
        client.close()  # returns (it used to block holding the GIL)
        raw.close()
    finally:
        client.close()
        server.close()


# ---------------------------------------------------------------- item 4: admission


def test_one_process_cannot_take_every_slot_and_refusals_say_why(monkeypatch):
    share = _visionipc.MAX_CLIENTS_PER_PEER
    server = serving()
    mine = [VisionIpcClient("cam", "road", False) for _ in range(share)]
    try:
        assert all(c.connect(False) for c in mine)
        greedy = VisionIpcClient("cam", "road", False)
        assert not greedy.connect(False)
        assert f"pid {os.getpid()}" in greedy.last_error and "share" in greedy.last_error
        monkeypatch.setattr(client_module, "_REFUSAL_GRACE_S", 0.05)
        with pytest.raises(IpcError, match="share"):
            greedy.connect(True)
        greedy.close()

        def another_process():
            with VisionIpcClient("cam", "road", False) as c:
                return c.connect(False) or c.last_error

        assert in_child(another_process) == "True"  # the others still get in
    finally:
        for c in mine:
            c.close()
        server.close()


def _idle_connections(n, idle, name="cam"):
    """Connect ``n`` raw sockets to the server ``name`` that never ask anything (into ``idle``)."""
    address = f"\0visionipc@{os.environ.get('MSGQ_PREFIX', '')}@{name}".encode()
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(address)
        idle.append(s)


def test_idle_connections_of_one_peer_do_not_lock_the_others_out():
    server = serving()
    idle = []
    try:
        _idle_connections(3 * _visionipc.MAX_CLIENTS_PER_PEER, idle)

        def another_process():
            with VisionIpcClient("cam", "road", False) as c:
                return c.connect(False) or c.last_error

        assert in_child(another_process) == "True"
    finally:
        for s in idle:
            s.close()
        server.close()


def test_connections_that_ask_nothing_are_dropped_and_free_the_peers_share():
    server = serving()
    idle = []
    try:
        _idle_connections(_visionipc.MAX_CLIENTS_PER_PEER, idle)
        with VisionIpcClient("cam", "road", False) as c:
            assert not c.connect(False) and "share" in c.last_error
            for s in idle:  # the server hangs up on each after its grace (2 s)
                s.settimeout(30)
                assert s.recv(16) == b""
            assert c.connect(False), c.last_error
    finally:
        for s in idle:
            s.close()
        server.close()


def test_a_full_server_and_a_misspelled_stream_are_named(monkeypatch):
    share, total = _visionipc.MAX_CLIENTS_PER_PEER, _visionipc.MAX_CLIENTS
    server = serving()
    held, holders = [], []
    try:
        # Every slot taken, a share per process: this one and forked holders.
        held = [VisionIpcClient("cam", "road", False) for _ in range(share)]
        assert all(c.connect(False) for c in held)
        for _ in range(total // share - 1):
            r, w = os.pipe()
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    clients = [VisionIpcClient("cam", "road", False) for _ in range(share)]
                    os.write(w, b"1" if all(c.connect(False) for c in clients) else b"0")
                    os.read(go_r, 1)  # hold them until the parent is done
                finally:
                    os._exit(0)
            holders.append((pid, go_w))
            assert os.read(r, 1) == b"1"
            os.close(r)

        def refused():
            with VisionIpcClient("cam", "road", False) as c:
                return c.connect(False) or c.last_error

        report = in_child(refused)
        assert "is full" in report and f"all {total} client slots" in report

        wrong = VisionIpcClient("cam", "raod", False)
        assert not wrong.connect(False)
        assert "has no stream 'raod'" in wrong.last_error and "road" in wrong.last_error.split("it has:")[1]
        monkeypatch.setattr(client_module, "_REFUSAL_GRACE_S", 0.05)
        with pytest.raises(IpcError, match="raod"):
            wrong.connect(True)
        wrong.close()
        nobody = VisionIpcClient("nobody_here", "road", False)
        assert not nobody.connect(False) and "no VisionIPC server 'nobody_here'" in nobody.last_error
        nobody.close()
    finally:
        for pid, go in holders:
            os.write(go, b"x")
            os.waitpid(pid, 0)
        for c in held:
            c.close()
        server.close()


# ---------------------------------------------------------------- item 9: pool memory


def test_a_pool_larger_than_the_memory_the_process_may_use_is_refused_before_allocating(monkeypatch, msgq_prefix):
    shm_before = shm_watch.listing()
    with VisionIpcServer("cam") as server:
        with pytest.raises(NoSpaceError, match="may take at most"):
            server.create_buffers("huge", 256, 32768, 32768, "gray")  # 256 GiB
        monkeypatch.setenv("VIPC_MAX_POOL_BYTES", "1000000")
        with pytest.raises(NoSpaceError, match="VIPC_MAX_POOL_BYTES=1000000"):
            server.create_buffers("capped", 10, 640, 480, "nv12")
        monkeypatch.setenv("VIPC_MAX_POOL_BYTES", "lots")
        with pytest.raises(InvalidArgumentError, match="VIPC_MAX_POOL_BYTES"):
            server.create_buffers("capped", 1, 64, 32)
        monkeypatch.delenv("VIPC_MAX_POOL_BYTES")
        server.create_buffers("road", 2, 64, 32)  # the server is unharmed
        assert server.streams() == ["road"]
    assert shm_watch.added(shm_before, msgq_prefix) == set()


# ---------------------------------------------------------------- item 15: leftovers


def forked_server(name, pause_s=0.005):
    """Fork a child serving ``name`` (stream road), sending a frame every
    ``pause_s`` until it is killed; returns its pid once it serves."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            server = serving(name)
            os.write(w, b"1")
            for n in range(1, 1 << 30):
                server.send(server.get_buffer("road"), frame_id=n)
                time.sleep(pause_s)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read(1) == b"1"
    return pid


def test_a_sigkilled_server_leaves_nothing_in_the_shm_directory():
    pid = forked_server("doomed")
    client = VisionIpcClient("doomed", "road", False)
    try:
        assert client.connect(True)
        assert client.recv(5000) is not None
        assert [f for f in os.listdir(segment_dir()) if "doomed" in f] == []  # the ring has no name even now
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        client.close()
    assert [f for f in os.listdir(segment_dir()) if "doomed" in f] == []


# ---------------------------------------------------------------- item 16: messages


def test_one_name_limit_for_python_and_cpp_and_a_squatted_name_names_its_holder(monkeypatch):
    limit = _visionipc.MAX_NAME_LENGTH
    for length in (limit + 1, 128):
        with pytest.raises(InvalidNameError, match=f"at most {limit}"):
            VisionIpcServer("n" * length)
        with pytest.raises(InvalidNameError, match=f"at most {limit}"):
            VisionIpcClient("n" * length, "road")
    with pytest.raises(InvalidArgumentError, match=f"at most {limit}"):  # the same words: one rule (names.cc)
        _visionipc.Server("n" * (limit + 1))
    # The longest name under the longest prefix still makes a working server.
    monkeypatch.setenv("MSGQ_PREFIX", "p" * 64)
    name = "n" * limit
    server = VisionIpcServer(name)
    server.create_buffers("r", 2, 64, 32)
    server.start_listener()
    try:
        with VisionIpcClient(name, "r", False) as client:
            assert client.connect(False), client.last_error
            buf = server.get_buffer("r")
            server.send(buf, frame_id=5)
            assert client.recv(5000).frame_id == 5
        with pytest.raises(IpcError, match=f"uid {os.geteuid()} \\(pid {os.getpid()}\\)"):
            VisionIpcServer(name)
    finally:
        server.close()


def test_a_second_thread_receiving_on_the_same_client_gets_an_error_not_part_of_the_stream():
    # A client's read position and lease belong to one reader: while one thread waits
    # in recv(), another thread's recv() on the same client raises (use a client per
    # thread) instead of both threads taking frames of one stream, or one object.
    import threading

    server = VisionIpcServer("threads")
    server.create_buffers("s", 4, 64, 32)
    server.start_listener()
    client = VisionIpcClient("threads", "s")
    assert client.connect(True)
    outcome = {}

    def receive(who):
        try:
            outcome[who] = client.recv(5000)
        except IpcError as e:
            outcome[who] = e

    try:
        threads = [threading.Thread(target=receive, args=(who,)) for who in ("first", "second")]
        for t in threads:  # whichever waits first gets the frame; the other one the error
            t.start()
        deadline = time.monotonic() + 10
        while not outcome and time.monotonic() < deadline:
            time.sleep(0.01)  # until the second one has raised
        server.send("s", bytes(client.buffer_len), frame_id=5)
        for t in threads:
            t.join(10)
        errors = [v for v in outcome.values() if isinstance(v, IpcError)]
        frames = [v for v in outcome.values() if not isinstance(v, IpcError)]
        assert len(errors) == 1 and "already waiting in another thread" in str(errors[0])
        assert len(frames) == 1 and frames[0] is not None and frames[0].frame_id == 5
        server.send("s", bytes(client.buffer_len), frame_id=6)
        assert client.recv(5000).frame_id == 6  # the client goes on normally, from this thread too
    finally:
        client.close()
        server.close()


def _close_while_frames_flow(name, send, pause_s):
    """One camera thread sending, one consumer thread reading frames; the caller's
    thread closes the client, then the server. Returns what each thread raised."""
    import threading

    import numpy as np

    frame = np.zeros(640 * 480 * 3 // 2, np.uint8)
    server = VisionIpcServer(name)
    server.create_buffers("s", 4, 640, 480)
    server.start_listener()
    client = VisionIpcClient(name, "s")
    assert client.connect(True)
    outcome, reading = {}, threading.Event()

    def produce():
        try:
            for fid in itertools.count(1):
                if send == "copying":
                    server.send("s", frame, fid)
                else:
                    buf = server.get_buffer("s")
                    buf.data[:8] = fid.to_bytes(8, "little")
                    server.send(buf, frame_id=fid)
        except Exception as e:  # the caller's assertion names it
            outcome["producer"] = e

    def consume():
        try:
            while True:
                got = client.recv(1000)
                if got is not None:
                    with got:
                        assert int(got.array.sum()) >= 0 and got.valid in (True, False)
                    reading.set()
        except Exception as e:
            outcome["consumer"] = e

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    assert reading.wait(10)
    time.sleep(pause_s)
    client.close()
    threads[1].join(10)
    server.close()
    threads[0].join(10)
    assert not any(t.is_alive() for t in threads), "a thread hangs after the close"
    return outcome


@pytest.mark.parametrize("send", ["zero-copy", "copying"])
def test_closing_the_server_and_client_from_another_thread_while_frames_flow_raises_closed_error(send):
    """A camera thread sends and a consumer thread receives and reads frames while the
    main thread closes the client, then the server (Ctrl-C handling often does this):
    each thread's next call raises ClosedError; no crash, no hang, no other error. The
    copying send copies 460 KB frames without the GIL, so the close lands mid-copy too."""
    for round_ in range(25):
        outcome = _close_while_frames_flow(f"closing{round_}", send, 0.0003 * (round_ % 6))
        assert {k: type(v) for k, v in outcome.items()} == {"producer": ClosedError, "consumer": ClosedError}, outcome
