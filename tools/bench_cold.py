#!/usr/bin/env python3
"""Where a camera-paced handoff spends its time: each step of the send and receive
paths timed warm (the same sequence without a sleep) and cold (right after a 33 ms
sleep, as at 30 fps),
in one process pinned to one CPU. A step that costs 0.3 µs warm can cost 10-20 µs
cold on a VM, where a sleeping vCPU comes back with caches and TLBs emptied by
whatever ran meanwhile; what runs between a wake-up and the frame in the client's
hands is what issue 19 item 2 is about.

    python tools/bench_cold.py              # ~40 s
    python tools/bench_cold.py --rounds 50  # quicker, noisier
"""

import argparse
import os
import statistics
import sys
import time

import msgq
from msgq.testing import isolated_prefix, unique_name
from visionipc import VisionIpcClient, VisionIpcServer
from visionipc.bench.stats import format_table
from visionipc.bench.workers import read_loadavg

PERIOD_S = 1 / 30


def _nothing():
    pass


def steps(server, client, pub, sub, empty_sub):
    """name -> (prepare(), timed()) ; prepare runs before the sleep, untimed."""
    msg = bytes(64)
    native = client._native
    frame = {}

    def queue_frame():
        buf = server.get_buffer("s")
        server.send(buf, frame_id=1)

    def checked_out():
        frame["buf"] = server.get_buffer("s")

    def received():
        queue_frame()
        frame["f"] = client.recv(100)

    def give_back():  # what the last get_buffer checked out goes out again (untimed)
        for key in ("g", "n"):
            got = frame.pop(key, None)
            if key == "g" and got is not None:
                server.send(got, frame_id=1)
            elif got is not None:
                server._native.send("s", got[0], got[1], 1, 0, 0)

    image = bytes(server.get_buffer("s").geometry.size)  # the copying send's input (one buffer's bytes)
    native_server = server._native
    # the stream's native handle where the build has one (an older build: its name)
    target = native_server.handle("s") if hasattr(native_server, "handle") else "s"

    none = lambda: None  # noqa: E731
    return {
        "VisionIPC server.get_buffer()": (give_back, lambda: frame.__setitem__("g", server.get_buffer("s"))),
        "  its native acquire alone": (give_back, lambda: frame.__setitem__("n", native_server.acquire(target)[:2])),
        "VisionIPC copying server.send(stream, data)": (none, lambda: server.send("s", image, frame_id=1)),
        "clock read (time.monotonic_ns)": (none, time.monotonic_ns),
        "empty Python call": (none, _nothing),
        "pybind11 method (client.connected)": (none, native.connected),
        "C method (msgq receive, nothing there)": (none, lambda: empty_sub.receive(True)),
        "msgq send 64 B": (lambda: sub.receive(True), lambda: pub.send(msg)),
        "msgq receive 64 B (waiting)": (lambda: pub.send(msg), sub.receive),
        "VisionIPC server.send(buf)": (checked_out, lambda: server.send(frame["buf"], frame_id=1)),
        "VisionIPC client.recv() (frame waiting)": (queue_frame, lambda: client.recv(100)),
        "VisionBuf.array": (received, lambda: frame["f"].array),
    }


def measure(table, rounds):
    now = time.monotonic_ns
    warm = {k: [] for k in table}
    cold = {k: [] for k in table}
    for _ in range(rounds):
        for name, (prepare, fn) in table.items():
            prepare()
            fn()  # warm: the same step again right away
            prepare()
            t0 = now()
            fn()
            warm[name].append(now() - t0)
            prepare()
            time.sleep(PERIOD_S)
            t0 = now()
            fn()
            cold[name].append(now() - t0)
    return {k: (statistics.median(warm[k]) / 1e3, statistics.median(cold[k]) / 1e3) for k in table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=120, help="samples per step and state (default 120)")
    ap.add_argument("--cpu", type=int, default=0, help="CPU to pin to (default 0)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        os.sched_setaffinity(0, {args.cpu})
    except (OSError, ValueError) as e:
        ap.error(f"cannot pin to CPU {args.cpu}: {e}")
    load = read_loadavg()
    with isolated_prefix(f"cold{os.getpid()}"):
        name = unique_name("cold")
        server = VisionIpcServer(name)
        server.create_buffers("s", 4, 64, 64, "nv12")
        server.start_listener()
        client = VisionIpcClient(name, "s")
        client.connect(True)
        pub, sub = msgq.pub_sock(f"{name}_m"), msgq.sub_sock(f"{name}_m", timeout=100)
        empty_pub, empty_sub = msgq.pub_sock(f"{name}_e"), msgq.sub_sock(f"{name}_e")
        try:
            results = measure(steps(server, client, pub, sub, empty_sub), args.rounds)
        finally:
            for s in (pub, sub, empty_pub, empty_sub, client, server):
                s.close()
    print(f"# one process on CPU {args.cpu}; cold: after a {PERIOD_S * 1e3:.0f} ms sleep; medians of {args.rounds}")
    rows = [[k, f"{w:.2f}", f"{c:.2f}", f"{c / w:.0f}x" if w > 0 else "-"] for k, (w, c) in results.items()]
    print(format_table(["step", "warm µs", "cold µs", "cold / warm"], rows, "lrrr"))
    print(f"# load average {load} -> {read_loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
