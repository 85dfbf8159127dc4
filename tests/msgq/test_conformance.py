"""One behaviour, every backend: the same tests run against msgq (shared
memory), zmq (ZeroMQ TCP) and fake (shared memory with the fake-event hooks,
here disabled). Backend-specific behaviour lives in each backend's own tests.

Subscribers wait for the publisher to see them (``wait_for_readers``) before
the first send: a no-op for shared memory, the cure for ZeroMQ's slow joiner.
"""

import asyncio
import multiprocessing
import os
import random
import select
import threading
import time

import numpy as np
import pytest

import msgq
from msgq.testing import unique_topic

BACKENDS = ["msgq", "zmq", "fake"]
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("MSGQ_BACKEND", request.param)
    return request.param


def connected(topic, n_subs=1, **sub_kwargs):
    pub = msgq.pub_sock(topic)
    subs = [msgq.sub_sock(topic, timeout=5000, **sub_kwargs) for _ in range(n_subs)]
    assert pub.wait_for_readers(n_subs, timeout=10), "subscribers never reached the publisher"
    return pub, subs


def test_sockets_use_the_chosen_backend(backend):
    pub, (sub,) = connected(unique_topic())
    assert pub._backend.NAME == backend == sub._backend.NAME


def test_messages_of_random_sizes_arrive_intact_and_in_order(backend):
    pub, subs = connected(unique_topic(), n_subs=3)
    rng = random.Random(7)
    sent = [rng.randbytes(rng.choice([0, 1, 8, 100, 4096, 100_000])) for _ in range(200)]
    for i, m in enumerate(sent):
        pub.send(m)
        if i % 20 == 19:  # stay well inside every backend's buffering
            for sub in subs:
                assert [sub.receive() for _ in range(20)] == sent[i - 19 : i + 1]


def test_receive_times_out_with_none_and_non_blocking_returns_at_once(backend):
    pub, (sub,) = connected(unique_topic())
    sub.setTimeout(30)
    assert sub.receive() is None
    assert sub.receive(non_blocking=True) is None
    pub.send(b"x")
    assert msgq.drain_sock_raw(sub, wait_for_one=True) == [b"x"]


def test_conflating_subscriber_gets_the_newest(backend):
    pub, (sub,) = connected(unique_topic(), conflate=True)
    sent = [b"%d" % i for i in range(50)] + [b"last"]
    for m in sent:
        pub.send(m)
    got = []
    while not got or got[-1] != b"last":  # over TCP the newest may still be in flight
        msg = sub.receive()
        assert msg is not None, f"never got the newest message; got {got}"
        got.append(msg)
    assert len(got) < len(sent) / 2  # older messages were dropped, not queued
    assert [sent.index(m) for m in got] == sorted(sent.index(m) for m in got)


def test_receive_batch_and_iteration(backend):
    pub, (sub,) = connected(unique_topic())
    for i in range(10):
        pub.send(bytes([i]))
    got = sub.receive_batch(4, timeout=5000)
    assert got == [bytes([i]) for i in range(len(got))] and 1 <= len(got) <= 4
    sub.setTimeout(500)
    assert got + list(sub) == [bytes([i]) for i in range(10)]


def test_poller_returns_exactly_the_ready_sockets(backend):
    topics = [unique_topic() for _ in range(4)]
    pubs = [msgq.pub_sock(t) for t in topics]
    poller = msgq.Poller()
    subs = [msgq.sub_sock(t, poller=poller) for t in topics]
    for p in pubs:
        assert p.wait_for_readers(1, timeout=10)
    assert poller.poll(20) == []
    pubs[1].send(b"one")
    pubs[3].send(b"three")
    ready, deadline = set(), time.monotonic() + 10
    while len(ready) < 2 and time.monotonic() < deadline:  # over TCP the two may arrive apart
        ready |= set(poller.poll(1000))
    assert ready == {subs[1], subs[3]}
    assert subs[1].receive(non_blocking=True) == b"one"
    assert subs[3].receive(non_blocking=True) == b"three"


