"""msgq vs pyzmq ``ipc://`` benchmark, both measured in the same run, the same way.

Measures, for 64 B, 4 KiB and 1 MiB messages:

- one-way latency (p50 / p99 / p99.9) with a blocking receive and with a
  busy non-blocking receive loop; the sender is paced (one message every few
  hundred µs) so the numbers are latency, not queueing. Each message carries
  the CLOCK_MONOTONIC send time (``time.monotonic_ns``, the same clock in every
  process);
- round trip (ping-pong over two topics, blocking receive on both sides);
- throughput, sender flat out: *lossless* (msgq with a credit scheme: the
  receiver acks over a second msgq topic and the sender never runs more than
  half a ring ahead, receive_batch or receive(); pyzmq XPUB + XPUB_NODROP) and
  *lossy* (msgq without credit, pyzmq XPUB without NODROP = plain PUB), with
  the losses counted;
- the CPU time of a subscriber blocked in receive() for ~2 s with no traffic.

Publisher and subscriber are two persistent ``spawn`` worker processes, each
pinned to its own CPU (when there are 2+); start-up is synchronised through the
sockets themselves (``wait_for_readers`` / the XPUB subscription message) and a
pipe barrier, never by sleeping. msgq and pyzmq runs alternate round by round
so slow drifts of a noisy machine hit both alike.

Run ``python tools/bench_msgq.py --quick`` for a ~20 s smoke run; the default
run takes a few minutes. ``--json PATH`` writes every raw number, ``--plot
PATH`` a PNG (needs matplotlib).
"""

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from itertools import repeat

from msgq.names import segment_dir
from msgq.testing import segments
from msgq.tooling import scoped_env
from visionipc.bench import reference
from visionipc.bench.harness import (
    add_common_flags,
    git_rev,
    logger,
    parse_only,
    parse_sizes,
    placement,
    print_failures,
    print_report_head,
    run_in_pool,
    run_meta,
    write_json,
)
from visionipc.bench.pubsub import (
    END,
    MsgqSockets,
    ZmqSockets,
    busy_latency_loop,
    flat_send,
    latency_loop,
    paced_send,
    publishing,
    send_end_markers,
    subscribing,
)
from visionipc.bench.pubsub import STAMP as _Q
from visionipc.bench.stats import fmt_rate, fmt_size, format_table, latency_stats, median
from visionipc.bench.workers import BenchError, read_loadavg

MSGQ_TIMEOUT_MS = 5000  # receive timeouts: only there so that a lost message cannot hang a run

SIZES = (64, 4096, 1 << 20)
CAMERA_INTERVAL_US = 33_333  # "30hz" latency: a camera's pace, the receiver asleep in between


# =========================================================================== transports
# Only set-up goes through these; the timed loops call the sockets' own methods.


class MsgqTransport(MsgqSockets):
    kind = "msgq"

    def __init__(self, state, spin_us=None):
        super().__init__()
        self.spin_us = spin_us

    def pub(self, topic, segment_size):
        return self.msgq.pub_sock(topic, segment_size=segment_size)

    def sub(self, topic, segment_size):
        s = self.msgq.sub_sock(topic, timeout=MSGQ_TIMEOUT_MS, segment_size=segment_size)
        if self.spin_us is not None:
            s.spin_us = self.spin_us
        return s

    def set_timeout(self, sub, ms):
        sub.setTimeout(ms)


class ZmqTransport(ZmqSockets):
    """pyzmq over ``ipc://`` in the run's folder; XPUB_NODROP for the lossless variant."""

    kind = "zmq"

    def __init__(self, state, nodrop=True):
        import zmq

        if "zmq_ctx" not in state:
            state["zmq_ctx"] = zmq.Context()
        super().__init__(state["zmq_ctx"], nodrop=nodrop, timeout_ms=MSGQ_TIMEOUT_MS)
        self.dir = state["ipc_dir"]

    def url(self, topic):
        return f"ipc://{self.dir}/{topic}"

    def set_timeout(self, sub, ms):
        sub.setsockopt(self.zmq.RCVTIMEO, ms)


class ReferenceTransport:
    """commaai/msgq's own Python sockets (the reference, built from source:
    ``visionipc.bench.reference``), with the same segment sizes as ours. It counts no
    readers: a subscriber is registered once its ``connect`` returned, which the "ready"
    barrier orders before the first send. Its ``send`` takes ``bytes`` only."""

    kind = "reference"

    def __init__(self, state):
        from visionipc.bench import reference

        self.ipc = reference.load("ipc")
        if "ref_ctx" not in state:
            state["ref_ctx"] = self.ipc.Context()
        self.ctx = state["ref_ctx"]

    def pub(self, topic, segment_size):
        s = self.ipc.PubSocket()
        s.connect(self.ctx, topic, segment_size=segment_size)
        return s

    def sub(self, topic, segment_size):
        s = self.ipc.SubSocket()
        s.connect(self.ctx, topic, segment_size=segment_size)
        s.setTimeout(MSGQ_TIMEOUT_MS)
        return s

    def set_timeout(self, sub, ms):
        sub.setTimeout(ms)

    def wait_subscribed(self, pub, timeout=20.0):
        pass  # see the class: the barrier orders it

    def close(self, *socks):
        pass  # its sockets close when collected


TRANSPORTS = {"msgq": MsgqTransport, "zmq": ZmqTransport, "reference": ReferenceTransport}


def make_transport(state, spec):
    spec = dict(spec)
    return TRANSPORTS[spec.pop("kind")](state, **spec)


