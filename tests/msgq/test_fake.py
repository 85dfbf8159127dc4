"""The fake backend and its events: a test decides when each receive() runs
and learns when the consumer has processed what it got, with no sleeps.

The first half reproduces the reference's own fake tests (commaai/msgq
``msgq/tests/test_fake.py``); the rest covers what we add: cleanup, names,
owner-only files, a harness that dies, Ctrl-C, and a lockstep replay that is
byte-identical across fresh consumer processes.
"""

import collections
import inspect
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import msgq
from msgq.names import segment_dir
from msgq.testing import unique_topic

WAIT = 30  # seconds: only ever reached when something hangs
FAKE_ENV = ("CEREAL_FAKE", "CEREAL_FAKE_PREFIX", "MSGQ_BACKEND")


@pytest.fixture(autouse=True)
def restore_fake_env():
    saved = {k: os.environ.get(k) for k in FAKE_ENV}
    os.environ.pop("MSGQ_BACKEND", None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(params=[None, "test"], ids=["no-fake-prefix", "fake-prefix"])
def fake_sockets(request):
    """Sockets use the fake backend, with or without CEREAL_FAKE_PREFIX (as in the reference)."""
    msgq.toggle_fake_events(True)
    if request.param is None:
        msgq.delete_fake_prefix()
    else:
        msgq.set_fake_prefix(request.param)
    yield request.param
    msgq.toggle_fake_events(False)
    msgq.delete_fake_prefix()


def fake_files(prefix):
    start = f"msgq@{prefix}@fake"
    return sorted(n for n in os.listdir(segment_dir()) if n.startswith(start))


def python(code, *args, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-P", "-c", textwrap.dedent(code), *args], env=env, **kwargs)


# --- the reference's event tests ------------------------------------------------------


def test_set_clear_and_peek_mutate_an_event():
    handle = msgq.fake_event_handle(unique_topic())
    event = handle.recv_called_event
    assert not event.peek()
    event.set()
    assert event.peek()
    event.set()
    assert event.clear() == 2  # how many set() calls it absorbed
    assert not event.peek()
    assert event.clear() == 0


def test_wait_returns_once_the_event_is_set():
    handle = msgq.fake_event_handle(unique_topic())
    event = handle.recv_called_event
    event.set()
    event.wait(WAIT)
    assert event.peek()  # waiting does not clear


def test_wait_wakes_when_another_process_sets_the_event():
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic)
    event = handle.recv_called_event
    child = python(
        """
        import sys, msgq
        msgq.fake_event_handle(sys.argv[1], identifier="", override=False).recv_called_event.set()
        """,
        topic,
    )
    try:
        event.wait(WAIT)
        assert event.peek()
    finally:
        assert child.wait(WAIT) == 0


def test_zero_timeout_raises_runtime_error():
    event = msgq.fake_event_handle(unique_topic()).recv_called_event
    with pytest.raises(RuntimeError) as info:
        event.wait(0)
    assert isinstance(info.value, msgq.IpcTimeoutError) and isinstance(info.value, TimeoutError)
    assert not event.peek()


def test_wait_for_one_returns_the_index_of_the_set_event():
    handles = [msgq.fake_event_handle(unique_topic()) for _ in range(3)]
    handles[1].recv_called_event.set()
    assert msgq.wait_for_one_event([h.recv_called_event for h in handles], WAIT) == 1
    with pytest.raises(RuntimeError):
        msgq.wait_for_one_event([handles[0].recv_called_event, handles[2].recv_ready_event], 0)


# --- the reference's fake socket tests ---------------------------------------------------


def test_event_handle_starts_disabled_with_valid_events(fake_sockets):
    handle = msgq.fake_event_handle(unique_topic(), override=True)
    assert not handle.enabled
    assert handle.recv_called_event.fd >= 0
    assert handle.recv_ready_event.fd >= 0


def test_non_managed_socket_has_no_event_state(fake_sockets):
    topic = unique_topic()
    _pub = msgq.pub_sock(topic)
    handle = msgq.fake_event_handle(topic, override=False)
    assert not handle.enabled
    assert handle.recv_called_event.fd == -1
    assert handle.recv_ready_event.fd == -1
    with pytest.raises(msgq.IpcError, match="override=True"):
        handle.enabled = True  # there are no events to enable: say so instead of failing later


def test_creating_sockets_leaves_a_managed_state_unchanged(fake_sockets):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic)
    handle.enabled = True
    expected = (handle.enabled, handle.recv_called_event.fd, handle.recv_ready_event.fd)
    _pub = msgq.pub_sock(topic)
    _sub = msgq.sub_sock(topic)
    assert (handle.enabled, handle.recv_called_event.fd, handle.recv_ready_event.fd) == expected


