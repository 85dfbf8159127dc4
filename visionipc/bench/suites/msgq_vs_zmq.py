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
pipe barrier, never by sleeping (the tasks: ``msgq_vs_zmq_tasks``). msgq and pyzmq
runs alternate round by round so slow drifts of a noisy machine hit both alike.

Run ``python tools/bench_msgq.py --quick`` for a ~20 s smoke run; the default
run takes a few minutes. ``--json PATH`` writes every raw number, ``--plot
PATH`` a PNG (needs matplotlib).
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from msgq.names import segment_dir
from msgq.testing import segments
from msgq.tooling import scoped_env
from visionipc.bench import reference, suite
from visionipc.bench.harness import Log, git_rev
from visionipc.bench.stats import fmt_rate, fmt_size, format_table, latency_stats, median
from visionipc.bench.suite import Record
from visionipc.bench.suites import msgq_vs_zmq_tasks as tasks
from visionipc.bench.workers import WorkerPool, read_loadavg

SIZES = (64, 4096, 1 << 20)
CAMERA_INTERVAL_US = 33_333  # "30hz" latency: a camera's pace, the receiver asleep in between

Spec = Dict[str, Any]  # a transport and its options: {"kind": "msgq" | "zmq" | "reference", ...}

MSGQ: Spec = {"kind": "msgq"}
MSGQ_NOSPIN = {"kind": "msgq", "spin_us": 0}
ZMQ = {"kind": "zmq", "nodrop": True}
ZMQ_LOSSY = {"kind": "zmq", "nodrop": False}
REFERENCE = {"kind": "reference"}


def _slot_bytes(size: int) -> int:
    return ((size + 7) & ~7) + 8


class Plan(suite.Plan):
    def __init__(self, quick: bool, rounds: int, sizes: List[int], only: Set[str], reference: bool = False) -> None:
        super().__init__(quick, rounds, sizes, only)
        self.reference = reference  # commaai/msgq runs beside us (visionipc.bench.reference)

    def lat_count(self, size: int) -> int:
        if size >= 1 << 20:
            return 300 if self.quick else 1500
        return 2000 if self.quick else 10000

    def camera_count(self) -> int:
        return 30 if self.quick else 150

    def lat_interval_us(self, size: int) -> int:
        return 2000 if size >= 1 << 20 else 300

    def rtt_count(self, size: int) -> int:
        if size >= 1 << 20:
            return 200 if self.quick else 1000
        return 3000 if self.quick else 20000

    @staticmethod
    def thr_probe_count(size: int) -> int:
        """Messages of the short calibration run that sizes the real one."""
        if size >= 1 << 20:
            return 300
        return 40000 if size >= 4096 else 100000

    def thr_seconds(self) -> float:
        """How long the sender of a throughput run should run flat out."""
        return 0.5 if self.quick else 2.0

    @staticmethod
    def lat_segment(size: int) -> int:
        return max(1 << 20, 8 * size)

    @staticmethod
    def thr_segment(size: int) -> int:
        return 64 << 20 if size >= 1 << 20 else 8 << 20


def _record(kind: str, variant: str, spec: Spec, size: int, rnd: int, **more: Any) -> Record:
    return {"kind": kind, "variant": variant, "transport": spec["kind"], "size": size, "round": rnd, **more}


