"""A child process of test_leases_64: ``clients`` VisionIPC clients, each of which
receives frames until its own one (``first + k`` for the k-th) and keeps its lease on
it; reports to ``connected`` once every client is, then the frames held to
``results``, then waits to be killed."""

import time
import traceback

from vipc_helpers import DEADLINE_S


def hold_frames(name, connected, results, server, stream, first, clients):
    from visionipc import VisionIpcClient

    try:
        made = [VisionIpcClient(server, stream, False) for _ in range(clients)]
        for client in made:
            assert client.connect(True)
        connected.put((name, {"connected": clients}))
        held = []
        for k, client in enumerate(made):
            frame = None
            deadline = time.monotonic() + DEADLINE_S
            while (frame is None or frame.frame_id < first + k) and time.monotonic() < deadline:
                frame = client.recv(100)  # each recv leases its frame and drops the one before
            assert frame is not None and frame.frame_id == first + k, f"client {k} got {frame and frame.frame_id}"
            held.append((frame.frame_id, frame.idx, frame.valid))
        results.put((name, {"held": held}))
        time.sleep(DEADLINE_S)
    except BaseException:
        results.put((name, {"exception": traceback.format_exc()}))
