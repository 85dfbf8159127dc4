"""CappedConnection (msgq.tooling): the connection made again after the peer closed it
must never cut off a connection ZeroMQ already made again by itself.

Under load a reader's loop can look at the connection monitor late, after ZeroMQ has
reconnected to a restarted publisher and its first message came through; a
reconnection forced then dropped the messages sent right after (msgq-bridge in:
"only 0 of 50 messages arrived")."""

import time

import pytest

from msgq.names import zmq_port
from msgq.testing import unique_topic
from msgq.tooling import CappedConnection

zmq = pytest.importorskip("zmq")

DEADLINE = 30.0  # seconds any single wait may take before the test fails


@pytest.fixture
def ctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def publisher(ctx, address):
    """A PUB bound to ``address``, retried while ZeroMQ still releases the previous one's port."""
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            sock.bind(address)
            return sock
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def warm_up(pub, sub, tag):
    """Send tagged messages until one arrives (slow joiner); the monitor is not looked at."""
    deadline = time.monotonic() + DEADLINE
    while True:
        pub.send(tag)
        if sub.poll(20):
            msg = sub.recv()
            if msg == tag:
                return
        assert time.monotonic() < deadline, f"no {tag!r} came through"


def test_a_restarted_publisher_is_not_cut_off_by_a_late_look_at_the_monitor(ctx):
    address = f"tcp://127.0.0.1:{zmq_port(unique_topic())}"
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RECONNECT_IVL, 100)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    link = CappedConnection(zmq, sub, address, 1 << 20)
    try:
        first = publisher(ctx, address)
        warm_up(first, sub, b"first")
        first.close()
        second = publisher(ctx, address)
        warm_up(second, sub, b"second")  # ZeroMQ connected again by itself
        assert link.closed()  # the first publisher's disconnect, seen late
        assert not link.reconnect_if_due(time.monotonic() + 10 * DEADLINE)  # long past any back-off
        expected = [b"data%d" % i for i in range(50)]
        for msg in expected:
            second.send(msg)
        got = []
        deadline = time.monotonic() + DEADLINE
        while len(got) < len(expected):
            if not sub.poll(100):
                assert time.monotonic() < deadline, f"only {len(got)} of {len(expected)} messages arrived"
            elif (msg := sub.recv()) != b"second":  # a warm-up message still in flight
                got.append(msg)
        assert got == expected
        assert link.reconnects == 0
    finally:
        link.close_monitor()
        sub.close(0)


def test_a_connection_closed_for_good_is_made_again_after_the_back_off(ctx):
    """The case the reconnection is for: a peer whose message broke the cap is never
    reconnected by ZeroMQ itself (a protocol error)."""
    address = f"tcp://127.0.0.1:{zmq_port(unique_topic())}"
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    link = CappedConnection(zmq, sub, address, 100)
    try:
        pub = publisher(ctx, address)
        warm_up(pub, sub, b"small")
        pub.send(b"x" * 101)  # over the cap: ZeroMQ closes the connection
        deadline = time.monotonic() + DEADLINE
        while not link.closed():
            assert time.monotonic() < deadline, "the connection was never closed"
            link.monitor.poll(100)
        assert link.reconnect_if_due(time.monotonic() + 10 * DEADLINE)
        warm_up(pub, sub, b"again")
        assert link.reconnects == 1
    finally:
        link.close_monitor()
        sub.close(0)
