"""Lossless broadcast of Python objects, 1 writer / N readers, three ways in one run:

- ``msgq``: :class:`msgq.BroadcastQueue` (C++ chunk ring, futex wake-ups) sized
  for the payload (256 chunks of max(4 KiB, 2 x payload));
- ``msgq-defaults``: the same with the constructor's default sizes, as a user
  who writes ``BroadcastQueue(n_readers=4)`` gets it;
- ``seed-py``: the plain chunk ring in pure Python over
  ``multiprocessing.shared_memory``: per chunk a written byte and one read
  byte per reader, writer and readers polling with ``os.sched_yield()`` (the
  naive design cpp/broadcast/README.md improves on);
- ``mp.Queue``: one ``multiprocessing.Queue`` per reader, the writer puts
  every object into each (the standard library's way to broadcast).

Each object is ``(seq, send_time_ns, payload)`` with a ``--size`` byte
payload (default 1 KiB), pickled by each transport. Throughput: the writer
sends ``--messages`` flat out; the rate is messages / (first send .. last
reader done); CPU per message: user + system time of the writer (with
mp.Queue's feeder threads) and every reader over the run, divided by the
messages: on a busy shared machine the one number that does not depend on
what else runs. Latency: ``--latency-messages`` sent one every ``--interval-us``,
readers record receive - send time (CLOCK_MONOTONIC, shared by processes),
then wait 0.5 s for a message that does not come: their CPU % meanwhile is the
"idle reader CPU" column (a reader that busy-waits shows ~100 %).
Every reader checks it got every sequence number in order. Runs alternate
transports round by round (``--rounds``), and report medians and ratios.

    python tools/bench_broadcast.py                 # ~2 minutes
    python tools/bench_broadcast.py --quick         # smoke run
"""

import argparse
import multiprocessing
import os
import pickle
import queue
import secrets
import struct
import sys
import time
from multiprocessing import shared_memory
from typing import Any, Dict, List, Optional, Sequence, Tuple

import msgq
from msgq.testing import isolated_prefix
from visionipc.bench.harness import add_common_flags, cpu_s, write_json
from visionipc.bench.stats import fmt_rate, format_table, latency_stats, median
from visionipc.bench.workers import read_loadavg

SPAWN = multiprocessing.get_context("spawn")
DONE_TIMEOUT = 120.0
IDLE_S = 0.5  # the idle wait after a latency run, timed for its CPU


# ------------------------------------------------------------------ the plain chunk ring in pure Python


class SeedRing:
    """A polling ShmRingBuffer in pure Python: chunk i
    has metadata [written, read_0 .. read_{n-1}] (one byte each) and a data
    area [overflow byte][4-byte length][pickle]. Polls with sched_yield()."""

    def __init__(self, n_readers: int, chunk_bytes: int, n_chunks: int, name: Optional[str] = None) -> None:
        self.n_readers, self.chunk_bytes, self.n_chunks = n_readers, chunk_bytes, n_chunks
        self.meta_bytes = 1 + n_readers
        size = n_chunks * (chunk_bytes + self.meta_bytes)
        # A name of the bench harness's own (``vipcb...``), not Python's anonymous ``psm_...``:
        # a run's files are told from other programs' by their prefix (tests/shm_watch.py)
        create = name is None
        name = name or f"vipcb{os.getpid()}_seedring_{secrets.token_hex(4)}"
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size)
        if create:
            self.shm.buf[:size] = bytes(size)  # type: ignore[index]  # open: buf is set
        self.data_offset = n_chunks * self.meta_bytes
        self.index = 0

    def handle(self) -> Tuple[int, int, int, str]:
        return (self.n_readers, self.chunk_bytes, self.n_chunks, self.shm.name)

    def meta(self, i: int) -> memoryview:
        return self.shm.buf[i * self.meta_bytes : (i + 1) * self.meta_bytes]  # type: ignore[index]

    def chunk(self, i: int) -> memoryview:
        start = self.data_offset + i * self.chunk_bytes
        return self.shm.buf[start : start + self.chunk_bytes]  # type: ignore[index]

    def enqueue(self, obj: object, deadline: float) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        meta = self.meta(self.index)
        while meta[0] == 1 and sum(meta[1:]) != self.n_readers:
            if time.monotonic() > deadline:
                raise TimeoutError("seed ring writer")
            os.sched_yield()
        meta[0] = 0
        chunk = self.chunk(self.index)
        chunk[0] = 0
        chunk[1:5] = struct.pack("<I", len(data))
        chunk[5 : 5 + len(data)] = data
        meta[1:] = bytes(self.n_readers)
        meta[0] = 1
        self.index = (self.index + 1) % self.n_chunks

    def dequeue(self, rank: int, deadline: float) -> Any:
        meta = self.meta(self.index)
        while meta[0] != 1 or meta[1 + rank] == 1:
            if time.monotonic() > deadline:
                raise TimeoutError("seed ring reader")
            os.sched_yield()
        chunk = self.chunk(self.index)
        (n,) = struct.unpack("<I", chunk[1:5])
        obj = pickle.loads(chunk[5 : 5 + n])
        meta[1 + rank] = 1
        self.index = (self.index + 1) % self.n_chunks
        return obj

    def close(self, unlink: bool = False) -> None:
        self.shm.close()
        if unlink:
            self.shm.unlink()


