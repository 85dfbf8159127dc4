"""msgq's zmq backend vs raw pyzmq over the same ``tcp://127.0.0.1`` transport,
measured in the same run, the same way: the overhead of our layer.

- ``msgq zmq``: ``msgq.pub_sock`` / ``msgq.sub_sock`` with ``MSGQ_BACKEND=zmq``
  (an XPUB bound on ``zmq_port(topic)``, a SUB connected to it);
- ``pyzmq``: a raw pyzmq XPUB bound on ``tcp://127.0.0.1:PORT`` and a SUB
  with ``recv()``. An XPUB sends exactly as a PUB does (default send HWM
  1000, drops when full); it is used so the sender can see the subscription
  arrive, which is what our ``wait_for_readers`` does too.

For 64 B and 4 KiB messages (``--only`` picks parts):

- ``latency``: one-way p50 / p99; the sender is paced (one message every
  ``--interval-us``), each message carries its CLOCK_MONOTONIC send time
  (``time.monotonic_ns``, one clock for every process), the receiver blocks
  in receive (no timeout: the reference's default); warm-up not counted;
- ``credit``: delivered messages/s, the sender flat out but never more than
  400 messages ahead of the receiver's acks (one per 100, over a second
  topic of the same kind), with a high-water mark of 100 000 on both sides:
  nothing is lost, so both variants move the same messages;
- ``lossy``: the sender flat out without credit, the receiver counts what
  it gets (both drop at the HWM of 1000; received/s over the receiver's
  span). Shown for insight only: a slower sender loses fewer messages,
  which then cost the receiver work, so these rates swing from round to
  round and do not isolate our overhead;
- ``calls``: the bare per-call cost in one process: ``send`` with no
  subscriber (dropped at once, no I/O) and ``receive`` of a waiting message.

Sender and receiver are two ``spawn`` worker processes (visionipc.bench.workers),
each pinned to its own CPU when there are two; both variants alternate round
by round so a noisy machine's drift hits both alike. Topics are drawn so
that their ports lie outside the ephemeral port range. Overhead = ours /
raw - 1 for latency and call costs, raw / ours - 1 for rates; the 20 %
target applies to latency and credit throughput.

``python tools/bench_zmq_backend.py --quick`` runs in well under a minute.
"""

import argparse
import contextlib
import os
import sys
import time
from itertools import repeat
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from msgq.tooling import scoped_env
from visionipc.bench import pubsub, suite
from visionipc.bench.pubsub import STAMP as _Q
from visionipc.bench.stats import fmt_rate, fmt_size, format_table, latency_stats, median
from visionipc.bench.suite import Record
from visionipc.bench.workers import BenchError, Control, State

# Receives wait without a timeout on both sides (the reference's default, and pyzmq's plain recv());
# a lost message ends a run through the worker pool's own time limit.
TARGET = 0.20  # overhead target
SIZES = (64, 4096)
OURS, RAW = "msgq zmq", "pyzmq"


# =========================================================================== transports
# Only set-up goes through these; the timed loops call the sockets' own methods.


class Ours(pubsub.MsgqSockets):
    kind = OURS

    def __init__(self, hwm: Optional[int] = None) -> None:
        os.environ["MSGQ_BACKEND"] = "zmq"
        os.environ["MSGQ_ZMQ_BIND"] = "127.0.0.1"
        if hwm is None:
            os.environ.pop("MSGQ_ZMQ_HWM", None)
        else:
            os.environ["MSGQ_ZMQ_HWM"] = str(hwm)
        super().__init__()

    def pub(self, topic: str) -> Any:
        return self.msgq.pub_sock(topic)

    def sub(self, topic: str) -> Any:
        return self.msgq.sub_sock(topic)

    def receiver(self, sub: Any) -> Callable[[], Optional[bytes]]:
        """``recv()`` -> bytes, or None on timeout."""
        return sub.receive


