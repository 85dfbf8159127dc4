"""Child-process targets for the VisionIPC tests (spawned, so importable by name).

Children report through a ``Results`` (one pipe per child), never through a
shared ``multiprocessing.Queue``: the tests SIGKILL children, and a child killed
while its queue feeder thread holds the queue's cross-process write lock (it
holds it from before the report reaches the parent until after, so a kill just
after the parent read the report can land inside it) takes that lock to its
grave, and every later child's ``put`` then waits forever.

Frames are stamped: every byte of frame N is ``N % 251`` and its first 8 bytes
hold N (little-endian), so a reader can tell an intact frame from a torn one.
"""

import hashlib
import multiprocessing
import os
import signal
import time
import traceback

import numpy as np
from reports import Results

SPAWN = multiprocessing.get_context("spawn")
DEADLINE_S = 60.0


def stamp(data, frame_id: int):
    """Stamp a whole buffer (``frame.data``: a writable memoryview, or a contiguous array)."""
    flat = np.frombuffer(data, np.uint8)
    flat[:] = frame_id % 251
    flat[:8] = np.frombuffer(int(frame_id).to_bytes(8, "little"), np.uint8)


def stamp_problem(data, frame_id: int):
    """None if ``data`` (the whole buffer: ``frame.data`` or a uint8 array) carries frame_id's
    stamp, else what is wrong."""
    data = np.frombuffer(data, np.uint8)
    head = int.from_bytes(bytes(data[:8]), "little")
    if head != frame_id:
        return f"frame {frame_id}: header says {head}"
    body = data[8:]
    bad = np.flatnonzero(body != frame_id % 251)
    if bad.size:
        return f"frame {frame_id}: {bad.size} bytes differ from the stamp (first at {bad[0] + 8})"
    return None


def _report(results, name, fn):
    try:
        results.put((name, fn()))
    except BaseException:
        results.put((name, {"exception": traceback.format_exc()}))


def client_reads(name, results, server, stream, count, conflate=False, ready=None):
    """Receive ``count`` frames (or until the deadline); check each valid one's stamp."""
    from visionipc import VisionIpcClient

    def run():
        client = VisionIpcClient(server, stream, conflate)
        assert client.connect(True)
        if ready is not None:
            ready.put(name)
        ids, torn, invalid = [], [], 0
        deadline = time.monotonic() + DEADLINE_S
        while len(ids) < count and time.monotonic() < deadline:
            frame = client.recv(200)
            if frame is None:
                continue
            with frame:
                problem = stamp_problem(frame.data, frame.frame_id)
                still_valid = frame.valid
            ids.append(frame.frame_id)
            if not still_valid:
                invalid += 1
            elif problem:
                torn.append(problem)
        client.close()
        return {"ids": ids, "torn": torn, "invalid": invalid}

    _report(results, name, run)


def client_digests(name, results, server, stream, count, ready):
    """Receive ``count`` frames; report each one's frame id and SHA-256 of its bytes."""
    from visionipc import VisionIpcClient

    def run():
        client = VisionIpcClient(server, stream, False)
        assert client.connect(True)
        ready.put(name)
        got = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < deadline:
            frame = client.recv(200)
            if frame is not None:
                with frame:
                    got[frame.frame_id] = hashlib.sha256(frame.data).hexdigest()
        client.close()
        return got

    _report(results, name, run)


def client_holds_lease(name, results, server, stream):
    """Receive one frame, hold it inside ``with``, report its index, then wait to be killed."""
    from visionipc import VisionIpcClient

    client = VisionIpcClient(server, stream, False)
    assert client.connect(True)
    frame = None
    while frame is None:
        frame = client.recv(100)
    with frame:
        results.put((name, {"idx": frame.idx, "frame_id": frame.frame_id, "valid": frame.valid}))
        time.sleep(DEADLINE_S)


def serve(name, results, server, stream, count, frames, interval_s, width=64, height=32, stop=None):
    """A producer: ``frames`` stamped frames (0: until ``stop`` is set or killed)."""
    from visionipc import VisionIpcServer

    def run():
        srv = VisionIpcServer(server)
        srv.create_buffers(stream, count, width, height)
        srv.start_listener()
        results.put((name, {"started": os.getpid()}))
        frame_id = 0
        while (frames == 0 or frame_id < frames) and not (stop is not None and stop.is_set()):
            frame_id += 1
            buf = srv.get_buffer(stream)
            stamp(buf.data, frame_id)
            srv.send(buf, frame_id=frame_id, timestamp_sof=frame_id, timestamp_eof=frame_id + 1)
            if interval_s:
                time.sleep(interval_s)
        srv.close()
        return {"sent": frame_id}

    _report(results, name, run)


def start(target, *args, **kwargs):
    """Spawn ``target``; a ``Results`` among ``args`` reaches it as a ``Reporter`` of its own."""
    reporters = []

    def own(arg):
        if isinstance(arg, Results):
            reporters.append(arg.reporter())
            return reporters[-1]
        return arg

    args = tuple(own(a) for a in args)
    kwargs = {k: own(v) for k, v in kwargs.items()}
    proc = SPAWN.Process(target=target, args=args, kwargs=kwargs, daemon=True)
    proc.start()
    for reporter in reporters:
        reporter.close()  # the child has its copy; ours would hide its end of file
    return proc


def kill(proc):
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def collect(results, n, timeout=DEADLINE_S):
    out = {}
    deadline = time.monotonic() + timeout
    while len(out) < n:
        name, report = results.get(timeout=max(0.1, deadline - time.monotonic()))
        assert "exception" not in report, f"{name} failed:\n{report['exception']}"
        out[name] = report
    return out


def client_acks(name, results, server, stream, count, ready):
    """Receive ``count`` frames (each within 30 s), one report per frame as it arrives:
    its id and whether it was intact and still valid (no other report, but a failure's)."""
    from visionipc import VisionIpcClient

    try:
        client = VisionIpcClient(server, stream)
        assert client.connect(True)
        ready.put(name)
        for _ in range(count):
            frame = client.recv(30_000)
            assert frame is not None, "a recv timed out after 30 s"
            with frame:
                ok = not stamp_problem(frame.data, frame.frame_id) and frame.valid
                results.put((name, {"frame_id": frame.frame_id, "ok": ok}))
        client.close()
    except BaseException:
        results.put((name, {"exception": traceback.format_exc()}))