def _send_bytes(t, pub):
    """``pub``'s send, for a buffer the task reuses (the reference's takes ``bytes`` only)."""
    return (lambda b, send=pub.send: send(bytes(b))) if t.kind == "reference" else pub.send


def worker_setup(state):
    state["ipc_dir"] = os.environ["BENCH_IPC_DIR"]


def worker_teardown(state):
    ctx = state.pop("zmq_ctx", None)
    if ctx is not None:
        ctx.destroy(linger=0)


# =========================================================================== tasks (run in the workers)
# Every task: ctl.barrier("bound") once its publishers exist, then create the
# subscribers and wait until its publishers see theirs, ctl.barrier("ready"),
# then the timed part.


def _slot_bytes(size):
    return ((size + 7) & ~7) + 8


def task_latency_pub(ctl, state, transport, topic, size, segment_size, count, warmup, interval_us):
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(topic, segment_size)) as (pub, _):
        paced_send(_send_bytes(t, pub), size, warmup + count, interval_us)
    return {}


def _ctx_switches():
    """(voluntary, involuntary context switches, ns spent runnable but waiting
    for a CPU) of this whole process, all its threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    run_delay = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_delay += int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        run_delay = -1
    return ru.ru_nvcsw, ru.ru_nivcsw, run_delay


def task_latency_sub(ctl, state, transport, topic, size, segment_size, busy, warmup):
    t = make_transport(state, transport)
    with subscribing(ctl, t, lambda: t.sub(topic, segment_size)) as sub:
        cs0 = _ctx_switches()
        lat = []
        if t.kind != "zmq":
            recv, nonblocking, Again = sub.receive, True, ()
        else:
            recv, nonblocking, Again = sub.recv, t.zmq.NOBLOCK, t.zmq.Again
        if busy:
            how = busy_latency_loop(recv, nonblocking, lat, MSGQ_TIMEOUT_MS, Again)
        else:
            how = latency_loop(recv, lat, Again)
        resets = getattr(sub, "resets", 0)  # the reference does not count them
        cs1 = _ctx_switches()
    # Context switches of the whole subscriber process (pyzmq's I/O thread too):
    # involuntary ones are preemptions by other work on its CPU.
    return {
        "samples": lat[warmup:],
        "ended": how,
        "resets": resets,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
        "run_delay_ms": (cs1[2] - cs0[2]) * 1e-6 if cs0[2] >= 0 else None,
    }


def task_rtt_ping(ctl, state, transport, size, segment_size, count, warmup, tag):
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(f"{tag}ping", segment_size), lambda: t.sub(f"{tag}pong", segment_size)) as (pub, sub):
        buf = bytearray(size)
        pack, unpack, send, now = _Q.pack_into, _Q.unpack_from, _send_bytes(t, pub), time.monotonic_ns
        rtt = []
        app = rtt.append
        recv = sub.recv if t.kind == "zmq" else sub.receive  # a pyzmq timeout raises zmq.Again
        for _ in repeat(None, warmup + count):
            pack(buf, 0, now())
            send(buf)
            m = recv()
            tr = now()
            if m is None:
                raise BenchError("pong timed out")
            app(tr - unpack(m)[0])
        pack(buf, 0, END)
        send(buf)
    return {"samples": rtt[warmup:]}


def task_rtt_echo(ctl, state, transport, size, segment_size, tag):
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(f"{tag}pong", segment_size), lambda: t.sub(f"{tag}ping", segment_size)) as (pub, sub):
        unpack, send = _Q.unpack_from, pub.send
        echoed = 0
        recv, Again = (sub.recv, t.zmq.Again) if t.kind == "zmq" else (sub.receive, ())
        try:
            while True:
                m = recv()
                if m is None or unpack(m)[0] < 0:
                    break
                send(m)
                echoed += 1
        except Again:
            pass
    return {"echoed": echoed}


def task_thr_send(ctl, state, transport, topic, size, segment_size, count, credit_window, lossy):
    """Flat out. With ``credit_window`` (msgq lossless), never more than that
    many messages ahead of the receiver's last ack."""
    t = make_transport(state, transport)
    open_ack = (lambda: t.sub(f"{topic}ack", 0)) if credit_window else None
    with publishing(ctl, t, t.pub(topic, segment_size), open_ack) as (pub, ack):
        send = pub.send
        stalls = 0
        cs0 = _ctx_switches()
        if credit_window:
            payload, now = bytes(size), time.monotonic_ns
            t0 = now()
            batch, unpack = ack.receive_batch, _Q.unpack_from
            acked = sent = 0
            chunk = max(1, min(256, credit_window))
            while sent < count:
                room = min(acked + credit_window, count) - sent
                if room <= 0:
                    stalls += 1
                    b = batch(1024, MSGQ_TIMEOUT_MS)
                    if not b:
                        raise BenchError("no ack from the receiver")
                    acked = unpack(b[-1])[0]
                    continue
                k = min(room, chunk)
                for _ in repeat(None, k):
                    send(payload)
                sent += k
                b = batch(1024, 0)
                if b:
                    acked = unpack(b[-1])[0]
            send_s = (now() - t0) * 1e-9
        else:
            send_s = flat_send(send, size, count)
        cs1 = _ctx_switches()
        if lossy:
            # The receiver stops at the first end marker it sees; a lossy
            # transport may drop some, so send a few.
            send_end_markers(send, b"\xff", 20, 0.005)
    return {
        "sent": count,
        "send_s": send_s,
        "stalls": stalls,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
    }