# ------------------------------------------------------------------ readers (child processes)


def _reader(kind, endpoint, rank, count, ready, results, record_latency):
    if kind in ("msgq", "msgq-defaults"):
        q = msgq.BroadcastQueue.create_from_handle(endpoint, rank)
        get = lambda: q.dequeue(timeout=DONE_TIMEOUT)  # noqa: E731
    elif kind == "seed-py":
        ring = SeedRing(*endpoint)
        get = lambda: ring.dequeue(rank, deadline)  # noqa: E731
    else:
        q = endpoint[rank]
        get = lambda: q.get(timeout=DONE_TIMEOUT)  # noqa: E731
    ready.put(rank)
    deadline = time.monotonic() + DONE_TIMEOUT
    cpu0 = cpu_s()
    lat, ok = [], True
    for seq in range(count):
        got_seq, sent, _payload = get()
        if record_latency:
            lat.append(time.monotonic_ns() - sent)
        ok &= got_seq == seq
    done, cpu = time.monotonic_ns(), cpu_s() - cpu0
    idle_pct = _idle_cpu_pct(kind, ring if kind == "seed-py" else q, rank) if record_latency else None
    results.put((rank, done, ok, lat, cpu, idle_pct))
    if kind in ("msgq", "msgq-defaults"):
        q.close()
    elif kind == "seed-py":
        ring.close()  # the writer unlinks it


def _idle_cpu_pct(kind, source, rank):
    """CPU % of this reader over IDLE_S s of waiting for a message that does not come
    (the writer sent its last one): what a reader costs while its queue is quiet."""
    t0, c0 = time.monotonic(), cpu_s()
    try:
        if kind == "seed-py":
            source.dequeue(rank, t0 + IDLE_S)
        elif kind == "mp.Queue":
            source.get(timeout=IDLE_S)
        else:
            source.dequeue(timeout=IDLE_S)
    except (TimeoutError, queue.Empty):
        pass
    return (cpu_s() - c0) / (time.monotonic() - t0) * 100


# ------------------------------------------------------------------ one run


