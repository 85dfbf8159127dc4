"""The ZeroMQ backend on its own: the documented topic -> port mapping, wire
compatibility with plain pyzmq sockets in both directions, one publisher per
port, subscriber counting, waiting (timeouts, signals, Ctrl-C, close from
another thread), fork and exit hygiene, and a topic crossing hosts: two
network namespaces joined by a veth pair (or, where namespaces cannot be
made, two loopback addresses).

Every wait is bounded; timing is asserted only as a lower bound.
"""

import contextlib
import hashlib
import json
import os
import random
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

import msgq
from msgq.backends import zmq as zmq_backend
from msgq.names import current_prefix, zmq_port
from msgq.testing import unique_topic

WAIT_S = 10.0  # bound on anything that should happen at once on a quiet machine


@pytest.fixture(autouse=True)
def zmq_env(monkeypatch):
    monkeypatch.setenv("MSGQ_BACKEND", "zmq")
    monkeypatch.setenv("MSGQ_ZMQ_BIND", "127.0.0.1")  # tests stay on this host unless they say otherwise


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def free_topic(stem="topic"):
    """msgq.testing.unique_topic already avoids ports an outgoing connection could hold."""
    return unique_topic(stem)


def connected(topic, n_subs=1, **sub_kwargs):
    pub = msgq.pub_sock(topic)
    subs = [msgq.sub_sock(topic, timeout=int(WAIT_S * 1000), **sub_kwargs) for _ in range(n_subs)]
    assert pub.wait_for_readers(n_subs, timeout=WAIT_S), "subscribers never reached the publisher"
    return pub, subs


def eventually(predicate, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def payloads(seed=1, sizes=(0, 1, 7, 64, 4096, 65_537, 300_000)):
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in sizes]


# ------------------------------------------------------------------ API and backend choice


def test_round_trip_through_the_msgq_api_uses_the_zmq_backend():
    pub, (sub,) = connected(free_topic())
    assert pub._backend.NAME == sub._backend.NAME == "zmq"
    sent = payloads()
    for m in sent:
        pub.send(m)
    assert [sub.receive() for _ in sent] == sent
    assert sub.receive(non_blocking=True) is None


def test_the_references_zmq_switch_picks_this_backend(monkeypatch):
    monkeypatch.delenv("MSGQ_BACKEND")
    monkeypatch.setenv("ZMQ", "1")
    with msgq.pub_sock(free_topic()) as pub:
        assert pub._backend.NAME == "zmq"


def test_the_reference_spelling_with_bytes_endpoint_and_address_works():
    topic = free_topic()
    ctx = msgq.Context()
    pub = msgq.PubSocket()
    pub.connect(ctx, topic.encode())
    sub = msgq.SubSocket()
    sub.connect(ctx, topic, b"127.0.0.1", conflate=False)
    sub.setTimeout(int(WAIT_S * 1000))
    assert pub.wait_for_readers(1, timeout=WAIT_S)
    pub.send(b"hi")
    assert sub.receive() == b"hi"