class Raw(pubsub.ZmqSockets):
    kind = RAW

    def __init__(self, hwm: Optional[int] = None) -> None:
        import zmq

        from msgq.names import zmq_port

        super().__init__(zmq.Context.instance(), hwm=hwm)
        self.zmq_port = zmq_port

    def url(self, topic: str) -> str:
        return f"tcp://127.0.0.1:{self.zmq_port(topic)}"

    def receiver(self, sub: Any) -> Callable[[], bytes]:
        """``recv()`` -> bytes; raises ``zmq.Again`` on timeout."""
        return sub.recv


def make(kind: str, hwm: Optional[int] = None) -> Any:
    return Ours(hwm) if kind == OURS else Raw(hwm)


# =========================================================================== tasks (run in the workers)
# Every task: the sender binds, ctl.barrier("bound"); the receiver connects;
# the sender waits until it sees the subscription; ctl.barrier("ready");
# the timed part; ctl.barrier("done").


def task_latency_send(
    ctl: Control, state: State, kind: str, topic: str, size: int, count: int, warmup: int, interval_us: int
) -> Dict[str, Any]:
    t = make(kind)
    with pubsub.publishing(ctl, t, t.pub(topic)) as (pub, _):
        # lossy transports: send the end marker a few times
        pubsub.paced_send(pub.send, size, warmup + count, interval_us, end_copies=10, end_pause_s=0.002)
    return {}


def task_latency_recv(ctl: Control, state: State, kind: str, topic: str, warmup: int) -> Dict[str, Any]:
    t = make(kind)
    with pubsub.subscribing(ctl, t, lambda: t.sub(topic)) as sub:
        lat: List[int] = []
        how = pubsub.latency_loop(t.receiver(sub), lat, () if kind == OURS else t.zmq.Again)
    return {"samples": lat[warmup:], "ended": how}


def task_thr_send(ctl: Control, state: State, kind: str, topic: str, size: int, count: int) -> Dict[str, Any]:
    t = make(kind)
    with pubsub.publishing(ctl, t, t.pub(topic)) as (pub, _):
        send_s = pubsub.flat_send(pub.send, size, count)
        # the receiver stops at the first end marker it sees; some may be dropped
        pubsub.send_end_markers(pub.send, b"\xff", 20, 0.005)
    return {"sent": count, "send_s": send_s}


def task_thr_recv(ctl: Control, state: State, kind: str, topic: str) -> Dict[str, Any]:
    t = make(kind)
    with pubsub.subscribing(ctl, t, lambda: t.sub(topic)) as sub:
        now = time.monotonic_ns
        got, t_first, t_last, ended = 0, None, None, "end"
        if kind == OURS:
            recv = t.receiver(sub)
            m = recv()
            t_first = now()
            while m is not None and len(m) != 1:
                got += 1
                m = recv()
            if m is None:
                ended = "timeout"
        else:
            recv, Again = t.receiver(sub), t.zmq.Again
            try:
                m = recv()
                t_first = now()
                while len(m) != 1:
                    got += 1
                    m = recv()
            except Again:
                ended = "timeout"
        t_last = now()
    span = (t_last - t_first) * 1e-9 if t_first is not None else float("nan")
    rate = (got - 1) / span if got > 1 and span > 0 else float("nan")
    return {"received": got, "rate": rate, "span_s": span, "ended": ended}


# Credit: at most WINDOW messages unacknowledged, one ack per ACK_EVERY. ZeroMQ's publisher learns of its
# subscriber's progress late (in steps of half the HWM, when it next processes commands), so even a small
# window can overrun the default HWM of 1000 at high rates: the credit runs use CREDIT_HWM on both sides.
WINDOW, ACK_EVERY, CREDIT_HWM = 400, 100, 100_000


def _ack_functions(t: Any, sub: Any) -> Tuple[Callable[[], Optional[bytes]], Callable[[], Optional[bytes]]]:
    """(wait, poll) on the ack subscriber, both returning bytes or None, for either kind."""
    if t.kind == OURS:
        return sub.receive, lambda: sub.receive(True)
    zmq = t.zmq

    def wait() -> Optional[bytes]:
        try:
            return sub.recv()
        except zmq.Again:
            return None

    def poll() -> Optional[bytes]:
        try:
            return sub.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    return wait, poll


