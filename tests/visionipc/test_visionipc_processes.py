"""VisionIPC across real processes: intact frames for 8 clients, torn-frame
policy under a fast producer, a client killed while holding a lease, a server
killed and restarted. Children are spawned (tests/vipc_helpers.py)."""

import threading
import time

import numpy as np
import pytest
import vipc_helpers as h

from msgq.errors import InvalidArgumentError
from visionipc import VisionIpcClient, VisionIpcServer

pytestmark = pytest.mark.timeout(120)


def test_eight_client_processes_receive_every_frame_intact_and_in_order():
    frames, clients = 60, 8
    results, ready = h.Results(), h.Results()
    server = VisionIpcServer("cam")
    server.create_buffers("road", 12, 128, 64)
    server.start_listener()
    procs = [h.start(h.client_reads, f"c{i}", results, "cam", "road", frames, False, ready) for i in range(clients)]
    try:
        for _ in range(clients):
            ready.get(timeout=h.DEADLINE_S)
        for fid in range(1, frames + 1):
            buf = server.get_buffer("road")
            h.stamp(buf.data, fid)
            server.send(buf, frame_id=fid)
            time.sleep(0.002)  # paced: this test is about content, not overruns
        reports = h.collect(results, clients)
    finally:
        for p in procs:
            h.kill(p)
        server.close()
    for name, r in reports.items():
        assert r["ids"] == list(range(1, frames + 1)), name
        assert r["torn"] == [], (name, r["torn"][:3])


def test_producer_threads_of_one_server_feed_its_streams_at_once():
    """One producer thread per stream, and two threads on one stream whose copying
    sends copy without the GIL at the same time: client processes get every frame
    of their stream, intact, and a one-producer stream's in order."""
    per_thread, clients = 50, 2
    results, ready = h.Results(), h.Results()
    server = VisionIpcServer("threads")
    # 40 buffers, a frame every 5 ms per thread: a client may be off its core for 100 ms (a
    # loaded machine, the suite's other worker) before a frame it has not read yet is reused
    server.create_buffers("road", 40, 640, 480)  # 460,800-byte frames: send_copy drops the GIL to copy
    server.create_buffers("wide", 40, 128, 64)
    server.start_listener()
    procs = [
        h.start(h.client_reads, f"{stream}{i}", results, "threads", stream, count, False, ready)
        for stream, count in (("road", 2 * per_thread), ("wide", per_thread))
        for i in range(clients)
    ]
    size = 640 * 480 * 3 // 2  # NV12 (send_copy refuses any other size)
    errors = []

    def copying(first_id):
        frame = np.empty(size, np.uint8)
        for fid in range(first_id, first_id + per_thread):
            h.stamp(frame, fid)
            server.send("road", frame, fid)
            time.sleep(0.005)

    def zero_copy():
        for fid in range(1, per_thread + 1):
            buf = server.get_buffer("wide")
            h.stamp(buf.data, fid)
            server.send(buf, frame_id=fid)
            time.sleep(0.005)

    def run(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported below: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=a) for a in ((copying, 1), (copying, 1001), (zero_copy,))]
    try:
        for _ in procs:
            ready.get(timeout=h.DEADLINE_S)
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        reports = h.collect(results, len(procs))
    finally:
        for p in procs:
            h.kill(p)
        server.close()
    assert errors == []
    road = sorted([*range(1, per_thread + 1), *range(1001, 1001 + per_thread)])
    for name, r in reports.items():
        assert r["torn"] == [] and r["invalid"] == 0, (name, r["torn"][:3], r["invalid"])
        if name.startswith("road"):
            assert sorted(r["ids"]) == road, name
        else:
            assert r["ids"] == list(range(1, per_thread + 1)), name


@pytest.mark.parametrize("lease", [True, False], ids=["leased", "unleased"])
def test_a_slow_consumer_never_sees_a_torn_frame_as_valid(lease):
    """A producer process flat out over 2 buffers, a consumer that reads slowly.
    Leased (inside ``with``): every frame stays valid and intact. Unleased (the
    lease dropped before reading): frames may be overwritten, and then ``valid``
    says so; a frame still valid after the read was intact."""
    results, stop = h.Results(), h.SPAWN.Event()
    producer = h.start(h.serve, "producer", results, "fast", "s", 2, 0, 0, 256, 128, stop=stop)
    try:
        h.collect(results, 1)
        client = VisionIpcClient("fast", "s", True)
        assert client.connect(True)
        checked = invalid = 0
        deadline = time.monotonic() + 30
        while checked < 40 and time.monotonic() < deadline:
            frame = client.recv(1000)
            if frame is None:
                continue
            if lease:
                with frame:
                    if not frame.valid:  # overwritten before recv could lease it: told, skipped
                        invalid += 1
                        continue
                    time.sleep(0.002)
                    problem = h.stamp_problem(frame.data, frame.frame_id)
                    assert frame.valid
                    assert problem is None, problem
            else:
                with frame:
                    pass  # drops the lease that recv took
                copy = np.array(frame.data)
                time.sleep(0.002)
                if not frame.valid:  # seqlock check after the read
                    invalid += 1
                else:
                    assert h.stamp_problem(copy, frame.frame_id) is None
            checked += 1
        client.close()
        assert checked >= 40, (checked, invalid)
    finally:
        stop.set()
        producer.join(20)
        h.kill(producer)