def test_loaned_message_is_published_on_commit_and_dropped_on_cancel(backend):
    pub, (sub,) = connected(unique_topic())
    loan = pub.loan(16)
    loan.cancel()
    with pub.loan(5) as buf:
        buf[:] = b"hello"
    assert sub.receive() == b"hello"
    sub.setTimeout(50)
    assert sub.receive() is None


@pytest.mark.parametrize("payload", [bytearray(b"ab"), memoryview(b"xyz"), np.arange(3, dtype=np.uint16)])
def test_send_takes_buffers(backend, payload):
    pub, (sub,) = connected(unique_topic())
    pub.send(payload)
    assert sub.receive() == bytes(memoryview(payload).cast("B"))


@pytest.mark.parametrize("payload", ["text", 5, np.arange(10)[::2]])
def test_send_refuses_other_types(backend, payload):
    pub = msgq.pub_sock(unique_topic())
    with pytest.raises(TypeError):
        pub.send(payload)


def test_invalid_names_and_use_after_close(backend):
    with pytest.raises(msgq.InvalidNameError):
        msgq.pub_sock("../etc")
    with pytest.raises(msgq.InvalidNameError):
        msgq.sub_sock("")
    pub, (sub,) = connected(unique_topic())
    pub.close()
    sub.close()
    with pytest.raises(msgq.ClosedError):
        pub.send(b"x")
    with pytest.raises(msgq.ClosedError):
        sub.receive()


@pytest.mark.parametrize("wake", ["all", "handoff"])
def test_the_wake_mode_is_chosen_checked_and_every_sleeper_still_gets_each_message(backend, monkeypatch, wake):
    monkeypatch.delenv("MSGQ_WAKE", raising=False)
    topic = unique_topic()
    with pytest.raises(msgq.InvalidArgumentError, match="wake must be 'all' or 'handoff', not 'some'"):
        msgq.pub_sock(topic, wake="some")
    monkeypatch.setenv("MSGQ_WAKE", "bogus")
    with pytest.raises(msgq.InvalidArgumentError, match="MSGQ_WAKE must be"):
        msgq.pub_sock(topic)
    monkeypatch.setenv("MSGQ_WAKE", wake)
    assert msgq.pub_sock(unique_topic()).wake == wake  # the environment's mode
    monkeypatch.delenv("MSGQ_WAKE")
    assert msgq.pub_sock(unique_topic()).wake == "all"  # the default
    # The refusals made nothing: the topic is free for this publisher.
    pub = msgq.pub_sock(topic, wake=wake)
    subs = [msgq.sub_sock(topic, timeout=5000) for _ in range(3)]
    assert pub.wake == wake and pub.wait_for_readers(3, timeout=10)
    got = {}

    def receive_two(i, sub):
        got[i] = [sub.receive(), sub.receive()]

    threads = [threading.Thread(target=receive_two, args=(i, s)) for i, s in enumerate(subs)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # every subscriber asleep in receive()
    pub.send(b"one")
    time.sleep(0.05)
    pub.send(b"two")
    for t in threads:
        t.join(10)
    assert got == {i: [b"one", b"two"] for i in range(3)}
    assert 0 <= pub.readers_woken <= (2 if wake == "handoff" else 6)


def test_fileno_becomes_readable_for_select(backend):
    pub, (sub,) = connected(unique_topic())
    assert sub.arm() is False
    pub.send(b"wake")
    readable, _, _ = select.select([sub.fileno()], [], [], 10)
    assert readable == [sub.fileno()]
    sub.disarm()
    assert sub.receive() == b"wake"


def test_receive_async_awaits_without_threads(backend):
    pub, (sub,) = connected(unique_topic())

    async def scenario():
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, pub.send, b"later")
        first = await sub.receive_async(timeout=10)
        nothing = await sub.receive_async(timeout=0.05)
        return first, nothing

    assert asyncio.run(scenario()) == (b"later", None)


