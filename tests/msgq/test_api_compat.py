"""Code written for commaai's msgq Python API runs unchanged.

These follow the reference's own public-API tests (messaging, poller): same
calls, same argument names, same return types.
"""

import concurrent.futures
import inspect
import random
import time

import pytest

import msgq
from msgq.testing import unique_topic

REFERENCE_NAMES = [
    "Context",
    "Poller",
    "SubSocket",
    "PubSocket",
    "MultiplePublishersError",
    "IpcError",
    "NO_TRAVERSAL_LIMIT",
    "context",
    "pub_sock",
    "sub_sock",
    "drain_sock_raw",
    "SocketEventHandle",
    "toggle_fake_events",
    "set_fake_prefix",
    "get_fake_prefix",
    "delete_fake_prefix",
    "wait_for_one_event",
    "fake_event_handle",
]


def random_bytes(length=1000):
    return bytes(random.randrange(256) for _ in range(length))


def test_reference_public_names_are_exported():
    for name in REFERENCE_NAMES:
        assert hasattr(msgq, name), name
        assert name in msgq.__all__, name
    assert msgq.NO_TRAVERSAL_LIMIT == 2**64 - 1
    assert isinstance(msgq.context, msgq.Context)
    assert issubclass(msgq.MultiplePublishersError, msgq.IpcError)
    assert issubclass(msgq.IpcError, Exception)


def test_helper_signatures_match_the_reference():
    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    # The reference's parameters, in its order; ours may add keywords after them.
    assert params(msgq.pub_sock)[:3] == [("endpoint", inspect.Parameter.empty), ("segment_size", 0), ("wake", None)]
    assert params(msgq.pub_sock)[3:] == [("schema", None)]  # ours: a typed topic's schema (msgq.schemas)
    assert params(msgq.sub_sock) == [
        ("endpoint", inspect.Parameter.empty),
        ("poller", None),
        ("addr", "127.0.0.1"),
        ("conflate", False),
        ("timeout", None),
        ("segment_size", 0),
    ]
    assert params(msgq.drain_sock_raw) == [("sock", inspect.Parameter.empty), ("wait_for_one", False)]


def test_pub_sub_delivers_each_message_as_bytes():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, conflate=False, timeout=None)
    for _ in range(1000):
        msg = random_bytes()
        pub.send(msg)
        got = sub.receive()
        assert type(got) is bytes
        assert got == msg


def test_conflate_and_drain_match_the_reference():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    for conflate in (True, False):
        for _ in range(10):
            sub = msgq.sub_sock(topic, conflate=conflate, timeout=None)
            sent = [random_bytes() for _ in range(random.randint(3, 10))]
            for msg in sent:
                pub.send(msg)
            got = msgq.drain_sock_raw(sub)
            assert got == (sent[-1:] if conflate else sent)
            sub.close()


def test_receive_timeout_returns_none_once_the_timeout_passed():
    topic = unique_topic()
    for _ in range(10):
        timeout = random.randrange(200)
        sub = msgq.sub_sock(topic, timeout=timeout)
        start = time.monotonic()
        assert sub.receive() is None
        assert timeout / 1000 <= time.monotonic() - start < 30  # it waited; the bound is only against a hang
        sub.close()


def test_poller_returns_the_socket_that_has_a_message():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, conflate=False, timeout=None)
    poller = msgq.Poller()
    poller.registerSocket(sub)
    assert poller.poll(100) == []
    msg = random_bytes()
    pub.send(msg)
    socks = poller.poll(1000)
    assert socks == [sub]
    assert sub.receive() == msg


def _poll_once(topic):
    context = msgq.Context()
    poller = msgq.Poller()
    sub = msgq.SubSocket()
    sub.connect(context, topic)
    poller.registerSocket(sub)
    socks = poller.poll(10000)
    return [s.receive(non_blocking=True) for s in socks]


@pytest.mark.parametrize("extra_subscribers", [0, 10])
def test_poll_in_a_thread_is_woken_by_a_send(extra_subscribers):
    topic = unique_topic()
    context = msgq.Context()
    pub = msgq.PubSocket()
    pub.connect(context, topic)
    with concurrent.futures.ThreadPoolExecutor() as pool:
        result = pool.submit(_poll_once, topic)
        assert pub.wait_for_readers(1, timeout=10)
        others = []
        for _ in range(extra_subscribers):
            s = msgq.SubSocket()
            s.connect(msgq.Context(), topic)
            others.append(s)
        pub.send(b"a")
        assert result.result(timeout=20) == [b"a"]
    del pub
    context.term()


def test_second_publisher_makes_the_first_raise_on_send():
    context = msgq.Context()
    topic = unique_topic()
    pub1 = msgq.PubSocket()
    pub1.connect(context, topic)
    pub2 = msgq.PubSocket()
    pub2.connect(context, topic)
    with pytest.raises(msgq.MultiplePublishersError):
        pub1.send(b"a")
    pub2.send(b"b")  # the newest publisher keeps working
    del pub1, pub2
    context.term()


def test_non_blocking_receive_sees_messages_in_order():
    context = msgq.Context()
    topic = unique_topic()
    pub = msgq.PubSocket()
    pub.connect(context, topic)
    sub = msgq.SubSocket()
    sub.connect(context, topic)
    for i in range(1, 100):
        pub.send(b"a" * i)
    got = []
    while (r := sub.receive(non_blocking=True)) is not None:
        got.append(r)
    assert got == [b"a" * i for i in range(1, 100)]


def test_connect_accepts_bytes_and_keyword_conflate():
    context = msgq.Context()
    topic = unique_topic()
    pub = msgq.PubSocket()
    pub.connect(context, topic.encode())
    sub = msgq.SubSocket()
    sub.connect(context, topic, b"127.0.0.1", conflate=True)
    pub.send(b"a")
    pub.send(b"b")
    assert sub.receive() == b"b"


def test_all_readers_updated_follows_the_readers():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    assert not pub.all_readers_updated()  # as in the reference: no reader, not updated
    sub = msgq.sub_sock(topic, timeout=1000)
    assert pub.all_readers_updated()
    pub.send(b"x")
    assert not pub.all_readers_updated()
    assert sub.receive() == b"x"
    assert pub.all_readers_updated()


def test_drain_with_wait_for_one_blocks_for_the_first_message():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=50)
    assert msgq.drain_sock_raw(sub, wait_for_one=True) == []
    pub.send(b"1")
    pub.send(b"2")
    assert msgq.drain_sock_raw(sub, wait_for_one=True) == [b"1", b"2"]
