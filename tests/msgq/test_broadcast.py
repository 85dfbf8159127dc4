"""The lossless broadcast queue (msgq.BroadcastQueue, seed 003) across real
processes: every reader gets every message exactly, a slow reader makes the
writer wait and warn, large messages overflow to ZeroMQ, remote readers get
everything over TCP; and bad input."""

import dataclasses
import logging
import pickle
import threading
import time

import numpy as np
import pytest
from mp_helpers import Children
from queue_helpers import broadcast_reader, send_message

import msgq
from msgq.broadcast import BroadcastHandle, BroadcastQueueReader, BroadcastQueueWriter
from msgq.errors import ClosedError, InvalidArgumentError, IpcError, QueueShutdownError

CHUNK = 4096


@pytest.mark.parametrize("max_chunks", [4, 16])  # 16: the writer sleeps for 4 free chunks at a time
def test_every_reader_gets_every_message_exactly_while_a_slow_reader_holds_the_writer_back(caplog, max_chunks):
    count = 300
    queue = msgq.BroadcastQueue(n_readers=3, chunk_bytes=CHUNK, max_chunks=max_chunks, warn_interval=0.2)
    with Children() as children, queue:
        children.start(broadcast_reader, "slow", queue.handle, 0, count, CHUNK, 1.0, 50, 0.05)
        children.start(broadcast_reader, "fast1", queue.handle, 1, count, CHUNK)
        children.start(broadcast_reader, "fast2", queue.handle, 2, count, CHUNK)
        queue.wait_until_ready(timeout=30)
        with caplog.at_level(logging.WARNING, logger="msgq.broadcast"):
            for seq in range(count):
                send_message(queue, seq, CHUNK, timeout=60)
        reports = children.collect(["slow", "fast1", "fast2"], timeout=90)
    for name, report in reports.items():
        assert report == {"count": count, "bad": 0, "first_bad": None, "extra": False}, (name, report)
    # The slow reader stalled 1 s with a small ring: the writer had to wait for it, and said so.
    logged = [r.getMessage() for r in caplog.records if r.name == "msgq.broadcast"]
    warnings = [w for w in logged if "the writer has waited" in w]
    assert warnings and all("reader 0" in w for w in warnings), warnings
    assert not any("reader 1" in w or "reader 2" in w for w in warnings)
    # some messages are larger than a chunk: the first of them says once how they travel
    hints = [w for w in logged if "travels as a file" in w]
    assert len(hints) == 1 and f"larger than chunk_bytes={CHUNK}" in hints[0], logged


def test_remote_reader_receives_every_message_over_zeromq_tcp():
    pytest.importorskip("zmq")
    count = 120
    queue = msgq.BroadcastQueue(
        n_readers=1,
        n_remote_readers=2,
        chunk_bytes=CHUNK,
        max_chunks=8,
        remote_host="127.0.0.1",
        remote_bind="127.0.0.1",
    )
    assert queue.handle.remote_addr.startswith("tcp://127.0.0.1:")
    with Children() as children, queue:
        children.start(broadcast_reader, "local", queue.handle, 0, count, CHUNK)
        children.start(broadcast_reader, "remote1", queue.handle, 1, count, CHUNK)
        children.start(broadcast_reader, "remote2", queue.handle, 2, count, CHUNK, 0.5, 10, 0.01)
        queue.wait_until_ready(timeout=30)
        for seq in range(count):
            send_message(queue, seq, CHUNK, timeout=60)
        reports = children.collect(["local", "remote1", "remote2"], timeout=90)
    for name, report in reports.items():
        assert report["bad"] == 0 and not report["extra"], (name, report)


def test_messages_larger_than_a_chunk_overflow_to_the_side_channel_in_order():
    queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=1024, max_chunks=4)
    readers = [msgq.BroadcastQueue.create_from_handle(queue.handle, r) for r in range(2)]
    queue.wait_until_ready(timeout=10)
    big = np.arange(1 << 18, dtype=np.uint32)  # 1 MiB: 1024 times a chunk
    queue.enqueue("small")
    queue.enqueue(big)
    queue.enqueue_bytes(b"x" * 5000)
    queue.enqueue({"after": True})
    for reader in readers:
        assert reader.dequeue(timeout=5) == "small"
        got = reader.dequeue(timeout=5)
        assert isinstance(got, np.ndarray) and np.array_equal(got, big)
        assert reader.dequeue_bytes(timeout=5) == b"x" * 5000
        assert reader.dequeue(timeout=5) == {"after": True}
    for q in (queue, *readers):
        q.close()