def task_credit_send(ctl: Control, state: State, kind: str, topic: str, size: int, count: int) -> Dict[str, Any]:
    """Sends as fast as the credit allows: never more than WINDOW messages
    beyond the receiver's last ack (one ack per ACK_EVERY messages), so
    nothing is dropped and every message is delivered."""
    t = make(kind, CREDIT_HWM)
    with pubsub.publishing(ctl, t, t.pub(topic), lambda: t.sub(f"{topic}ack")) as (pub, ack):
        payload = bytes(size)
        send, unpack, now = pub.send, _Q.unpack_from, time.monotonic_ns
        wait_ack, poll_ack = _ack_functions(t, ack)
        sent = acked = stalls = 0
        t0 = now()
        while acked < count:
            k = min(ACK_EVERY, count - sent, acked + WINDOW - sent)
            if k <= 0:
                stalls += 1
                m = wait_ack()
                if m is None:
                    raise BenchError(f"no ack (sent {sent}, acked {acked})")
                acked = unpack(m)[0]
                continue
            for _ in repeat(None, k):
                send(payload)
            sent += k
            m = poll_ack()
            while m is not None:
                acked = unpack(m)[0]
                m = poll_ack()
        t1 = now()
    return {"delivered": count, "seconds": (t1 - t0) * 1e-9, "stalls": stalls}


def task_credit_recv(ctl: Control, state: State, kind: str, topic: str, count: int) -> Dict[str, Any]:
    t = make(kind, CREDIT_HWM)
    ack_pub = t.pub(f"{topic}ack")
    sub = None
    try:
        ctl.barrier("bound")
        sub = t.sub(topic)
        t.wait_subscribed(ack_pub)
        ctl.barrier("ready")
        send_ack, pack = ack_pub.send, _Q.pack
        got, ended = 0, "end"
        if kind == OURS:
            recv = sub.receive
            while got < count:
                for _ in repeat(None, ACK_EVERY):
                    if recv() is None:
                        ended = "timeout"
                        break
                else:
                    got += ACK_EVERY
                    send_ack(pack(got))
                    continue
                break
        else:
            recv, Again = sub.recv, t.zmq.Again
            try:
                while got < count:
                    for _ in repeat(None, ACK_EVERY):
                        recv()
                    got += ACK_EVERY
                    send_ack(pack(got))
            except Again:
                ended = "timeout"
        ctl.barrier("done")
    finally:
        t.close(sub, ack_pub)
    return {"received": got, "ended": ended}


def task_call_cost(
    ctl: Control, state: State, kind: str, topic: str, size: int, count: int, rounds: int
) -> Dict[str, Any]:
    """µs per call of the bare socket methods, in one process: ``send`` with
    no subscriber (the message is dropped at once: no I/O is timed), and
    ``receive`` of a message already waiting in the subscriber."""
    t = make(kind)
    pub = t.pub(topic)
    sub = None
    try:
        payload = bytes(size)
        send, now = pub.send, time.perf_counter_ns
        send_us = float("inf")
        for _ in range(rounds):
            t0 = now()
            for _ in repeat(None, count):
                send(payload)
            send_us = min(send_us, (now() - t0) / count / 1000)
        sub = t.sub(topic)
        t.wait_subscribed(pub)
        recv = t.receiver(sub)
        batch = 400  # the sender sees its queue drain in steps of half the HWM: stay below 1000 - 500
        recv_us = float("inf")
        for _ in range(rounds):
            for _ in repeat(None, batch):
                send(payload)
            time.sleep(0.05)  # let the I/O threads move them; a late one only slows this round
            t0 = now()
            for _ in repeat(None, batch):
                recv()
            recv_us = min(recv_us, (now() - t0) / batch / 1000)
    finally:
        t.close(pub, sub)
    return {"send_us": send_us, "receive_us": recv_us}