class Runner(suite.Runner):
    plan: Plan

    def __init__(self, pool: WorkerPool, plan: Plan, log: Log) -> None:
        super().__init__(pool, plan, log)
        self.calibrations: List[Record] = []  # short throughput runs that sized the real ones (not in the summary)
        self._send_rate: Dict[Tuple[str, int], Optional[float]] = {}
        self._n = 0

    def _topic(self, stem: str) -> str:
        self._n += 1
        return f"b{self._n}{stem}"

    def run_tasks(self, record: Record, tasks: Sequence[Any], timeout: float) -> Optional[List[Any]]:
        t0 = time.monotonic()
        res = super().run_tasks(record, tasks, timeout)
        if res is not None:
            record["wall_s"] = time.monotonic() - t0
        return res

    def failure_label(self, record: Record) -> str:
        return f"ERROR in {suite.describe(record)}"

    def latency(self, variant: str, spec: Spec, size: int, busy: bool, rnd: int, camera: bool = False) -> None:
        """One-way latency; ``camera``: one message every 33 ms (30 Hz), the receiver idle between."""
        p = self.plan
        if camera:
            count, interval, warmup = p.camera_count(), CAMERA_INTERVAL_US, 3
        else:
            count, interval = p.lat_count(size), p.lat_interval_us(size)
            warmup = max(20, count // 50)
        seg = p.lat_segment(size)
        mode = "30hz" if camera else ("busy" if busy else "blocking")
        rec = _record(
            "latency", variant, spec, size, rnd, mode=mode, count=count, interval_us=interval, segment_size=seg
        )
        both = dict(transport=spec, topic=self._topic("lat"), size=size, segment_size=seg, warmup=warmup)
        pub = (tasks.task_latency_pub, {**both, "count": count, "interval_us": interval})
        res = self.run_tasks(
            rec,
            [pub, (tasks.task_latency_sub, {**both, "busy": busy})],
            timeout=60 + (warmup + count) * (interval * 3e-6 + 0.001),
        )
        if res is None:
            return
        sub = res[1]
        rec.update(
            samples_ns=sub["samples"], ended=sub["ended"], resets=sub["resets"], stats=latency_stats(sub["samples"])
        )
        rec.update((k, sub[k]) for k in ("voluntary_cs", "involuntary_cs", "run_delay_ms"))
        self.results.append(rec)
        s, nan = rec["stats"], float("nan")
        self.log(
            f"  latency {mode:8s} {variant:12s} {fmt_size(size):>6s}: p50 {s.get('p50', nan):8.1f} µs  "
            f"p99 {s.get('p99', nan):8.1f}  p99.9 {s.get('p99.9', nan):8.1f}  n={s['n']}  "
            f"cs {sub['voluntary_cs']}/{sub['involuntary_cs']} waited for CPU {sub['run_delay_ms'] or 0:.0f} ms"
            + ("" if sub["ended"] == "end" else f"  [{sub['ended']}]")
        )

    def rtt(self, variant: str, spec: Spec, size: int, rnd: int) -> None:
        p = self.plan
        count = p.rtt_count(size)
        warmup = max(20, count // 50)
        seg = p.lat_segment(size)
        rec = _record("rtt", variant, spec, size, rnd, mode="blocking", count=count, segment_size=seg)
        both = dict(transport=spec, size=size, segment_size=seg, tag=self._topic("rtt"))
        ping = (tasks.task_rtt_ping, {**both, "count": count, "warmup": warmup})
        res = self.run_tasks(rec, [ping, (tasks.task_rtt_echo, both)], 60 + count * 0.005)
        if res is None:
            return
        rec.update(samples_ns=res[0]["samples"], stats=latency_stats(res[0]["samples"]))
        self.results.append(rec)
        s = rec["stats"]
        self.log(
            f"  rtt      blocking {variant:12s} {fmt_size(size):>6s}: "
            f"p50 {s['p50']:8.1f} µs  p99 {s['p99']:8.1f}  n={s['n']}"
        )

    def throughput(
        self, variant: str, spec: Spec, size: int, rnd: int, credit: bool, lossy: bool, batch_receive: bool
    ) -> None:
        p = self.plan
        key = (variant, size)
        how = (variant, spec, size, rnd, credit, lossy, batch_receive)
        if key not in self._send_rate:
            # Calibrate: a short run tells how many messages make ~thr_seconds().
            rec = self._throughput(*how, p.thr_probe_count(size), True)
            rate = rec.get("send_rate") if rec else None
            self._send_rate[key] = rate if rate and rate == rate else None
        rate = self._send_rate[key]
        count = p.thr_probe_count(size) if not rate else max(p.thr_probe_count(size), int(rate * p.thr_seconds()))
        self._throughput(*how, min(count, 50_000_000), False)

    def _throughput(
        self,
        variant: str,
        spec: Spec,
        size: int,
        rnd: int,
        credit: bool,
        lossy: bool,
        batch_receive: bool,
        count: int,
        calibration: bool,
    ) -> Optional[Record]:
        seg = self.plan.thr_segment(size)
        window = max(2, min(1 << 16, (seg // 2) // _slot_bytes(size))) if credit else 0
        rec = _record(
            "throughput",
            variant,
            spec,
            size,
            rnd,
            count=count,
            segment_size=seg if spec["kind"] == "msgq" else None,
            credit_window=window,
            lossy=lossy,
            batch_receive=batch_receive,
            calibration=calibration,
        )
        # what both ends are told; the receiver also how to receive
        both = dict(transport=spec, topic=self._topic("thr"), size=size, segment_size=seg, count=count)
        both.update(credit_window=window, lossy=lossy)
        recv = (tasks.task_thr_recv, {**both, "batch_receive": batch_receive})
        res = self.run_tasks(rec, [(tasks.task_thr_send, both), recv], 120 + count * size * 2e-9 + count * 5e-6)
        if res is None:
            return None
        snd, rcv = res
        rec.update(
            sent=snd["sent"], send_s=snd["send_s"], send_rate=snd["sent"] / snd["send_s"] if snd["send_s"] else None
        )
        rec.update(stalls=snd["stalls"], received=rcv["received"], rate=rcv["rate"], span_s=rcv["span_s"])
        rec.update(
            resets=rcv["resets"], timed_out=rcv["timed_out"], sender_cs=(snd["voluntary_cs"], snd["involuntary_cs"])
        )
        rec.update(receiver_cs=(rcv["voluntary_cs"], rcv["involuntary_cs"]), receiver_run_delay_ms=rcv["run_delay_ms"])
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

    def idle(self, variant: str, spec: Spec, rnd: int, idle_ms: int) -> None:
        rec = _record("idle", variant, spec, 64, rnd, idle_ms=idle_ms)
        both = dict(transport=spec, topic=self._topic("idle"), warm_messages=200)
        res = self.run_tasks(
            rec, [(tasks.task_idle_pub, both), (tasks.task_idle_sub, {**both, "idle_ms": idle_ms})], 60
        )
        if res is None:
            return
        sub = res[1]
        rec.update(cpu_s=sub["cpu_s"], wall_s_idle=sub["wall_s"], cpu_pct=100 * sub["cpu_s"] / sub["wall_s"])
        rec.update(got_message=sub["got_message"])
        self.results.append(rec)
        self.log(
            f"  idle     {variant:12s}: {rec['cpu_s'] * 1e3:.2f} ms CPU in {rec['wall_s_idle']:.2f} s"
            f" = {rec['cpu_pct']:.3f} %"
        )

    def run_all(self) -> None:
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
                    variants = [("msgq", MSGQ, True, False, True), ("pyzmq", ZMQ, False, False, False)]
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


def pooled_latency(
    results: Sequence[Record], kind: str, variant: str, size: int, mode: Optional[str] = None
) -> Optional[Dict[str, float]]:
    """The latency percentiles of every sample of one measurement, all rounds pooled; None without samples."""
    samples = [x for r in suite.select(results, kind, variant, size, mode) for x in r["samples_ns"]]
    return latency_stats(samples) if samples else None


def throughput(results: Sequence[Record], variant: str, size: int, key: str = "rate") -> Optional[float]:
    """The median over the rounds of a throughput measurement's ``key``, or None."""
    vals = [r[key] for r in suite.select(results, "throughput", variant, size)]
    return median(vals) if vals else None


def _lossless(results: Sequence[Record], size: int, *variants: str) -> str:
    rs = [r for v in variants for r in suite.select(results, "throughput", v, size)]
    ok = all(suite.select(results, "throughput", v, size) for v in variants)
    return "all received" if ok and all(r["lost"] == 0 and not r["timed_out"] for r in rs) else "LOSS/timeout (see raw)"


def _better_by(m: Optional[float], z: Optional[float], higher_better: bool) -> Optional[float]:
    if m is None or z is None:
        return None
    if higher_better:
        return m / z if z else None
    return z / m if m else None


def summarize(results: List[Record], sizes: List[int]) -> List[Record]:
    """Rows: metric, size, msgq, pyzmq, unit, advantage (>1: msgq better), target, met."""
    rows: List[Record] = []

    def add(
        metric: str,
        size: int,
        m: Optional[float],
        z: Optional[float],
        unit: str,
        higher_better: bool,
        target: Optional[float] = None,
        note: str = "",
        ref: Optional[float] = None,
    ) -> None:
        adv = _better_by(m, z, higher_better)
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
                "reference_advantage": _better_by(m, ref, higher_better),
                "target": target,
                "met": adv >= target if target is not None and adv is not None else None,
                "note": note,
            }
        )

    def lat(kind: str, variant: str, size: int, mode: Optional[str] = None) -> Optional[Dict[str, float]]:
        return pooled_latency(results, kind, variant, size, mode)

    def pct(stats: Optional[Dict[str, float]], key: str) -> Optional[float]:
        return stats[key] if stats else None

    for size in sizes:
        m, z, r = (lat("rtt", v, size) for v in ("msgq", "pyzmq", "reference"))
        if m and z:
            add("round trip p50", size, m["p50"], z["p50"], "µs", False, 5.0 if size == 64 else None, ref=pct(r, "p50"))
            add("round trip p99", size, m["p99"], z["p99"], "µs", False, ref=pct(r, "p99"))
        ns = lat("rtt", "msgq-nospin", size) if size == 64 else None
        if ns and z:
            add("round trip p50, msgq spin_us=0", size, ns["p50"], z["p50"], "µs", False, note="diagnostic")
    for mode in ("blocking", "busy"):
        for size in sizes:
            m, z, r = (lat("latency", v, size, mode) for v in ("msgq", "pyzmq", "reference"))
            if not (m and z):
                continue
            waits = [
                sum(x.get("run_delay_ms") or 0 for x in suite.select(results, "latency", v, size, mode))
                for v in ("msgq", "pyzmq")
            ]
            for key in ("p50", "p99", "p99.9"):
                target = 2.0 if (size == 64 and mode == "blocking" and key == "p50") else None
                note = f"subscriber waited for a CPU {waits[0]:.0f} / {waits[1]:.0f} ms" if key == "p99.9" else ""
                add(f"one-way {mode} {key}", size, m[key], z[key], "µs", False, target, note, ref=pct(r, key))
            ns = lat("latency", "msgq-nospin", size, mode) if size == 64 and mode == "blocking" else None
            if ns:
                add("one-way blocking p50, msgq spin_us=0", size, ns["p50"], z["p50"], "µs", False, note="diagnostic")
    for size in sizes:
        tm, tz, r1 = (throughput(results, v, size) for v in ("msgq", "pyzmq", "msgq-recv1"))
        target = 1.5 if size == 64 else None
        if tm is not None and tz is not None:
            note = _lossless(results, size, "msgq", "pyzmq")
            add("throughput lossless msg/s (msgq receive_batch)", size, tm, tz, "msg/s", True, target, note)
            add("throughput lossless MB/s (msgq receive_batch)", size, tm * size / 1e6, tz * size / 1e6, "MB/s", True)
        if r1 is not None and tz is not None:
            note = _lossless(results, size, "msgq-recv1", "pyzmq")
            add("throughput lossless msg/s (msgq receive())", size, r1, tz, "msg/s", True, target, note)
    m, z = lat("latency", "msgq", 64, "30hz"), lat("latency", "pyzmq", 64, "30hz")
    if m and z:
        r = lat("latency", "reference", 64, "30hz")
        for key in ("p50", "p99"):
            add(f"one-way {key} at 30 Hz (receiver idle between)", 64, m[key], z[key], "µs", False, ref=pct(r, key))
    for size in sizes:
        tm, tz, tref = (throughput(results, v, size) for v in ("msgq-lossy-recv1", "pyzmq-lossy", "reference-lossy"))
        if tm is not None and tz is not None:
            add("throughput lossy msg/s received (receive() each)", size, tm, tz, "msg/s", True, ref=tref)
    idle = {
        v: [r["cpu_pct"] for r in results if r["kind"] == "idle" and r["variant"] == v]
        for v in ("msgq", "pyzmq", "reference")
    }
    if idle["msgq"] and idle["pyzmq"]:
        im, iz = median(idle["msgq"]), median(idle["pyzmq"])
        add("idle subscriber CPU (blocked in receive)", 64, im, iz, "% of a core", False)
        iref = median(idle["reference"]) if idle["reference"] else None
        rows[-1].update(advantage=None, reference=iref, reference_advantage=None, target="≈0 % (<1 %)", met=im < 1.0)
    return rows


LOSSY_VARIANTS = ("msgq-lossy", "msgq-lossy-recv1", "pyzmq-lossy", "reference-lossy")


def lossy_rows(results: Sequence[Record], sizes: Sequence[int]) -> List[List[str]]:
    out = []
    for size in sizes:
        for variant in LOSSY_VARIANTS + ("msgq", "msgq-recv1", "pyzmq"):
            rs = suite.select(results, "throughput", variant, size)
            if not rs:
                continue
            sent = sum(r["sent"] for r in rs)
            recv = sum(r["received"] for r in rs)
            rates = [fmt_rate(median([r[k] for r in rs])) for k in ("send_rate", "rate")]
            lost = f"{100 * (sent - recv) / sent:.2f} %" if sent else "-"
            mb_s = f"{median([r['mb_s'] for r in rs]):.1f}"
            out.append(
                [variant, fmt_size(size), *rates, mb_s, f"{recv}/{sent}", lost, str(sum(r["resets"] for r in rs))]
            )
    return out


def _fmt_val(v: Optional[float], unit: str) -> str:
    if v is None:
        return "-"
    if unit == "msg/s":
        return fmt_rate(v)
    if unit == "MB/s":
        return f"{v:.1f}"
    if unit.startswith("%"):
        return f"{v:.3f} %"
    return f"{v:.1f}"


def _times(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render(rows: List[Record]) -> str:
    """The summary table; the reference's columns when it ran."""
    with_ref = any(r.get("reference") is not None for r in rows)
    table = []
    for r in rows:
        ref = [_fmt_val(r.get("reference"), r["unit"])] if with_ref else []
        ref_adv = [_times(r.get("reference_advantage"))] if with_ref else []
        if r["target"] is None:
            target = r["note"] or ""
        else:
            target = r["target"] if isinstance(r["target"], str) else f">= {r['target']:g}x"
        met = "" if r["met"] is None else ("MET" if r["met"] else "NOT MET")
        unit = r["unit"]
        shown_unit = "µs" if unit == "µs" else ("" if unit in ("msg/s",) else unit)
        values = [_fmt_val(r["msgq"], unit), _fmt_val(r["pyzmq"], unit), *ref, shown_unit, _times(r["advantage"])]
        table.append([r["metric"], fmt_size(r["size"]), *values, *ref_adv, target, met])
    rc = "r" if with_ref else ""
    headers = ["metric", "size", "msgq", "pyzmq", *(["reference"] if with_ref else []), "unit", "msgq better by"]
    headers += ["vs reference"] if with_ref else []
    return format_table(headers + ["target", ""], table, f"llrr{rc}lr{rc}ll")


# =========================================================================== the command


class MsgqVsZmq(suite.Suite):
    description = "msgq vs pyzmq ipc:// PUB/SUB: latency, round trip, throughput, idle CPU."
    parts = ("latency", "rtt", "throughput", "idle", "camera")
    sizes = "64,4096,1MiB"
    quick_help = "short smoke run (~20-30 s)"
    rounds_help = "alternating rounds per measurement (default 2, --quick 1)"
    json_help = "write raw results (every sample) as JSON"
    no_pin_help = "do not pin publisher and subscriber to different CPUs"
    check = "exit 1 if a target is not met"
    failed_status = 2
    title = "msgq vs pyzmq ipc:// (XPUB_NODROP for lossless), same run;"
    plan, runner = Plan, Runner
    setup, teardown = staticmethod(tasks.worker_setup), staticmethod(tasks.worker_teardown)
    summarize, render = staticmethod(summarize), staticmethod(render)

    def flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--reference",
            choices=("auto", "on", "off"),
            default="auto",
            help="run commaai/msgq beside us (VIPC_REFERENCE_MSGQ, docs/reference.md): "
            "auto = when it is built (default), on = fail without it",
        )

    def output_flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--plot", metavar="PATH", help="write a PNG of latency percentiles and throughput (needs matplotlib)"
        )

    def make_plan(
        self, ap: argparse.ArgumentParser, args: argparse.Namespace, sizes: List[int], only: Set[str]
    ) -> Plan:
        why_not = reference.unavailable()
        if args.reference == "on" and why_not:
            ap.error(f"--reference on: {why_not}")
        plan = Plan(args.quick, args.rounds, sizes, only, reference=args.reference != "off" and not why_not)
        if args.reference == "auto" and why_not:
            print(f"reference: skipped ({why_not})", file=sys.stderr)
        return plan

    @contextlib.contextmanager
    def environment(self, plan: suite.Plan) -> Iterator[None]:
        self.prefix = prefix = f"bench{os.getpid()}"
        # the shared-memory ring, whatever the caller's environment says; the reference's
        # topic files (it never removes them) go to a folder of this run's, removed at the end
        with (
            tempfile.TemporaryDirectory(prefix="bench_zmq_") as ipc_dir,
            reference.prefix_dir(prefix) as ref_prefix,
            scoped_env(MSGQ_PREFIX=prefix, MSGQ_BACKEND="msgq", OPENPILOT_PREFIX=ref_prefix, BENCH_IPC_DIR=ipc_dir),
        ):
            try:
                yield
            finally:
                left = segments(prefix)
                if left:
                    print(f"WARNING: segments left behind in /dev/shm (removed now): {left}", file=sys.stderr)
                    for name in left:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(segment_dir(), name))

    def meta(self, plan: suite.Plan) -> Dict[str, Any]:
        assert isinstance(plan, Plan)
        return {
            "git": git_rev(),
            "msgq_spin_us_default": os.environ.get("MSGQ_SPIN_US", "library default"),
            "reference": reference.describe() if plan.reference else None,
        }

    def headline(self, info: Dict[str, Any], cpus: Sequence[int], pinned: Sequence[Optional[int]]) -> str:
        return (
            f"msgq vs pyzmq {info['pyzmq']} (libzmq {info['libzmq']}), MSGQ_PREFIX={self.prefix}, cpus={cpus}, "
            f"publisher on {pinned[0]}, subscriber on {pinned[1]}, load {info['loadavg_start']}"
            + (f", MSGQ_SPIN_US={os.environ['MSGQ_SPIN_US']}" if os.environ.get("MSGQ_SPIN_US") else "")
        )

    def notes(self, plan: suite.Plan) -> List[str]:
        return [
            "latency: medians/percentiles of all samples pooled over rounds; throughput: median over rounds, "
            "received msg/s at the subscriber"
        ]

    def print_tables(self, info: Dict[str, Any], rows: List[Record], runner: suite.Runner) -> None:
        if info["reference"]:
            print(f"reference: commaai/msgq {info['reference']} ({reference.root()})")
        print(render(rows))
        lr = lossy_rows(runner.results, runner.plan.sizes)
        if lr:
            print()
            print(
                "throughput detail (flat-out sender; msgq lossless = credit window of half a ring, "
                "pyzmq lossless = XPUB_NODROP):"
            )
            headers = ["variant", "size", "sent/s", "received/s", "MB/s", "received", "lost", "resets"]
            print(format_table(headers, lr, "llrrrrrr"))

    def json_report(
        self, info: Dict[str, Any], rows: List[Record], runner: suite.Runner, elapsed: float
    ) -> Dict[str, Any]:
        assert isinstance(runner, Runner)
        info.update(loadavg_end=read_loadavg(), elapsed_s=elapsed)
        report = {"meta": info, "summary": rows, "results": runner.results}
        return {**report, "calibrations": runner.calibrations, "errors": runner.errors}

    def outputs(self, args: argparse.Namespace, runner: suite.Runner, log: Log) -> None:
        if args.json:
            log(f"raw results: {args.json}")
        if args.plot:
            from visionipc.bench.plot import write_pubsub_png

            if write_pubsub_png(runner.results, runner.plan.sizes, args.plot, pooled_latency, throughput):
                log(f"plot: {args.plot}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return MsgqVsZmq().main(argv)


if __name__ == "__main__":
    sys.exit(main())
