"""Blocking receive semantics: waking across processes, timeouts, sleeping
(not spinning) while idle, the GIL released while waiting, Ctrl-C, no signal
handlers installed, Poller over many topics, and fileno() readiness with
select and asyncio.

Timing is checked only as behaviour: a wait lasts at least its timeout (a lower
bound no machine can break), and ends (an upper bound only against a hang, far
above any wake-up on a loaded machine); speed is the benchmarks' business.
"""

import asyncio
import os
import random
import select
import signal
import threading
import time

import mp_helpers
import pytest
from mp_helpers import SPAWN, Children, wait_until_asleep

import msgq
from msgq.testing import unique_topic

SLACK_S = 20.0  # only against a hang: any wake-up, even on a loaded 2-core machine, is far sooner


@pytest.mark.timeout(60)
def test_receive_without_timeout_blocks_until_another_process_sends():
    topic = unique_topic()
    payload = os.urandom(333)
    ready = SPAWN.Event()
    with msgq.pub_sock(topic) as pub, Children() as children:
        waiter = children.start(mp_helpers.receive_blocking_and_measure, "waiter", topic, ready)
        assert ready.wait(60)
        assert wait_until_asleep(waiter.pid), "the receiving process never went to sleep"
        assert children.results.empty()  # still waiting: nothing was sent
        pub.send(payload)
        report = children.collect(["waiter"], timeout=30)["waiter"]
    assert report["message"] == payload


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout_ms", [0, 50, 300])
def test_receive_with_a_timeout_returns_none_once_it_has_passed(timeout_ms):
    topic = unique_topic()
    with msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=timeout_ms) as sub:
        assert sub.timeout == timeout_ms
        start = time.monotonic()
        assert sub.receive() is None
        elapsed = time.monotonic() - start
    assert timeout_ms / 1000 <= elapsed < timeout_ms / 1000 + SLACK_S


@pytest.mark.timeout(60)
def test_set_timeout_changes_how_long_receive_waits():
    topic = unique_topic()
    with msgq.pub_sock(topic), msgq.sub_sock(topic) as sub:
        assert sub.timeout is None
        sub.setTimeout(200)
        start = time.monotonic()
        assert sub.receive() is None
        assert 0.2 <= time.monotonic() - start < 0.2 + SLACK_S
        start = time.monotonic()
        assert sub.receive(non_blocking=True) is None
        assert time.monotonic() - start < SLACK_S


@pytest.mark.timeout(60)
def test_receive_batch_waits_up_to_its_timeout_for_the_first_message():
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic) as sub:
        start = time.monotonic()
        assert sub.receive_batch(10, timeout=150) == []
        assert 0.15 <= time.monotonic() - start < 0.15 + SLACK_S
        for i in range(3):
            pub.send(bytes([i]))
        assert sub.receive_batch(10, timeout=150) == [b"\x00", b"\x01", b"\x02"]


@pytest.mark.timeout(60)
def test_a_message_that_arrives_during_a_timed_receive_is_returned_before_the_timeout():
    topic = unique_topic()
    ready = SPAWN.Event()
    timeout_ms = 30_000
    with msgq.pub_sock(topic) as pub, Children() as children:
        waiter = children.start(mp_helpers.receive_blocking_and_measure, "waiter", topic, ready, timeout_ms)
        assert ready.wait(60) and wait_until_asleep(waiter.pid)
        pub.send(b"in time")
        report = children.collect(["waiter"], timeout=30)["waiter"]
    assert report["message"] == b"in time"
    assert report["wall_s"] < timeout_ms / 1000