# =========================================================================== the run


PARTS = ("latency", "credit", "lossy", "calls")


class Plan(suite.Plan):
    default_rounds = 5

    def __init__(self, quick: bool, rounds: int, sizes: List[int], interval_us: int, only: Set[str]) -> None:
        super().__init__(quick, rounds, sizes, only)
        self.interval_us = interval_us
        self.lat_count = 300 if quick else 2000
        self.lat_warmup = 50 if quick else 200

    def thr_count(self, size: int) -> int:
        base = 100_000 if self.quick else 500_000
        return base if size <= 1024 else base // 4


def _topic(stem: str) -> str:
    """A fresh topic whose port, and its ack topic's, no outgoing connection can hold."""
    from msgq.testing import unique_topic

    return unique_topic(stem, companions=("ack",))


class Runner(suite.Runner):
    plan: Plan

    def run_tasks(self, record: Record, tasks: Sequence[Any], timeout: float) -> Optional[List[Any]]:
        res = super().run_tasks(record, tasks, timeout)
        if res is not None:
            self.results.append({**record, "sender": res[0], "receiver": res[1] if len(res) > 1 else None})
        return res

    def latency(self, kind: str, size: int, rnd: int) -> None:
        p = self.plan
        topic = _topic("lat")
        record = {"kind": "latency", "variant": kind, "size": size, "round": rnd}
        budget = 60 + (p.lat_count + p.lat_warmup) * p.interval_us * 4e-6
        res = self.run_tasks(
            record,
            [
                (
                    task_latency_send,
                    dict(
                        kind=kind,
                        topic=topic,
                        size=size,
                        count=p.lat_count,
                        warmup=p.lat_warmup,
                        interval_us=p.interval_us,
                    ),
                ),
                (task_latency_recv, dict(kind=kind, topic=topic, warmup=p.lat_warmup)),
            ],
            budget,
        )
        if res:
            s = latency_stats(res[1]["samples"])
            self.log(
                f"  latency {kind:9} {fmt_size(size):>6} round {rnd}: p50 {s.get('p50', float('nan')):7.1f} µs "
                f"p99 {s.get('p99', float('nan')):7.1f} µs  ({s['n']} samples, {res[1]['ended']})"
            )

    def throughput(self, kind: str, size: int, rnd: int) -> None:
        count = self.plan.thr_count(size)
        topic = _topic("thr")
        record = {"kind": "throughput", "variant": kind, "size": size, "round": rnd}
        res = self.run_tasks(
            record,
            [
                (task_thr_send, dict(kind=kind, topic=topic, size=size, count=count)),
                (task_thr_recv, dict(kind=kind, topic=topic)),
            ],
            120,
        )
        if res:
            self.log(
                f"  throughput {kind:9} {fmt_size(size):>6} round {rnd}: received {fmt_rate(res[1]['rate'])} "
                f"({res[1]['received']}/{count}), sent {fmt_rate(count / res[0]['send_s'])}"
            )

    def credit(self, kind: str, size: int, rnd: int) -> None:
        count = self.plan.thr_count(size) // ACK_EVERY * ACK_EVERY
        topic = _topic("cred")
        record = {"kind": "credit", "variant": kind, "size": size, "round": rnd}
        res = self.run_tasks(
            record,
            [
                (task_credit_send, dict(kind=kind, topic=topic, size=size, count=count)),
                (task_credit_recv, dict(kind=kind, topic=topic, count=count)),
            ],
            180,
        )
        if res:
            self.log(
                f"  credit     {kind:9} {fmt_size(size):>6} round {rnd}: delivered "
                f"{fmt_rate(count / res[0]['seconds'])} ({res[1]['received']}/{count}, {res[0]['stalls']} stalls)"
            )

    def call_cost(self, kind: str, size: int, rnd: int) -> None:
        record = {"kind": "call_cost", "variant": kind, "size": size, "round": rnd}
        count = 20_000 if self.plan.quick else 50_000
        res = self.run_tasks(
            record,
            [(task_call_cost, dict(kind=kind, topic=_topic("cc"), size=size, count=count, rounds=15)), None],
            300,
        )
        if res:
            self.log(
                f"  call cost {kind:9} {fmt_size(size):>6} round {rnd}: send {res[0]['send_us']:.3f} µs, "
                f"receive {res[0]['receive_us']:.3f} µs"
            )

    def run_all(self) -> None:
        for rnd in range(1, self.plan.rounds + 1):
            order = (OURS, RAW) if rnd % 2 else (RAW, OURS)
            for part, measure in (
                ("latency", self.latency),
                ("credit", self.credit),
                ("lossy", self.throughput),
                ("calls", self.call_cost),
            ):
                if self.plan.wants(part):
                    for size in self.plan.sizes:
                        for kind in order:
                            measure(kind, size, rnd)


