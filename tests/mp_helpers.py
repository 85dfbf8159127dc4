"""Code the multi-process tests run in child processes, and the harness that
starts, watches and reaps those children.

Children are started with the ``spawn`` method, so every target lives here,
importable by name. Each target takes ``(name, results, ...)`` and puts one
``(name, report)`` on ``results`` (a dict; on an exception, a dict with an
``"exception"`` traceback; targets the test kills report nothing). The run
prefix reaches children through the inherited ``MSGQ_PREFIX``.

Every message of a stream carries its generation (which publisher), its
length, its sequence number and a blake2b checksum over all of them plus the
payload, so a subscriber can prove each message intact and in order.
"""

import contextlib
import functools
import hashlib
import multiprocessing
import queue
import random
import resource
import select
import signal
import struct
import threading
import time
import traceback

from reports import Results

import msgq
from msgq.backends.shm import remove_stale_segments
from msgq.names import current_prefix

SPAWN = multiprocessing.get_context("spawn")

HEADER = struct.Struct("<IIQ")  # generation, payload length, sequence number
DIGEST_SIZE = 16
OVERHEAD = HEADER.size + DIGEST_SIZE  # bytes of every message before its payload
PREFIX_BYTES = 8  # the ring's size prefix (DESIGN.md section 3)

BARRIER_TIMEOUT = 60.0  # seconds any child waits for its peers
STREAM_DEADLINE = 90.0  # seconds any stream may take before a child gives up


# ---------------------------------------------------------------- messages


def encode(seq: int, payload, generation: int = 0) -> bytes:
    head = HEADER.pack(generation, len(payload), seq)
    digest = hashlib.blake2b(head, digest_size=DIGEST_SIZE)
    digest.update(payload)
    return b"".join((head, digest.digest(), payload))


def decode(msg: bytes):
    """``(generation, seq)`` of an intact message; ``ValueError`` saying what is wrong otherwise."""
    if len(msg) < OVERHEAD:
        raise ValueError(f"a {len(msg)}-byte message is shorter than the {OVERHEAD}-byte header")
    generation, length, seq = HEADER.unpack_from(msg)
    if length != len(msg) - OVERHEAD:
        raise ValueError(f"message says {length} payload bytes but has {len(msg) - OVERHEAD} (seq {seq}?)")
    digest = hashlib.blake2b(memoryview(msg)[: HEADER.size], digest_size=DIGEST_SIZE)
    digest.update(memoryview(msg)[OVERHEAD:])
    if digest.digest() != msg[HEADER.size : OVERHEAD]:
        raise ValueError(f"checksum mismatch: torn message (seq {seq}?, generation {generation}?, {len(msg)} bytes)")
    return generation, seq


def ring_bytes_at_least(message_len: int) -> int:
    """Lower bound of the ring space a message takes: its size prefix plus its bytes."""
    return PREFIX_BYTES + message_len


def ring_bytes_at_most(message_len: int) -> int:
    """Upper bound: prefix, bytes, and up to 8 bytes of alignment padding."""
    return PREFIX_BYTES + message_len + 8


class Payloads:
    """Random payloads of random sizes, cheap to make: slices of one random pool."""

    def __init__(self, seed: int, max_payload: int):
        self.rng = random.Random(seed)
        self.max_payload = max_payload
        self.pool = self.rng.randbytes(2 * max_payload + 1)

    def size(self) -> int:
        """Mostly small, often large, sometimes exactly 0 or the largest that fits."""
        r = self.rng.random()
        if r < 0.10:
            return 0
        if r < 0.13:
            return self.max_payload
        if r < 0.40:
            return self.rng.randint(1, min(64, self.max_payload))
        if r < 0.70:
            return self.rng.randint(1, min(4096, self.max_payload))
        return self.rng.randint(1, self.max_payload)

    def next(self) -> bytes:
        n = self.size()
        start = self.rng.randrange(len(self.pool) - n)
        return self.pool[start : start + n]


