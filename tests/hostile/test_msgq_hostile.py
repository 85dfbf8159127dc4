"""msgq against hostile peers and hostile input (issue 16): a same-user peer
sitting on a segment's lock, a producer SIGKILLed holding an ordered
reservation, a full shared-memory filesystem during a resize, bad arguments
to a loan, out-of-range timeouts and settings. Real processes, real shared
memory; each peer is a short Python child (one start per scenario)."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import msgq
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    IpcTimeoutError,
    MultiplePublishersError,
    NoSpaceError,
    QueueShutdownError,
)
from msgq.names import segment_basename, segment_dir
from msgq.testing import unique_name, unique_topic

# A peer that holds an OFD lock on byte 0 (the attach lock) of a file, as a
# buggy or hostile process of the same user could, until its stdin closes.
HOLD_LOCK = textwrap.dedent(
    """
    import fcntl, os, struct, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 1, 0))
    print("locked", flush=True)
    sys.stdin.read()
    """
)


def _child(code, *args, env=None, stdin=subprocess.PIPE):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _segment_path(topic):
    return os.path.join(segment_dir(), segment_basename(topic))


# ------------------------------------------------------------ item 2: lockout


def test_a_peer_sitting_on_the_attach_lock_bounds_every_attach_and_is_named(monkeypatch):
    topic = unique_topic("locked")
    path = _segment_path(topic)
    peer = _child(HOLD_LOCK, path)
    try:
        assert peer.stdout.readline().strip() == "locked"
        monkeypatch.setenv("MSGQ_LOCK_TIMEOUT_S", "0.3")
        for attach in (lambda: msgq.pub_sock(topic), lambda: msgq.sub_sock(topic)):
            with pytest.raises(IpcTimeoutError) as info:
                attach()
            message = str(info.value)
            assert f"pid {peer.pid} (python" in message and path in message, message
        monkeypatch.setenv("MSGQ_LOCK_TIMEOUT_S", "soon")
        with pytest.raises(InvalidArgumentError, match="MSGQ_LOCK_TIMEOUT_S"):
            msgq.pub_sock(topic)
    finally:
        peer.kill()
        peer.wait()
    monkeypatch.delenv("MSGQ_LOCK_TIMEOUT_S")
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=1000) as sub:  # the peer is gone: all is well
        pub.send(b"after")
        assert sub.receive() == b"after"


def test_ctrl_c_breaks_an_attach_stuck_on_a_peer_lock():
    topic = unique_topic("ctrlc")
    peer = _child(HOLD_LOCK, _segment_path(topic))
    try:
        assert peer.stdout.readline().strip() == "locked"
        waiter = _child(
            """
            import sys, msgq
            print("attaching", flush=True)
            try:
                msgq.sub_sock(sys.argv[1])
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            """,
            topic,
        )
        assert waiter.stdout.readline().strip() == "attaching"
        while waiter.poll() is None:  # until it sleeps in the lock wait (not merely starting up)
            with open(f"/proc/{waiter.pid}/wchan") as f:
                if "nanosleep" in f.read():
                    break
            time.sleep(0.01)
        waiter.send_signal(signal.SIGINT)
        out, err = waiter.communicate(timeout=30)  # a hang guard, not a timing assert
        assert out.strip() == "interrupted", (out, err)
    finally:
        peer.kill()
        peer.wait()
        os.unlink(_segment_path(topic))  # the peer's file


# ------------------------------------------------ item 3: dead ordered producer

DIE_HOLDING_RESERVATION = """
    import sys, time, msgq
    producer = msgq.OrderedProducer(sys.argv[1])
    print(producer.reserve().id, flush=True)
    time.sleep(60)