# =========================================================================== report


def summarize(results: List[Record], sizes: List[int]) -> List[Record]:
    """Rows: size, metric, ours, raw, overhead (> 0: ours is worse), and
    whether the 20 % target applies (end-to-end numbers; the bare call
    costs and the lossy sender's loop rate are shown for insight)."""
    rows: List[Record] = []
    Spread = Optional[Tuple[float, float]]

    def add(
        size: int,
        metric: str,
        ours: Optional[float],
        raw: Optional[float],
        higher_better: bool,
        target: bool,
        spread: Optional[Tuple[Spread, Spread]] = None,
    ) -> None:
        over = float("nan")
        if ours is not None and raw is not None and ours == ours and raw == raw and ours > 0 and raw > 0:
            over = raw / ours - 1 if higher_better else ours / raw - 1
        rows.append(
            {
                "size": size,
                "metric": metric,
                "ours": ours,
                "raw": raw,
                "overhead": over,
                "target": target,
                "spread": spread,
            }
        )

    def spread(values: List[float]) -> Spread:
        values = [v for v in values if v == v]
        return (min(values), max(values)) if len(values) > 1 else None

    def add_rounds(
        size: int, metric: str, per_round: Dict[str, List[float]], higher_better: bool, target: bool
    ) -> None:
        """A row from one value per round for each variant: the medians, and the min-max of the rounds."""
        ours, raw = per_round[OURS], per_round[RAW]
        add(size, metric, median(ours), median(raw), higher_better, target, (spread(ours), spread(raw)))

    for size in sizes:
        lat = {
            v: latency_stats([x for r in suite.select(results, "latency", v, size) for x in r["receiver"]["samples"]])
            for v in (OURS, RAW)
        }
        for pct in ("p50", "p99"):
            add(size, f"latency {pct} (µs)", lat[OURS].get(pct), lat[RAW].get(pct), False, True)
        cred = {
            v: [r["sender"]["delivered"] / r["sender"]["seconds"] for r in suite.select(results, "credit", v, size)]
            for v in (OURS, RAW)
        }
        add_rounds(size, "delivered/s, credit window", cred, True, True)
        thr = {v: suite.select(results, "throughput", v, size) for v in (OURS, RAW)}
        rate = {v: [r["receiver"]["rate"] for r in thr[v]] for v in (OURS, RAW)}
        add_rounds(size, "received/s, flat out lossy", rate, True, False)
        sent = {v: [r["sender"]["sent"] / r["sender"]["send_s"] for r in thr[v]] for v in (OURS, RAW)}
        add_rounds(size, "sent/s, flat out lossy", sent, True, False)
        cost = {v: suite.select(results, "call_cost", v, size) for v in (OURS, RAW)}
        for what in ("send", "receive"):
            c = {v: median([r["sender"][f"{what}_us"] for r in cost[v]]) for v in (OURS, RAW)}
            add(size, f"{what}() call (µs)", c[OURS], c[RAW], False, False)
    return rows