def test_a_client_killed_while_holding_a_lease_releases_its_buffer():
    results = h.Results()
    server = VisionIpcServer("cam")
    server.create_buffers(0, 2, 64, 32)
    server.start_listener()
    holder = h.start(h.client_holds_lease, "holder", results, "cam", 0)
    try:
        while server.num_clients(0) < 1:
            time.sleep(0.01)
        fid = 0
        while results.empty():  # until the child has a frame in hand
            fid += 1
            server.send(server.get_buffer(0), frame_id=fid)
            time.sleep(0.01)
        held = h.collect(results, 1)["holder"]
        assert held["valid"]
        for _ in range(6):  # while it lives, its buffer is never handed out
            buf = server.get_buffer(0)
            assert buf.idx != held["idx"]
            server.send(buf)
        h.kill(holder)
        deadline = time.monotonic() + 10
        while server.num_clients(0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.num_clients(0) == 0
        seen = set()
        for _ in range(4):
            buf = server.get_buffer(0)
            seen.add(buf.idx)
            server.send(buf)
        assert held["idx"] in seen
    finally:
        h.kill(holder)
        server.close()


def test_a_client_follows_a_server_killed_and_restarted():
    results = h.Results()
    first = h.start(h.serve, "first", results, "cam", "road", 3, 0, 0.005)
    client = VisionIpcClient("cam", "road", False)
    try:
        h.collect(results, 1)
        assert client.connect(True)
        frame = None
        while frame is None:
            frame = client.recv(1000)
        first_server = client._native.server_id
        h.kill(first)
        deadline = time.monotonic() + 10
        while client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not client.is_connected()
        second = h.start(h.serve, "second", results, "cam", "road", 4, 0, 0.005, 96, 48)
        h.collect(results, 1)
        frames = []
        deadline = time.monotonic() + 30
        while len(frames) < 5 and time.monotonic() < deadline:
            f = client.recv(1000)
            if f is not None and client._native.server_id != first_server:
                frames.append(f)
        assert len(frames) == 5
        assert (client.width, client.height, client.num_buffers) == (96, 48, 4)
        for f in frames:
            if f.valid:
                copy = np.array(f.data)
                if f.valid:
                    assert h.stamp_problem(copy, f.frame_id) is None
        h.kill(second)
    finally:
        client.close()
        h.kill(first)


@pytest.mark.parametrize("size", [3840 * 2160 * 3 // 2, 2_250_037])  # 4K NV12; a custom size, not a multiple of 64
def test_large_copying_sends_arrive_byte_exact_from_any_source_alignment(size):
    # Frames of 2 MiB and more are copied into the pool with streaming stores
    # (cpp/common/frame_copy.h): every byte, head and tail included, must reach a
    # client in another process, whatever the source's alignment.
    import hashlib

    results, ready = h.Results(), h.Results()
    server = VisionIpcServer("big")
    server.create_buffers_with_sizes(0, 5, 1500, 1000, size, 1500, 1500 * 1000)  # no frame is overwritten
    server.start_listener()
    proc = h.start(h.client_digests, "c", results, "big", 0, 4, ready)
    rng = np.random.default_rng(size)
    backing = rng.integers(0, 256, size + 64, dtype=np.uint8)
    sources = [backing[:size].tobytes()] + [backing[off : off + size] for off in (1, 7, 63)]  # bytes; 3 misalignments
    try:
        ready.get(timeout=h.DEADLINE_S)
        for fid, data in enumerate(sources, 1):
            server.send(0, data, frame_id=fid)
        report = h.collect(results, 1)["c"]
    finally:
        h.kill(proc)
        server.close()
    assert report == {fid: hashlib.sha256(bytes(data)).hexdigest() for fid, data in enumerate(sources, 1)}


def test_a_handoff_server_wakes_one_sleeping_client_per_frame_and_every_client_gets_every_frame(monkeypatch):
    """``VisionIpcServer(wake="handoff")``: four clients asleep in recv(); each frame
    must reach all of them (intact, valid) before the next is sent, while the
    server's own system calls wake at most one client per frame."""
    monkeypatch.setenv("MSGQ_SPIN_US", "0")  # the clients sleep at once
    frames, clients = 40, 4
    results, ready = h.Results(), h.Results()
    server = VisionIpcServer("handoff", wake="handoff")
    server.create_buffers("road", clients + 4, 128, 64)
    server.start_listener()
    procs = [h.start(h.client_acks, f"c{i}", results, "handoff", "road", frames, ready) for i in range(clients)]
    try:
        for _ in range(clients):
            ready.get(timeout=h.DEADLINE_S)
        for fid in range(1, frames + 1):
            time.sleep(0.005)  # every client back asleep
            buf = server.get_buffer("road")
            h.stamp(buf.data, fid)
            server.send(buf, frame_id=fid)
            acks = h.collect(results, clients, timeout=10)
            assert acks == {f"c{i}": {"frame_id": fid, "ok": True} for i in range(clients)}, fid
        woken = server.readers_woken("road")
    finally:
        for p in procs:
            h.kill(p)
        server.close()
    assert 0 < woken <= frames, woken


def test_a_bad_wake_choice_is_a_clear_error(monkeypatch):
    with pytest.raises(InvalidArgumentError, match="wake must be 'all' or 'handoff', not 'fast'"):
        VisionIpcServer("badwake", wake="fast")
    monkeypatch.setenv("MSGQ_WAKE", "fast")
    with pytest.raises(InvalidArgumentError, match="MSGQ_WAKE must be 'all' or 'handoff'"):
        VisionIpcServer("badwake")
    monkeypatch.setenv("MSGQ_WAKE", "handoff")
    with VisionIpcServer("badwake") as server:  # the environment chooses when wake= is not given
        assert server.wake == "handoff"
    with VisionIpcServer("badwake", wake="all") as server:  # an argument wins over the environment
        assert server.wake == "all"
        server.create_buffers("road", 2, 64, 64)
        assert server.readers_woken("road") == 0
        with pytest.raises(InvalidArgumentError, match="has no stream 'nope'"):
            server.readers_woken("nope")