def test_receive_signals_recv_called_only_while_enabled(fake_sockets):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    recv_called, recv_ready = handle.recv_called_event, handle.recv_ready_event
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic)
    assert sub._backend.NAME == "fake"

    recv_ready.set()  # released in advance: the receive does not wait
    pub.send(b"test")
    assert sub.receive() == b"test"
    assert recv_called.peek()
    assert not recv_ready.peek()  # the receive consumed the release
    recv_called.clear()

    handle.enabled = False
    recv_ready.set()
    pub.send(b"test")
    assert sub.receive() == b"test"
    assert not recv_called.peek()


DAEMON = """
import sys, msgq
pub = msgq.pub_sock(sys.argv[1])
sub = msgq.sub_sock(sys.argv[2])
frame = 0
while True:
    msg = sub.receive(non_blocking=True)  # each call waits for the harness
    if msg is None:
        continue
    pub.send(frame.to_bytes(8, "little"))
    frame += 1
"""


def test_synced_pub_sub_with_a_republishing_daemon(fake_sockets):
    car_state, ublox = unique_topic("carState"), unique_topic("ubloxGnss")
    handle = msgq.fake_event_handle(car_state, enable=True)
    recv_called, recv_ready = handle.recv_called_event, handle.recv_ready_event
    pub = msgq.pub_sock(car_state)
    daemon = python(DAEMON, ublox, car_state)
    try:
        recv_called.wait(WAIT)  # the daemon is connected and inside its first receive
        sub = msgq.sub_sock(ublox, timeout=WAIT * 1000)
        for i in range(10):
            recv_called.wait(WAIT)
            recv_called.clear()
            pub.send(i.to_bytes(8, "little"))
            recv_ready.set()
            recv_called.wait(WAIT)  # it processed the message and asks for the next
            msg = sub.receive()
            assert msg is not None and int.from_bytes(msg, "little") == i
    finally:
        daemon.kill()
        daemon.wait()


# --- lockstep replay: byte-identical output on every run ----------------------------------


def consume(sub, pub):
    """The consumer under test: for each receive (a message or nothing yet),
    publish a function of what it got and of its own running state."""
    import hashlib

    state = hashlib.blake2b(b"consumer", digest_size=8)
    step = 0
    while True:
        msg = sub.receive(non_blocking=True)
        if msg == b"stop":
            return
        step += 1
        state.update(b"." if msg is None else b"+" + msg)
        pub.send(step.to_bytes(4, "little") + state.digest() + (msg or b"")[::-1])


def make_script(seed=1234, steps=40):
    """What the harness publishes before each receive (0, 1 or 2 messages),
    then empty steps until the backlog is consumed; the same on every run."""
    rng = random.Random(seed)
    script = [[rng.randbytes(rng.randrange(1, 64)) for _ in range(rng.choice([0, 1, 1, 2]))] for _ in range(steps)]
    backlog = 0
    for batch in script:
        backlog = max(backlog + len(batch) - 1, 0)
    return script + [[] for _ in range(backlog)]


def expected_outputs(script):
    """The consumer's outputs derived independently: receive k gets the oldest
    message not yet received, if any."""
    import hashlib

    pending, state, out = collections.deque(), hashlib.blake2b(b"consumer", digest_size=8), []
    for step, batch in enumerate(script, 1):
        pending.extend(batch)
        msg = pending.popleft() if pending else None
        state.update(b"." if msg is None else b"+" + msg)
        out.append(step.to_bytes(4, "little") + state.digest() + (msg or b"")[::-1])
    assert not pending
    return out


