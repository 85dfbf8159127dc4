"""How fast a VisionIPC frame reaches GPU memory (issue 32), side by side in one run:

  ceiling     a pinned host buffer alone, no frame: the link's speed
  registered  frame.to_device(out=) from the pool's pages, registered once (visionipc.cuda)
  naive       cupy.asarray(frame.array): pageable memory, what users write today
  staged      np.copyto into a pinned buffer, then an async host-to-device copy

Medians over --rounds rounds of --iters copies each, per frame size, with ratios and the
issue's targets (registered >= 0.9x the ceiling and >= 5x naive at 4K). ``--race N``
then sends N frames at full rate while a client copies each one it gets to the device
and checks every byte (0 torn frames, no growth of device memory or registrations).
Needs a CUDA device, cuda-bindings and CuPy:

    python tools/bench_gpu.py --sizes 1920x1080,3840x2160 --rounds 3 --race 10000
"""

import argparse
import json
import statistics
import sys
import threading
import time

import numpy as np

from visionipc import VisionIpcClient, VisionIpcServer, cuda, layout


def timed(fn, iters, sync):
    fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pair(name, w, h, conflate):
    """A server with one NV12 stream of 4 buffers and a connected cuda=True client."""
    server = VisionIpcServer(name)
    server.create_buffers("road", 4, w, h)
    server.start_listener()
    client = VisionIpcClient(name, "road", conflate=conflate, cuda=True)
    client.connect(blocking=True)
    return server, client


def measure(size, rounds, iters):
    import cupy as cp

    w, h = size
    server, client = _pair("gpubench", w, h, conflate=False)
    # naive and staged read the frame through a client of their own (cuda=False): its
    # mapping of the pool is not registered, as in a user's process that never asked
    plain = VisionIpcClient("gpubench", "road", conflate=False)
    plain.connect(blocking=True)
    nbytes = layout("nv12", w, h).size

    def frame():
        buf = server.get_buffer("road")
        buf.array[:1] = 1
        server.send(buf, frame_id=1, timestamp_sof=0, timestamp_eof=0)
        return client.recv(timeout_ms=1000), plain.recv(timeout_ms=1000)

    out = cuda.empty(nbytes)
    dev = cp.empty(nbytes, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    pinned = cp.cuda.alloc_pinned_memory(nbytes)
    staging = np.frombuffer(pinned, np.uint8, nbytes)
    held, pageable = frame()
    paths = {
        "ceiling": lambda: dev.data.copy_from_host_async(staging.ctypes.data, nbytes, stream),
        "registered": lambda: held.to_device(out=out).synchronize(),
        "naive": lambda: cp.asarray(pageable.as_array()),
        "staged": lambda: (
            np.copyto(staging, pageable.as_array()),
            dev.data.copy_from_host_async(staging.ctypes.data, nbytes, stream),
        ),
    }
    sync = {"ceiling": stream.synchronize, "registered": lambda: None, "naive": cp.cuda.runtime.deviceSynchronize}
    sync["staged"] = stream.synchronize
    results = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            results[name].append(timed(fn, iters, sync[name]))
    plain.close()
    client.close()
    server.close()
    return nbytes, {name: statistics.median(v) for name, v in results.items()}


def race(frames, w=640, h=480):
    """A producer thread sends ``frames`` stamped frames flat out; the client copies each
    frame it receives to the device and checks every byte that arrived there."""
    server, client = _pair("gpurace", w, h, conflate=True)
    size = layout("nv12", w, h).size
    out = cuda.empty(size)
    done = threading.Event()

    def produce():
        for i in range(1, frames + 1):
            buf = server.get_buffer("road")
            buf.array.reshape(-1)[:] = i % 251
            buf.array.reshape(-1)[:8] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)
            server.send(buf, frame_id=i, timestamp_sof=0, timestamp_eof=0)
        done.set()

    free_before = cuda.runtime()._rt.cudaMemGetInfo()[1]
    producer = threading.Thread(target=produce)
    producer.start()
    checked = torn = last = 0
    while not (done.is_set() and checked and last == frames):
        frame = client.recv(timeout_ms=200)
        if frame is None:
            if done.is_set():
                break
            continue
        last = frame.frame_id
        host = frame.to_device(out=out).to_host().reshape(-1)[:size]
        expect = last % 251
        if int.from_bytes(host[:8].tobytes(), "little") != last or np.count_nonzero(host[8:] != expect):
            torn += 1
        checked += 1
    producer.join()
    free_after = cuda.runtime()._rt.cudaMemGetInfo()[1]
    client.close()
    server.close()
    return {"sent": frames, "checked": checked, "torn": torn, "device_free_delta_bytes": int(free_before - free_after)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="640x480,1920x1080,3840x2160")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--race", type=int, default=0, help="frames for the racing-producer check (0: skip)")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args(argv)
    if not cuda.available():
        print("bench_gpu: no CUDA device (visionipc.cuda.available() is False)", file=sys.stderr)
        return 2
    report = {"sizes": {}}
    print(f"{'size':>10} {'MB':>6} {'path':>10} {'median us':>10} {'GB/s':>7} {'x ceiling':>9} {'x naive':>8}")
    for text in args.sizes.split(","):
        w, h = (int(n) for n in text.lower().split("x"))
        nbytes, med = measure((w, h), args.rounds, args.iters)
        report["sizes"][text] = {"bytes": nbytes, "median_s": med}
        for name, t in med.items():
            print(
                f"{text:>10} {nbytes / 1e6:6.1f} {name:>10} {t * 1e6:10.1f} {nbytes / t / 1e9:7.2f} "
                f"{med['ceiling'] / t:9.2f} {med['naive'] / t:8.2f}"
            )
        if (w, h) == (3840, 2160):
            ok_ceiling = med["ceiling"] / med["registered"] >= 0.9
            ok_naive = med["naive"] / med["registered"] >= 5
            print(f"target 4K registered >= 0.9x ceiling: {'MET' if ok_ceiling else 'NOT MET'}; "
                  f">= 5x naive: {'MET' if ok_naive else 'NOT MET'}")  # fmt: skip
    if args.race:
        report["race"] = race(args.race)
        print("race:", json.dumps(report["race"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
