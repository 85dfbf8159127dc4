"""The measurement plan: every chosen (mode, frame size, client count, transport) cell,
transports in rotating order, ``rounds`` times; each cell is one producer worker and
``clients`` consumer workers from a :class:`~visionipc.bench.workers.WorkerPool`."""

import dataclasses
import time
from typing import Any, Dict, List, Sequence, Tuple

from visionipc.bench import transports
from visionipc.bench.harness import Log
from visionipc.bench.stats import latency_stats, median
from visionipc.bench.tasks import task_consumer, task_producer
from visionipc.bench.workers import BenchError, WorkerPool

Result = Dict[str, Any]  # a worker task's result, or a cell's record

SIZE_NAMES = {(64, 64): "64x64", (640, 480): "VGA", (1920, 1080): "1080p", (3840, 2160): "4K", (7680, 4320): "8K"}


def first_and_last(consumers: Sequence[Result]) -> Tuple[List[int], List[int]]:
    """Per frame every client got: the latency of the first client to hold it and of
    the last (with 8 clients sharing a CPU, the 8th waits for the other 7)."""
    per_frame: Dict[int, List[int]] = {}
    for c in consumers:
        for fid, lat in zip(c["fids"], c["lat_view_ns"]):
            per_frame.setdefault(fid, []).append(lat)
    full = [lats for lats in per_frame.values() if len(lats) == len(consumers)]
    return [min(x) for x in full], [max(x) for x in full]


def size_name(w: int, h: int) -> str:
    return SIZE_NAMES.get((w, h), f"{w}x{h}")


PACED = ("paced", "warm")  # the modes that send at --fps and measure latency


@dataclasses.dataclass
class Config:
    sizes: list  # [(w, h)]
    clients: list  # [n]
    transports: list  # names from transports.TRANSPORTS that can run here
    modes: list  # "paced" (the producer sleeps between frames), "warm" (it spins before each), "flat"
    rounds: int = 1
    paced_fps: float = 30.0
    paced_count: int = 60  # measured frames per paced cell (after the warm-up)
    paced_warmup: int = 5
    spin_us: int = 2000  # warm producer: spin (not sleep) this long before each frame
    flat_seconds: float = 1.0
    fill: bool = False  # flat out: write every byte of every frame (memset), not only the stamp
    extra_buffers: int = 4  # pool / ring = clients + this many frames

    def cells(self, mode: str, rnd: int) -> List[Tuple[int, int, int, str]]:
        """(w, h, n, transport) in this round's order: transports rotate cell by cell."""
        out = []
        names = [t for t in self.transports if not (mode == "flat" and t == "futex")]  # no frame to send flat out
        k = rnd
        for w, h in self.sizes:
            for n in self.clients:
                k += 1
                i = k % len(names) if names else 0
                out += [(w, h, n, t) for t in names[i:] + names[:i]]
        return out