# ------------------------------------------------------------------ the port of a topic


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bit, written from its definition (offset basis, prime)."""
    h = 14695981039346656037
    for byte in data:
        h ^= byte
        h = (h * 1099511628211) % 2**64
    return h


def test_fnv1a64_matches_the_published_test_vectors():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


@pytest.mark.parametrize("topic", ["carState", "modelV2", "a", "x" * 128])
def test_port_of_a_topic_is_the_documented_formula(topic):
    assert zmq_port(topic, prefix="") == 8023 + fnv1a64(topic.encode()) % 57512
    assert zmq_port(topic, prefix="run7") == 8023 + fnv1a64(f"run7@{topic}".encode()) % 57512
    assert 8023 <= zmq_port(topic, prefix="") <= 65534
    assert zmq_port(topic, prefix="") == zmq_port(topic, prefix="")  # stable within and across runs


def test_publisher_binds_the_port_of_its_topic_under_the_run_prefix(msgq_prefix):
    topic = free_topic()
    with msgq.pub_sock(topic) as pub:
        port = 8023 + fnv1a64(f"{msgq_prefix}@{topic}".encode()) % 57512
        assert current_prefix() == msgq_prefix
        assert pub._impl.url == f"tcp://127.0.0.1:{port}"


# ------------------------------------------------------------------ plain pyzmq on the other end


def test_a_plain_pyzmq_sub_receives_the_exact_bytes(zctx):
    topic = free_topic()
    pub = msgq.pub_sock(topic)
    raw = zctx.socket(zmq.SUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
    raw.subscribe(b"")
    raw.connect(f"tcp://127.0.0.1:{zmq_port(topic)}")
    assert pub.wait_for_readers(1, timeout=WAIT_S)
    sent = payloads() + [np.arange(6, dtype=np.uint16), bytearray(b"ba"), memoryview(b"xmemoryview")[1:]]
    for m in sent:
        pub.send(m)
    with pub.loan(5) as buf:
        buf[:] = b"loan!"
    for m in sent + [b"loan!"]:
        assert raw.recv_multipart() == [bytes(memoryview(m).cast("B"))]  # one frame: the payload, nothing else
    pub.close()


def test_our_subscriber_receives_from_a_plain_pyzmq_pub(zctx):
    topic = free_topic()
    raw = zctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.bind(f"tcp://127.0.0.1:{zmq_port(topic)}")
    sub = msgq.sub_sock(topic, timeout=20)
    deadline = time.monotonic() + WAIT_S
    while True:  # a plain PUB cannot tell when the subscription arrived: probe until one gets through
        raw.send(b"probe")
        if sub.receive() == b"probe":
            break
        assert time.monotonic() < deadline, "the subscriber never connected to the plain PUB"
    sent = payloads(seed=2)
    for m in sent:
        raw.send(m)
    sub.setTimeout(int(WAIT_S * 1000))
    got = []
    while len(got) < len(sent):
        m = sub.receive()
        assert m is not None
        if m != b"probe":
            got.append(m)
    assert got == sent
    sub.close()


# ------------------------------------------------------------------ publishers and subscribers


def test_a_second_publisher_on_a_topic_raises_at_creation_and_the_first_keeps_working():
    topic = free_topic()
    pub, (sub,) = connected(topic)
    with pytest.raises(msgq.MultiplePublishersError, match="already bound"):
        msgq.pub_sock(topic)
    pub.send(b"first still here")
    assert sub.receive() == b"first still here"
    pub.close()
    again = msgq.pub_sock(topic)  # the port is free once the first one closed
    # The subscriber reconnects on its own and subscribes again the next time it is used.
    assert eventually(lambda: sub.receive(non_blocking=True) is None and again.num_readers == 1)
    again.send(b"new publisher")
    assert sub.receive() == b"new publisher"
    again.close()


def occupy_as_local_port(port):
    """A TCP connection whose local end is 127.0.0.1:``port`` (what an outgoing
    connection's ephemeral port looks like): ``(client, server side, listener)``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: reset, no TIME_WAIT
    client.bind(("127.0.0.1", port))
    client.connect(listener.getsockname())
    server_side, _ = listener.accept()
    return client, server_side, listener


def test_a_port_held_by_a_connection_is_not_mistaken_for_another_publisher(monkeypatch):
    topic = free_topic()
    held = occupy_as_local_port(zmq_port(topic))
    monkeypatch.setattr(zmq_backend, "PORT_BUSY_GRACE_S", 0.3)
    try:
        with pytest.raises(msgq.IpcError, match="local port of a TCP connection.*TIME_WAIT") as info:
            msgq.pub_sock(topic)
        assert not isinstance(info.value, msgq.MultiplePublishersError)
    finally:
        for s in held:
            s.close()


def test_a_port_held_for_a_moment_by_a_connection_is_waited_for(monkeypatch):
    topic = free_topic()
    held = occupy_as_local_port(zmq_port(topic))
    monkeypatch.setattr(zmq_backend, "PORT_BUSY_GRACE_S", WAIT_S)
    timer = threading.Timer(0.2, lambda: [s.close() for s in held])
    timer.start()
    try:
        pub, (sub,) = connected(topic)
        pub.send(b"got the port")
        assert sub.receive() == b"got the port"
    finally:
        timer.join()


def test_num_readers_follows_subscribers_coming_and_going(zctx):
    topic = free_topic()
    pub = msgq.pub_sock(topic)
    assert pub.num_readers == 0
    assert not pub.all_readers_updated()
    subs = [msgq.sub_sock(topic) for _ in range(3)]
    raw = zctx.socket(zmq.SUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.subscribe(b"")
    raw.connect(f"tcp://127.0.0.1:{zmq_port(topic)}")
    assert pub.wait_for_readers(4, timeout=WAIT_S)
    assert pub.num_readers == 4 and pub.all_readers_updated()
    subs.pop().close()
    raw.close()
    assert eventually(lambda: pub.num_readers == 2), f"num_readers stayed {pub.num_readers}"
    for s in subs:
        s.close()
    assert eventually(lambda: pub.num_readers == 0)
    assert not pub.all_readers_updated()


def test_conflating_subscriber_ends_with_the_newest_and_skips_the_rest():
    pub, (sub,) = connected(free_topic(), conflate=True)
    assert sub._impl.conflate
    for i in range(500):
        pub.send(b"%d" % i)
    pub.send(b"last")
    got = []
    while not got or got[-1] != b"last":  # in flight over TCP until it arrives; then nothing newer
        m = sub.receive()
        assert m is not None, f"'last' never arrived; got {got[-5:]}"
        got.append(m)
    assert len(got) < 501  # messages that were waiting together were conflated
    assert sub.receive(non_blocking=True) is None


def test_timeouts_non_blocking_and_batches():
    pub, (sub,) = connected(free_topic())
    sub.setTimeout(50)
    start = time.monotonic()
    assert sub.receive() is None
    assert time.monotonic() - start >= 0.05
    assert sub.receive(non_blocking=True) is None
    start = time.monotonic()
    assert sub.receive_batch(10, timeout=30) == []
    assert time.monotonic() - start >= 0.03
    assert sub.receive_batch(10, timeout=0) == []
    sent = [bytes([i]) * i for i in range(20)]
    for m in sent:
        pub.send(m)
    got = sub.receive_batch(5, timeout=int(WAIT_S * 1000))
    sub.setTimeout(int(WAIT_S * 1000))
    while len(got) < len(sent):
        got += sub.receive_batch(100, timeout=int(WAIT_S * 1000))
    assert got == sent


def test_receive_without_timeout_waits_for_a_message_sent_later():
    pub, (sub,) = connected(free_topic())
    sub.setTimeout(None)
    threading.Timer(0.1, pub.send, args=(b"later",)).start()
    start = time.monotonic()
    assert sub.receive() == b"later"
    assert time.monotonic() - start >= 0.09


def test_a_subscriber_streaming_and_waiting_alternately_gets_every_message():
    """Exercise both receive paths (direct receive while messages queue up,
    poll first while idle) and the switch between them."""
    pub, (sub,) = connected(free_topic())
    expected = []
    for burst in range(30):
        n = 1 if burst % 3 else 50
        for i in range(n):
            m = b"%d:%d" % (burst, i)
            pub.send(m)
            expected.append(m)
        got = [sub.receive() for _ in range(n)]
        assert got == expected[-n:]
    sub.setTimeout(10)
    assert sub.receive() is None


@pytest.mark.parametrize(
    "payload", ["text", 12, None, np.arange(10)[::2], np.asfortranarray(np.zeros((3, 4)))], ids=repr
)
def test_bad_payload_types_raise_type_error(payload):
    pub, (sub,) = connected(free_topic())
    with pytest.raises(TypeError):
        pub.send(payload)
    pub.send(b"ok")
    assert sub.receive() == b"ok"  # nothing else went out


def test_loan_commit_cancel_and_misuse():
    pub, (sub,) = connected(free_topic())
    impl = pub._impl
    buf = impl.loan(10)
    assert len(buf) == 10
    buf[:3] = b"abc"
    with pytest.raises(msgq.IpcError, match="outstanding"):
        impl.send(b"x")
    with pytest.raises(msgq.IpcError, match="outstanding"):
        impl.loan(1)
    with pytest.raises(msgq.InvalidArgumentError, match="exceeds"):
        impl.commit(11)
    del buf
    impl.commit(3)
    with pytest.raises(msgq.IpcError, match="without a loaned"):
        impl.commit(1)
    impl.loan(4)
    impl.cancel_loan()
    with pytest.raises(msgq.InvalidArgumentError):
        impl.loan(-1)
    with pytest.raises(msgq.MessageTooLargeError):
        impl.loan(impl.max_message_size + 1)
    pub.send(b"after")
    assert [sub.receive(), sub.receive()] == [b"abc", b"after"]
    assert impl.messages_sent == 2


def test_properties_report_what_zmq_has():
    pub = msgq.pub_sock(free_topic(), segment_size=1 << 16)
    sub = msgq.sub_sock(pub.endpoint)
    assert pub.max_message_size == msgq._msgq.max_message_size(1 << 16)  # as on the shared-memory backend
    assert pub.segment_size == 1 << 16
    assert sub._impl.segment_size == msgq.pub_sock(free_topic()).segment_size == 1 << 20
    assert sub.resets == 0
    sub.spin_us = 123
    assert sub.spin_us == 123
    with pytest.raises(msgq.InvalidArgumentError, match="segment_size"):
        msgq.pub_sock(free_topic(), segment_size=1)
    poller = msgq.Poller()
    poller.registerSocket(sub)
    with pytest.raises(msgq.IpcError, match="not supported by the zmq backend"):
        poller.fileno()


def test_use_after_close_raises_closed_error_and_close_is_idempotent():
    pub, (sub,) = connected(free_topic())
    pimpl, simpl = pub._impl, sub._impl
    pub.close()
    pub.close()
    sub.close()
    sub.close()
    pimpl.close()
    simpl.close()
    for call in (lambda: pimpl.send(b"x"), pimpl.num_readers, lambda: pimpl.loan(1), lambda: pimpl.commit(0)):
        with pytest.raises(msgq.ClosedError):
            call()
    for call in (
        simpl.receive,
        lambda: simpl.receive(True),
        lambda: simpl.receive_batch(4, 0),
        simpl.ready,
        simpl.fileno,
        simpl.arm,
    ):
        with pytest.raises(msgq.ClosedError):
            call()
    with pytest.raises(msgq.ClosedError):
        zmq_backend.Poller().add(simpl)


def test_bad_addresses_are_refused_clearly(monkeypatch):
    topic = free_topic()
    for addr in ("", "host name", "a/b", "tcp://x;y"):
        with pytest.raises(msgq.InvalidArgumentError, match="address"):
            msgq.sub_sock(topic, addr=addr)
    with pytest.raises(msgq.InvalidArgumentError):
        zmq_backend.Subscriber(topic, 5)
    monkeypatch.setenv("MSGQ_ZMQ_BIND", "0.0.0.0/8")
    with pytest.raises(msgq.InvalidArgumentError, match="MSGQ_ZMQ_BIND"):
        msgq.pub_sock(topic)


def test_msgq_zmq_bind_limits_the_publisher_to_one_address(monkeypatch):
    topic = free_topic()
    port = zmq_port(topic)
    pub = msgq.pub_sock(topic)  # MSGQ_ZMQ_BIND=127.0.0.1 (fixture)
    assert pub._impl.url == f"tcp://127.0.0.1:{port}"
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.2", port))  # free: the publisher holds 127.0.0.1 only
    other.close()
    pub.close()
    monkeypatch.delenv("MSGQ_ZMQ_BIND")  # the default, "*", takes the port on every interface
    pub = msgq.pub_sock(topic)
    assert pub._impl.url == f"tcp://*:{port}"
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with pytest.raises(OSError):
        other.bind(("127.0.0.2", port))
    other.close()
    pub.close()


def test_ipv6_loopback_works_when_the_host_has_it(monkeypatch):
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    monkeypatch.setenv("MSGQ_ZMQ_BIND", "::1")
    topic = free_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, addr="::1", timeout=int(WAIT_S * 1000))
    assert pub.wait_for_readers(1, timeout=WAIT_S)
    pub.send(b"six")
    assert sub.receive() == b"six"


# ------------------------------------------------------------------ waiting


def test_fileno_becomes_readable_after_arm_reports_nothing_waiting():
    pub, (sub,) = connected(free_topic())
    assert sub.arm() is False
    pub.send(b"wake")
    deadline = time.monotonic() + WAIT_S
    while not sub.ready():  # edge-triggered: a wake-up may be a state change without a message
        readable, _, _ = select.select([sub.fileno()], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, "the descriptor never became readable"
        if sub.arm():
            break
    sub.disarm()
    assert sub.receive(non_blocking=True) == b"wake"
    assert sub.arm() is False


def test_poller_returns_ready_subscribers_in_add_order_and_closed_ones_too():
    topics = [free_topic() for _ in range(3)]
    pubs = [msgq.pub_sock(t) for t in topics]
    poller = msgq.Poller()
    subs = [msgq.sub_sock(t, poller=poller) for t in topics]
    for p in pubs:
        assert p.wait_for_readers(1, timeout=WAIT_S)
    assert poller.poll(10) == []
    pubs[2].send(b"c")
    pubs[0].send(b"a")
    ready = set()
    deadline = time.monotonic() + WAIT_S
    while len(ready) < 2 and time.monotonic() < deadline:
        ready |= set(poller.poll(1000))
    assert ready == {subs[0], subs[2]}
    assert poller._impl.poll(0) == [0, 2]  # indices in add order
    subs[1].close()
    assert subs[1] in poller.poll(0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout_ms", [None, 30_000], ids=["no_timeout", "timeout"])
@pytest.mark.parametrize("how", ["receive", "receive_batch", "poll"])
def test_close_from_another_thread_ends_a_wait(how, timeout_ms):
    """The waiting thread gets ClosedError (the wake-up message is never
    handed out as data), or the poll reports the closed subscriber."""
    pub, (sub,) = connected(free_topic())
    sub.setTimeout(timeout_ms)
    poller = msgq.Poller()
    poller.registerSocket(sub)
    wait_ms = -1 if timeout_ms is None else timeout_ms
    wait = {
        "receive": sub.receive,
        "receive_batch": lambda: sub.receive_batch(10, timeout=wait_ms),
        "poll": lambda: poller.poll(wait_ms),
    }[how]
    outcome = []

    def waiter():
        try:
            outcome.append(("returned", wait()))
        except msgq.ClosedError:
            outcome.append(("raised", "ClosedError"))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.2)  # let it get into the wait (either order must end the wait)
    sub.close()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the wait did not end when the subscriber was closed"
    assert outcome in ([("raised", "ClosedError")], [("returned", [sub])])
    assert sub._impl._zsock is None  # the waiter finished the close


@pytest.mark.timeout(60)
def test_gil_is_released_while_a_thread_waits():
    pub, (sub,) = connected(free_topic())
    sub.setTimeout(None)
    got = []
    thread = threading.Thread(target=lambda: got.append(sub.receive()), daemon=True)
    thread.start()
    time.sleep(0.1)
    iterations, end = 0, time.monotonic() + 0.2
    while time.monotonic() < end:
        iterations += 1
    pub.send(b"done")
    thread.join(WAIT_S)
    assert got == [b"done"]
    assert iterations > 1000  # a held GIL would have stopped this loop


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["receive", "poll"])
def test_signal_handlers_run_during_a_timed_wait_and_the_deadline_holds(how):
    timeout_s = 0.5
    handled = []
    main = threading.get_ident()
    stop = threading.Event()

    def poke():
        while not stop.wait(0.02):  # faster than the timeout: a restarted wait would never end
            signal.pthread_kill(main, signal.SIGUSR1)

    pub, (sub,) = connected(free_topic())
    sub.setTimeout(int(timeout_s * 1000))
    poller = msgq.Poller()
    poller.registerSocket(sub)
    wait = sub.receive if how == "receive" else lambda: poller.poll(int(timeout_s * 1000))
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(time.monotonic()))
    poker = threading.Thread(target=poke, daemon=True)
    try:
        poker.start()
        start = time.monotonic()
        result = wait()
        end = time.monotonic()
    finally:
        stop.set()
        poker.join(WAIT_S)
        signal.signal(signal.SIGUSR1, previous)
    assert result in (None, [])
    assert end - start >= timeout_s
    assert sum(start <= t < end for t in handled) >= 2