@pytest.mark.timeout(60)
def test_idle_subscribers_sleep_instead_of_spinning():
    """Blocked ~1.5 s in receive() (without and with a timeout) or in
    Poller.poll(), each child uses almost no CPU: it sleeps, it does not spin."""
    idle_s = 1.5
    cpu_budget_s = 0.15
    topics = [unique_topic() for _ in range(3)]
    ready = [SPAWN.Event() for _ in range(3)]
    with msgq.pub_sock(topics[0]) as pub, Children() as children:
        children.start(mp_helpers.receive_blocking_and_measure, "forever", topics[0], ready[0])
        children.start(mp_helpers.receive_blocking_and_measure, "timed", topics[1], ready[1], int(idle_s * 1000))
        children.start(mp_helpers.poll_blocking_and_measure, "polling", topics[1:], ready[2], int(idle_s * 1000))
        assert all(e.wait(60) for e in ready)
        time.sleep(idle_s)
        pub.send(b"wake")
        reports = children.collect(["forever", "timed", "polling"], timeout=30)
    assert reports["forever"]["message"] == b"wake"
    assert reports["timed"]["message"] is None
    assert reports["polling"]["ready"] == []
    for name, report in reports.items():
        assert report["wall_s"] >= 0.9 * idle_s, name  # it really was blocked that long
        assert report["cpu_s"] < cpu_budget_s, f"{name} used {report['cpu_s']:.3f} s of CPU while idle"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["receive", "receive_batch", "poll"])
def test_the_gil_is_released_while_a_thread_waits(how):
    """Another thread keeps running Python code while one thread waits. (Run
    in a child: if the wait held the GIL, that process would hang and the
    watchdog kills it.)"""
    with Children() as children:
        children.start(mp_helpers.count_while_other_thread_blocks, "counter", unique_topic(), how, 0.3)
        report = children.collect(["counter"], timeout=45)["counter"]
    assert report["woken"] and report["result_count"] == 1
    assert report["iterations"] > 1000  # a Python loop makes millions a second; a held GIL makes none


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout_ms", [None, 1000], ids=["no_timeout", "timeout"])
def test_closing_a_subscriber_ends_a_receive_waiting_on_it_in_another_thread(timeout_ms):
    """close() from one thread while another blocks in receive(): the wait
    ends (ClosedError, or None) instead of hanging or touching the unmapped
    ring. (In a child, so a crash fails the test instead of killing pytest.)"""
    with Children() as children:
        children.start(mp_helpers.close_while_another_thread_waits, "closer", unique_topic(), timeout_ms)
        report = children.collect(["closer"], timeout=45)["closer"]
    assert report["ended"], "the waiting thread is still blocked 5 s after close()"
    assert report["outcome"] in ([("raised", "ClosedError")], [("returned", "None")])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["receive", "receive_batch", "poll"])
def test_ctrl_c_interrupts_a_blocked_wait_with_keyboard_interrupt(how):
    topic = unique_topic()
    ready = SPAWN.Event()
    with Children() as children:
        waiter = children.start(mp_helpers.wait_for_ctrl_c, "waiter", topic, how, ready)
        assert ready.wait(60) and wait_until_asleep(waiter.pid)
        interrupted_at = time.monotonic()
        os.kill(waiter.pid, signal.SIGINT)
        report = children.collect(["waiter"], timeout=SLACK_S + 10)["waiter"]
        reported_after = time.monotonic() - interrupted_at
        waiter.join(30)
    assert report["outcome"] == "KeyboardInterrupt"
    assert reported_after < SLACK_S + 3  # promptly, on the scale of a loaded machine
    assert waiter.exitcode == 0  # it caught the interrupt, closed its socket and exited cleanly


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["receive", "poll"])
def test_python_signal_handlers_run_during_a_wait_and_the_wait_goes_on(how):
    """A signal whose Python handler returns normally runs its handler while
    the main thread waits, and the wait then continues to its timeout."""
    timeout_s = 1.0
    handled = []
    main = threading.get_ident()
    stop = threading.Event()

    def poke():
        while not stop.wait(0.05):
            signal.pthread_kill(main, signal.SIGUSR1)

    topic = unique_topic()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(time.monotonic()))
    poker = threading.Thread(target=poke, daemon=True)
    try:
        with msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=int(timeout_s * 1000)) as sub:
            poller = msgq.Poller()
            poller.registerSocket(sub)
            wait = sub.receive if how == "receive" else lambda: poller.poll(int(timeout_s * 1000))
            poker.start()
            start = time.monotonic()
            result = wait()
            end = time.monotonic()
            stop.set()
            poker.join(10)
    finally:
        stop.set()
        signal.signal(signal.SIGUSR1, previous)
    assert result in (None, [])
    assert timeout_s <= end - start < timeout_s + SLACK_S
    during = [t for t in handled if start <= t < end]
    assert len(during) >= 2, f"handlers ran {len(handled)} times, {len(during)} of them during the wait"