class StreamChecker:
    """Checks each received message and keeps the counts a test asserts on.

    Per generation: messages, first and last sequence number, gaps (places
    where sequence numbers skipped ahead) and how many they skipped. Across
    the whole stream, (generation, seq) must strictly increase.
    """

    def __init__(self):
        self.count = 0
        self.error_count = 0
        self.errors = []
        self.last = None
        self.generations = {}

    def error(self, text: str):
        self.error_count += 1
        if len(self.errors) < 5:
            self.errors.append(text)

    def add(self, msg: bytes):
        try:
            key = decode(msg)
        except ValueError as e:
            self.error(str(e))
            return None
        if self.last is not None and key <= self.last:
            self.error(f"message (generation, seq) {key} came after {self.last}: not strictly increasing")
            return key
        generation, seq = key
        stats = self.generations.get(generation)
        if stats is None:
            stats = self.generations[generation] = {"count": 0, "first": seq, "last": seq, "gaps": 0, "missed": 0}
        elif seq != stats["last"] + 1:
            stats["gaps"] += 1
            stats["missed"] += seq - stats["last"] - 1
        stats["count"] += 1
        stats["last"] = seq
        self.count += 1
        self.last = key
        return key

    def report(self) -> dict:
        return {
            "count": self.count,
            "errors": self.errors,
            "error_count": self.error_count,
            "generations": self.generations,
        }


# ---------------------------------------------------------------- harness


def child(fn):
    """Report a child's exception to the parent instead of dying silently."""

    @functools.wraps(fn)
    def run(name, results, *args, **kwargs):
        try:
            fn(name, results, *args, **kwargs)
        except BaseException:
            results.put((name, {"exception": traceback.format_exc()}))
            raise

    return run