CHILD_WAITS_FOR_CTRL_C = """
import sys, msgq
how, topic = sys.argv[1], sys.argv[2]
sub = msgq.sub_sock(topic)
poller = msgq.Poller()
poller.registerSocket(sub)
wait = {"receive": sub.receive, "receive_batch": lambda: sub.receive_batch(10, timeout=-1),
        "poll": lambda: poller.poll(-1)}[how]
print("waiting", flush=True)
try:
    wait()
    print("returned", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
sub.close()
"""


def main_thread_asleep(pid, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        in_a_row = in_a_row + 1 if state == "S" else 0
        if in_a_row >= 5:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["receive", "receive_batch", "poll"])
def test_ctrl_c_interrupts_a_blocked_wait_with_keyboard_interrupt(how):
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", CHILD_WAITS_FOR_CTRL_C, how, free_topic()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert expect_line(child, "waiting", WAIT_S * 2)
        assert main_thread_asleep(child.pid)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        kill(child)
    assert out.split() == ["KeyboardInterrupt"], err
    assert child.returncode == 0, err


# ------------------------------------------------------------------ processes


def test_forked_child_disowns_inherited_sockets_and_makes_its_own():
    pub, (sub,) = connected(free_topic())
    child_topic = free_topic()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 1
        try:
            try:
                pub.send(b"from the child")
            except msgq.ClosedError:
                child_pub = msgq.pub_sock(child_topic)
                child_sub = msgq.sub_sock(child_topic, timeout=int(WAIT_S * 1000))
                if child_pub.wait_for_readers(1, timeout=WAIT_S):
                    child_pub.send(b"child")
                    status = 0 if child_sub.receive() == b"child" else 3
                child_pub.close()
                child_sub.close()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pub.send(b"parent")
    assert sub.receive() == b"parent"
    assert pub.num_readers == 1


