"""Ordered topics (msgq.OrderedProducer / OrderedReader, seed 004) and their
VisionIPC application (visionipc.ordered) across real processes: producers
finish out of order, sequential readers still get every id in order and
never one early, newest readers get the newest; and bad input."""

import gc
import threading
import time

import numpy as np
import pytest
from mp_helpers import SPAWN, Children
from queue_helpers import (
    frame_worker,
    ordered_hold_then_publish,
    ordered_payload,
    ordered_producer,
    ordered_reserve_and_publish_now,
)

import msgq
from msgq.errors import ClosedError, InvalidArgumentError, MessageTooLargeError, QueueShutdownError
from msgq.testing import unique_name
from visionipc.ordered import OrderedFrameClient, OrderedFrameWriter


def test_readers_do_not_see_id_n_early_when_another_process_finishes_n_plus_1_first():
    """The case a counter (first, last) design gets wrong: process A reserves
    N, process B reserves N+1 and publishes it first. A counter would say
    "N+1 is the newest, so N is there too" and hand out A's half-written slot."""
    topic = unique_name("ooo")
    creator = msgq.OrderedProducer(topic, capacity=32, slot_bytes=64)
    creator.send(b"before")  # N = 1
    sequential = msgq.OrderedReader(topic, "sequential")
    newest = msgq.OrderedReader(topic, "newest")
    reserved, release = SPAWN.Event(), SPAWN.Event()
    with Children() as children:
        children.start(ordered_hold_then_publish, "A", topic, reserved, release, b"from A")
        children.start(ordered_reserve_and_publish_now, "B", topic, reserved, b"from B")
        ids = children.collect(["A", "B"])
        a_id, b_id = ids["A"]["id"], ids["B"]["id"]
        assert b_id == a_id + 1
        assert not creator.is_available(a_id) and creator.is_available(b_id)
        assert creator.availability().available_end == a_id
        with pytest.raises(TimeoutError, match=f"message {a_id}"):
            sequential.recv(timeout=0.3)  # N is not available: nothing yet
        assert newest.recv(timeout=1) == (b_id, b"from B", 0, 0)  # newest may take N+1
        release.set()
        first = sequential.recv(timeout=10)  # woken when N becomes available
        second = sequential.recv(timeout=10)
    assert (first.id, first.data) == (a_id, b"from A")
    assert (second.id, second.data) == (b_id, b"from B")
    for end in (creator, sequential, newest):
        end.close()


def test_many_producer_processes_out_of_order_sequential_reader_gets_every_id_in_order():
    topic = unique_name("ooo")
    producers, each = 3, 150
    creator = msgq.OrderedProducer(topic, capacity=1024, slot_bytes=256)
    sequential = msgq.OrderedReader(topic, "sequential")
    newest = msgq.OrderedReader(topic, "newest")
    barrier = SPAWN.Barrier(producers + 1)
    with Children() as children:
        for p in range(producers):
            children.start(ordered_producer, f"p{p}", topic, each, p, barrier)
        barrier.wait(60)
        got = [sequential.recv(timeout=30) for _ in range(producers * each)]
        reports = children.collect([f"p{p}" for p in range(producers)])
    ids = sorted(i for r in reports.values() for i in r["ids"])
    assert ids == list(range(producers * each))  # every id reserved exactly once
    assert [m.id for m in got] == ids
    assert all(m.data == ordered_payload(m.id) for m in got)
    assert sequential.dropped == 0 and sequential.gaps == 0
    seen = []
    while True:
        try:
            seen.append(newest.recv(timeout=0).id)
        except TimeoutError:
            break
    assert seen and seen == sorted(set(seen)) and seen[-1] == producers * each - 1
    for end in (creator, sequential, newest):
        end.close()