class Children:
    """Spawned child processes that cannot outlive the block: on leaving it,
    survivors are joined (``join_timeout``), then killed; after an error they
    are killed at once."""

    def __init__(self, join_timeout: float = 30.0):
        self.join_timeout = join_timeout
        self.procs = []
        self.results = Results()  # a pipe per child: killing one cannot block the others' reports

    def start(self, target, name, *args):
        reporter = self.results.reporter()
        proc = SPAWN.Process(target=target, args=(name, reporter) + args, name=name, daemon=True)
        proc.start()
        reporter.close()  # the child has its copy; ours would hide its end of file
        self.procs.append(proc)
        return proc

    def collect(self, names, timeout: float = 60.0) -> dict:
        """The reports of the children ``names``; fails if one raised, died
        without reporting, or all did not report within ``timeout`` s."""
        wanted = set(names)
        got = {}
        deadline = time.monotonic() + timeout
        exited_at = {}
        while wanted - set(got):
            try:
                name, report = self.results.get(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                for proc in self.procs:
                    if proc.name in wanted and proc.name not in got and proc.exitcode is not None:
                        # Its report may still be in the pipe: give it a moment.
                        if now - exited_at.setdefault(proc.name, now) > 2.0:
                            raise AssertionError(
                                f"child {proc.name} exited with code {proc.exitcode} without reporting"
                            ) from None
                if now > deadline:
                    raise AssertionError(
                        f"children {sorted(wanted - set(got))} did not report within {timeout} s"
                    ) from None
                continue
            if "exception" in report:
                raise AssertionError(f"child {name} failed:\n{report['exception']}")
            got[name] = report
        return {name: got[name] for name in names}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        deadline = time.monotonic() + (0 if exc_type else self.join_timeout)
        stuck = []
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                stuck.append(proc.name)
                proc.kill()
                proc.join(timeout=10)
        self.results.close()
        if exc_type is not None and current_prefix():
            # Killed children cannot unlink their segments; do what a user would.
            remove_stale_segments(current_prefix())
        if stuck and exc_type is None:
            raise AssertionError(f"children {stuck} did not exit within {self.join_timeout} s and were killed")


def process_state(pid: int) -> str:
    """One-letter scheduler state of ``pid`` ('S' sleeping, 'R' running, 'Z' zombie...)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"


def wait_until_asleep(pid: int, timeout: float = 10.0) -> bool:
    """Wait until ``pid`` has been seen asleep a few times in a row (it is then
    blocked, not merely descheduled); whether it was."""
    deadline = time.monotonic() + timeout
    in_a_row = 0
    while time.monotonic() < deadline:
        in_a_row = in_a_row + 1 if process_state(pid) == "S" else 0
        if in_a_row >= 5:
            return True
        time.sleep(0.02)
    return False


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def wait_until_all_read(pub, deadline: float):
    while not pub.all_readers_updated():
        if time.monotonic() > deadline:
            raise RuntimeError(f"readers of {pub.endpoint} stopped reading ({pub.num_readers} attached)")
        time.sleep(0.0002)


# ---------------------------------------------------------------- stream children


@child
def publish_stream(
    name,
    results,
    topic,
    segment_size,
    target_ring_bytes,
    seed,
    barrier,
    done,
    max_payload=None,
    burst_bytes=None,
    generation=0,
    zero_copy=False,
):
    """Publish messages until at least ``target_ring_bytes`` went through the
    ring. With ``burst_bytes``, pace: after each burst of at most that many ring
    bytes, wait until every reader has read everything (so none is lapped).
    With ``zero_copy``, write each message in place through a loan a little
    larger than the message, and commit only the message's bytes."""
    pub = msgq.pub_sock(topic, segment_size=segment_size)
    if max_payload is None:
        max_payload = pub.max_message_size - OVERHEAD
    payloads = Payloads(seed, max_payload)
    extra = random.Random(seed + 1)

    def send(msg):
        if not zero_copy:
            pub.send(msg)
            return
        loan = pub.loan(min(pub.max_message_size, len(msg) + extra.randrange(64)))
        loan.data[: len(msg)] = msg
        loan.commit(len(msg))

    barrier.wait(BARRIER_TIMEOUT)
    deadline = time.monotonic() + STREAM_DEADLINE
    if burst_bytes is not None:
        wait_until_all_read(pub, deadline)  # whatever an earlier publisher left
    sent = ring_total = burst = 0
    while ring_total < target_ring_bytes:
        msg = encode(sent, payloads.next(), generation)
        if burst_bytes is not None and burst + ring_bytes_at_most(len(msg)) > burst_bytes:
            wait_until_all_read(pub, deadline)
            burst = 0
        send(msg)
        sent += 1
        ring_total += ring_bytes_at_least(len(msg))
        burst += ring_bytes_at_most(len(msg))
    if burst_bytes is not None:
        wait_until_all_read(pub, deadline)
    report = {
        "sent": sent,
        "ring_bytes": ring_total,
        "max_payload": max_payload,
        "segment_size": pub.segment_size,
        "readers": pub.num_readers,
    }
    results.put((name, report))
    done.set()
    pub.close()


@child
def subscribe_stream(name, results, topic, segment_size, barrier, done, conflate=False, pause_s=0.0):
    """Receive and check every message until the publisher is done and the
    ring is drained; ``pause_s`` makes a deliberately slow reader."""
    sub = msgq.sub_sock(topic, conflate=conflate, timeout=100, segment_size=segment_size)
    barrier.wait(BARRIER_TIMEOUT)
    checker = StreamChecker()
    deadline = time.monotonic() + STREAM_DEADLINE
    while time.monotonic() < deadline:
        msg = sub.receive()
        if msg is None:
            # done is set after the last send: once seen, an empty ring is final.
            if not done.is_set():
                continue
            msg = sub.receive(non_blocking=True)
            if msg is None:
                break
        checker.add(msg)
        if pause_s:
            time.sleep(pause_s)
    else:
        checker.error(f"gave up after {STREAM_DEADLINE} s")
    report = checker.report()
    report["resets"] = sub.resets
    sub.close()
    results.put((name, report))


@child
def publish_until_killed(name, results, topic, segment_size, generation, seed, started):
    """Publish as fast as possible until SIGKILL, so the kill can land mid-send."""
    pub = msgq.pub_sock(topic, segment_size=segment_size)
    payloads = Payloads(seed, min(2048, pub.max_message_size - OVERHEAD))
    seq = 0
    while True:
        pub.send(encode(seq, payloads.next(), generation))
        seq += 1
        if seq == 1000:
            started.set()


@child
def hold_loan_until_killed(name, results, topic, segment_size, generation, count, loaned):
    """Publish ``count`` messages, then take a loan, write half of it, and wait for SIGKILL."""
    pub = msgq.pub_sock(topic, segment_size=segment_size)
    for seq in range(count):
        pub.send(encode(seq, b"x" * (seq % 100), generation))
    loan = pub.loan(256)
    loan.data[:128] = b"\xff" * 128
    loaned.set()
    while True:
        time.sleep(1)


@child
def subscribe_until_done(name, results, topic, segment_size, ready, first_seen, done):
    """Check messages of any generation until ``done`` is set and the ring is
    drained; set ``first_seen`` at the first message."""
    sub = msgq.sub_sock(topic, timeout=100, segment_size=segment_size)
    ready.set()
    checker = StreamChecker()
    deadline = time.monotonic() + STREAM_DEADLINE
    while time.monotonic() < deadline:
        msg = sub.receive()
        if msg is None:
            if not done.is_set():
                continue
            msg = sub.receive(non_blocking=True)
            if msg is None:
                break
        checker.add(msg)
        first_seen.set()
    else:
        checker.error(f"gave up after {STREAM_DEADLINE} s")
    report = checker.report()
    report["resets"] = sub.resets
    sub.close()
    results.put((name, report))


@child
def receive_messages(name, results, topic, segment_size, count, ready, linger=None):
    """Receive ``count`` messages (blocking, each within 30 s) and check them;
    with ``linger``, stay attached after reporting until it is set."""
    sub = msgq.sub_sock(topic, timeout=30_000, segment_size=segment_size)
    ready.set()
    checker = StreamChecker()
    for _ in range(count):
        msg = sub.receive()
        if msg is None:
            checker.error("a receive timed out after 30 s")
            break
        checker.add(msg)
    report = checker.report()
    report["resets"] = sub.resets
    results.put((name, report))
    if linger is not None:
        linger.wait(BARRIER_TIMEOUT)
    sub.close()


@child
def block_in_receive(name, results, topic, segment_size, ready):
    """Block in receive() with no timeout, until killed."""
    sub = msgq.sub_sock(topic, segment_size=segment_size)
    ready.set()
    while True:
        sub.receive()


@child
def hold_subscribers(name, results, topic, count, ready, release):
    """Hold ``count`` subscribers of ``topic``; report the first message each
    receives, then block in receive() on the first until ``release`` (or SIGKILL)."""
    subs = [msgq.sub_sock(topic, timeout=30_000) for _ in range(count)]
    ready.set()
    received = [sub.receive() for sub in subs]
    results.put((name, {"received": received}))
    subs[0].setTimeout(100)
    while not release.is_set():
        subs[0].receive()
    for sub in subs:
        sub.close()


# ---------------------------------------------------------------- waiting children


@child
def receive_blocking_and_measure(name, results, topic, ready, timeout_ms=None):
    """Block in one receive() (no timeout, or ``timeout_ms``); report what came,
    and the wall and CPU seconds the call took in this process."""
    sub = msgq.sub_sock(topic, timeout=timeout_ms)
    ready.set()
    wall, cpu = time.monotonic(), cpu_seconds()
    msg = sub.receive()
    wall, cpu = time.monotonic() - wall, cpu_seconds() - cpu
    sub.close()
    results.put((name, {"message": msg, "wall_s": wall, "cpu_s": cpu}))


@child
def poll_blocking_and_measure(name, results, topics, ready, timeout_ms):
    """Block in one Poller.poll(timeout_ms) over ``topics``; report which
    topics were ready, and the wall and CPU seconds the call took."""
    poller = msgq.Poller()
    subs = [msgq.sub_sock(topic, poller=poller) for topic in topics]
    ready.set()
    wall, cpu = time.monotonic(), cpu_seconds()
    ready_socks = poller.poll(timeout_ms)
    wall, cpu = time.monotonic() - wall, cpu_seconds() - cpu
    report = {
        "ready": [s.endpoint for s in ready_socks],
        "messages": {s.endpoint: s.receive(non_blocking=True) for s in ready_socks},
        "wall_s": wall,
        "cpu_s": cpu,
    }
    for sub in subs:
        sub.close()
    results.put((name, report))


def _blocking_call(how, topic):
    """A socket on ``topic`` and a call that blocks on it until a message comes."""
    sub = msgq.sub_sock(topic)
    if how == "receive":
        return sub, sub.receive
    if how == "receive_batch":
        return sub, lambda: sub.receive_batch(16, timeout=-1)
    if how == "poll":
        poller = msgq.Poller()
        poller.registerSocket(sub)
        return sub, lambda: poller.poll(-1)
    raise ValueError(how)


@child
def count_while_other_thread_blocks(name, results, topic, how, count_for_s):
    """A thread blocks in ``how`` (receive / receive_batch / poll) on ``topic``
    while the main thread counts loop iterations for ``count_for_s`` seconds,
    then publishes to wake it. If the wait held the GIL, the main thread would
    never get to count (the parent's watchdog then kills us)."""
    pub = msgq.pub_sock(topic)
    sub, call = _blocking_call(how, topic)
    entering = threading.Event()
    got = []

    def waiter():
        entering.set()
        got.append(call())

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    entering.wait()
    time.sleep(0.2)  # let the thread get into the wait
    iterations = 0
    end = time.monotonic() + count_for_s
    while time.monotonic() < end:
        iterations += 1
    pub.send(b"wake up")
    thread.join(30)
    report = {"iterations": iterations, "woken": not thread.is_alive(), "result_count": len(got)}
    sub.close()
    pub.close()
    results.put((name, report))


@child
def wait_for_ctrl_c(name, results, topic, how, ready):
    """Block in ``how`` on ``topic`` until SIGINT; report what happened, and
    close cleanly."""
    sub, call = _blocking_call(how, topic)
    ready.set()
    start = time.monotonic()
    try:
        call()
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    waited = time.monotonic() - start
    sub.close()
    results.put((name, {"outcome": outcome, "waited_s": waited}))


@child
def close_while_another_thread_waits(name, results, topic, timeout_ms):
    """A thread blocks in receive() (``timeout_ms``; None: no timeout) on a
    subscriber; the main thread closes that subscriber. Report how the wait
    ended and whether it ended within 5 s of the close."""
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=timeout_ms)
    call = sub.receive
    entering = threading.Event()
    outcome = []

    def waiter():
        entering.set()
        try:
            outcome.append(("returned", repr(call())))
        except Exception as e:  # noqa: BLE001 - the test asserts which one
            outcome.append(("raised", type(e).__name__))

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    entering.wait()
    time.sleep(0.3)  # let the thread get into the wait
    sub.close()
    thread.join(5)
    report = {"ended": not thread.is_alive(), "outcome": outcome}
    pub.close()
    results.put((name, report))