def test_interpreter_exit_with_open_sockets_does_not_hang():
    code = (
        "import sys, msgq\n"
        "pub = msgq.pub_sock(sys.argv[1])\n"
        "sub = msgq.sub_sock(sys.argv[1], timeout=10)\n"
        "nobody = msgq.sub_sock(sys.argv[2])\n"  # keeps reconnecting; nothing may wait for it
        "pub.send(b'x' * 100000)\n"
        "for i in range(1000): pub.send(b'queued')\n"
    )
    result = subprocess.run(
        [sys.executable, "-P", "-c", code, free_topic(), free_topic()], timeout=30, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------ across hosts


PUBLISHER_HOST = """
import sys, random, msgq
topic, seed, sizes = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3].split(",")]
rng = random.Random(seed)
pub = msgq.pub_sock(topic)
print("bound", pub._impl.url, flush=True)
if not pub.wait_for_readers(1, timeout=30):
    print("no reader", flush=True)
    sys.exit(2)
for n in sizes:
    pub.send(rng.randbytes(n))
print("sent", flush=True)
sys.stdin.readline()  # keep the socket (and its queue) until the parent has the result
pub.close()
"""

SUBSCRIBER_HOST = """
import sys, json, hashlib, msgq
topic, addr, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sub = msgq.sub_sock(topic, addr=addr, timeout=30000)
got = [sub.receive() for _ in range(count)]
print(json.dumps([None if m is None else [len(m), hashlib.sha256(m).hexdigest()] for m in got]), flush=True)
sub.close()
"""


def expect_line(proc, text, timeout):
    """Read lines from ``proc``'s stdout until one starts with ``text``; False on EOF or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if not readable:
            return False
        line = proc.stdout.readline()
        if not line:
            return False
        if line.startswith(text):
            return line


def kill(proc):
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=WAIT_S)


def ip(*args):
    subprocess.run(["ip", *args], check=True, timeout=20, capture_output=True)


@contextlib.contextmanager
def two_hosts():
    """Two hosts on this machine: ``(publisher command prefix, subscriber
    command prefix, publisher address, how)``. Network namespaces A and B
    joined by a veth pair 10.213.N.1/30 <-> 10.213.N.2/30 where we may make
    them; else the loopback addresses 127.0.0.2 (publisher) and the default
    127.0.0.1 side of this host (subscriber)."""
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"vipc-a-{tag}", f"vipc-b-{tag}"
    net = random.randint(0, 255)
    addr_a, addr_b = f"10.213.{net}.1", f"10.213.{net}.2"
    made = []
    try:
        try:
            for ns in (ns_a, ns_b):
                ip("netns", "add", ns)
                made.append(ns)
            ip("link", "add", f"vpa{tag}", "netns", ns_a, "type", "veth", "peer", "name", f"vpb{tag}", "netns", ns_b)
            ip("-n", ns_a, "addr", "add", f"{addr_a}/30", "dev", f"vpa{tag}")
            ip("-n", ns_b, "addr", "add", f"{addr_b}/30", "dev", f"vpb{tag}")
            for ns, dev in ((ns_a, f"vpa{tag}"), (ns_b, f"vpb{tag}")):
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except (OSError, subprocess.SubprocessError):
            hosts = ([], [], "127.0.0.2", "loopback")
        else:
            hosts = (["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_b], addr_a, "netns")
        yield hosts
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], timeout=20, capture_output=True)


def run_across(pub_prefix, sub_prefix, pub_addr, topic):
    seed, sizes = 11, [0, 1, 64, 4096, 300_000, 5]
    rng = random.Random(seed)
    expected = [[n, hashlib.sha256(rng.randbytes(n)).hexdigest()] for n in sizes]
    env = dict(os.environ, MSGQ_BACKEND="zmq", MSGQ_ZMQ_BIND=pub_addr)
    publisher = subprocess.Popen(
        [*pub_prefix, sys.executable, "-P", "-c", PUBLISHER_HOST, topic, str(seed), ",".join(map(str, sizes))],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    subscriber = None
    try:
        bound = expect_line(publisher, "bound", 30)
        if not bound:
            kill(publisher)
            pytest.fail(f"the publisher did not start: {publisher.stderr.read()}")
        assert bound.split()[1] == f"tcp://{pub_addr}:{zmq_port(topic)}"
        env_sub = dict(env)
        env_sub.pop("MSGQ_ZMQ_BIND")
        subscriber = subprocess.Popen(
            [*sub_prefix, sys.executable, "-P", "-c", SUBSCRIBER_HOST, topic, pub_addr, str(len(sizes))],
            env=env_sub,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert expect_line(publisher, "sent", 40), "the subscriber never reached the publisher"
        out, err = subscriber.communicate(timeout=40)
        assert subscriber.returncode == 0, err
        assert json.loads(out) == expected
        publisher.stdin.write("done\n")
        publisher.stdin.flush()
        publisher.wait(timeout=WAIT_S)
        assert publisher.returncode == 0
    finally:
        kill(publisher)
        if subscriber is not None:
            kill(subscriber)


@pytest.mark.timeout(120)
def test_a_subscriber_on_another_host_receives_the_exact_messages():
    with two_hosts() as (pub_prefix, sub_prefix, pub_addr, how):
        print(f"hosts: {how}")
        run_across(pub_prefix, sub_prefix, pub_addr, free_topic())


@pytest.mark.timeout(120)
def test_a_subscriber_reaches_a_publisher_bound_on_another_loopback_address():
    run_across([], [], "127.0.0.2", free_topic())


def test_curve_admits_only_authorized_subscribers_and_encrypts(monkeypatch, tmp_path, zctx):
    from msgq import curve

    keys, other = curve.create_keys(str(tmp_path / "keys")), curve.create_keys(str(tmp_path / "other"))
    monkeypatch.setenv("MSGQ_ZMQ_CURVE_DIR", keys)
    topic = free_topic("curve")
    pub, (sub,) = connected(topic)  # an authorized subscriber: counted, and receives
    plain = zctx.socket(zmq.SUB)  # no CURVE at all
    wrong = zctx.socket(zmq.SUB)  # a client key pair the publisher does not admit
    curve.make_client(wrong, other, curve.server_public_key(keys))
    for s in (plain, wrong):
        s.setsockopt(zmq.LINGER, 0)
        s.subscribe(b"")
        s.connect(f"tcp://127.0.0.1:{zmq_port(topic)}")
    time.sleep(0.2)  # give the intruders time to try their handshakes
    assert pub.num_readers == 1  # the intruders never got as far as subscribing
    for i in range(20):
        pub.send(b"secret %d" % i)
    assert [sub.receive() for _ in range(20)] == [b"secret %d" % i for i in range(20)]
    assert not plain.poll(200) and not wrong.poll(50)  # neither got anything
    for s in (plain, wrong, sub, pub):
        s.close()


# ------------------------------------------------------------------ bounded network input


def test_a_topic_bounds_a_message_as_the_shared_memory_backend_does():
    topic = free_topic()
    pub = msgq.pub_sock(topic, segment_size=1 << 16)
    sub = msgq.sub_sock(topic, timeout=int(WAIT_S * 1000), segment_size=1 << 16)
    assert pub.wait_for_readers(1, timeout=WAIT_S)
    ring = msgq.Context(backend="msgq")
    ring_pub = msgq.PubSocket()
    ring_pub.connect(ring, free_topic("ring"), 1 << 16)
    try:
        largest = pub.max_message_size
        assert largest == ring_pub.max_message_size
        pub.send(b"L" * largest)
        assert sub.receive() == b"L" * largest
        for too_big in (b"x" * (largest + 1), np.zeros(largest + 1, np.uint8)):
            with pytest.raises(msgq.MessageTooLargeError, match="segment_size"):
                pub.send(too_big)
        with pytest.raises(msgq.MessageTooLargeError, match="segment_size"):
            pub._impl.loan(largest + 1)
        pub.send(b"after")
        assert sub.receive() == b"after"
    finally:
        ring_pub.close()


_CAPPED_SUBSCRIBER = r"""
import sys, time
import msgq
topic, how = sys.argv[1], sys.argv[2]
if how == "poller":
    poller = msgq.Poller()
    sub = msgq.sub_sock(topic, poller=poller, timeout=100)
else:
    sub = msgq.sub_sock(topic, timeout=-1 if how == "blocking" else 100)
print("ready", flush=True)
largest, deadline = 0, time.monotonic() + 30
while time.monotonic() < deadline:
    if how == "poller" and not poller.poll(100):
        continue
    msg = sub.receive()
    if msg is None:
        continue
    largest = max(largest, len(msg))
    if msg == b"small":
        break
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent (pytest) across fork and exec
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(largest, hwm // 1024, flush=True)
"""


@pytest.mark.parametrize("how", ["blocking", "timeout", "poller"])
def test_a_subscriber_refuses_an_oversized_message_from_the_network_and_reconnects(zctx, how):
    """A peer on the topic's port (not a msgq publisher: any program that binds it
    first) sends 6 messages of 64 MB. The subscriber's ZeroMQ refuses each as soon as
    its size is announced (ZMQ_MAXMSGSIZE = the topic's maximum), before buffering it,
    and the connection is made again, so what fits still arrives. Before: every
    64 MB message was received, and the process held them (596 MB for 12 x 100 MB)."""
    topic = free_topic()
    rogue = zctx.socket(zmq.XPUB)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.setsockopt(zmq.SNDHWM, 100)
    rogue.bind(f"tcp://127.0.0.1:{zmq_port(topic)}")
    env = dict(os.environ, MSGQ_BACKEND="zmq")
    child = subprocess.Popen(
        [sys.executable, "-c", _CAPPED_SUBSCRIBER, topic, how], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        rogue.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))
        assert rogue.recv() == b"\x01"  # the subscription: the subscriber is connected
        big = b"B" * (64 << 20)
        for _ in range(6):
            rogue.send(big, copy=False)
        deadline = time.monotonic() + 20
        while child.poll() is None and time.monotonic() < deadline:
            rogue.send(b"small")  # dropped by XPUB while nobody is subscribed, then delivered
            time.sleep(0.02)
        out, _ = child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        rogue.close(0)
    assert child.returncode == 0
    largest, peak_mb = (int(n) for n in out.split())
    assert largest == len(b"small"), f"the subscriber received a {largest}-byte message"
    assert peak_mb < 64 + 120, f"the subscriber peaked at {peak_mb} MB (one refused message is 64 MB)"