def drive(handle, pub, outputs_sub, script):
    """Release the consumer one receive at a time; after each, collect exactly
    the one output it published before asking for the next message."""
    called, ready = handle.recv_called_event, handle.recv_ready_event
    outputs = []
    for step, batch in enumerate(script):
        called.wait(WAIT)  # inside receive: done with the previous step
        called.clear()
        if step:
            outputs.append(outputs_sub.receive(non_blocking=True))
            assert outputs_sub.receive(non_blocking=True) is None
        for msg in batch:
            pub.send(msg)
        ready.set()
    called.wait(WAIT)
    called.clear()
    outputs.append(outputs_sub.receive(non_blocking=True))
    pub.send(b"stop")
    ready.set()
    return outputs


CONSUMER_MAIN = inspect.getsource(consume) + textwrap.dedent("""
    import sys, msgq
    consume(msgq.sub_sock(sys.argv[1]), msgq.pub_sock(sys.argv[2]))
""")


def test_lockstep_replay_across_processes_is_byte_identical_on_every_run():
    script = make_script()
    runs = 20
    env = {k: v for k, v in os.environ.items() if k not in FAKE_ENV}
    env["CEREAL_FAKE"] = "1"  # only the consumers use the fake backend
    setups = []
    for run in range(runs):  # all consumers start at once; each waits in its first receive
        topic_in, topic_out = unique_topic("in"), unique_topic("out")
        handle = msgq.fake_event_handle(topic_in, identifier=f"replay{run}", enable=True)
        pub, outputs_sub = msgq.pub_sock(topic_in), msgq.sub_sock(topic_out)
        proc = python(CONSUMER_MAIN, topic_in, topic_out, env={**env, "CEREAL_FAKE_PREFIX": f"replay{run}"})
        setups.append((handle, pub, outputs_sub, proc))
    results = []
    try:
        for handle, pub, outputs_sub, _ in setups:
            results.append(drive(handle, pub, outputs_sub, script))
        assert [proc.wait(WAIT) for *_, proc in setups] == [0] * runs
    finally:
        for *_, proc in setups:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(results) == runs
    assert all(r == results[0] for r in results)
    assert results[0] == expected_outputs(script)
    assert any(o[4 + 8 :] == b"" for o in results[0]) and len(results[0]) > 40  # empty receives happened


def test_lockstep_replay_in_one_process(fake_sockets):
    script = make_script(seed=99, steps=25)
    topic_in, topic_out = unique_topic("in"), unique_topic("out")
    handle = msgq.fake_event_handle(topic_in, enable=True)
    pub, outputs_sub = msgq.pub_sock(topic_in), msgq.sub_sock(topic_out)
    consumer_sub = msgq.sub_sock(topic_in)
    consumer_pub = msgq.pub_sock(topic_out)
    thread = threading.Thread(target=consume, args=(consumer_sub, consumer_pub))
    thread.start()
    try:
        assert drive(handle, pub, outputs_sub, script) == expected_outputs(script)
    finally:
        thread.join(WAIT)
    assert not thread.is_alive()


# --- beyond the reference ---------------------------------------------------------------


def test_subscriber_follows_a_handle_created_after_it_connected_and_a_new_owner(fake_sockets):
    topic = unique_topic()
    pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=WAIT * 1000)
    for _ in range(2):  # the second owner takes over from the first
        handle = msgq.fake_event_handle(topic, enable=True)
        handle.recv_ready_event.set()
        pub.send(b"m")
        assert sub.receive() == b"m"
        assert handle.recv_called_event.clear() == 1
    assert sub._impl.events_enabled