class Runner:
    def __init__(self, pool: WorkerPool, config: Config, log: Log) -> None:
        self.pool = pool
        self.cfg = config
        self.log = log
        self.results: List[Result] = []
        self.errors: List[Result] = []
        self._n = 0

    def run(self) -> List[Result]:
        self.warm_up()
        for rnd in range(self.cfg.rounds):
            for mode in self.cfg.modes:
                self.log(f"round {rnd + 1}/{self.cfg.rounds}: {mode}")
                for w, h, n, kind in self.cfg.cells(mode, rnd):
                    self.cell(mode, kind, w, h, n, rnd)
        return self.results

    def warm_up(self) -> None:
        """One short, unrecorded run per transport with every worker: imports, first
        mappings and lazy set-up are paid here, not by whichever cell comes first."""
        w, h = self.cfg.sizes[0]
        n = max(self.cfg.clients)
        for kind in self.cfg.transports:
            tag = f"w{kind}".replace("+", "")
            prod = dict(
                kind=kind,
                tag=tag,
                w=w,
                h=h,
                nbuf=n + self.cfg.extra_buffers,
                nclients=n,
                fill=False,
                mode="paced",
                fps=200.0,
                count=3,
                warmup=0,
            )
            cons = dict(kind=kind, tag=tag, w=w, h=h, conflate=False, warmup=0, keep_samples=False)
            tasks = [(task_producer, prod)] + [(task_consumer, cons)] * n
            try:
                self.pool.run(tasks + [None] * (self.pool.size - len(tasks)), 60)
            except BenchError as e:
                self.log(f"  warm-up of {kind} failed: {str(e).strip().splitlines()[-1]}")

    def cell(self, mode: str, kind: str, w: int, h: int, n: int, rnd: int) -> None:
        c = self.cfg
        self._n += 1
        tag = str(self._n)
        rec: Result = {
            "mode": mode,
            "transport": kind,
            "frame": size_name(w, h),
            "width": w,
            "height": h,
            "bytes": transports.nv12(w, h)[0],
            "clients": n,
            "round": rnd,
        }
        common = dict(kind=kind, tag=tag, w=w, h=h)
        nbuf = n + c.extra_buffers
        if mode in PACED:
            prod = dict(
                common,
                nbuf=nbuf,
                nclients=n,
                fill=False,
                mode="paced",
                fps=c.paced_fps,
                count=c.paced_count,
                warmup=c.paced_warmup,
                spin_us=c.spin_us if mode == "warm" else 0,  # "paced": asleep until the frame is due
            )
            cons = dict(common, conflate=False, warmup=c.paced_warmup, keep_samples=True)
            # a transport that copies the frame to every client (pyzmq) falls behind at 8K: allow
            # ~20 MB/s per client copy on a loaded machine before calling the cell lost (50 MB/s,
            # 141 s for pyzmq 8K x8, was too little beside a 5-worker test suite on 2 cores)
            copies = (c.paced_count + c.paced_warmup) * n * rec["bytes"]
            timeout = 60 + (c.paced_count + c.paced_warmup) / c.paced_fps * 4 + copies / 20e6
        else:
            prod = dict(common, nbuf=nbuf, nclients=n, fill=c.fill, mode="flat", seconds=c.flat_seconds)
            cons = dict(common, conflate=True, warmup=0, keep_samples=False)
            timeout = 60 + c.flat_seconds * 6 + 4 * n * rec["bytes"] / 50e6  # + draining the queued frames
        tasks = [(task_producer, prod)] + [(task_consumer, cons)] * n
        started = time.monotonic()
        try:
            res = self.pool.run(tasks + [None] * (self.pool.size - len(tasks)), timeout)
        except BenchError as e:
            rec["error"] = str(e)
            self.errors.append(rec)
            self.log(f"  ERROR {mode} {kind} {rec['frame']} x{n}: {str(e).strip().splitlines()[-1]}")
            return
        p, cs = res[0], res[1 : 1 + n]
        rec.update(
            cell_s=time.monotonic() - started,
            sent=p["sent"],
            server_cpu_us=p["cpu_ns"] / p["sent"] * 1e-3 if p["sent"] else None,
            server_wakes=p["woken"] / p["sent"] if p.get("woken") is not None and p["sent"] else None,
            client_cpu_us=median([x["cpu_ns"] / x["frames"] * 1e-3 for x in cs if x["frames"]]),
            received=[x["received"] for x in cs],
            intact=[x["intact"] for x in cs],
            ended=[x["ended"] for x in cs],
            client_sleeps=[x["sleeps"] for x in cs],
            server_preempted=p["preempted"],
        )
        if mode in PACED:
            rec["samples_ns"] = [s for x in cs for s in x["lat_view_ns"]]
            rec["recv_samples_ns"] = [s for x in cs for s in x["lat_recv_ns"]]
            rec["send_call_ns"] = p["send_call_ns"]
            rec["server_frame_cpu_ns"] = p["frame_cpu_ns"]
            rec["first_ns"], rec["last_ns"] = first_and_last(cs)
            st = latency_stats(rec["samples_ns"])
            what = f"p50 {st.get('p50', float('nan')):9.1f} µs  p99 {st.get('p99', float('nan')):9.1f}"
        else:
            rec["send_rate"] = p["sent"] / p["wall_s"]
            rec["client_rates"] = [x["intact"] / x["span_s"] if x["span_s"] > 0 else 0.0 for x in cs]
            what = f"{median(rec['client_rates']):10.0f} intact frames/s per client"
        self.results.append(rec)
        bad = [e for e in rec["ended"] if e != "end"]
        self.log(
            f"  {mode:5s} {kind:9s} {rec['frame']:>9s} x{n}: {what}  server {rec['server_cpu_us'] or 0:7.1f} µs "
            f"CPU/frame  ({rec['cell_s']:.1f} s)" + (f"  [{len(bad)} client(s) timed out]" if bad else "")
        )
