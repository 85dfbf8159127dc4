"""msgq-bridge: shared-memory topics to ZeroMQ TCP and back, tested against
plain pyzmq sockets on 127.0.0.1 (ports from msgq.names.zmq_port, which the
per-test MSGQ_PREFIX makes unique)."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

import msgq
from msgq.names import segment_basename, zmq_port
from msgq.testing import segments, unique_topic, wait_until_gone

zmq = pytest.importorskip("zmq")

DEADLINE = 30.0  # seconds any single wait may take before the test fails
WARM = b"warm"


def endpoint(topic):
    return f"tcp://127.0.0.1:{zmq_port(topic)}"


def payloads(count, seed, max_size=2000):
    """Distinct payloads of random sizes (one empty), recognisable by their first bytes."""
    rng = random.Random(seed)
    out = [b"data%06d" % i + rng.randbytes(rng.randrange(max_size)) for i in range(count)]
    out[count // 2] = b""
    return out


@contextlib.contextmanager
def bridge(tmp_path, *args):
    """Runs ``msgq-bridge ARGS`` in a child process; on leaving, stops it with
    SIGTERM and checks that it exited with status 0."""
    log_path = tmp_path / f"bridge-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "msgq.apps.bridge", *args], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    assert rc == 0, log_path.read_text()


def wait_for_segment(topic, proc):
    """The bridge has installed its signal handlers and attached its local side."""
    deadline = time.monotonic() + DEADLINE
    prefix = os.environ["MSGQ_PREFIX"]
    while segment_basename(topic) not in segments(prefix):
        assert proc.poll() is None, "the bridge exited early"
        assert time.monotonic() < deadline, "the bridge never attached to the topic"
        time.sleep(0.01)


def bind_when_free(sock, address):
    """ZeroMQ releases a closed socket's port asynchronously, and the bridge's
    reconnect attempts may hold it for an instant: retry until it is free."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return sock.bind(address)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def zmq_sub(ctx, topic):
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint(topic))
    return sock


def warm_up(send, receive, proc, tag=WARM, stale=WARM):
    """Tolerate slow joiners: keep sending tagged messages until one arrives. Messages of
    an earlier warm-up (``stale``) still in flight are passed over: the first warm-up
    sends one every 20 ms until one comes through, and under load the rest can arrive
    after a later warm-up began (a run beside ``stress-ng`` saw ``warm24`` there)."""
    deadline = time.monotonic() + DEADLINE
    i = 0
    while True:
        send(tag + b"%d" % i)
        i += 1
        msg = receive(0.02)
        if msg is not None and not (tag != stale and msg.startswith(stale)):
            assert msg.startswith(tag), msg[:40]
            return msg
        assert proc is None or proc.poll() is None, "the bridge exited"
        assert time.monotonic() < deadline, "nothing came through the bridge"


def receive_exactly(receive, expected, skip=WARM):
    """The next len(expected) messages after any leftover warm-up ones."""
    got = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < len(expected):
        msg = receive(0.1)
        if msg is None:
            assert time.monotonic() < deadline, f"only {len(got)} of {len(expected)} messages arrived"
            continue
        if not got and msg.startswith(skip):
            continue
        got.append(msg)
    assert got == expected
    assert receive(0.05) is None  # nothing extra, nothing duplicated


def zmq_receiver(sock):
    def receive(timeout_s):
        return sock.recv() if sock.poll(int(timeout_s * 1000)) else None

    return receive


def msgq_receiver(sub):
    def receive(timeout_s):
        sub.setTimeout(int(timeout_s * 1000))
        return sub.receive()

    return receive


