"""Child-process targets for the broadcast queue and ordered topic tests
(spawned: every target lives here, importable by name; see mp_helpers.Children).

Message ``seq`` of a stream is derived from ``seq`` alone (``make_message``),
so a reader checks every message it gets, byte for byte, without the writer
telling it anything."""

import random
import time

import numpy as np
from mp_helpers import BARRIER_TIMEOUT, child

import msgq
from visionipc.ordered import OrderedFrameWriter


def make_message(seq: int, chunk_bytes: int):
    """Message ``seq``: raw bytes, a numpy array or a dict, of random sizes
    from empty to three chunks (so some overflow to the side channel)."""
    rng = random.Random(seq)
    size = rng.choice([0, 1, 100, rng.randrange(chunk_bytes // 2), rng.randrange(chunk_bytes, 3 * chunk_bytes)])
    kind = seq % 3
    if kind == 0:
        return rng.randbytes(size)
    if kind == 1:
        return np.frombuffer(rng.randbytes(size - size % 8), dtype=np.float64).reshape(-1, 1)
    return {"seq": seq, "blob": rng.randbytes(size), "tail": [seq] * 3}


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


def send_message(queue, seq: int, chunk_bytes: int, timeout=None):
    msg = make_message(seq, chunk_bytes)
    if isinstance(msg, bytes):
        queue.enqueue_bytes(msg, timeout=timeout)
    else:
        queue.enqueue(msg, timeout=timeout)


@child
def broadcast_reader(name, results, handle, rank, count, chunk_bytes, stall_s=0.0, pause_every=0, pause_s=0.0):
    """Reader ``rank``: receive ``count`` messages and check each against
    make_message; optionally slow: a stall of ``stall_s`` after the first message
    (the writer is surely sending then, however late the processes started), pauses."""
    queue = msgq.BroadcastQueue.create_from_handle(handle, rank)
    bad, first_bad = 0, None
    for seq in range(count):
        got = queue.dequeue(timeout=60)
        if seq == 0:
            time.sleep(stall_s)
        if not same(got, make_message(seq, chunk_bytes)):
            bad += 1
            first_bad = first_bad if first_bad is not None else seq
        if pause_every and seq % pause_every == 0:
            time.sleep(pause_s)
    try:
        queue.dequeue(timeout=0.2)
        extra = True
    except TimeoutError:
        extra = False
    queue.close()
    results.put((name, {"count": count, "bad": bad, "first_bad": first_bad, "extra": extra}))


@child
def ordered_hold_then_publish(name, results, topic, reserved, release, payload):
    """Reserve the next id, say which, and publish ``payload`` only once ``release`` is set."""
    producer = msgq.OrderedProducer(topic)
    res = producer.reserve(timeout=10)
    results.put((name, {"id": res.id}))
    reserved.set()
    release.wait(BARRIER_TIMEOUT)
    res.data[: len(payload)] = payload
    res.publish(len(payload))
    producer.close()


@child
def ordered_reserve_and_publish_now(name, results, topic, after, payload):
    """Once ``after`` is set, reserve the next id and publish ``payload`` at once."""
    after.wait(BARRIER_TIMEOUT)
    producer = msgq.OrderedProducer(topic)
    id_ = producer.send(payload, timeout=10)
    producer.close()
    results.put((name, {"id": id_}))


def ordered_payload(id_: int) -> bytes:
    rng = random.Random(id_)
    return id_.to_bytes(8, "little") + rng.randbytes(rng.randrange(0, 200))


@child
def ordered_producer(name, results, topic, count, seed, barrier):
    """Publish ``count`` messages, each made of its own id, with random work
    between reserve and publish so producers finish out of order."""
    producer = msgq.OrderedProducer(topic)
    rng = random.Random(seed)
    barrier.wait(BARRIER_TIMEOUT)
    ids = []
    for _ in range(count):
        with producer.reserve(timeout=30) as res:
            time.sleep(rng.choice([0, 0, 0.0005, 0.002]))
            data = ordered_payload(res.id)
            res.data[: len(data)] = data
            res.size = len(data)
        ids.append(res.id)
    producer.close()
    results.put((name, {"ids": ids}))


@child
def frame_worker(name, results, server, stream, width, height, count, seed, barrier):
    """A VisionIPC worker: fill ``count`` gray8 frames with their frame id, taking random time per frame."""
    writer = OrderedFrameWriter(server, stream, width, height, "gray8", count=32)
    rng = random.Random(seed)
    barrier.wait(BARRIER_TIMEOUT)
    ids = []
    for _ in range(count):
        frame = writer.get_buffer(timeout=30)
        time.sleep(rng.choice([0, 0.001, 0.004]))
        frame.array[:] = frame.frame_id % 251
        frame.array[0, :8] = np.frombuffer(frame.frame_id.to_bytes(8, "little"), dtype=np.uint8)
        writer.send(frame, timestamp_sof=frame.frame_id * 10, timestamp_eof=frame.frame_id * 10 + 1)
        ids.append(frame.frame_id)
    writer.close()
    results.put((name, {"ids": ids}))