def test_threads_fill_in_place_in_any_order_and_newest_reader_skips_to_the_newest():
    topic = unique_name("ooo")
    producer = msgq.OrderedProducer(topic, capacity=64, slot_bytes=64)
    newest = msgq.OrderedReader(topic, "newest")
    sequential = msgq.OrderedReader(topic, "sequential")
    reservations = [producer.reserve() for _ in range(5)]
    threads = []
    for res in reversed(reservations):  # the last reserved finishes first

        def fill(res=res):
            res.data[:2] = res.id.to_bytes(2, "little")
            res.publish(2, t0=res.id, t1=7)

        threads.append(threading.Thread(target=fill))
        threads[-1].start()
        threads[-1].join()
        if res.id > 0:
            with pytest.raises(TimeoutError):
                sequential.recv(timeout=0)
    assert [sequential.recv(timeout=1).id for _ in range(5)] == [0, 1, 2, 3, 4]
    m = newest.recv(timeout=1)
    assert (m.id, m.data, m.t0, m.t1) == (4, (4).to_bytes(2, "little"), 4, 7)
    with pytest.raises(TimeoutError):
        newest.recv(timeout=0.05)
    for end in (producer, newest, sequential):
        end.close()


def test_explicit_ids_skip_gaps_and_cancelled_or_abandoned_reservations_are_skipped():
    topic = unique_name("ooo")
    producer = msgq.OrderedProducer(topic, capacity=32, slot_bytes=16)
    reader = msgq.OrderedReader(topic, "sequential")
    producer.send(b"zero")
    with producer.reserve(id=5) as res:  # 1..4 never come
        res.data[:4] = b"five"
        res.size = 4
    with pytest.raises(RuntimeError):
        with producer.reserve() as res:  # an exception in the block cancels
            raise RuntimeError("worker failed")
    abandoned = msgq.OrderedProducer(topic)
    abandoned.reserve()  # 7, never published: its producer closes
    producer.send(b"eight")
    abandoned.close()
    assert [(m.id, m.data) for m in (reader.recv(timeout=1) for _ in range(3))] == [
        (0, b"zero"),
        (5, b"five"),
        (8, b"eight"),
    ]
    assert reader.gaps == 6
    with pytest.raises(InvalidArgumentError, match="reserved already"):
        producer.reserve(id=3)
    producer.close()
    reader.close()


def test_a_lapped_sequential_reader_counts_drops_and_keeps_order():
    topic = unique_name("ooo")
    producer = msgq.OrderedProducer(topic, capacity=16, slot_bytes=8)
    reader = msgq.OrderedReader(topic, "sequential")
    newest = msgq.OrderedReader(topic, "newest")
    for i in range(40):
        producer.send(i.to_bytes(8, "little"))
    got = [reader.recv(timeout=0).id for _ in range(16)]
    assert got == list(range(24, 40)) and reader.dropped == 24
    m = newest.recv(timeout=0)
    assert (m.id, m.data) == (39, (39).to_bytes(8, "little"))
    for end in (producer, reader, newest):
        end.close()


def test_shutdown_and_timeouts_wake_waiters_with_clear_errors():
    topic = unique_name("ooo")
    producer = msgq.OrderedProducer(topic, capacity=16, slot_bytes=8)
    held = [producer.reserve() for _ in range(msgq.ordered.WINDOW)]
    with pytest.raises(TimeoutError, match=f"message {held[0].id} was reserved but not published"):
        producer.reserve(timeout=0.05)
    reader = msgq.OrderedReader(topic, "sequential")
    outcome = []

    def wait():
        try:
            reader.recv()
        except QueueShutdownError as e:
            outcome.append(type(e).__name__)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    producer.shutdown()
    thread.join(5)
    assert not thread.is_alive() and outcome == ["QueueShutdownError"]
    with pytest.raises(QueueShutdownError):
        producer.reserve(timeout=1)
    producer.close()
    reader.close()