def test_local_topic_reaches_a_plain_zmq_subscriber_byte_for_byte(tmp_path):
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        with msgq.pub_sock(topic) as pub, bridge(tmp_path, "out", topic, "--bind", "127.0.0.1") as proc:
            sock = zmq_sub(ctx, topic)
            receive = zmq_receiver(sock)
            warm_up(pub.send, receive, proc)
            expected = payloads(300, seed=1)
            for msg in expected:
                pub.send(msg)
            receive_exactly(receive, expected)
            sock.close()
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_zmq_publisher_reaches_a_local_subscriber_byte_for_byte(tmp_path):
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        remote.bind(endpoint(topic))
        with msgq.sub_sock(topic) as sub, bridge(tmp_path, "in", topic, "--from", "127.0.0.1") as proc:
            receive = msgq_receiver(sub)
            warm_up(remote.send, receive, proc)
            expected = payloads(300, seed=2)
            for i, msg in enumerate(expected):
                remote.send(msg)
                if i == 10:  # not a msgq message (one frame each): dropped, not mangled
                    remote.send_multipart([b"two", b"frames"])
            receive_exactly(receive, expected)
        remote.close()
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_restarted_remote_publisher_is_reconnected(tmp_path):
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        with msgq.sub_sock(topic) as sub, bridge(tmp_path, "in", topic, "--from", "127.0.0.1") as proc:
            receive = msgq_receiver(sub)
            for generation in (b"first", b"second"):
                remote = ctx.socket(zmq.PUB)
                remote.setsockopt(zmq.LINGER, 0)
                bind_when_free(remote, endpoint(topic))
                warm_up(remote.send, receive, proc, tag=generation)
                expected = payloads(50, seed=len(generation))
                for msg in expected:
                    remote.send(msg)
                receive_exactly(receive, expected, skip=generation)
                remote.close()  # the bridge keeps retrying until a publisher is back on the port
    finally:
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


def test_local_publisher_taking_over_an_incoming_topic_wins(tmp_path):
    topic = unique_topic()
    ctx = zmq.Context()
    log_path = tmp_path / "bridge.log"
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        remote.bind(endpoint(topic))
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "msgq.apps.bridge", "in", topic, "--from", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            with msgq.sub_sock(topic) as sub:
                warm_up(remote.send, msgq_receiver(sub), proc)
                with msgq.pub_sock(topic) as local:  # last publisher wins: the bridge steps aside
                    deadline = time.monotonic() + DEADLINE
                    while proc.poll() is None:
                        remote.send(b"remote")
                        assert time.monotonic() < deadline, "the bridge kept its publisher"
                        time.sleep(0.01)
                    local.send(b"local")
                    sub.setTimeout(int(DEADLINE * 1000))
                    while (msg := sub.receive()) == b"remote":
                        pass
                    assert msg == b"local"
        finally:
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
        assert rc == 1
        assert "took over" in log_path.read_text()
    finally:
        ctx.destroy(linger=0)


PUBLISH_FOREVER = """
import sys, time, msgq
pub = msgq.pub_sock(sys.argv[1])
i = 0
while True:
    pub.send(b"gen1 %d" % i)
    i += 1
    time.sleep(0.002)
"""


@pytest.mark.parametrize("new_size", [0, 2 << 20], ids=["same-size", "new-segment-size"])
def test_killed_and_restarted_local_publisher_keeps_flowing(tmp_path, new_size):
    topic = unique_topic()
    ctx = zmq.Context()
    first = subprocess.Popen([sys.executable, "-P", "-c", PUBLISH_FOREVER, topic])
    try:
        with bridge(tmp_path, "out", topic, "--bind", "127.0.0.1") as proc:
            sock = zmq_sub(ctx, topic)
            receive = zmq_receiver(sock)
            deadline = time.monotonic() + DEADLINE
            while (msg := receive(0.1)) is None or not msg.startswith(b"gen1"):
                assert first.poll() is None and proc.poll() is None
                assert time.monotonic() < deadline, "the first publisher's messages never came through"
            first.kill()
            first.wait()

            with msgq.pub_sock(topic, segment_size=new_size) as second:
                # Skip what the first publisher left in flight, then expect exactly the second's.
                deadline = time.monotonic() + DEADLINE
                i = 0
                while True:
                    second.send(b"gen2 %d" % i)
                    i += 1
                    msg = receive(0.02)
                    if msg is not None and msg.startswith(b"gen2"):
                        break
                    assert time.monotonic() < deadline, "the restarted publisher's messages never came through"
                expected = payloads(200, seed=3)
                for msg in expected:
                    second.send(msg)
                receive_exactly(receive, expected, skip=b"gen2")
            sock.close()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        ctx.destroy(linger=0)  # closes whatever a failed assertion left open


@pytest.mark.parametrize(
    "direction, sig",
    [("out", signal.SIGTERM), ("in", signal.SIGTERM), ("out", signal.SIGINT)],
    ids=["out-sigterm", "in-sigterm", "out-sigint"],
)
def test_stopped_bridge_exits_zero_and_leaves_no_segment(tmp_path, msgq_prefix, direction, sig):
    topic = unique_topic()
    args = ["--bind", "127.0.0.1"] if direction == "out" else ["--from", "127.0.0.1"]
    with bridge(tmp_path, direction, topic, *args) as proc:
        wait_for_segment(topic, proc)  # created by the bridge itself: nobody else uses the topic
        proc.send_signal(sig)
        assert proc.wait(timeout=DEADLINE) == 0
    assert wait_until_gone(msgq_prefix) == []