"""


def _kill_holding_a_reservation(topic):
    child = _child(DIE_HOLDING_RESERVATION, topic)
    held = int(child.stdout.readline())
    child.kill()
    child.wait()
    return held


def test_a_producer_killed_holding_a_reservation_is_reclaimed_readers_pass_the_gap():
    topic = unique_name("deadres")
    live = msgq.OrderedProducer(topic, capacity=64, slot_bytes=64)
    reader = msgq.OrderedReader(topic, "sequential")
    dead = _kill_holding_a_reservation(topic)
    after = live.send(b"after the dead one")
    got = reader.recv(timeout=30)  # the reader waits on the dead id, notices and passes it
    assert (got.id, got.data) == (after, b"after the dead one")
    assert after == dead + 1 and reader.gaps == 1 and reader.reclaimed == 1
    # A live producer does not stall once the window (16 in flight) would fill.
    dead = _kill_holding_a_reservation(topic)
    ids = [live.send(b"%d" % i, timeout=30) for i in range(40)]
    assert ids == list(range(dead + 1, dead + 41))
    assert [reader.recv(timeout=30).data for _ in ids] == [b"%d" % i for i in range(40)]
    assert reader.reclaimed == 2 and reader.dropped == 0
    live.close()
    reader.close()


# -------------------------------------------- item 7: full shm during a resize


@pytest.fixture
def tiny_shm(monkeypatch, tmp_path):
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(f"this test mounts a 1 MiB tmpfs (needs root, as in CI): {done.stderr}")
    monkeypatch.setenv("MSGQ_SHM_DIR", str(mount))
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_resize_that_does_not_fit_leaves_the_topic_as_it_was(tiny_shm):
    topic = unique_topic("resize")
    with msgq.pub_sock(topic, segment_size=64 * 1024) as pub, msgq.sub_sock(topic, timeout=1000) as sub:
        before = sorted(os.listdir(tiny_shm))
        with pytest.raises(NoSpaceError, match="use a smaller segment_size"):
            msgq.pub_sock(topic, segment_size=4 << 20)
        assert sorted(os.listdir(tiny_shm)) == before  # nothing half-made, the segment unchanged
        pub.send(b"still the publisher")  # no MultiplePublishersError: nothing replaced it
        assert sub.receive() == b"still the publisher"
        with msgq.pub_sock(topic, segment_size=128 * 1024) as bigger:  # a resize that fits still works
            with pytest.raises(MultiplePublishersError, match="another segment_size"):
                pub.send(b"old")
            assert bigger.segment_size == 128 * 1024
            bigger.send(b"in the new segment")
            assert sub.receive() == b"in the new segment"


# ----------------------------------------------------- item 8: Loan.commit(n)


@pytest.mark.parametrize("bad", [65, -1, 2**64, "3", 1.5, True])
def test_a_bad_commit_size_changes_nothing(bad):
    topic = unique_topic("loan")
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=1000) as sub:
        loan = pub.loan(64)
        loan.data[:3] = b"abc"
        with pytest.raises(InvalidArgumentError, match="commit size"):
            loan.commit(bad)
        loan.commit(3)  # the loan is still open and commits
        assert sub.receive() == b"abc"
        pub.loan(8).cancel()  # and nothing is left outstanding
        pub.send(b"next")
        assert sub.receive() == b"next"


# ------------------------------------------- item 16 and 5: messages, timeouts


def test_out_of_range_timeouts_and_settings_are_clear_errors_that_keep_the_old_value(monkeypatch):
    topic = unique_topic("args")
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=250) as sub:
        for bad in (2**31, math.nan, "10", True):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                sub.setTimeout(bad)
            assert sub.timeout == 250
            with pytest.raises(InvalidArgumentError, match="timeout"):
                sub.receive_batch(timeout=bad)
        sub.setTimeout(math.inf)
        assert sub.timeout is None
        for bad in (-1, 2**40, 1.5):
            with pytest.raises(InvalidArgumentError, match="spin_us"):
                sub.spin_us = bad
        assert sub.spin_us == 50
        for bad in (math.nan, "1", True):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                pub.wait_for_readers(1, timeout=bad)
        with pytest.raises(InvalidArgumentError, match="count"):
            pub.wait_for_readers(2**40, timeout=0)
        for bad in (-(2**63) - 1, math.nan, "8"):
            with pytest.raises(InvalidArgumentError, match="loan size"):
                pub.loan(bad)
        poller = msgq.Poller()
        poller.registerSocket(sub)
        with pytest.raises(InvalidArgumentError, match="already registered"):
            poller.registerSocket(sub)
        with pytest.raises(InvalidArgumentError, match="timeout"):
            poller.poll(2**31)
        pub.send(b"x")
        assert poller.poll(1000) == [sub]
    for text in ("fast", "-1", "99999999999"):
        monkeypatch.setenv("MSGQ_SPIN_US", text)
        with pytest.raises(InvalidArgumentError, match="MSGQ_SPIN_US"):
            msgq.sub_sock(topic)


def test_mmap_out_of_address_space_is_not_called_a_full_shm():
    child = _child(
        """
        import resource, sys, msgq
        pages = int(open("/proc/self/statm").read().split()[0])
        limit = pages * 4096 + (16 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            msgq.pub_sock(sys.argv[1], segment_size=64 << 20)
        except msgq.NoSpaceError as e:
            print(e)
        """,
        unique_topic("enomem"),
    )
    out, err = child.communicate(timeout=60)
    assert "address space" in out and "shm-size" not in out, (out, err)


def test_the_per_message_native_calls_refuse_bad_arguments_with_type_errors():
    # send/receive (and VisionIPC's native send/recv) are plain CPython methods, not
    # pybind11's dispatcher: they check their own arguments.
    from visionipc import _visionipc

    topic = unique_topic("fastcall")
    pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=0)
    try:
        for bad in (5, None, 1.5, "text"):
            with pytest.raises(TypeError, match="bytes or a C-contiguous buffer"):
                pub.send(bad)
        with pytest.raises(TypeError, match="unexpected keyword argument 'blocking'"):
            sub.receive(blocking=True)
        with pytest.raises(TypeError, match="takes 0 to 1 arguments"):
            sub.receive(True, True)
        with pytest.raises(TypeError):
            type(sub._impl).receive(pub._impl)  # another class's object as self
        pub.send(memoryview(b"ok"))
        assert sub.receive(non_blocking=False) == b"ok" and sub.receive(True) is None
    finally:
        pub.close(), sub.close()
    for cls, call in (
        (_visionipc.Client, lambda c: c.recv_into(_visionipc.Frame(), None, None, 0)),
        (type(sub._impl), lambda s: s.receive(True)),
    ):
        with pytest.raises(TypeError, match="not initialized"):
            call(cls.__new__(cls))  # no object behind it: refused, never read
    client = _visionipc.Client(unique_name("fc"), "0")
    frame = _visionipc.Frame()
    for bad in ("1", 1.5, 2**40, True):
        with pytest.raises(TypeError, match="timeout_ms must be an int"):
            client.recv_into(frame, None, None, bad)
    assert client.recv_into(frame, None, None, 0) is None
    client.close()


def _close_while_messages_flow(make, pause_s):
    """``make()`` -> (send, receive, closers): a writer thread calls ``send()`` and a
    reader thread ``receive()`` in loops while this thread runs ``closers`` in order.
    Returns the exception type each loop ended with."""
    import threading

    send, receive, closers = make()
    outcome, reading = {}, threading.Event()

    def loop(name, step):
        try:
            while True:
                step()
                if name == "reader":
                    reading.set()
        except Exception as e:  # the caller's assertion names it
            outcome[name] = e

    threads = [threading.Thread(target=loop, args=a) for a in (("writer", send), ("reader", receive))]
    for t in threads:
        t.start()
    assert reading.wait(10)
    time.sleep(pause_s)
    for close in closers:
        close()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a thread hangs after the close"
    return {k: type(v) for k, v in outcome.items()}


def _broadcast():
    q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=1 << 20, max_chunks=8)
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    data = b"b" * 300_000  # large: copied out without the GIL
    return (lambda: q.enqueue_bytes(data, timeout=5)), (lambda: r.dequeue_bytes(timeout=5)), [r.close, q.close]


def _broadcast_objects():
    q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=1 << 20, max_chunks=8)
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    obj = {"frame": bytes(300_000), "n": 1}
    return (lambda: q.enqueue(obj, timeout=5)), (lambda: r.dequeue(timeout=5)), [r.close, q.close]


def _broadcast_remote():
    pytest.importorskip("zmq")
    q = msgq.BroadcastQueue(n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    q.wait_until_ready(timeout=10)
    data = b"z" * 300_000
    return (lambda: q.enqueue_bytes(data, timeout=5)), (lambda: r.dequeue_bytes(timeout=5)), [r.close, q.close]


def _ordered():
    from msgq.ordered import OrderedProducer, OrderedReader

    name = unique_topic()
    producer = OrderedProducer(name, capacity=16, slot_bytes=1 << 19)
    reader = OrderedReader(name)
    data = b"o" * 400_000

    def send():  # paced: flat out, the lossy ring laps a reader copying 400 KB before it ever gets one
        producer.send(data, timeout=5)
        time.sleep(0.001)

    return send, (lambda: reader.recv(timeout=5)), [reader.close, producer.close]


@pytest.mark.parametrize(
    "make",
    [_broadcast, _broadcast_objects, _broadcast_remote, _ordered],
    ids=["broadcast", "objects", "remote", "ordered"],
)
def test_closing_a_queue_from_another_thread_while_messages_flow_raises_closed_error(make):
    """The reader, then the writer, closed by another thread while a writer thread and a
    reader thread move 300-400 KB messages (copied without the GIL; over ZeroMQ TCP for
    "remote"): each loop ends with ClosedError, never a crash (these crashed: the close
    unmapped the chunk or slot under the copy, or closed the ZeroMQ socket under a poll),
    a hang, or another error."""
    for round_ in range(30):
        outcome = _close_while_messages_flow(make, 0.0003 * (round_ % 7))
        assert outcome == {"writer": ClosedError, "reader": ClosedError}, (round_, outcome)


@pytest.mark.parametrize("stop", ["shutdown", "close"])
def test_a_writer_waiting_on_a_remote_reader_is_stopped_from_another_thread(stop):
    """A writer thread blocked in enqueue() (no timeout) on remote reader 1, which never
    connects, while reader 0 is connected: shutdown() from another thread ends the wait
    with QueueShutdownError, close() with ClosedError; either way reader 0 is told the
    queue was shut down (once), and later calls raise the same errors."""
    import threading

    pytest.importorskip("zmq")
    q = msgq.BroadcastQueue(n_readers=0, n_remote_readers=2, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    outcome = {}

    def write():
        try:
            q.enqueue("never sent")
        except Exception as e:  # the assertion below names it
            outcome["writer"] = e

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.3)
    assert writer.is_alive(), outcome  # waiting for reader 1 to subscribe
    getattr(q, stop)()
    writer.join(10)
    assert not writer.is_alive(), "the writer still waits"
    expected = {"shutdown": QueueShutdownError, "close": ClosedError}[stop]
    assert type(outcome.get("writer")) is expected, outcome
    with pytest.raises(expected):
        q.enqueue("after", timeout=1)
    with pytest.raises(QueueShutdownError):
        r.dequeue(timeout=10)
    with pytest.raises(QueueShutdownError):  # it stays shut down
        r.dequeue(timeout=0.2)
    r.close()
    q.close()
    assert q.closed and r.closed


@pytest.mark.parametrize("where", ["local", "remote"])
def test_wait_until_ready_ends_with_closed_error_when_another_thread_closes_the_writer(where):
    """A thread waiting for a reader that never comes; the writer closed meanwhile is
    not "ready" (wait_until_ready returned as if every reader had attached)."""
    import threading

    if where == "remote":
        pytest.importorskip("zmq")
        q = msgq.BroadcastQueue(n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    else:
        q = msgq.BroadcastQueue(n_readers=1)
    outcome = {}

    def wait():
        try:
            q.wait_until_ready(timeout=30)
            outcome["waiter"] = "ready"
        except Exception as e:  # the assertion below names it
            outcome["waiter"] = e

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    q.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert type(outcome["waiter"]) is ClosedError, outcome


def test_stray_subscriptions_on_the_writers_port_are_ignored():
    """Anyone who reaches a writer's remote port (a queue made without CURVE) can
    connect and subscribe. Subscriptions that are not a reader's hello, or a hello
    whose rank is no number, are ignored: the writer goes on serving its reader
    (a hello with a rank that is no number raised ValueError in every enqueue)."""
    zmq = pytest.importorskip("zmq")
    from msgq._broadcast_remote import HELLO

    q = msgq.BroadcastQueue(n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    stray = zmq.Context.instance().socket(zmq.XSUB)
    stray.setsockopt(zmq.LINGER, 0)
    stray.connect(q.handle.remote_addr)
    for junk in (
        b"\x01" + HELLO + b"x",
        b"\x01" + HELLO,
        b"\x01" + HELLO + b"\xff\x00",
        b"\x00" + HELLO + b"-",
        b"\x07",
        b"\x01" + HELLO + b"7",  # last: a well-formed hello (rank 7 is no reader of this queue)
    ):
        stray.send(junk)
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    try:
        # The stray's subscriptions arrive in order: once its last is seen, the writer went over the junk.
        deadline = time.monotonic() + 10
        while 7 not in q._remote_sock.refresh_subscriptions() and time.monotonic() < deadline:
            time.sleep(0.01)
        q.wait_until_ready(timeout=10)
        q.enqueue({"n": 1}, timeout=10)
        assert r.dequeue(timeout=10) == {"n": 1}
    finally:
        stray.close(linger=0)
        r.close()
        q.close()


def test_a_remote_reader_refuses_malformed_messages_with_a_clear_error():
    """A remote reader is handed a handle whose address is a peer that sends junk
    (a first frame of the wrong size, an unknown kind, no payload): each dequeue
    raises IpcError saying so (it raised struct.error, or unpickled nothing:
    IndexError), and the next good message is delivered."""
    zmq = pytest.importorskip("zmq")
    from msgq._broadcast_remote import FRAME, KIND_PICKLE, KIND_RAW
    from msgq.broadcast import BroadcastHandle
    from msgq.errors import IpcError

    peer = zmq.Context.instance().socket(zmq.XPUB)
    peer.setsockopt(zmq.LINGER, 0)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    handle = BroadcastHandle(unique_name(), "", "/dev/shm", 0, 1, 1 << 16, 4, None, f"tcp://127.0.0.1:{port}")
    r = msgq.BroadcastQueue.create_from_handle(handle, rank=0)
    try:
        peer.setsockopt(zmq.RCVTIMEO, 10_000)
        peer.recv()  # the reader's subscription: what is sent from now on reaches it
        for junk in ([b"short"], [FRAME.pack(9, 0), b"x"], [FRAME.pack(KIND_PICKLE, 0)], [FRAME.pack(KIND_RAW, 0)]):
            peer.send_multipart(junk)
            with pytest.raises(IpcError, match="malformed"):
                r.dequeue(timeout=10)
        peer.send_multipart([FRAME.pack(KIND_RAW, 0), b"good"])
        assert r.dequeue_bytes(timeout=10) == b"good"
    finally:
        r.close()
        peer.close(linger=0)


def test_a_remote_reader_refuses_a_message_over_the_queues_maximum_and_reconnects():
    """A peer at the writer's address sends messages of 64 MB to a remote reader of a
    queue whose max_message_bytes is 1 MiB (the handle carries it): the reader's ZeroMQ
    refuses each before buffering it, the connection is made again, and the next
    message that fits is delivered. Before: the reader took every 64 MB message."""
    zmq = pytest.importorskip("zmq")
    from msgq._broadcast_remote import FRAME, KIND_RAW
    from msgq.broadcast import BroadcastHandle

    peer = zmq.Context.instance().socket(zmq.XPUB)
    peer.setsockopt(zmq.LINGER, 0)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    handle = BroadcastHandle(
        unique_name(), "", "/dev/shm", 0, 1, 1 << 16, 4, None, f"tcp://127.0.0.1:{port}", max_message_bytes=1 << 20
    )
    r = msgq.BroadcastQueue.create_from_handle(handle, rank=0)
    try:
        peer.setsockopt(zmq.RCVTIMEO, 10_000)
        peer.recv()  # the reader's subscription
        big = b"B" * (64 << 20)
        for _ in range(3):
            peer.send_multipart([FRAME.pack(KIND_RAW, 0), big], copy=False)
        got, deadline = None, time.monotonic() + 20
        while got is None and time.monotonic() < deadline:
            peer.send_multipart([FRAME.pack(KIND_RAW, 0), b"fits"])  # dropped until the reader is back
            try:
                got = r.dequeue_bytes(timeout=0.05)
            except msgq.IpcTimeoutError:
                pass
        assert got == b"fits"
    finally:
        r.close()
        peer.close(linger=0)


def test_the_writer_refuses_a_message_over_max_message_bytes():
    q = msgq.BroadcastQueue(1, max_message_bytes=1 << 20, chunk_bytes=1 << 16)
    r = msgq.BroadcastQueue.create_from_handle(q.handle, rank=0)
    try:
        assert q.handle.max_message_bytes == 1 << 20
        with pytest.raises(msgq.MessageTooLargeError, match="max_message_bytes"):
            q.enqueue_bytes(b"x" * ((1 << 20) + 1))
        with pytest.raises(msgq.MessageTooLargeError, match="max_message_bytes"):
            q.enqueue(bytearray((1 << 20) + 1))  # pickled: the buffer travels out of band
        q.enqueue_bytes(b"y" * (1 << 19))  # larger than a chunk, within the maximum
        assert r.dequeue_bytes(timeout=10) == b"y" * (1 << 19)
        with pytest.raises(msgq.InvalidArgumentError, match="max_message_bytes"):
            msgq.BroadcastQueue(1, max_message_bytes=1 << 10, chunk_bytes=1 << 16)
    finally:
        r.close()
        q.close()