def test_files_are_owner_only_and_removed_when_the_last_user_closes(fake_sockets, msgq_prefix):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    sub = msgq.sub_sock(topic)
    names = fake_files(msgq_prefix)
    assert len(names) == 3  # the state and the two FIFOs
    for name in names:
        mode = os.lstat(os.path.join(segment_dir(), name)).st_mode
        assert mode & 0o077 == 0
    assert sum(stat.S_ISFIFO(os.lstat(os.path.join(segment_dir(), n)).st_mode) for n in names) == 2
    handle.close()
    assert len(fake_files(msgq_prefix)) == 1  # the FIFOs go with their owner; the subscriber keeps the state
    assert not sub._impl.events_enabled  # the owner leaving hands the topic back to normal delivery
    sub.close()
    assert fake_files(msgq_prefix) == []
    with pytest.raises(msgq.ClosedError):
        handle.enabled = True
    with msgq.fake_event_handle(topic) as handle:
        assert len(fake_files(msgq_prefix)) == 3
    assert handle.closed and fake_files(msgq_prefix) == []


def test_garbage_collected_handle_removes_its_files(msgq_prefix):
    msgq.fake_event_handle(unique_topic())
    assert fake_files(msgq_prefix) == []
    event = msgq.fake_event_handle(unique_topic()).recv_ready_event  # an event keeps its handle alive
    event.set()
    assert event.peek() and len(fake_files(msgq_prefix)) == 3
    del event
    assert fake_files(msgq_prefix) == []


@pytest.mark.parametrize("endpoint, identifier", [("a/b", ""), ("..", ""), ("ok", "x/../y"), ("ok", "..")])
def test_names_are_validated(endpoint, identifier, msgq_prefix):
    with pytest.raises(msgq.InvalidNameError):
        msgq.fake_event_handle(endpoint, identifier=identifier)
    with pytest.raises(msgq.InvalidNameError):
        msgq.set_fake_prefix("a/b")
    assert fake_files(msgq_prefix) == []


def test_fake_prefix_round_trips_as_bytes_and_toggle_selects_the_backend():
    msgq.set_fake_prefix("proc1")
    assert msgq.get_fake_prefix() == b"proc1"
    msgq.delete_fake_prefix()
    assert msgq.get_fake_prefix() == b""
    msgq.toggle_fake_events(True)
    assert msgq.sub_sock(unique_topic())._backend.NAME == "fake"
    msgq.toggle_fake_events(False)
    assert msgq.sub_sock(unique_topic())._backend.NAME == "msgq"


def test_fake_poller_returns_enabled_sockets_at_once_and_otherwise_waits_like_msgq(fake_sockets):
    topics = [unique_topic() for _ in range(2)]
    pubs = [msgq.pub_sock(t) for t in topics]
    poller = msgq.Poller()
    subs = [msgq.sub_sock(t, poller=poller) for t in topics]
    assert poller.poll(10) == []
    pubs[1].send(b"x")
    assert poller.poll(WAIT * 1000) == [subs[1]]
    handle = msgq.fake_event_handle(topics[0], enable=True)
    assert poller.poll(WAIT * 1000) == subs  # enabled: ready at once (its receive waits for the harness)
    assert subs[0].ready()
    handle.enabled = False
    assert poller.poll(WAIT * 1000) == [subs[1]]


def test_waiting_releases_the_gil():
    event = msgq.fake_event_handle(unique_topic()).recv_ready_event
    thread = threading.Thread(target=lambda: (sum(range(200_000)), event.set()))
    thread.start()
    event.wait(WAIT)  # the thread can only run if the wait let go of the GIL
    thread.join()


def test_ctrl_c_interrupts_a_receive_waiting_for_the_harness(fake_sockets):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    sub = msgq.sub_sock(topic)
    main = threading.get_ident()

    def interrupt_once_waiting():
        handle.recv_called_event.wait(WAIT)  # the receive is in its handshake
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt_once_waiting)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        sub.receive()
    thread.join()