def test_bad_arguments_are_refused(capsys):
    from msgq.apps import bridge as tool

    for argv in (["out", "../etc"], ["in", "topic"], ["sideways", "topic"], ["out", "t", "--hwm", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            tool.main(argv)
        assert exit_info.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--help"])
    assert exit_info.value.code == 0
    assert "msgq-bridge out" in capsys.readouterr().out


def test_setup_failures_exit_one_and_leave_nothing(capsys):
    from msgq.apps import bridge as tool

    topic = unique_topic()
    assert tool.main(["in", topic, "--from", "127.0.0.1", "--segment-size", "5"]) == 1
    assert "segment_size" in capsys.readouterr().err

    ctx = zmq.Context()
    try:
        squatter = ctx.socket(zmq.PUB)
        squatter.bind(endpoint(topic))
        assert tool.main(["out", unique_topic(), topic, "--bind", "127.0.0.1"]) == 1
        assert "cannot bind" in capsys.readouterr().err
    finally:
        ctx.destroy(linger=0)


def test_curve_bridge_admits_only_authorized_subscribers(tmp_path):
    from msgq import curve

    keys, other = curve.create_keys(str(tmp_path / "keys")), curve.create_keys(str(tmp_path / "other"))
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        with (
            msgq.pub_sock(topic) as pub,
            bridge(tmp_path, "out", topic, "--bind", "127.0.0.1", "--curve", keys) as proc,
        ):
            socks = {}
            for name, key_dir in (("authorized", keys), ("wrong_key", other), ("plain", None)):
                sock = ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SUBSCRIBE, b"")
                if key_dir:
                    curve.make_client(sock, key_dir, curve.server_public_key(keys))
                sock.connect(endpoint(topic))
                socks[name] = sock
            receive = zmq_receiver(socks["authorized"])
            warm_up(pub.send, receive, proc)
            expected = payloads(50, seed=3)
            for msg in expected:
                pub.send(msg)
            receive_exactly(receive, expected)
            assert not socks["wrong_key"].poll(100) and not socks["plain"].poll(100)  # nothing at all
            for sock in socks.values():
                sock.close()
    finally:
        ctx.destroy(linger=0)


def test_curve_bridge_in_reaches_an_authenticated_publisher(tmp_path):
    from msgq import curve

    keys = curve.create_keys(str(tmp_path / "keys"))
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        curve.make_server(remote, keys)  # admits only DIR/authorized: the bridge's client key
        remote.bind(endpoint(topic))
        with msgq.sub_sock(topic) as sub, bridge(tmp_path, "in", topic, "--from", "127.0.0.1", "--curve", keys) as proc:
            receive = msgq_receiver(sub)
            warm_up(remote.send, receive, proc)
            expected = payloads(50, seed=4)
            for msg in expected:
                remote.send(msg)
            receive_exactly(receive, expected)
        remote.close()
    finally:
        curve.stop_authenticator(ctx)
        ctx.destroy(linger=0)


def test_curve_keys_directory_is_checked_before_starting(tmp_path, capsys):
    from msgq.apps import bridge as tool

    for direction in (["out", "t"], ["in", "t", "--from", "127.0.0.1"]):
        with pytest.raises(SystemExit) as exit_info:
            tool.main([*direction, "--curve", str(tmp_path / "missing")])
        assert exit_info.value.code == 2
        assert "CURVE keys directory" in capsys.readouterr().err


def _memory_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def test_messages_larger_than_the_topic_never_reach_the_bridges_memory(tmp_path):
    """Issue 31 item 5: a peer at the bridge's port sending 12 messages of 100 MB
    took ``msgq-bridge in`` to a 596 MB peak (no ZMQ_MAXMSGSIZE). Now ZeroMQ refuses
    anything larger than the local topic can hold before buffering it; the peer is
    disconnected, reconnected, and what fits still flows."""
    topic = unique_topic()
    ctx = zmq.Context()
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        remote.bind(endpoint(topic))
        with msgq.sub_sock(topic) as sub, bridge(tmp_path, "in", topic, "--from", "127.0.0.1") as proc:
            receive = msgq_receiver(sub)
            warm_up(remote.send, receive, proc)
            before_kb = _memory_kb(proc.pid, "VmRSS")
            huge = zmq.Frame(b"\xab" * (100 << 20))  # sent by reference: the test holds one copy
            for _ in range(12):
                remote.send(huge, copy=False)
            time.sleep(2)  # what the bridge would have received and buffered by now
            warm_up(remote.send, receive, proc, tag=b"after")  # reconnected; small messages flow
            peak_kb = _memory_kb(proc.pid, "VmHWM")
            assert peak_kb - before_kb < 32 * 1024, f"the bridge grew from {before_kb} kB to a {peak_kb} kB peak"
            assert proc.poll() is None
        remote.close()
    finally:
        ctx.destroy(linger=0)


def test_out_announces_a_topics_schema_to_each_new_subscriber(tmp_path):
    from msgq.schemas import from_announcement

    topic = unique_topic()
    schema = msgq.Schema("jsonschema", "Reading", b'{"type": "object"}')
    ctx = zmq.Context()
    try:
        with msgq.pub_sock(topic, schema=schema) as pub, bridge(tmp_path, "out", topic, "--bind", "127.0.0.1") as proc:
            wait_for_segment(topic, proc)
            remote = zmq_sub(ctx, topic)
            deadline, announced = time.monotonic() + DEADLINE, None
            while announced is None:  # the announcement, among the messages sent meanwhile
                assert time.monotonic() < deadline and proc.poll() is None, "no schema announcement came"
                pub.send(b"x")
                if remote.poll(20):
                    announced = from_announcement(remote.recv_multipart())
            assert announced == schema
            remote.close()
    finally:
        ctx.destroy(linger=0)


def test_in_declares_the_schema_a_remote_bridge_announces_and_ignores_a_malformed_one(tmp_path):
    from msgq.schemas import ANNOUNCE, announcement

    topic = unique_topic()
    schema = msgq.Schema("protobuf", "pkg.Msg", b"\x0a\x03abc")
    ctx = zmq.Context()
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        remote.bind(endpoint(topic))
        with msgq.sub_sock(topic) as sub, bridge(tmp_path, "in", topic, "--from", "127.0.0.1") as proc:
            warm_up(remote.send, msgq_receiver(sub), proc)
            remote.send_multipart([ANNOUNCE, b"{not json"])
            remote.send_multipart(announcement(schema))
            deadline = time.monotonic() + DEADLINE
            while msgq.topic_schema(topic) != schema:
                assert time.monotonic() < deadline and proc.poll() is None, "the schema never arrived"
                time.sleep(0.02)
        remote.close()
    finally:
        ctx.destroy(linger=0)
    log = "".join(p.read_text() for p in tmp_path.glob("bridge-*.log"))
    assert "malformed schema announcement" in log and log.count("malformed") == 1


def test_in_takes_a_schema_larger_than_the_topics_largest_message_and_drops_such_data(tmp_path):
    """A schema may be larger than the messages its topic holds (a 64 KiB ring holds
    messages of about 32 KiB): its announcement gets through and is declared, a data
    message that large is dropped and logged, and the connection stays up."""
    from msgq.schemas import announcement

    topic = unique_topic()
    schema = msgq.Schema("protobuf", "pkg.Big", bytes(range(256)) * 400)  # 100 KiB
    ctx = zmq.Context()
    try:
        remote = ctx.socket(zmq.PUB)
        remote.setsockopt(zmq.LINGER, 0)
        remote.bind(endpoint(topic))
        args = ("in", topic, "--from", "127.0.0.1", "--segment-size", "65536")
        with bridge(tmp_path, *args) as proc:
            wait_for_segment(topic, proc)
            with msgq.sub_sock(topic) as sub:
                warm_up(remote.send, msgq_receiver(sub), proc)
                remote.send_multipart(announcement(schema))
                remote.send(b"y" * 50_000)  # over the topic's largest message
                remote.send(b"after")
                receive, deadline, got = msgq_receiver(sub), time.monotonic() + DEADLINE, None
                while got != b"after":  # the warm-up's stragglers first, never the large one
                    assert time.monotonic() < deadline and proc.poll() is None, "nothing came after the schema"
                    got = receive(0.05)
                    assert got is None or got == b"after" or got.startswith(WARM), len(got)
                assert msgq.topic_schema(topic) == schema
        remote.close()
    finally:
        ctx.destroy(linger=0)
    log = "".join(p.read_text() for p in tmp_path.glob("bridge-*.log"))
    assert "dropping messages of" in log and "closed its connection" not in log, log