def _signal_state():
    dispositions = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            dispositions[int(sig)] = handler if isinstance(handler, int) else repr(handler)
    kernel = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigCgt", "SigIgn", "SigBlk"):
                kernel[key] = value.strip()
    return {"python": dispositions, "kernel": kernel}


@child
def signal_state_around_sockets(name, results, topic):
    """Signal dispositions (Python's view and the kernel's masks) before and
    after using every kind of socket and wait."""
    before = _signal_state()
    pub = msgq.pub_sock(topic)
    poller = msgq.Poller()
    sub = msgq.sub_sock(topic, poller=poller, timeout=50)
    other = msgq.sub_sock(topic, conflate=True, timeout=50)
    pub.send(b"one")
    assert sub.receive() == b"one" and other.receive() == b"one"
    assert sub.receive() is None and other.receive() is None
    assert poller.poll(50) == []
    assert not sub.arm()
    select.select([sub.fileno()], [], [], 0.05)
    sub.disarm()
    with pub.loan(8) as buf:
        buf[:] = b"12345678"
    assert sub.receive() == b"12345678"
    after = _signal_state()
    for s in (sub, other, pub):
        s.close()
    results.put((name, {"before": before, "after": after}))


@child
def publish_later(name, results, sends, delay_s):
    """After ``delay_s``, for each ``(topic, payload)`` publish it (topics
    must exist already; this keeps their ring size)."""
    pubs = {}
    for topic, _ in sends:
        if topic not in pubs:
            pubs[topic] = msgq.pub_sock(topic)
    time.sleep(delay_s)
    for topic, payload in sends:
        pubs[topic].send(payload)
    for pub in pubs.values():
        pub.close()
    results.put((name, {"sent": len(sends)}))


@child
def publish_paced(name, results, topic, payloads, interval_s):
    """Publish ``payloads`` on an existing topic, ``interval_s`` apart."""
    pub = msgq.pub_sock(topic)
    for payload in payloads:
        time.sleep(interval_s)
        pub.send(payload)
    pub.close()
    results.put((name, {"sent": len(payloads)}))


@child
def receive_and_ack(name, results, topic, count, ready):
    """Receive ``count`` messages, one report (its sequence number) as each arrives."""
    sub = msgq.sub_sock(topic, timeout=30_000)
    ready.set()
    for _ in range(count):
        msg = sub.receive()
        if msg is None:
            raise AssertionError("a receive timed out after 30 s")
        results.put((name, {"seq": decode(msg)[1]}))
    sub.close()