@pytest.mark.timeout(60)
def test_the_library_installs_no_signal_handler():
    """Neither Python's handler table nor the kernel's masks of caught,
    ignored and blocked signals change when a process uses sockets, polls,
    selects and loans (the reference replaces SIGUSR2 handlers)."""
    with Children() as children:
        children.start(mp_helpers.signal_state_around_sockets, "user", unique_topic())
        report = children.collect(["user"], timeout=45)["user"]
    before, after = report["before"], report["after"]
    assert after["kernel"] == before["kernel"]
    assert after["python"] == before["python"]
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM):
        assert after["python"][int(sig)] == before["python"][int(sig)]


def test_the_library_installs_no_signal_handler_in_this_process_either():
    watched = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE]
    before = {sig: signal.getsignal(sig) for sig in watched}
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=10) as sub:
        poller = msgq.Poller()
        poller.registerSocket(sub)
        pub.send(b"x")
        assert poller.poll(10) == [sub]
        assert sub.receive() == b"x"
    assert {sig: signal.getsignal(sig) for sig in watched} == before


@pytest.fixture
def twenty_topics():
    """20 topics, each with a publisher and a subscriber registered in one Poller."""
    topics = [unique_topic() for _ in range(20)]
    pubs = [msgq.pub_sock(t) for t in topics]
    poller = msgq.Poller()
    subs = [msgq.sub_sock(t, poller=poller) for t in topics]
    yield topics, pubs, subs, poller
    for sock in subs + pubs:
        sock.close()


@pytest.mark.timeout(60)
def test_poller_returns_exactly_the_sockets_with_a_message(twenty_topics):
    topics, pubs, subs, poller = twenty_topics
    assert len(poller) == len(subs)
    rng = random.Random(7)
    for _ in range(30):
        chosen = sorted(rng.sample(range(len(topics)), rng.randint(1, len(topics))))
        for i in chosen:
            pubs[i].send(topics[i].encode())
        ready = poller.poll(1000)
        assert len(ready) == len(set(map(id, ready)))
        assert {id(s) for s in ready} == {id(subs[i]) for i in chosen}
        for s in ready:
            assert s.receive(non_blocking=True) == s.endpoint.encode()
            assert s.receive(non_blocking=True) is None
        assert poller.poll(0) == []


@pytest.mark.timeout(60)
def test_poll_returns_an_empty_list_when_its_timeout_passes(twenty_topics):
    _, _, _, poller = twenty_topics
    for timeout_ms in (0, 200):
        start = time.monotonic()
        assert poller.poll(timeout_ms) == []
        assert timeout_ms / 1000 <= time.monotonic() - start < timeout_ms / 1000 + SLACK_S


@pytest.mark.timeout(60)
def test_a_poller_is_woken_by_a_publisher_in_another_process():
    topics = [unique_topic() for _ in range(20)]
    target = 13
    poller = msgq.Poller()
    subs = [msgq.sub_sock(t, poller=poller) for t in topics]
    try:
        with Children() as children:
            children.start(mp_helpers.publish_later, "publisher", [(topics[target], b"from afar")], 0.5)
            start = time.monotonic()
            ready = poller.poll(30_000)
            waited = time.monotonic() - start
            children.collect(["publisher"], timeout=30)
        assert ready == [subs[target]]
        assert waited < 30
        assert subs[target].receive(non_blocking=True) == b"from afar"
    finally:
        for sub in subs:
            sub.close()