def run(kind: str, n_readers: int, count: int, size: int, record_latency: bool, interval_us: float) -> Dict[str, Any]:
    payload = os.urandom(size)
    ready, results = SPAWN.Queue(), SPAWN.Queue()
    ring = writer = None
    endpoint: Any  # what the readers attach to: a BroadcastHandle, a SeedRing's handle, or one Queue each
    if kind in ("msgq", "msgq-defaults"):
        sizes = dict(chunk_bytes=max(4096, 2 * size), max_chunks=256) if kind == "msgq" else {}
        writer = msgq.BroadcastQueue(n_readers, **sizes)
        endpoint, send = writer.handle, lambda obj: writer.enqueue(obj, timeout=DONE_TIMEOUT)
    elif kind == "seed-py":
        ring = SeedRing(n_readers, max(4096, 2 * size), 256)
        endpoint = ring.handle()
        send = lambda obj: ring.enqueue(obj, time.monotonic() + DONE_TIMEOUT)  # noqa: E731
    else:
        endpoint = [SPAWN.Queue() for _ in range(n_readers)]

        def send(obj):
            for q in endpoint:
                q.put(obj)

    procs = [
        SPAWN.Process(target=_reader, args=(kind, endpoint, r, count, ready, results, record_latency))
        for r in range(n_readers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in range(n_readers):
            ready.get(timeout=60)
        if writer is not None:
            writer.wait_until_ready(timeout=60)
        start, cpu0 = time.monotonic_ns(), cpu_s()
        for seq in range(count):
            if record_latency:
                target = start + seq * interval_us * 1000
                while time.monotonic_ns() < target:
                    pass
            send((seq, time.monotonic_ns(), payload))
        reports = [results.get(timeout=DONE_TIMEOUT) for _ in range(n_readers)]
        writer_cpu = cpu_s() - cpu0  # mp.Queue: includes its feeder threads
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if writer is not None:
            writer.close()
        if ring is not None:
            ring.close(unlink=True)
    end = max(r[1] for r in reports)
    ok = all(r[2] for r in reports)
    lat = [x for r in reports for x in r[3]]
    cpu = writer_cpu + sum(r[4] for r in reports)
    return {
        "rate": count / ((end - start) / 1e9),
        "ok": ok,
        "cpu_us": cpu / count * 1e6,
        "latency": latency_stats(lat) if lat else None,
        "idle_cpu_pct": median([r[5] for r in reports]) if record_latency else None,
    }


KINDS = ("msgq", "msgq-defaults", "seed-py", "mp.Queue")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--size", type=int, default=1024, help="payload bytes per object (default 1024)")
    ap.add_argument(
        "--messages",
        type=int,
        default=100000,
        help="objects per throughput run (100 k: at ~150 k/s a shorter run is over in a scheduler tick or two)",
    )
    ap.add_argument("--latency-messages", type=int, default=1000)
    ap.add_argument("--interval-us", type=int, default=500, help="pacing of the latency run")
    add_common_flags(ap, rounds=(3, None), quick="small counts, one round", json="write every number to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.messages, args.latency_messages, args.rounds = 2000, 200, 1
    print(
        f"# {args.readers} readers, {args.size} B payload objects, {os.cpu_count()} CPUs, load average {read_loadavg()}"
    )
    rates: Dict[str, List[float]] = {k: [] for k in KINDS}
    cpus: Dict[str, List[float]] = {k: [] for k in KINDS}
    lats: Dict[str, List[Dict[str, Any]]] = {k: [] for k in KINDS}  # latency stats per round
    idles: Dict[str, List[float]] = {k: [] for k in KINDS}
    with isolated_prefix():
        for _ in range(args.rounds):
            for kind in KINDS:
                r = run(kind, args.readers, args.messages, args.size, False, 0)
                if not r["ok"]:
                    print(f"{kind}: a reader lost or reordered messages", file=sys.stderr)
                    return 1
                rates[kind].append(r["rate"])
                cpus[kind].append(r["cpu_us"])
                lat = run(kind, args.readers, args.latency_messages, args.size, True, args.interval_us)
                lats[kind].append(lat["latency"])
                idles[kind].append(lat["idle_cpu_pct"])
    rows: List[List[str]] = []
    summary: Dict[str, Dict[str, Any]] = {}
    for kind in KINDS:
        rate = median(rates[kind])
        p50 = median([x["p50"] for x in lats[kind]])
        p99 = median([x["p99"] for x in lats[kind]])
        cpu, idle = median(cpus[kind]), median(idles[kind])
        summary[kind] = {
            "msgs_per_s": rate,
            "p50_us": p50,
            "p99_us": p99,
            "cpu_us_per_msg": cpu,
            "idle_reader_cpu_pct": idle,
            "rates": rates[kind],
        }
        rows.append([kind, fmt_rate(rate), f"{cpu:.1f}", f"{p50:.1f}", f"{p99:.1f}", f"{idle:.1f}"])
    print(
        format_table(
            ["transport", "msgs/s", "CPU µs/msg (all processes)", "latency p50 µs", "p99 µs", "idle reader CPU %"], rows
        )
    )
    for name, other in (("msgq", "seed-py"), ("msgq", "mp.Queue"), ("msgq-defaults", "mp.Queue")):
        base, o = summary[name], summary[other]
        print(
            f"{name} / {other}: throughput x{base['msgs_per_s'] / o['msgs_per_s']:.1f}, "
            f"CPU per message x{o['cpu_us_per_msg'] / base['cpu_us_per_msg']:.1f} lower, "
            f"latency p50 x{o['p50_us'] / base['p50_us']:.1f} lower"
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "summary": summary, "load": read_loadavg()}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