def test_numpy_buffers_travel_out_of_band_and_come_back_writable():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=1 << 20, max_chunks=2)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    frame = np.random.default_rng(0).integers(0, 255, (480, 640), dtype=np.uint8)
    queue.enqueue({"frame": frame, "strided": frame[:, ::2]})  # a strided view goes in band
    got = reader.dequeue(timeout=5)
    assert np.array_equal(got["frame"], frame) and np.array_equal(got["strided"], frame[:, ::2])
    assert got["frame"].flags.writeable  # the reader's own copy (one copy out of the chunk, none in pickle)
    queue.close()
    reader.close()


def test_timeouts_raise_timeout_error_naming_the_reader_the_writer_waits_for():
    queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=256, max_chunks=2, warn_interval=10)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    with pytest.raises(TimeoutError):
        reader.dequeue(timeout=0.05)
    queue.enqueue(1)
    queue.enqueue(2)
    assert reader.dequeue(timeout=1) == 1 and reader.dequeue(timeout=1) == 2
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"reader 1 \(never attached\)"):
        queue.enqueue(3, timeout=0.1)
    assert 0.1 <= time.monotonic() - started < 60  # it waited its timeout; the bound is only against a hang
    queue.close()
    reader.close()


def test_shutdown_wakes_a_waiting_reader_after_it_drained_the_queue():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=256, max_chunks=4)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.enqueue("last words")
    outcome = []

    def wait():
        outcome.append(reader.dequeue())
        try:
            reader.dequeue()
        except QueueShutdownError as e:
            outcome.append(type(e).__name__)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    queue.shutdown()
    thread.join(5)
    assert not thread.is_alive() and outcome == ["last words", "QueueShutdownError"]
    with pytest.raises(QueueShutdownError):
        queue.enqueue("too late")
    queue.close()
    reader.close()


def test_a_reader_can_shut_the_queue_down_and_wake_a_blocked_writer():
    queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=256, max_chunks=1)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.enqueue(0)
    result = []
    thread = threading.Thread(target=lambda: result.append(pytest.raises(QueueShutdownError, queue.enqueue, 1)))
    thread.start()
    time.sleep(0.2)
    reader.shutdown()
    thread.join(5)
    assert not thread.is_alive() and result
    queue.close()
    reader.close()


def test_closing_the_writer_lets_readers_drain_then_tells_them():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=256, max_chunks=4)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.enqueue("one")
    queue.close()
    assert reader.dequeue(timeout=1) == "one"
    with pytest.raises(QueueShutdownError):
        reader.dequeue(timeout=1)
    reader.close()


def test_the_one_call_hot_path_keeps_every_message_and_every_error():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=256, max_chunks=4)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    marker = object()
    for obj in (None, marker, b"raw bytes"):
        queue.enqueue(obj)
    queue.enqueue_bytes(b"sent raw")
    assert reader.dequeue(timeout=1) is None
    got = reader.dequeue(timeout=float("inf"))
    assert type(got) is object and got is not marker  # a plain object() is a message, not a sentinel
    assert reader.dequeue(timeout=10**12) == b"raw bytes"
    assert reader.dequeue(timeout=1) == b"sent raw"
    with pytest.raises(TimeoutError):
        reader.dequeue(timeout=-1)  # negative: do not wait
    # A bad timeout is refused before anything is pickled, sent or consumed.
    queue.enqueue("kept")
    for bad in (float("nan"), "1", True, None.__class__):
        with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds or None"):
            reader.dequeue(timeout=bad)
        with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds or None"):
            queue.enqueue("never sent", timeout=bad)
    queue.enqueue("huge", timeout=10**400)  # too large for a double: no limit
    assert reader.dequeue(timeout=-(10**400)) == "kept"  # hugely negative: do not wait
    assert reader.dequeue(timeout=0) == "huge"
    # A chunk that is not a pickle stream (a corrupt peer): a clear error, and the message is spent.
    assert queue._writer.write(0, [b"not a pickle"], 1.0) == "ready"
    queue.enqueue("next")
    with pytest.raises(pickle.UnpicklingError):
        reader.dequeue(timeout=1)
    assert reader.dequeue(timeout=1) == "next"
    assert reader._seq == reader._reader.consumed == 8  # in step: an overflow file is found by _seq
    queue.close()
    with pytest.raises(QueueShutdownError):
        reader.dequeue(timeout=1)
    reader.close()