@pytest.mark.timeout(60)
def test_a_poller_in_another_process_is_woken_by_a_publisher_here():
    topics = [unique_topic() for _ in range(20)]
    target = 4
    ready = SPAWN.Event()
    pubs = [msgq.pub_sock(t) for t in topics]
    try:
        with Children() as children:
            poller_proc = children.start(mp_helpers.poll_blocking_and_measure, "poller", topics, ready, 30_000)
            assert ready.wait(60) and wait_until_asleep(poller_proc.pid)
            pubs[target].send(b"wake")
            report = children.collect(["poller"], timeout=30)["poller"]
    finally:
        for pub in pubs:
            pub.close()
    assert report["ready"] == [topics[target]]
    assert report["messages"] == {topics[target]: b"wake"}
    assert report["wall_s"] < 30


@pytest.mark.timeout(60)
def test_fileno_becomes_readable_in_select_once_a_message_arrives():
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic) as sub:
        fd = sub.fileno()
        assert sub.arm() is False  # nothing there: armed
        assert select.select([fd], [], [], 0.05) == ([], [], [])
        pub.send(b"first")
        assert select.select([fd], [], [], 10) == ([fd], [], [])
        sub.disarm()
        assert sub.receive(non_blocking=True) == b"first"

        pub.send(b"second")
        assert sub.arm() is True  # already waiting: do not select at all
        assert sub.receive(non_blocking=True) == b"second"

        assert sub.arm() is False
        with Children() as children:
            children.start(mp_helpers.publish_later, "publisher", [(topic, b"third")], 0.3)
            assert select.select([fd], [], [], 30) == ([fd], [], [])
            children.collect(["publisher"], timeout=30)
        sub.disarm()
        assert select.select([fd], [], [], 0) == ([], [], [])  # disarm drained the wake-up
        assert sub.receive(non_blocking=True) == b"third"


async def next_message(sock):
    """The next message of ``sock``, waiting in the event loop (the example of
    asyncio integration: arm, add_reader on fileno(), disarm)."""
    loop = asyncio.get_running_loop()
    while True:
        msg = sock.receive(non_blocking=True)
        if msg is not None:
            return msg
        if sock.arm():  # a message came between the receive and arming
            continue
        readable = loop.create_future()
        loop.add_reader(sock.fileno(), lambda fut: fut.done() or fut.set_result(None), readable)
        try:
            await readable
        finally:
            loop.remove_reader(sock.fileno())
            sock.disarm()


@pytest.mark.timeout(60)
def test_asyncio_coroutines_wait_on_sockets_through_add_reader():
    topics = [unique_topic() for _ in range(3)]
    per_topic = 5
    sent = {t: [f"{t}:{i}".encode() for i in range(per_topic)] for t in topics}
    subs = [msgq.sub_sock(t) for t in topics]

    async def collect(sub):
        return [await next_message(sub) for _ in range(per_topic)]

    async def main(children):
        ticks = 0

        async def ticker():  # the loop stays free while coroutines wait
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        for i, t in enumerate(topics):
            children.start(mp_helpers.publish_paced, f"publisher{i}", t, sent[t], 0.05)
        got = await asyncio.wait_for(asyncio.gather(*(collect(s) for s in subs)), timeout=30)
        tick_task.cancel()
        return got, ticks

    try:
        with Children() as children:
            got, ticks = asyncio.run(main(children))
            children.collect([f"publisher{i}" for i in range(len(topics))], timeout=30)
    finally:
        for sub in subs:
            sub.close()
    assert got == [sent[t] for t in topics]
    assert ticks > 0