def task_thr_recv(ctl, state, transport, topic, size, segment_size, count, credit_window, lossy, batch_receive):
    t = make_transport(state, transport)
    ack_pub = t.pub(f"{topic}ack", 0) if credit_window else None
    sub = None
    try:
        ctl.barrier("bound")
        sub = t.sub(topic, segment_size)
        if credit_window:
            t.wait_subscribed(ack_pub)
        ctl.barrier("ready")
        cs0 = _ctx_switches()
        now = time.monotonic_ns
        got = first = 0
        t_first = t_last = None
        timed_out = False
        if t.kind != "zmq" and lossy and not batch_receive:  # the reference's only way (no receive_batch)
            recv = sub.receive
            m = recv()
            if m is None:
                raise BenchError("nothing received")
            t_first = now()
            got = first = 1
            while m is not None and len(m) != 1:
                m = recv()
                got += 1
            timed_out = m is None
            got -= 1  # the end marker, or the None of a timeout
            t_last = now()
            resets = getattr(sub, "resets", 0)
        elif t.kind == "msgq":
            if batch_receive:
                batch = sub.receive_batch
                ack_every = max(1, credit_window // 4) if credit_window else 0
                next_ack = ack_every
                send_ack, pack = (ack_pub.send if ack_pub else None), _Q.pack
                b = batch(1024, MSGQ_TIMEOUT_MS)
                t_first = now()
                while b:
                    if lossy and len(b[-1]) == 1:  # end marker(s)
                        got += sum(1 for m in b if len(m) != 1)
                        break
                    got += len(b)
                    if not first:
                        first = got
                    if credit_window and got >= next_ack:
                        send_ack(pack(got))
                        next_ack = got + ack_every
                    if not lossy and got >= count:
                        break
                    b = batch(1024, MSGQ_TIMEOUT_MS)
                else:
                    timed_out = True
                t_last = now()
            else:
                recv = sub.receive
                ack_every = max(1, credit_window // 4)
                pack = _Q.pack
                if recv() is None:
                    raise BenchError("nothing received")
                t_first = now()
                got = first = 1
                while got < count:
                    k = min(ack_every - got % ack_every, count - got)
                    for _ in repeat(None, k):
                        if recv() is None:
                            timed_out = True
                            break
                    if timed_out:
                        break
                    got += k
                    if got % ack_every == 0:
                        ack_pub.send(pack(got))
                t_last = now()
            resets = sub.resets
        else:
            zmq = t.zmq
            recv = sub.recv
            try:
                m = recv()
                t_first = now()
                got = first = 1
                if lossy:
                    while len(m) != 1:
                        m = recv()
                        got += 1
                    got -= 1  # the end marker
                else:
                    for _ in repeat(None, count - 1):
                        recv()
                    got = count
            except zmq.Again:
                timed_out = True
            t_last = now()
            resets = 0
        cs1 = _ctx_switches()
        ctl.barrier("done")
    finally:
        t.close(sub, ack_pub)
    span = (t_last - t_first) * 1e-9 if t_first and t_last else float("nan")
    rate = (got - first) / span if span and span > 0 and got > first else float("nan")
    return {
        "received": got,
        "rate": rate,
        "span_s": span,
        "resets": resets,
        "timed_out": timed_out,
        "voluntary_cs": cs1[0] - cs0[0],
        "involuntary_cs": cs1[1] - cs0[1],
        "run_delay_ms": (cs1[2] - cs0[2]) * 1e-6 if cs0[2] >= 0 else None,
    }


def task_idle_pub(ctl, state, transport, topic, warm_messages):
    t = make_transport(state, transport)
    with publishing(ctl, t, t.pub(topic, 0)) as (pub, _):
        for _ in range(warm_messages):  # recent traffic, so an adaptive spin is primed
            pub.send(b"x" * 64)
            time.sleep(0.0001)
        ctl.barrier("idle")  # keep the publisher alive while the subscriber idles
    return {}


def task_idle_sub(ctl, state, transport, topic, warm_messages, idle_ms):
    t = make_transport(state, transport)
    with subscribing(ctl, t, lambda: t.sub(topic, 0)) as sub:
        recv = sub.recv if t.kind == "zmq" else sub.receive
        for _ in range(warm_messages):
            if recv() is None:
                break
        ctl.barrier("idle")
        t.set_timeout(sub, idle_ms)
        c0, w0 = time.process_time(), time.monotonic()
        try:
            m = recv()
        except Exception:  # zmq.Again: the expected timeout
            m = None
        c1, w1 = time.process_time(), time.monotonic()
    return {"cpu_s": c1 - c0, "wall_s": w1 - w0, "got_message": m is not None}


# =========================================================================== the plan (parent)

MSGQ = {"kind": "msgq"}
MSGQ_NOSPIN = {"kind": "msgq", "spin_us": 0}
ZMQ = {"kind": "zmq", "nodrop": True}
ZMQ_LOSSY = {"kind": "zmq", "nodrop": False}
REFERENCE = {"kind": "reference"}


class Plan:
    def __init__(self, quick, rounds, sizes, only, reference=False):
        self.reference = reference  # commaai/msgq runs beside us (visionipc.bench.reference)
        self.quick = quick
        self.rounds = rounds if rounds else (1 if quick else 2)
        self.sizes = sizes
        self.only = only

    def lat_count(self, size):
        if size >= 1 << 20:
            return 300 if self.quick else 1500
        return 2000 if self.quick else 10000

    def camera_count(self):
        return 30 if self.quick else 150

    def lat_interval_us(self, size):
        return 2000 if size >= 1 << 20 else 300

    def rtt_count(self, size):
        if size >= 1 << 20:
            return 200 if self.quick else 1000
        return 3000 if self.quick else 20000

    @staticmethod
    def thr_probe_count(size):
        """Messages of the short calibration run that sizes the real one."""
        if size >= 1 << 20:
            return 300
        return 40000 if size >= 4096 else 100000

    def thr_seconds(self):
        """How long the sender of a throughput run should run flat out."""
        return 0.5 if self.quick else 2.0

    @staticmethod
    def lat_segment(size):
        return max(1 << 20, 8 * size)

    @staticmethod
    def thr_segment(size):
        return 64 << 20 if size >= 1 << 20 else 8 << 20

    def wants(self, what):
        return not self.only or what in self.only


class Runner:
    def __init__(self, pool, plan, log):
        self.pool = pool
        self.plan = plan
        self.log = log
        self.results = []  # raw records
        self.errors = []
        self.calibrations = []  # short throughput runs that sized the real ones (not in the summary)
        self._send_rate = {}
        self._n = 0

    def _topic(self, stem):
        self._n += 1
        return f"b{self._n}{stem}"

    def _run(self, record, tasks, timeout):
        t0 = time.monotonic()
        try:
            res = self.pool.run(tasks, timeout)
        except BenchError as e:
            record["error"] = str(e)
            self.errors.append(record)
            self.log(
                f"  ERROR in {record['kind']} {record['variant']} {fmt_size(record['size'])}: {str(e).splitlines()[-1]}"
            )
            return None
        record["wall_s"] = time.monotonic() - t0
        return res

    def latency(self, variant, spec, size, busy, rnd, camera=False):
        """One-way latency; ``camera``: one message every 33 ms (30 Hz), the receiver idle between."""
        p = self.plan
        if camera:
            count, interval, warmup = p.camera_count(), CAMERA_INTERVAL_US, 3
        else:
            count, interval = p.lat_count(size), p.lat_interval_us(size)
            warmup = max(20, count // 50)
        seg = p.lat_segment(size)
        topic = self._topic("lat")
        rec = {
            "kind": "latency",
            "mode": "30hz" if camera else ("busy" if busy else "blocking"),
            "variant": variant,
            "transport": spec["kind"],
            "size": size,
            "round": rnd,
            "count": count,
            "interval_us": interval,
            "segment_size": seg,
        }
        timeout = 60 + (warmup + count) * (interval * 3e-6 + 0.001)
        both = dict(transport=spec, topic=topic, size=size, segment_size=seg, warmup=warmup)
        res = self._run(
            rec,
            [
                (task_latency_pub, {**both, "count": count, "interval_us": interval}),
                (task_latency_sub, {**both, "busy": busy}),
            ],
            timeout,
        )
        if res is None:
            return
        sub = res[1]
        rec.update(
            samples_ns=sub["samples"],
            ended=sub["ended"],
            resets=sub["resets"],
            stats=latency_stats(sub["samples"]),
            voluntary_cs=sub["voluntary_cs"],
            involuntary_cs=sub["involuntary_cs"],
            run_delay_ms=sub["run_delay_ms"],
        )
        self.results.append(rec)
        s = rec["stats"]
        self.log(
            f"  latency {rec['mode']:8s} {variant:12s} {fmt_size(size):>6s}: p50 {s.get('p50', float('nan')):8.1f} µs  "
            f"p99 {s.get('p99', float('nan')):8.1f}  p99.9 {s.get('p99.9', float('nan')):8.1f}  n={s['n']}  "
            f"cs {sub['voluntary_cs']}/{sub['involuntary_cs']} waited for CPU {sub['run_delay_ms'] or 0:.0f} ms"
            + ("" if sub["ended"] == "end" else f"  [{sub['ended']}]")
        )

    def rtt(self, variant, spec, size, rnd):
        p = self.plan
        count = p.rtt_count(size)
        warmup = max(20, count // 50)
        seg = p.lat_segment(size)
        tag = self._topic("rtt")
        rec = {
            "kind": "rtt",
            "mode": "blocking",
            "variant": variant,
            "transport": spec["kind"],
            "size": size,
            "round": rnd,
            "count": count,
            "segment_size": seg,
        }
        res = self._run(
            rec,
            [
                (task_rtt_ping, dict(transport=spec, size=size, segment_size=seg, count=count, warmup=warmup, tag=tag)),
                (task_rtt_echo, dict(transport=spec, size=size, segment_size=seg, tag=tag)),
            ],
            60 + count * 0.005,
        )
        if res is None:
            return
        rec.update(samples_ns=res[0]["samples"], stats=latency_stats(res[0]["samples"]))
        self.results.append(rec)
        s = rec["stats"]
        self.log(
            f"  rtt      blocking {variant:12s} {fmt_size(size):>6s}: "
            f"p50 {s['p50']:8.1f} µs  p99 {s['p99']:8.1f}  n={s['n']}"
        )

    def throughput(self, variant, spec, size, rnd, credit, lossy, batch_receive):
        p = self.plan
        key = (variant, size)
        if key not in self._send_rate:
            # Calibrate: a short run tells how many messages make ~thr_seconds().
            rec = self._throughput(
                variant, spec, size, rnd, credit, lossy, batch_receive, p.thr_probe_count(size), True
            )
            rate = rec.get("send_rate") if rec else None
            self._send_rate[key] = rate if rate and rate == rate else None
        rate = self._send_rate[key]
        count = p.thr_probe_count(size) if not rate else max(p.thr_probe_count(size), int(rate * p.thr_seconds()))
        self._throughput(variant, spec, size, rnd, credit, lossy, batch_receive, min(count, 50_000_000), False)

    def _throughput(self, variant, spec, size, rnd, credit, lossy, batch_receive, count, calibration):
        p = self.plan
        seg = p.thr_segment(size)
        window = 0
        if credit:
            window = max(2, min(1 << 16, (seg // 2) // _slot_bytes(size)))
        topic = self._topic("thr")
        rec = {
            "kind": "throughput",
            "variant": variant,
            "transport": spec["kind"],
            "size": size,
            "round": rnd,
            "count": count,
            "segment_size": seg if spec["kind"] == "msgq" else None,
            "credit_window": window,
            "lossy": lossy,
            "batch_receive": batch_receive,
            "calibration": calibration,
        }
        # what both ends are told; the receiver also how to receive
        both = dict(
            transport=spec, topic=topic, size=size, segment_size=seg, count=count, credit_window=window, lossy=lossy
        )
        res = self._run(
            rec,
            [(task_thr_send, both), (task_thr_recv, {**both, "batch_receive": batch_receive})],
            120 + count * size * 2e-9 + count * 5e-6,
        )
        if res is None:
            return None
        snd, rcv = res
        rec.update(
            sent=snd["sent"],
            send_s=snd["send_s"],
            send_rate=snd["sent"] / snd["send_s"] if snd["send_s"] else None,
            stalls=snd["stalls"],
            received=rcv["received"],
            rate=rcv["rate"],
            span_s=rcv["span_s"],
            resets=rcv["resets"],
            timed_out=rcv["timed_out"],
            sender_cs=(snd["voluntary_cs"], snd["involuntary_cs"]),
            receiver_cs=(rcv["voluntary_cs"], rcv["involuntary_cs"]),
            receiver_run_delay_ms=rcv["run_delay_ms"],
        )
        rec["lost"] = rec["sent"] - rec["received"]
        rec["mb_s"] = rec["rate"] * size / 1e6 if rec["rate"] == rec["rate"] else float("nan")
        if calibration:
            self.calibrations.append(rec)
            return rec
        self.results.append(rec)
        self.log(
            f"  thr      {variant:24s} {fmt_size(size):>6s}: {fmt_rate(rec['rate']):>10s} {rec['mb_s']:9.1f} MB/s  "
            f"received {rec['received']}/{rec['sent']}"
            + (f"  resets {rec['resets']}" if rec["resets"] else "")
            + ("  [timed out]" if rec["timed_out"] else "")
            + f"  ({rec['span_s']:.2f} s)"
            + f"  cs send {rec['sender_cs'][0]}/{rec['sender_cs'][1]}"
            + f" recv {rec['receiver_cs'][0]}/{rec['receiver_cs'][1]}"
        )
        return rec

    def idle(self, variant, spec, rnd, idle_ms):
        topic = self._topic("idle")
        rec = {
            "kind": "idle",
            "variant": variant,
            "transport": spec["kind"],
            "size": 64,
            "round": rnd,
            "idle_ms": idle_ms,
        }
        res = self._run(
            rec,
            [
                (task_idle_pub, dict(transport=spec, topic=topic, warm_messages=200)),
                (task_idle_sub, dict(transport=spec, topic=topic, warm_messages=200, idle_ms=idle_ms)),
            ],
            60,
        )
        if res is None:
            return
        sub = res[1]
        rec.update(
            cpu_s=sub["cpu_s"],
            wall_s_idle=sub["wall_s"],
            cpu_pct=100 * sub["cpu_s"] / sub["wall_s"],
            got_message=sub["got_message"],
        )
        self.results.append(rec)
        self.log(
            f"  idle     {variant:12s}: {rec['cpu_s'] * 1e3:.2f} ms CPU in {rec['wall_s_idle']:.2f} s"
            f" = {rec['cpu_pct']:.3f} %"
        )

    def run_all(self):
        p = self.plan
        for rnd in range(p.rounds):
            self.log(f"round {rnd + 1}/{p.rounds}")
            # Alternate which transport goes first, so neither always gets the same slot.
            order = [("msgq", MSGQ), ("pyzmq", ZMQ)] + ([("reference", REFERENCE)] if p.reference else [])
            if rnd % 2:
                order.reverse()
            if p.wants("idle"):
                for name, spec in order:
                    self.idle(name, spec, rnd, 1000 if p.quick else 2000)
            if p.wants("rtt"):
                for size in p.sizes:
                    for name, spec in order:
                        self.rtt(name, spec, size, rnd)
                    if size == 64:
                        self.rtt("msgq-nospin", MSGQ_NOSPIN, size, rnd)
            if p.wants("latency"):
                for size in p.sizes:
                    for busy in (False, True):
                        for name, spec in order:
                            self.latency(name, spec, size, busy, rnd)
                        if size == 64 and not busy:
                            self.latency("msgq-nospin", MSGQ_NOSPIN, size, busy, rnd)
            if p.wants("camera") and (not p.quick or "camera" in p.only):  # 1 s+ per transport: full runs
                for name, spec in order:
                    self.latency(name, spec, 64, False, rnd, camera=True)
            if p.wants("throughput"):
                for size in p.sizes:
                    variants = [
                        ("msgq", MSGQ, True, False, True),
                        ("pyzmq", ZMQ, False, False, False),
                    ]
                    if rnd % 2:
                        variants.reverse()
                    variants += [
                        ("msgq-recv1", MSGQ, True, False, False),  # lossless, one receive() per message
                        ("msgq-lossy", MSGQ, False, True, True),
                        ("msgq-lossy-recv1", MSGQ, False, True, False),  # as the reference receives
                        ("pyzmq-lossy", ZMQ_LOSSY, False, True, False),
                    ]
                    if p.reference:
                        variants.append(("reference-lossy", REFERENCE, False, True, False))
                    for name, spec, credit, lossy, batch in variants:
                        self.throughput(name, spec, size, rnd, credit, lossy, batch)


# =========================================================================== summary


def _pool_samples(results, kind, variant, size, mode=None):
    samples = []
    for r in results:
        if (
            r["kind"] == kind
            and r["variant"] == variant
            and r["size"] == size
            and (mode is None or r.get("mode") == mode)
        ):
            samples.extend(r["samples_ns"])
    return latency_stats(samples) if samples else None


def _thr(results, variant, size, key="rate"):
    vals = [r[key] for r in results if r["kind"] == "throughput" and r["variant"] == variant and r["size"] == size]
    return median(vals) if vals else None


def _thr_lossless_ok(results, variant, size):
    rs = [r for r in results if r["kind"] == "throughput" and r["variant"] == variant and r["size"] == size]
    return bool(rs) and all(r["lost"] == 0 and not r["timed_out"] for r in rs)


def summarize(results, sizes):
    """Rows: metric, size, msgq, pyzmq, unit, advantage (>1: msgq better), target, met."""
    rows = []

    def better_by(m, z, higher_better):
        if m is None or z is None:
            return None
        if higher_better:
            return m / z if z else None
        return z / m if m else None

    def add(metric, size, m, z, unit, higher_better, target=None, note="", ref=None):
        adv = better_by(m, z, higher_better)
        met = None
        if target is not None and adv is not None:
            met = adv >= target
        rows.append(
            {
                "metric": metric,
                "size": size,
                "msgq": m,
                "pyzmq": z,
                "unit": unit,
                "higher_is_better": higher_better,
                "advantage": adv,
                "reference": ref,
                "reference_advantage": better_by(m, ref, higher_better),
                "target": target,
                "met": met,
                "note": note,
            }
        )

    def pct(stats, key):
        return stats[key] if stats else None

    for size in sizes:
        m = _pool_samples(results, "rtt", "msgq", size)
        z = _pool_samples(results, "rtt", "pyzmq", size)
        r = _pool_samples(results, "rtt", "reference", size)
        if m and z:
            add("round trip p50", size, m["p50"], z["p50"], "µs", False, 5.0 if size == 64 else None, ref=pct(r, "p50"))
            add("round trip p99", size, m["p99"], z["p99"], "µs", False, ref=pct(r, "p99"))
        if size == 64:
            ns = _pool_samples(results, "rtt", "msgq-nospin", size)
            if ns and z:
                add("round trip p50, msgq spin_us=0", size, ns["p50"], z["p50"], "µs", False, note="diagnostic")
    for mode in ("blocking", "busy"):
        for size in sizes:
            m = _pool_samples(results, "latency", "msgq", size, mode)
            z = _pool_samples(results, "latency", "pyzmq", size, mode)
            r = _pool_samples(results, "latency", "reference", size, mode)
            if not (m and z):
                continue
            waits = [
                sum(
                    r.get("run_delay_ms") or 0
                    for r in results
                    if r["kind"] == "latency" and r["variant"] == v and r["size"] == size and r["mode"] == mode
                )
                for v in ("msgq", "pyzmq")
            ]
            for key in ("p50", "p99", "p99.9"):
                target = 2.0 if (size == 64 and mode == "blocking" and key == "p50") else None
                note = f"subscriber waited for a CPU {waits[0]:.0f} / {waits[1]:.0f} ms" if key == "p99.9" else ""
                add(f"one-way {mode} {key}", size, m[key], z[key], "µs", False, target, note, ref=pct(r, key))
            if size == 64 and mode == "blocking":
                ns = _pool_samples(results, "latency", "msgq-nospin", size, mode)
                if ns:
                    add(
                        "one-way blocking p50, msgq spin_us=0",
                        size,
                        ns["p50"],
                        z["p50"],
                        "µs",
                        False,
                        note="diagnostic",
                    )
    for size in sizes:
        m, z = _thr(results, "msgq", size), _thr(results, "pyzmq", size)
        if m is not None and z is not None:
            ok = _thr_lossless_ok(results, "msgq", size) and _thr_lossless_ok(results, "pyzmq", size)
            note = "all received" if ok else "LOSS/timeout (see raw)"
            add(
                "throughput lossless msg/s (msgq receive_batch)",
                size,
                m,
                z,
                "msg/s",
                True,
                1.5 if size == 64 else None,
                note,
            )
            add("throughput lossless MB/s (msgq receive_batch)", size, m * size / 1e6, z * size / 1e6, "MB/s", True)
        r1 = _thr(results, "msgq-recv1", size)
        if r1 is not None and z is not None:
            ok = _thr_lossless_ok(results, "msgq-recv1", size) and _thr_lossless_ok(results, "pyzmq", size)
            add(
                "throughput lossless msg/s (msgq receive())",
                size,
                r1,
                z,
                "msg/s",
                True,
                1.5 if size == 64 else None,
                "all received" if ok else "LOSS/timeout (see raw)",
            )
    m = _pool_samples(results, "latency", "msgq", 64, "30hz")
    z = _pool_samples(results, "latency", "pyzmq", 64, "30hz")
    if m and z:
        r = _pool_samples(results, "latency", "reference", 64, "30hz")
        for key in ("p50", "p99"):
            add(f"one-way {key} at 30 Hz (receiver idle between)", 64, m[key], z[key], "µs", False, ref=pct(r, key))
    for size in sizes:
        m, z = _thr(results, "msgq-lossy-recv1", size), _thr(results, "pyzmq-lossy", size)
        if m is not None and z is not None:
            ref = _thr(results, "reference-lossy", size)
            add("throughput lossy msg/s received (receive() each)", size, m, z, "msg/s", True, ref=ref)
    idle = {
        v: [r["cpu_pct"] for r in results if r["kind"] == "idle" and r["variant"] == v]
        for v in ("msgq", "pyzmq", "reference")
    }
    if idle["msgq"] and idle["pyzmq"]:
        m, z = median(idle["msgq"]), median(idle["pyzmq"])
        rows.append(
            {
                "metric": "idle subscriber CPU (blocked in receive)",
                "size": 64,
                "msgq": m,
                "pyzmq": z,
                "unit": "% of a core",
                "higher_is_better": False,
                "advantage": None,
                "reference": median(idle["reference"]) if idle["reference"] else None,
                "reference_advantage": None,
                "target": "≈0 % (<1 %)",
                "met": m < 1.0,
                "note": "",
            }
        )
    return rows


LOSSY_VARIANTS = ("msgq-lossy", "msgq-lossy-recv1", "pyzmq-lossy", "reference-lossy")


def lossy_rows(results, sizes):
    out = []
    for size in sizes:
        for variant in LOSSY_VARIANTS + ("msgq", "msgq-recv1", "pyzmq"):
            rs = [r for r in results if r["kind"] == "throughput" and r["variant"] == variant and r["size"] == size]
            if not rs:
                continue
            sent = sum(r["sent"] for r in rs)
            recv = sum(r["received"] for r in rs)
            out.append(
                [
                    variant,
                    fmt_size(size),
                    fmt_rate(median([r["send_rate"] for r in rs])),
                    fmt_rate(median([r["rate"] for r in rs])),
                    f"{median([r['mb_s'] for r in rs]):.1f}",
                    f"{recv}/{sent}",
                    f"{100 * (sent - recv) / sent:.2f} %" if sent else "-",
                    str(sum(r["resets"] for r in rs)),
                ]
            )
    return out


def _fmt_val(v, unit):
    if v is None:
        return "-"
    if unit == "msg/s":
        return fmt_rate(v)
    if unit == "MB/s":
        return f"{v:.1f}"
    if unit.startswith("%"):
        return f"{v:.3f} %"
    return f"{v:.1f}"


def render(rows):
    """The summary table; the reference's columns when it ran."""
    with_ref = any(r.get("reference") is not None for r in rows)
    table = []
    for r in rows:
        adv = "-" if r["advantage"] is None else f"{r['advantage']:.2f}x"
        ref = ref_adv = []
        if with_ref:
            ref = [_fmt_val(r.get("reference"), r["unit"])]
            ref_adv = ["-" if r.get("reference_advantage") is None else f"{r['reference_advantage']:.2f}x"]
        if r["target"] is None:
            target = r["note"] or ""
        elif isinstance(r["target"], str):
            target = r["target"]
        else:
            target = f">= {r['target']:g}x"
        met = "" if r["met"] is None else ("MET" if r["met"] else "NOT MET")
        unit = r["unit"]
        table.append(
            [
                r["metric"],
                fmt_size(r["size"]),
                _fmt_val(r["msgq"], unit),
                _fmt_val(r["pyzmq"], unit),
                *ref,
                "µs" if unit == "µs" else ("" if unit in ("msg/s",) else unit),
                adv,
                *ref_adv,
                target,
                met,
            ]
        )
    r = "r" if with_ref else ""
    headers = ["metric", "size", "msgq", "pyzmq", *(["reference"] if with_ref else []), "unit", "msgq better by"]
    headers += ["vs reference"] if with_ref else []
    return format_table(headers + ["target", ""], table, f"llrr{r}lr{r}ll")


def plot(results, sizes, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no plot written", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.5))
    colors = {"msgq": "#1f77b4", "pyzmq": "#d62728"}
    # latency percentiles
    for ax, kind_modes, title in (
        (axes[0], [("latency", "blocking"), ("latency", "busy")], "one-way latency (µs, log)"),
        (axes[1], [("rtt", None)], "round trip, blocking (µs, log)"),
    ):
        labels, x = [], 0
        for kind, mode in kind_modes:
            for size in sizes:
                for j, tr in enumerate(("msgq", "pyzmq")):
                    st = _pool_samples(results, kind, tr, size, mode)
                    if not st:
                        continue
                    for k, (pct, alpha) in enumerate((("p50", 1.0), ("p99", 0.6), ("p99.9", 0.3))):
                        ax.bar(
                            x + j * 0.4 + k * 0.13 - 0.13,
                            st[pct],
                            width=0.13,
                            color=colors[tr],
                            alpha=alpha,
                            label=f"{tr} {pct}" if not labels and size == sizes[0] else None,
                        )
                labels.append((x + 0.2, f"{mode + ' ' if mode else ''}{fmt_size(size)}"))
                x += 1
        ax.set_xticks([p for p, _ in labels], [t for _, t in labels], rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=7)
    ax = axes[2]
    width = 0.2
    variants = ("msgq", "msgq-recv1", "pyzmq", "msgq-lossy", "pyzmq-lossy")
    vcolors = ("#1f77b4", "#6baed6", "#d62728", "#9ecae1", "#fc9272")
    for j, (v, c) in enumerate(zip(variants, vcolors)):
        ys = [_thr(results, v, s) or 0 for s in sizes]
        ax.bar([i + (j - 2) * width * 0.8 for i in range(len(sizes))], ys, width=width * 0.8, color=c, label=v)
    ax.set_xticks(range(len(sizes)), [fmt_size(s) for s in sizes])
    ax.set_yscale("log")
    ax.set_title("throughput received (msg/s, log); msgq/pyzmq = lossless")
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


def meta(plan, cpus, pinned):
    return {
        **run_meta(cpus, pinned),
        "git": git_rev(),
        "quick": plan.quick,
        "rounds": plan.rounds,
        "sizes": plan.sizes,
        "msgq_spin_us_default": os.environ.get("MSGQ_SPIN_US", "library default"),
        "reference": reference.describe() if plan.reference else None,
    }


# =========================================================================== main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="msgq vs pyzmq ipc:// PUB/SUB: latency, round trip, throughput, idle CPU.")
    add_common_flags(
        ap, quick="short smoke run (~20-30 s)", rounds=(0, "alternating rounds per measurement (default 2, --quick 1)")
    )
    ap.add_argument("--sizes", default="64,4096,1MiB", help="message sizes, comma separated (default 64,4096,1MiB)")
    ap.add_argument("--only", default="", help="comma list of: latency,rtt,throughput,idle,camera (default all)")
    ap.add_argument(
        "--reference",
        choices=("auto", "on", "off"),
        default="auto",
        help="run commaai/msgq beside us (VIPC_REFERENCE_MSGQ, docs/reference.md): "
        "auto = when it is built (default), on = fail without it",
    )
    add_common_flags(ap, json="write raw results (every sample) as JSON")
    ap.add_argument(
        "--plot", metavar="PATH", help="write a PNG of latency percentiles and throughput (needs matplotlib)"
    )
    add_common_flags(
        ap,
        no_pin="do not pin publisher and subscriber to different CPUs",
        check="exit 1 if a target is not met",
        quiet=True,
    )
    args = ap.parse_args(argv)

    sizes = parse_sizes(args.sizes)
    only = parse_only(ap, args.only, ("latency", "rtt", "throughput", "idle", "camera"))
    why_not = reference.unavailable()
    if args.reference == "on" and why_not:
        ap.error(f"--reference on: {why_not}")
    plan = Plan(args.quick, args.rounds, sizes, only, reference=args.reference != "off" and not why_not)
    if args.reference == "auto" and why_not:
        print(f"reference: skipped ({why_not})", file=sys.stderr)
    log = logger(args.quiet)

    prefix = f"bench{os.getpid()}"
    cpus, pinned = placement(2, args.no_pin)
    started = time.monotonic()
    # the shared-memory ring, whatever the caller's environment says; the reference's
    # topic files (it never removes them) go to a folder of this run's, removed at the end
    with (
        tempfile.TemporaryDirectory(prefix="bench_zmq_") as ipc_dir,
        reference.prefix_dir(prefix) as ref_prefix,
        scoped_env(MSGQ_PREFIX=prefix, MSGQ_BACKEND="msgq", OPENPILOT_PREFIX=ref_prefix, BENCH_IPC_DIR=ipc_dir),
    ):
        try:
            info = meta(plan, cpus, pinned)
            log(
                f"msgq vs pyzmq {info['pyzmq']} (libzmq {info['libzmq']}), MSGQ_PREFIX={prefix}, cpus={cpus}, "
                f"publisher on {pinned[0]}, subscriber on {pinned[1]}, load {info['loadavg_start']}"
                + (f", MSGQ_SPIN_US={os.environ['MSGQ_SPIN_US']}" if os.environ.get("MSGQ_SPIN_US") else "")
            )
            runner = run_in_pool(pinned, lambda pool: Runner(pool, plan, log), log, worker_setup, worker_teardown)
        finally:
            left = segments(prefix)
            if left:
                print(f"WARNING: segments left behind in /dev/shm (removed now): {left}", file=sys.stderr)
                for name in left:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(segment_dir(), name))
    if runner is None:
        return 130

    elapsed = time.monotonic() - started
    rows = summarize(runner.results, sizes)
    print_report_head(
        "msgq vs pyzmq ipc:// (XPUB_NODROP for lossless), same run;",
        plan.rounds,
        elapsed,
        info["loadavg_start"],
        "latency: medians/percentiles of all samples pooled over rounds; throughput: median over rounds, "
        "received msg/s at the subscriber",
    )
    if info["reference"]:
        print(f"reference: commaai/msgq {info['reference']} ({reference.root()})")
    print(render(rows))
    lr = lossy_rows(runner.results, sizes)
    if lr:
        print()
        print(
            "throughput detail (flat-out sender; msgq lossless = credit window of half a ring, "
            "pyzmq lossless = XPUB_NODROP):"
        )
        print(
            format_table(
                ["variant", "size", "sent/s", "received/s", "MB/s", "received", "lost", "resets"], lr, "llrrrrrr"
            )
        )
    print_failures(runner.errors, lambda e: f"{e['kind']} {e['variant']} {fmt_size(e['size'])}")

    if args.json:
        info["loadavg_end"] = read_loadavg()
        info["elapsed_s"] = elapsed
        write_json(
            args.json,
            {
                "meta": info,
                "summary": rows,
                "results": runner.results,
                "calibrations": runner.calibrations,
                "errors": runner.errors,
            },
        )
        log(f"raw results: {args.json}")
    if args.plot and plot(runner.results, sizes, args.plot):
        log(f"plot: {args.plot}")
    if runner.errors:
        return 2
    if args.check and any(r["met"] is False for r in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