def render(rows: List[Record]) -> str:
    def val(row: Record, v: Optional[float]) -> str:
        if v is None or v != v:
            return "-"
        if "call" in row["metric"]:
            return f"{v:.3f}"
        return f"{v:.1f}" if "latency" in row["metric"] else fmt_rate(v)

    table = []
    for row in rows:
        over = row["overhead"]
        if over != over:
            verdict = ""
        elif not row["target"]:
            verdict = "(info)"
        else:
            verdict = "ok" if over < TARGET else "over target"
        rng = ""
        if row.get("spread") and all(row["spread"]):
            (a, b), (c, d) = row["spread"]
            rng = f"{a / 1e3:.0f}-{b / 1e3:.0f}k / {c / 1e3:.0f}-{d / 1e3:.0f}k"
        table.append(
            [
                fmt_size(row["size"]),
                row["metric"],
                val(row, row["ours"]),
                val(row, row["raw"]),
                "-" if over != over else f"{over * 100:+.1f} %",
                verdict,
                rng,
            ]
        )
    return format_table(
        ["size", "metric", OURS, RAW, "overhead", f"< {TARGET:.0%}", "rounds: ours / raw"], table, "llrrrll"
    )


class ZmqBackend(suite.Suite):
    description = "msgq's zmq backend vs raw pyzmq over tcp://127.0.0.1: latency and throughput."
    parts = PARTS
    sizes = "64,4096"
    quick_help = "short smoke run (well under a minute)"
    rounds_help = "alternating rounds per measurement (default 5, --quick 1)"
    json_help = "write the raw results (every latency sample) as JSON"
    no_pin_help = "do not pin sender and receiver to different CPUs"
    title = "msgq zmq backend vs raw pyzmq, tcp://127.0.0.1, same run:"
    runner = Runner
    summarize, render = staticmethod(summarize), staticmethod(render)

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--interval-us", type=int, default=500, help="latency: time between two sends (default 500 µs)")

    def make_plan(
        self, ap: argparse.ArgumentParser, args: argparse.Namespace, sizes: List[int], only: Set[str]
    ) -> Plan:
        if not sizes or min(sizes) < 16:
            ap.error("--sizes: at least 16 bytes each (the send time takes 8)")
        return Plan(args.quick, args.rounds, sizes, args.interval_us, only)

    @contextlib.contextmanager
    def environment(self, plan: suite.Plan) -> Iterator[None]:
        with scoped_env(MSGQ_PREFIX=f"benchzmq{os.getpid()}", OPENPILOT_PREFIX=None):  # ports of this run only
            yield

    def meta(self, plan: suite.Plan) -> Dict[str, Any]:
        assert isinstance(plan, Plan)
        return {"interval_us": plan.interval_us}

    def headline(self, info: Dict[str, Any], cpus: Sequence[int], pinned: Sequence[Optional[int]]) -> str:
        return (
            f"msgq zmq backend vs pyzmq {info['pyzmq']} (libzmq {info['libzmq']}) over tcp://127.0.0.1, "
            f"sender on cpu {pinned[0]}, receiver on cpu {pinned[1]}, load {info['loadavg_start']}"
        )

    def notes(self, plan: suite.Plan) -> List[str]:
        assert isinstance(plan, Plan)
        return [
            f"latency: paced every {plan.interval_us} µs, blocking receive, percentiles of all samples pooled over "
            f"rounds; delivered/s: sender flat out within a credit window of {WINDOW} messages (nothing lost), median "
            "over rounds.",
            "(info) rows: flat out without credit both are lossy, and a slower sender loses fewer messages, which "
            "then cost the receiver work: those rates swing widely from round to round; call costs are the bare "
            "methods in one process (send with no subscriber, receive of a waiting message).",
        ]

    def json_report(
        self, info: Dict[str, Any], rows: List[Record], runner: suite.Runner, elapsed: float
    ) -> Dict[str, Any]:
        return {"meta": info, "results": runner.results, "errors": runner.errors, "summary": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    return ZmqBackend().main(argv)


if __name__ == "__main__":
    sys.exit(main())