def test_no_wait_blocks_in_one_system_call_for_longer_than_a_signal_slice(monkeypatch):
    """A Ctrl-C that lands after Python last ran its handlers but before poll() blocks is no
    EINTR of that call (a stress run hung 5 minutes so in the test above): every wait, the
    harness handshake and Event.wait included, is made of bounded poll() calls, after each
    of which Python runs the pending handler."""
    from msgq import events

    timeouts, interrupt_at = [], [5]

    class Poller:
        def register(self, fd, mask):
            pass

        def poll(self, timeout_ms=None):
            timeouts.append(timeout_ms)
            if len(timeouts) == interrupt_at[0]:
                raise KeyboardInterrupt  # what the pending handler does once the call returns
            time.sleep((timeout_ms if timeout_ms is not None else 10_000) / 1000)  # nothing ready
            return []

    monkeypatch.setattr(events.select, "poll", Poller)
    monkeypatch.setattr(events, "SIGNAL_SLICE_MS", 20)
    with pytest.raises(KeyboardInterrupt):
        events._poll([0], None)  # forever
    assert timeouts == [20] * 5
    timeouts[:], interrupt_at[0] = [], 0
    assert events._poll([0], 45) == [] and len(timeouts) in (3, 4)  # a timeout, in slices
    assert all(t is not None and 0 <= t <= 20 for t in timeouts)
    timeouts.clear()
    assert events._poll([0], 0) == [] and timeouts == [0]  # a peek stays one call


def test_closing_the_owner_releases_a_waiting_receive(fake_sockets):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=WAIT * 1000)
    pub.send(b"delivered anyway")
    got = []
    thread = threading.Thread(target=lambda: got.append(sub.receive()))
    thread.start()
    handle.recv_called_event.wait(WAIT)
    handle.close()
    thread.join(WAIT)
    assert got == [b"delivered anyway"]


def test_a_killed_harness_does_not_hang_its_consumer_and_its_files_are_swept(fake_sockets, msgq_prefix):
    topic = unique_topic()
    pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic, timeout=WAIT * 1000)
    harness = python(
        """
        import sys, msgq
        handle = msgq.fake_event_handle(sys.argv[1], enable=True)
        print("ready", flush=True)
        handle.recv_called_event.wait(30)
        print("called", flush=True)
        sys.stdin.read()
        """,
        topic,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert harness.stdout.readline() == "ready\n"
        assert sub._impl.events_enabled

        def kill_once_called():
            assert harness.stdout.readline() == "called\n"
            harness.kill()

        killer = threading.Thread(target=kill_once_called)
        killer.start()
        pub.send(b"after the harness died")
        assert sub.receive() == b"after the harness died"
        killer.join()
    finally:
        harness.kill()
        harness.wait()
    assert len(fake_files(msgq_prefix)) == 3  # the dead harness's FIFOs, and the state we still use
    msgq.fake_event_handle(topic).close()  # a new owner sweeps the dead one's FIFOs
    sub.close()
    assert fake_files(msgq_prefix) == []


def test_drain_takes_one_handshake_per_receive_like_the_reference(fake_sockets):
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    called, ready = handle.recv_called_event, handle.recv_ready_event
    pub, sub = msgq.pub_sock(topic), msgq.sub_sock(topic)
    for i in range(3):
        pub.send(b"%d" % i)

    def harness():  # three messages, then the receive that finds nothing
        for _ in range(4):
            called.wait(WAIT)
            called.clear()
            ready.set()

    thread = threading.Thread(target=harness)
    thread.start()
    assert msgq.drain_sock_raw(sub) == [b"0", b"1", b"2"]
    thread.join()
    assert not called.peek()


def test_the_references_fake_event_names_are_exported():
    names = [
        "SocketEventHandle",
        "toggle_fake_events",
        "set_fake_prefix",
        "get_fake_prefix",
        "delete_fake_prefix",
        "wait_for_one_event",
        "fake_event_handle",
    ]
    assert all(name in msgq.__all__ and hasattr(msgq, name) for name in names)
    assert [(p.name, p.default) for p in inspect.signature(msgq.fake_event_handle).parameters.values()] == [
        ("endpoint", inspect.Parameter.empty),
        ("identifier", None),
        ("override", True),
        ("enable", False),
    ]
    assert {"set", "clear", "wait", "peek", "fd", "ptr"} <= set(dir(msgq.Event))