def test_bad_input_gets_clear_errors():
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue(n_readers=0)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue(n_readers=65)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue(n_readers=1, chunk_bytes=10)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue(n_readers=1, max_chunks=0)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue(n_readers=1, name="../etc")
    queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=256, max_chunks=2)
    with pytest.raises(InvalidArgumentError, match="already exists|in use"):
        msgq.BroadcastQueue(n_readers=1, name=queue.name)
    handle = pickle.loads(pickle.dumps(queue.handle))
    assert isinstance(handle, BroadcastHandle) and handle == queue.handle
    with pytest.raises(TypeError):
        pickle.dumps(queue)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue.create_from_handle(handle, 2)
    with pytest.raises(InvalidArgumentError):
        msgq.BroadcastQueue.create_from_handle("not a handle", 0)
    reader = msgq.BroadcastQueue.create_from_handle(handle, 0)
    with pytest.raises(InvalidArgumentError, match="already attached"):
        msgq.BroadcastQueue.create_from_handle(handle, 0)
    with pytest.raises(IpcError, match="only the writer"):
        reader.enqueue(1)
    with pytest.raises(IpcError, match="only readers"):
        queue.dequeue()
    with pytest.raises(TypeError):
        queue.enqueue_bytes(12345)
    with pytest.raises(InvalidArgumentError):
        queue.enqueue(1, timeout="soon")
    queue.enqueue({"an": "object"})
    with pytest.raises(TypeError, match="use dequeue"):
        reader.dequeue_bytes(timeout=1)
    assert reader.dequeue(timeout=1) == {"an": "object"}  # not lost
    reader.close()
    queue.close()
    with pytest.raises(ClosedError):
        queue.enqueue(1)
    with pytest.raises(ClosedError):
        reader.dequeue(timeout=0)
    queue.close()  # twice is fine


def test_a_reader_that_comes_back_under_its_rank_continues_where_it_stopped():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=256, max_chunks=4)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    for i in range(4):
        queue.enqueue(i)
    assert reader.dequeue(timeout=1) == 0
    reader.close()
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    assert [reader.dequeue(timeout=1) for _ in range(3)] == [1, 2, 3]
    reader.close()
    queue.close()


def test_remote_readers_with_curve_need_an_authorized_key(tmp_path):
    pytest.importorskip("zmq")
    from msgq import curve

    keys, other = curve.create_keys(str(tmp_path / "keys")), curve.create_keys(str(tmp_path / "other"))
    queue = msgq.BroadcastQueue(
        n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1", curve_dir=keys
    )
    with pytest.raises(InvalidArgumentError, match="CURVE"):
        msgq.BroadcastQueue.create_from_handle(queue.handle, 0)  # no key: refused at once
    intruder = msgq.BroadcastQueue.create_from_handle(queue.handle, 0, curve_dir=other)  # a key not authorized
    with pytest.raises(TimeoutError, match=r"readers \[0\]"):
        queue.wait_until_ready(timeout=0.5)  # its handshake never completes: it never subscribes
    good = msgq.BroadcastQueue.create_from_handle(queue.handle, 0, curve_dir=keys)
    queue.wait_until_ready(timeout=10)
    queue.enqueue({"secret": 1})
    assert good.dequeue(timeout=5) == {"secret": 1}
    with pytest.raises(TimeoutError):
        intruder.dequeue(timeout=0.2)
    for q in (good, intruder, queue):
        q.close()