def test_bad_input_gets_clear_errors():
    topic = unique_name("ooo")
    with pytest.raises(InvalidArgumentError, match="no ordered topic"):
        msgq.OrderedReader(topic)
    with pytest.raises(InvalidArgumentError):
        msgq.OrderedProducer(topic, capacity=8, slot_bytes=8)
    with pytest.raises(InvalidArgumentError):
        msgq.OrderedProducer("bad/name", capacity=16, slot_bytes=8)
    producer = msgq.OrderedProducer(topic, capacity=16, slot_bytes=8)
    with pytest.raises(InvalidArgumentError, match="exists with capacity 16"):
        msgq.OrderedProducer(topic, capacity=32, slot_bytes=8)
    with pytest.raises(InvalidArgumentError):
        msgq.OrderedReader(topic, mode="oldest")
    with pytest.raises(MessageTooLargeError):
        producer.send(b"123456789")
    with pytest.raises(TypeError):
        producer.send(42)
    res = producer.reserve()
    with pytest.raises(MessageTooLargeError):
        res.publish(9)
    res.publish(1)
    with pytest.raises(InvalidArgumentError, match="already published"):
        res.publish(1)
    with pytest.raises(InvalidArgumentError):
        producer.reserve(id=-1)
    producer.close()
    with pytest.raises(ClosedError):
        producer.send(b"x")
    producer.close()


def test_visionipc_workers_in_processes_fill_frames_in_parallel_clients_get_frame_id_order():
    server, stream = unique_name("cam"), "road"
    width, height, workers, each = 64, 48, 3, 40
    creator = OrderedFrameWriter(server, stream, width, height, "gray8", count=32)
    sequential = OrderedFrameClient(server, stream, mode="sequential")
    newest = OrderedFrameClient(server, stream, mode="newest")
    barrier = SPAWN.Barrier(workers + 1)
    ids, pixels_ok, newest_ids = [], True, []
    with Children() as children:
        for w in range(workers):
            children.start(frame_worker, f"w{w}", server, stream, width, height, each, w, barrier)
        barrier.wait(60)
        while len(ids) < workers * each:
            frame = sequential.recv(timeout_ms=30_000)
            assert frame is not None, f"no frame after {ids[-1:]}"
            stamped = int.from_bytes(frame.array[0, :8].tobytes(), "little")
            pixels_ok &= (
                stamped == frame.frame_id
                and int(frame.array[1:].min()) == frame.frame_id % 251
                and frame.timestamp_sof == frame.frame_id * 10
                and frame.valid
            )
            ids.append(frame.frame_id)
            latest = newest.recv(timeout_ms=0)
            if latest is not None:
                newest_ids.append(latest.frame_id)
        children.collect([f"w{w}" for w in range(workers)])
    assert ids == list(range(workers * each)) and pixels_ok
    assert (frame.width, frame.height, frame.format) == (width, height, "gray8")
    assert not frame.array.flags.writeable
    assert newest_ids == sorted(set(newest_ids))
    del frame, latest
    for end in (creator, sequential, newest):
        end.close()
    gc.collect()


def test_client_frames_are_zero_copy_and_turn_invalid_when_the_ring_reuses_their_slot():
    server = unique_name("cam")
    writer = OrderedFrameWriter(server, 0, 32, 16, "rgb8", count=16)
    client = OrderedFrameClient(server, 0)
    frame = writer.get_buffer()
    frame.array[:] = 9
    writer.send(frame)
    got = client.recv(timeout_ms=1000)
    assert got.array.shape == (16, 32, 3) and int(got.array.max()) == 9 and got.valid
    assert np.shares_memory(got.array, got.data)
    assert isinstance(got.data, memoryview) and got.data.readonly and not got.array.flags.writeable
    assert isinstance(frame.data, memoryview) and not frame.data.readonly  # the writer's frames are writable
    with pytest.raises(TypeError):
        got.data[0] = 1
    for _ in range(16):
        f = writer.get_buffer()
        writer.send(f)
    assert not got.valid  # its slot holds frame 16 now
    with pytest.raises(InvalidArgumentError):
        OrderedFrameWriter(server, 0, 32, 16, "rgb8", count=8)
    with pytest.raises(InvalidArgumentError):
        writer.send(got)
    del got, frame, f
    writer.close()
    client.close()
    gc.collect()
