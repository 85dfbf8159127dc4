"""Where a paced frame's time goes on its way into GPU memory (issue 32 diagnostics).

One process: a server and a cuda=True client; every --period ms a frame is sent, received,
and copied to the device several ways; per-step medians (µs) are printed. Needs a GPU:

    python tools/gpu_paced_probe.py --sizes 64x64,3840x2160 --frames 40
"""

import argparse
import statistics
import time

import numpy as np

from visionipc import VisionIpcClient, VisionIpcServer, cuda, layout


def run(w, h, frames, period, spin):
    import cupy as cp

    server = VisionIpcServer(f"probe{w}")
    server.create_buffers("road", 4, w, h)
    server.start_listener()
    client = VisionIpcClient(f"probe{w}", "road", conflate=False, cuda=True)
    client.connect(blocking=True)
    plain = VisionIpcClient(f"probe{w}", "road", conflate=False)
    plain.connect(blocking=True)
    size = layout("nv12", w, h).size
    out = cuda.empty(size)
    link, rt = client._cuda, client._cuda.runtime
    dev = cp.empty(size, cp.uint8)
    cstream = cp.cuda.Stream(non_blocking=True)
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(size), np.uint8, size)
    steps = {}

    def t(name, t0):
        t1 = time.perf_counter_ns()
        steps.setdefault(name, []).append((t1 - t0) / 1e3)
        return t1

    for i in range(frames):
        if spin:
            end = time.perf_counter() + period / 1e3
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(period / 1e3)
        buf = server.get_buffer("road")
        buf.array[:1] = i
        server.send(buf, frame_id=i + 1, timestamp_sof=0, timestamp_eof=0)
        frame = client.recv(timeout_ms=1000)
        other = plain.recv(timeout_ms=1000)
        host = frame.as_array()
        which = i % 4
        t0 = time.perf_counter_ns()
        if which == 0:  # the library's path, broken into its calls
            rt.set_device(link.device)
            t0 = t("set_device", t0)
            from visionipc.cuda.device_frame import external_buffer

            external_buffer(out, size, link.device, rt)
            t0 = t("external_buffer", t0)
            rt.memcpy_async(out.ptr, host.ctypes.data, size, "h2d", link.stream)
            t0 = t("memcpy_async", t0)
            ev = link._record("lease", link.stream)
            t0 = t("event_record", t0)
            rt.event_sync(ev.handle)
            t0 = t("event_sync", t0)
            link.finish()
            s = time.perf_counter_ns()
            d = frame.to_device(out=out)
            d.synchronize()
            t("to_device+sync (2nd, same frame)", s)
        elif which == 1:  # registered pages, stream sync instead of event sync
            rt.memcpy_async(out.ptr, host.ctypes.data, size, "h2d", link.stream)
            t0 = t("reg memcpy_async", t0)
            rt.stream_sync(link.stream)
            t("reg stream_sync", t0)
        elif which == 2:  # CuPy from the registered pages
            dev.data.copy_from_host_async(host.ctypes.data, size, cstream)
            cstream.synchronize()
            t("cupy from registered", t0)
        else:  # pinned staging and naive (unregistered mapping)
            np.copyto(pinned, other.as_array().reshape(-1)[:size])
            dev.data.copy_from_host_async(pinned.ctypes.data, size, cstream)
            cstream.synchronize()
            t0 = t("pinned staging", t0)
    plain.close()
    client.close()
    server.close()
    return {k: statistics.median(v) for k, v in steps.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64x64,3840x2160")
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--period", type=float, default=33.3)
    a = p.parse_args()
    for text in a.sizes.split(","):
        w, h = (int(n) for n in text.split("x"))
        for spin in (False, True):
            med = run(w, h, a.frames, a.period, spin)
            steps = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
            print(f"{text} {'spin' if spin else 'sleep'} {a.period} ms: {steps}")


if __name__ == "__main__":
    main()