@pytest.mark.parametrize("closer", ["task", "thread"])
def test_close_ends_a_receive_async_waiting_with_closed_error(backend, closer):
    """close() from another task of the loop, or from another thread while the loop
    runs in its own, wakes a receive_async() waiting without a timeout: ClosedError
    (it waited forever, either way, on every backend; on msgq and fake the close also
    shut the wake-up descriptor the loop watched). Then a fresh socket waits and
    receives as usual (the loop is not left watching a stale descriptor)."""
    topic = unique_topic()
    pub, (sub,) = connected(topic)
    outcome = {}

    async def wait_on(s):
        try:
            outcome["got"] = await s.receive_async(timeout=None)
        except Exception as e:  # the assertion names it
            outcome["got"] = e

    async def in_the_loop():
        waiting = asyncio.create_task(wait_on(sub))
        await asyncio.sleep(0.2)
        if closer == "task":
            sub.close()
        else:
            threading.Thread(target=sub.close).start()
        await asyncio.wait_for(waiting, 10)
        fresh = msgq.sub_sock(topic)
        assert pub.wait_for_readers(1, timeout=10)
        asyncio.get_running_loop().call_later(0.05, pub.send, b"again")
        again = await fresh.receive_async(timeout=10)
        fresh.close()
        return again

    assert asyncio.run(in_the_loop()) == b"again"
    assert type(outcome["got"]) is msgq.ClosedError, outcome
    pub.close()


def test_two_threads_sending_on_one_publisher_get_a_clear_error_and_no_torn_message(backend):
    """A publisher is used by one thread at a time. Two threads sending 300 KB messages
    (sent without the GIL) on one anyway: a send that overlaps the other's raises
    IpcError saying so (msgq raised MultiplePublishersError: "another publisher (pid <our
    own>) took over ...; this one can no longer send"; zmq let both threads into libzmq's
    send at once), every message that arrives is whole, and the publisher goes on."""
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=8 << 20)
    sub = msgq.sub_sock(topic, timeout=2000)
    assert pub.wait_for_readers(1, timeout=10)
    size, errors, sent = 300_000, [], []

    def send(tag):
        for _ in range(150):
            try:
                pub.send(bytes([tag]) * size)
                sent.append(tag)
            except Exception as e:  # the assertion below names it
                errors.append(e)

    threads = [threading.Thread(target=send, args=(tag,)) for tag in (1, 2)]
    for t in threads:
        t.start()
    received = []
    while (m := sub.receive()) is not None:
        assert len(m) == size and m.count(m[:1]) == size, "a torn message"
        received.append(m[0])
    for t in threads:
        t.join()
    for e in errors:
        assert type(e) is msgq.IpcError and "another thread is inside a send()" in str(e), repr(e)
    # The ring may lap the reader: a reader overwritten is reset to the newest message (the
    # reference's rule), so one starved by a loaded machine (2 of 25 runs beside stress-ng)
    # may see none of the race's messages; what it sees is whole, and "after" reaches it.
    assert sent and all(received.count(tag) <= sent.count(tag) for tag in (1, 2))
    pub.send(b"after")
    assert sub.receive() == b"after"
    sub.close()
    pub.close()


def _echo(topic_in, topic_out, count, backend):
    os.environ["MSGQ_BACKEND"] = backend
    sub = msgq.sub_sock(topic_in, timeout=20000)
    pub = msgq.pub_sock(topic_out)
    pub.wait_for_readers(1, timeout=20)
    for _ in range(count):
        msg = sub.receive()
        if msg is None:
            return
        pub.send(msg[::-1])


def test_messages_cross_process_boundaries(backend):
    ping, pong = unique_topic("ping"), unique_topic("pong")
    pub = msgq.pub_sock(ping)
    sub = msgq.sub_sock(pong, timeout=20000)
    child = SPAWN.Process(target=_echo, args=(ping, pong, 20, backend))
    child.start()
    try:
        assert pub.wait_for_readers(1, timeout=30)
        for i in range(20):
            msg = os.urandom(i * 50)
            pub.send(msg)
            assert sub.receive() == msg[::-1]
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