def test_a_remote_reader_that_comes_back_under_its_rank_gets_what_is_sent_from_then_on():
    pytest.importorskip("zmq")
    queue = msgq.BroadcastQueue(n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    first = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.wait_until_ready(timeout=10)
    queue.enqueue(0)
    assert first.dequeue(timeout=5) == 0
    first.close()
    # What the writer sends before it has seen the reader leave goes to the dead connection
    # (ZeroMQ has no replay): wait until it has, so that the test is deterministic.
    remote, deadline = queue._remote_sock, time.monotonic() + 10
    while 0 in remote.refresh_subscriptions() and time.monotonic() < deadline:
        time.sleep(0.01)
    again = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.enqueue(1, timeout=10)  # waits until the new reader has subscribed
    assert again.dequeue(timeout=5) == 1  # not "expected message 0: messages were lost", forever
    queue.enqueue(2, timeout=10)
    assert again.dequeue(timeout=5) == 2
    again.close()
    queue.close()


def _idle_remote_reader(handle, ready, go):
    """A remote reader that attaches, reads nothing until told, then reads everything;
    reports how much its resident memory grew meanwhile and what it got."""
    reader = msgq.BroadcastQueue.create_from_handle(handle, 0)
    start_kb = _status_kb("VmRSS")  # a forked child: what it shares with the parent counts too
    ready.set()
    go.wait(60)
    growth_kb = _status_kb("VmHWM") - start_kb
    got = []
    while True:
        msg = reader.dequeue_bytes(timeout=10)
        if msg == b"end":
            break
        got.append(int.from_bytes(msg[:4], "little"))
    reader.close()
    return {"growth_kb": growth_kb, "got": got}


def _status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def test_a_remote_reader_that_does_not_dequeue_makes_the_writer_wait_instead_of_growing():
    """Issue 31: remote readers' ZeroMQ queue was unlimited (RCVHWM 0): a reader that did
    not dequeue took 276 MB for 4,000 messages of 64 KB and the writer never waited. Now
    the writer waits (lossless, as for a slow local reader) and the reader stays bounded."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    queue = msgq.BroadcastQueue(n_readers=0, n_remote_readers=1, remote_host="127.0.0.1", remote_bind="127.0.0.1")
    child = ctx.Process(target=lambda: results.put(_idle_remote_reader(queue.handle, ready, go)))
    child.start()
    try:
        assert ready.wait(30)
        queue.wait_until_ready(timeout=30)
        payload = bytes(65536)
        sent = 0
        with pytest.raises(msgq.IpcTimeoutError):
            for sent in range(4000):  # noqa: B007 - how far it got is the point
                queue.enqueue_bytes(sent.to_bytes(4, "little") + payload, timeout=2)
        # REMOTE_HWM (1000) queued on each side of the connection, a few in the TCP buffers
        assert sent < 2500, f"the writer sent {sent} messages to a reader that took none"
        go.set()
        queue.enqueue_bytes(b"end", timeout=30)
        report = results.get(timeout=60)
        assert report["growth_kb"] < 160 * 1024, report["growth_kb"]  # REMOTE_HWM x 64 KB, not 4,000 x
        assert report["got"] == list(range(sent)), "lossless: every message sent, in order"
    finally:
        go.set()
        child.join(30)
        queue.close()


def test_the_writer_and_its_readers_are_classes_of_their_own_behind_the_same_spellings():
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=256, max_chunks=2)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    assert type(queue) is BroadcastQueueWriter and type(reader) is BroadcastQueueReader
    assert isinstance(queue, msgq.BroadcastQueue) and isinstance(reader, msgq.BroadcastQueue)
    assert "writer, 1 local + 0 remote readers" in repr(queue) and "reader 0," in repr(reader)
    no_address = dataclasses.replace(queue.handle, n_remote_readers=1)  # a handle made by hand
    with pytest.raises(InvalidArgumentError, match="names no remote address"):
        msgq.BroadcastQueue.create_from_handle(no_address, 1)
    queue.enqueue("through")
    assert reader.dequeue(timeout=1) == "through"
    reader.close()
    queue.close()


def test_the_roles_modules_keep_the_public_names_of_msgq_broadcast():
    # The writer, a reader and what both share live in modules of their own (issue 35);
    # msgq.broadcast names them as before: a pickled handle says msgq.broadcast, and the
    # factory makes each role.
    import msgq.broadcast

    for name in msgq.broadcast.__all__:
        obj = getattr(msgq.broadcast, name)
        assert getattr(obj, "__module__", "msgq.broadcast") == "msgq.broadcast", name
    with msgq.BroadcastQueue(n_readers=1) as queue:
        handle = pickle.loads(pickle.dumps(queue.handle))
        assert b"msgq.broadcast" in pickle.dumps(queue.handle) and handle == queue.handle
        with msgq.BroadcastQueue.create_from_handle(handle, 0) as reader:
            assert type(queue) is BroadcastQueueWriter and type(reader) is BroadcastQueueReader
            assert isinstance(reader, msgq.BroadcastQueue) and isinstance(queue, msgq.BroadcastQueue)
            queue.enqueue({"x": 1})
            assert reader.dequeue(timeout=5) == {"x": 1}
