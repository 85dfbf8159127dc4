"""The msgq demo: one publisher process, two subscriber processes.

The publisher sends a 1 kHz stream of small timestamped messages on ``demo_ticks``
and a 30 Hz stream of 1 MiB "frames" written in place (zero-copy loans) on
``demo_frames``. One subscriber blocks on the ticks; the other waits on both
topics with a Poller. Each prints, once a second, how many messages it got,
the one-way latency and its drops.

    python tools/demo_msgq.py [--seconds 5]
"""

import argparse
import multiprocessing as mp
import os
import statistics
import struct
import time

STAMP = struct.Struct("<qQ")  # monotonic send time (ns), sequence number
FRAME = 1 << 20


def publisher(seconds, ready):
    import msgq

    ticks = msgq.pub_sock("demo_ticks")
    frames = msgq.pub_sock("demo_frames", segment_size=8 * FRAME)
    ready.wait()
    start = time.monotonic()
    seq = 0
    next_frame = start
    while time.monotonic() - start < seconds:
        ticks.send(STAMP.pack(time.monotonic_ns(), seq) + b"." * 48)
        if time.monotonic() >= next_frame:
            with frames.loan(FRAME) as buf:  # filled in place, no copy
                buf[STAMP.size : STAMP.size + 8] = seq.to_bytes(8, "little")
                buf[: STAMP.size] = STAMP.pack(time.monotonic_ns(), seq)
            next_frame += 1 / 30
        seq += 1
        time.sleep(0.001)
    ticks.send(b"")  # end marker


def report(name, lat_ns, count, resets):
    if lat_ns:
        p50 = statistics.median(lat_ns) / 1000
        p99 = sorted(lat_ns)[int(len(lat_ns) * 0.99)] / 1000
        print(
            f"{name:>10}: {count:5d} msgs/s  latency p50 {p50:7.1f} µs  p99 {p99:7.1f} µs  drops {resets}", flush=True
        )


def blocking_subscriber(ready):
    import msgq

    sub = msgq.sub_sock("demo_ticks", timeout=5000)
    ready.wait()
    lat, last = [], time.monotonic()
    for msg in sub:
        if not msg:
            break
        lat.append(time.monotonic_ns() - STAMP.unpack_from(msg)[0])
        if time.monotonic() - last >= 1:
            report("ticks", lat, len(lat), sub.resets)
            lat, last = [], time.monotonic()


def polling_subscriber(ready):
    import msgq

    poller = msgq.Poller()
    ticks = msgq.sub_sock("demo_ticks", poller=poller)
    frames = msgq.sub_sock("demo_frames", poller=poller, conflate=True)
    ready.wait()
    got = {ticks: 0, frames: 0}
    frame_lat, last = [], time.monotonic()
    while True:
        for sock in poller.poll(5000) or [None]:
            if sock is None:
                return
            msg = sock.receive(non_blocking=True)
            if msg is None:
                continue
            if sock is ticks and not msg:
                return
            got[sock] += 1
            if sock is frames:
                frame_lat.append(time.monotonic_ns() - STAMP.unpack_from(msg)[0])
        if time.monotonic() - last >= 1:
            report("frames", frame_lat, got[frames], frames.resets)
            print(f"{'poller':>10}: {got[ticks]} ticks and {got[frames]} frames of 1 MiB this second", flush=True)
            got = {ticks: 0, frames: 0}
            frame_lat, last = [], time.monotonic()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to publish (default 5)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MSGQ_PREFIX", f"demo{os.getpid()}")  # keep this run's topics to itself
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(3)
    procs = [
        ctx.Process(target=blocking_subscriber, args=(ready,)),
        ctx.Process(target=polling_subscriber, args=(ready,)),
    ]
    for p in procs:
        p.start()
    pub = ctx.Process(target=publisher, args=(args.seconds, ready))
    pub.start()
    for p in [pub, *procs]:
        p.join(args.seconds + 30)
        if p.is_alive():
            p.kill()
    ok = all(p.exitcode == 0 for p in [pub, *procs])
    print("demo finished" if ok else "demo failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
