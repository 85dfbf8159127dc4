"""What the worker processes run: one producer task and ``n`` consumer tasks per
measurement, started together and kept in step by barriers ("bound": the producer
exists; "ready": every client is attached; "done")."""

import os
import resource
import time
from typing import Any, Dict

from visionipc.bench import transports
from visionipc.bench.workers import Control, State


def worker_setup(state: State) -> None:
    state["ipc_dir"] = os.environ["VIPC_BENCH_IPC_DIR"]


def worker_teardown(state: State) -> None:
    for fn in state.pop("teardown", []):
        fn()


def task_producer(
    ctl: Control,
    state: State,
    kind: str,
    tag: str,
    w: int,
    h: int,
    nbuf: int,
    nclients: int,
    fill: bool,
    mode: str,
    fps: float = 0.0,
    count: int = 0,
    warmup: int = 0,
    seconds: float = 0.0,
    spin_us: int = 0,
) -> Dict[str, Any]:
    """``mode`` "paced": ``warmup + count`` frames at ``fps``; the producer sleeps until
    ``spin_us`` before each frame's time and spins the rest: with ``spin_us`` 0 it sleeps
    between frames as a camera daemon does (sends cold); with 2000 it sends warm (only the
    clients have been asleep). "flat": as fast as it can for ``seconds``.

    CPU per frame: the process's CPU time over the measured frames (every thread:
    a transport's I/O or listener threads count), paced minus the CPU the producer
    thread spent pacing (sleep + spin), divided by the frames sent (a mean).
    ``frame_cpu_ns`` (paced): per measured frame, the producer thread's own CPU from
    the end of its pacing to the start of the next (the frame's calls), read from the
    clock reads the pacing takes anyway; its median shrugs off the odd interrupt or
    slow phase that moves the mean of 60 frames. ``woken``: the
    sleeping clients the producer's own system calls woke over those frames, for a
    transport that counts them (``readers_woken()``), else None."""
    p = transports.load(kind).Producer(state, tag, w, h, nbuf, nclients)
    try:
        if mode == "flat":
            p.prefault()
        ctl.barrier("bound")
        p.accept()
        ctl.barrier("ready")
        p.check()
        send, now, perf = p.send, time.monotonic_ns, time.perf_counter
        thread_time, sleep = time.thread_time_ns, time.sleep
        send_call, frame_cpu = [], []
        pacing_cpu = 0
        woken = getattr(p, "readers_woken", None)
        woken0 = None
        fid = 0
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        if mode == "paced":
            period, spin = 1.0 / fps, spin_us * 1e-6
            nxt = perf() + period
            # set at the first measured frame (after the warm-up); Any: None until then
            cpu0: Any = None
            t0: Any = None
            paced: Any = None
            for fid in range(1, warmup + count + 1):
                c = thread_time()
                if fid > warmup + 1:
                    frame_cpu.append(c - paced)  # the previous frame's calls
                delay = nxt - perf() - spin
                if delay > 0:
                    sleep(delay)
                while perf() < nxt:
                    pass
                nxt += period
                if fid == warmup + 1:
                    woken0 = woken() if woken else None  # before the CPU clock starts
                    cpu0, t0, pacing_cpu = time.process_time_ns(), perf(), 0
                paced = thread_time()
                if fid != warmup + 1:
                    pacing_cpu += paced - c
                ts = send(fid, fill)
                send_call.append(now() - ts)
            cpu1, t1 = time.process_time_ns(), perf()
            frame_cpu.append(thread_time() - paced)
            sent = count
            send_call = send_call[warmup:]
            sleep(period)  # a conflating client must not see the end marker replace the last frame
        else:
            woken0 = woken() if woken else None
            cpu0, t0 = time.process_time_ns(), perf()
            deadline = t0 + seconds
            while True:
                fid += 1
                send(fid, fill)
                if perf() > deadline:
                    break
            cpu1, t1 = time.process_time_ns(), perf()
            sent = fid
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        woken1 = woken() if woken else None
        p.end()
        ctl.barrier("done")
    finally:
        p.close()
    return {
        "sent": sent,
        "wall_s": t1 - t0,
        "cpu_ns": cpu1 - cpu0 - pacing_cpu,
        "pacing_cpu_ns": pacing_cpu,
        "woken": woken1 - woken0 if woken0 is not None else None,
        "send_call_ns": send_call,
        "frame_cpu_ns": frame_cpu,
        "preempted": ru1.ru_nivcsw - ru0.ru_nivcsw,
    }


def task_consumer(
    ctl: Control, state: State, kind: str, tag: str, w: int, h: int, conflate: bool, warmup: int, keep_samples: bool
) -> Dict[str, Any]:
    """Receive until the end marker. Latency samples (frames after ``warmup``):
    send -> the client holds a numpy view of the frame."""
    ctl.barrier("bound")
    c = transports.load(kind).Consumer(state, tag, w, h, conflate)
    try:
        ctl.barrier("ready")
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = time.process_time_ns()
        recv = c.recv
        lat_view, lat_recv, fids = [], [], []
        got = intact = 0
        t_first = t_last = None
        ended = "end"
        while True:
            r = recv()
            if r is None:
                ended = "timeout"
                break
            if r == "end":
                break
            fid, ts, tr, tv, ok = r
            if t_first is None:  # rates run from the first frame to the last
                t_first = tr
            else:
                got += 1
                intact += bool(ok)
            t_last = tr
            if keep_samples and fid > warmup:
                lat_view.append(tv - ts)
                lat_recv.append(tr - ts)
                fids.append(fid)
        cpu1 = time.process_time_ns()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        ctl.barrier("done")
    finally:
        c.close()
    span = (t_last - t_first) * 1e-9 if t_first is not None else 0.0
    return {
        "ended": ended,
        "received": got,
        "frames": got + (t_first is not None),
        "intact": intact,
        "span_s": span,
        "cpu_ns": cpu1 - cpu0,
        "sleeps": ru1.ru_nvcsw - ru0.ru_nvcsw,
        "preempted": ru1.ru_nivcsw - ru0.ru_nivcsw,
        "lat_view_ns": lat_view,
        "lat_recv_ns": lat_recv,
        "fids": fids,
    }
