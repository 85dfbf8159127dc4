"""Out-of-order publishing on an ordered topic (msgq.OrderedProducer) with 1..4
producer processes, in one run:

- ``work``: each message needs ``--work-us`` (default 200) of CPU to fill
  (a busy loop between reserve() and publish, as an image worker would
  compute); producers finish out of order. With P cores, P producers should
  publish close to P times the messages/s of one: no hidden serialization.
- ``publish``: no work at all (reserve, copy 64 B, publish): what the shared
  availability word costs when producers contend on it.

A sequential reader process drains the topic every few ms and checks that it
got every id exactly once, in order. The rate is messages / (barrier ..
last producer done); the producers' CPU time per message (user + system)
shows contention on the shared word independently of what else runs on a
busy machine: with no hidden serialization it stays flat as producers are
added. Rounds alternate producer counts; medians are reported
with ratios to one producer.

    python tools/bench_ordered.py            # ~1 minute
    python tools/bench_ordered.py --quick
"""

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import msgq
from msgq.testing import isolated_prefix, unique_name
from visionipc.bench.harness import add_common_flags, cpu_s, write_json
from visionipc.bench.stats import fmt_rate, format_table, median
from visionipc.bench.workers import read_loadavg

SPAWN = multiprocessing.get_context("spawn")
PAYLOAD = bytes(range(64))


def _producer(topic, count, work_us, barrier, done):
    producer = msgq.OrderedProducer(topic)
    barrier.wait(60)
    start, cpu0 = time.monotonic_ns(), cpu_s()
    work_s = work_us / 1e6
    perf = time.perf_counter
    for _ in range(count):
        if work_s:
            res = producer.reserve(timeout=60)
            end = perf() + work_s
            while perf() < end:  # the "compute" that fills the message
                pass
            res.data[:64] = PAYLOAD
            res.publish(64)
        else:
            producer.send(PAYLOAD, timeout=60)
    done.put((start, time.monotonic_ns(), cpu_s() - cpu0))
    producer.close()


def _reader(topic, total, ready, result):
    reader = msgq.OrderedReader(topic, "sequential")
    ready.set()
    expect, ok = 0, True
    deadline = time.monotonic() + 300
    while expect < total and time.monotonic() < deadline:
        try:
            m = reader.recv(timeout=0)
        except TimeoutError:
            time.sleep(0.005)  # drain in batches: the reader must not steal the producers' CPUs
            continue
        ok &= m.id == expect and m.data == PAYLOAD
        expect = m.id + 1
    result.put({"ok": ok and expect == total, "dropped": reader.dropped})
    reader.close()


def run(producers: int, total: int, work_us: float) -> Dict[str, Any]:
    topic = unique_name("bench")
    creator = msgq.OrderedProducer(topic, capacity=1 << 16, slot_bytes=64)
    barrier = SPAWN.Barrier(producers + 1)
    done, result, ready = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
    reader = SPAWN.Process(target=_reader, args=(topic, total, ready, result))
    reader.start()
    ready.wait(60)
    each = [total // producers + (1 if i < total % producers else 0) for i in range(producers)]
    procs = [SPAWN.Process(target=_producer, args=(topic, n, work_us, barrier, done)) for n in each]
    for p in procs:
        p.start()
    barrier.wait(60)
    finished = [done.get(timeout=300) for _ in procs]
    # the producers' own clocks: this process may run again only after they finished
    start, end = min(t0 for t0, _, _ in finished), max(t1 for _, t1, _ in finished)
    cpu = sum(c for _, _, c in finished)
    check = result.get(timeout=300)
    for p in (*procs, reader):
        p.join(30)
    creator.close()
    return {"rate": total / ((end - start) / 1e9), "cpu_us": cpu / total * 1e6, **check}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--work-us", type=float, default=200.0)
    ap.add_argument("--work-messages", type=int, default=8000)
    ap.add_argument("--publish-messages", type=int, default=60000)
    add_common_flags(ap, rounds=(3, None), quick=None, json=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.work_messages, args.publish_messages, args.rounds = 1000, 5000, 1
    print(f"# ordered topic, {os.cpu_count()} CPUs, load average {read_loadavg()}")
    results: Dict[str, Dict[int, List[float]]] = {mode: {p: [] for p in args.producers} for mode in ("work", "publish")}
    cpus: Dict[str, Dict[int, List[float]]] = {mode: {p: [] for p in args.producers} for mode in ("work", "publish")}
    with isolated_prefix():
        for _ in range(args.rounds):
            for p in args.producers:
                for mode, total, work in (
                    ("work", args.work_messages, args.work_us),
                    ("publish", args.publish_messages, 0),
                ):
                    r = run(p, total, work)
                    if not r["ok"]:
                        print(f"{mode} x{p}: the sequential reader did not get every id in order: {r}", file=sys.stderr)
                        return 1
                    results[mode][p].append(r["rate"])
                    cpus[mode][p].append(r["cpu_us"])
    summary: Dict[str, Any] = {}
    rows: List[Any] = []
    for mode in ("work", "publish"):
        base = median(results[mode][args.producers[0]])
        base_cpu = median(cpus[mode][args.producers[0]])
        for p in args.producers:
            rate = median(results[mode][p])
            cpu = median(cpus[mode][p])
            # What P producers could publish on min(P, CPUs) idle cores at this CPU cost per message.
            cores = min(p, os.cpu_count() or 1)
            summary.setdefault(mode, {})[p] = {
                "msgs_per_s": rate,
                "ratio": rate / base,
                "cpu_us_per_msg": cpu,
                "cpu_ratio": cpu / base_cpu,
                "rates": results[mode][p],
            }
            label = f"{args.work_us:g} µs work" if mode == "work" else "publish only"
            rows.append(
                [
                    label,
                    str(p),
                    fmt_rate(rate),
                    f"x{rate / base:.2f}",
                    f"{cpu:.1f}",
                    f"x{base_cpu / cpu:.2f}",
                    fmt_rate(cores / cpu * 1e6),
                ]
            )
    print(
        format_table(
            [
                "mode",
                "producers",
                "msgs/s",
                f"vs {args.producers[0]}",
                "producer CPU µs/msg",
                "CPU efficiency vs 1",
                "msgs/s on idle cores (from CPU)",
            ],
            rows,
        )
    )
    if args.json:
        write_json(args.json, {"args": vars(args), "summary": summary, "load": read_loadavg()}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
