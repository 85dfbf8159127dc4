"""The socket API beyond the reference: zero-copy loans, batches, iteration,
context managers, payload types, sizes at the edges of the ring."""

import hashlib

import numpy as np
import pytest

import msgq
from msgq.testing import unique_topic

SEG = 64 * 1024


@pytest.fixture
def pair():
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=SEG)
    sub = msgq.sub_sock(topic, timeout=1000)
    yield pub, sub
    sub.close()
    pub.close()


def test_loan_is_filled_in_place_and_published_on_commit(pair):
    pub, sub = pair
    loan = pub.loan(100)
    loan.data[:5] = b"hello"
    assert sub.receive(non_blocking=True) is None  # nothing visible before commit
    loan.commit(5)
    assert sub.receive() == b"hello"


def test_loan_as_context_manager_commits_all_bytes(pair):
    pub, sub = pair
    with pub.loan(8) as buf:
        np.frombuffer(buf, dtype=np.uint8)[:] = np.arange(8, dtype=np.uint8)
    assert sub.receive() == bytes(range(8))


def test_loan_cancelled_by_an_exception_publishes_nothing(pair):
    pub, sub = pair
    with pytest.raises(ZeroDivisionError):
        with pub.loan(8) as buf:
            buf[:] = b"x" * 8
            raise ZeroDivisionError
    assert sub.receive(non_blocking=True) is None
    pub.send(b"after")  # the publisher is usable again
    assert sub.receive() == b"after"


def test_loan_misuse_gives_clear_errors(pair):
    pub, sub = pair
    loan = pub.loan(16)
    with pytest.raises(msgq.IpcError, match="outstanding"):
        pub.send(b"x")
    with pytest.raises(msgq.IpcError, match="outstanding"):
        pub.loan(4)
    with pytest.raises(msgq.InvalidArgumentError, match="exceeds"):
        loan._impl.commit(17)
    view = np.frombuffer(loan.data, dtype=np.uint8)
    with pytest.raises(msgq.IpcError, match="release every view"):
        loan.commit()
    del view
    loan.commit(3)
    with pytest.raises(msgq.IpcError, match="already committed"):
        loan.commit()
    assert len(sub.receive()) == 3
    with pytest.raises(msgq.MessageTooLargeError):
        pub.loan(SEG)


@pytest.mark.parametrize("payload", [bytearray(b"abc"), memoryview(b"abcdef")[2:], np.arange(5, dtype=np.int32)])
def test_send_takes_any_contiguous_buffer(pair, payload):
    pub, sub = pair
    pub.send(payload)
    assert sub.receive() == bytes(memoryview(payload).cast("B"))


@pytest.mark.parametrize("payload", ["text", 12, None, np.arange(10)[::2]])
def test_send_refuses_non_buffers_with_type_error(pair, payload):
    pub, sub = pair
    with pytest.raises(TypeError):
        pub.send(payload)
    assert sub.receive(non_blocking=True) is None


def test_empty_and_largest_messages_round_trip(pair):
    pub, sub = pair
    largest = pub.max_message_size
    assert largest == ((SEG - 8) // 2 - 8) // 8 * 8  # half the usable ring, prefix included
    for n in (0, 1, 7, 8, 9, largest, 0):
        data = bytes([n % 251]) * n
        pub.send(data)
        assert sub.receive() == data
    with pytest.raises(msgq.MessageTooLargeError, match="segment_size"):
        pub.send(b"x" * (largest + 1))


def test_a_reader_that_keeps_up_gets_every_largest_message_at_every_offset(pair):
    pub, sub = pair
    largest = pub.max_message_size
    for shift in range(0, 600, 8):  # move the write position around the ring
        pub.send(b"s" * shift)
        assert sub.receive() == b"s" * shift
        for i in range(3):
            data = bytes([i]) * largest
            pub.send(data)
            assert sub.receive() == data
    assert sub.resets == 0


def test_receive_batch_returns_everything_waiting(pair):
    pub, sub = pair
    sent = [str(i).encode() * (i % 40) for i in range(500)]
    for m in sent:
        pub.send(m)
    got = sub.receive_batch(200)
    got += sub.receive_batch(1000)
    assert got == sent
    assert sub.receive_batch(10, timeout=10) == []


def test_iterating_a_subscriber_stops_at_a_timeout(pair):
    pub, sub = pair
    sub.setTimeout(50)
    for i in range(5):
        pub.send(bytes([i]))
    assert list(sub) == [bytes([i]) for i in range(5)]
    assert sub.timeout == 50


def test_context_managers_close_and_use_after_close_raises():
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic) as sub:
        pub.send(b"x")
        assert sub.receive() == b"x"
        assert "connected" in repr(sub)
    assert pub.closed and sub.closed
    with pytest.raises(msgq.ClosedError):
        pub.send(b"x")
    with pytest.raises(msgq.ClosedError):
        sub.receive()
    with pytest.raises(msgq.ClosedError):
        sub.fileno()
    pub.close()  # closing twice is fine
    with pytest.raises(msgq.ClosedError, match="not connected"):
        msgq.SubSocket().receive()
    with pytest.raises(msgq.ClosedError, match="not connected"):
        msgq.PubSocket().send(b"x")


def test_connecting_a_socket_twice_is_refused():
    topic = unique_topic()
    sub = msgq.sub_sock(topic)
    with pytest.raises(msgq.IpcError, match="already connected"):
        sub.connect(msgq.context, topic)


def test_lapped_reader_is_reset_and_counts_it(pair):
    pub, sub = pair
    chunk = 1000
    n = 3 * SEG // chunk  # three laps of the ring
    for i in range(n):
        pub.send(i.to_bytes(4, "little") + hashlib.sha256(bytes([i % 256])).digest() * (chunk // 32))
    got = msgq.drain_sock_raw(sub)
    assert sub.resets >= 1
    seqs = [int.from_bytes(m[:4], "little") for m in got]
    assert seqs == sorted(set(seqs))  # in order, no repeats
    assert seqs[-1] == n - 1 if seqs else True
    for m, s in zip(got, seqs):
        assert m[4:] == hashlib.sha256(bytes([s % 256])).digest() * (chunk // 32)


def test_conflating_subscriber_gets_only_the_newest():
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=SEG)
    sub = msgq.sub_sock(topic, conflate=True, timeout=100)
    for i in range(1000):  # several wraps
        pub.send(i.to_bytes(4, "little") * 20)
    assert sub.receive() == (999).to_bytes(4, "little") * 20
    assert sub.receive() is None
    pub.send(b"next")
    assert sub.receive() == b"next"


def test_num_readers_and_wait_for_readers():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    assert pub.num_readers == 0
    assert not pub.wait_for_readers(1, timeout=0.05)
    subs = [msgq.sub_sock(topic) for _ in range(3)]
    assert pub.wait_for_readers(3, timeout=1)
    assert pub.num_readers == 3
    subs.pop().close()
    assert pub.num_readers == 2
    with pytest.raises(ValueError):
        pub.wait_for_readers(-1)


def test_closing_a_publisher_while_another_thread_sends_large_messages_raises_closed_error():
    import threading

    pub = msgq.pub_sock(unique_topic(), segment_size=32 << 20)
    big = b"x" * (8 << 20)  # large sends copy with the GIL released
    errors = []

    def spam():
        try:
            while True:
                pub.send(big)
        except msgq.ClosedError as e:
            errors.append(e)

    t = threading.Thread(target=spam)
    t.start()
    while pub._impl.messages_sent < 3:
        pass
    pub.close()
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])
