"""The other process of tests/visionipc/test_cuda_pool.py: a producer whose stream's pool is
in device memory. ``python cuda_pool_peer.py NAME COUNT W H FRAMES FIRST_ID``: sends frame
FIRST_ID - 1 every 5 ms until a client comes, then FRAMES frames (ids from FIRST_ID, stamped
as vipc_helpers.stamp does) every 5 ms, alternately by the copying send of host bytes and of
a device array, prints "sent", then waits for a line on stdin (or its end) before it closes."""

import sys
import time

import numpy as np
from vipc_helpers import stamp

from visionipc import VisionIpcServer
from visionipc.formats import layout


def device_copy(host: np.ndarray):
    """``host`` in device memory through a framework, or None without one."""
    for name in ("cupy", "torch"):
        try:
            xp = __import__(name)
        except ImportError:
            continue
        return xp.asarray(host) if name == "cupy" else xp.from_numpy(host).cuda()
    return None


def main() -> None:
    name, count, width, height, frames, first = sys.argv[1], *map(int, sys.argv[2:7])
    server = VisionIpcServer(name)
    server.create_buffers("road", count, width, height, memory="cuda")
    server.start_listener()
    print("ready", flush=True)
    size = layout("nv12", width, height).size
    host = np.empty(size, np.uint8)
    deadline = time.monotonic() + 30
    while server.num_clients("road") == 0:  # frames meanwhile: a client of a restarted server
        assert time.monotonic() < deadline, "no client came"  # picks it up at its first frame
        stamp(host, first - 1)
        server.send("road", host.tobytes(), first - 1, 0, 0)
        time.sleep(0.005)
    for i in range(first, first + frames):
        stamp(host, i)
        data = device_copy(host) if i % 2 else None
        server.send("road", host.tobytes() if data is None else data, i, i * 10, i * 10 + 1)
        time.sleep(0.005)
    print("sent", flush=True)
    sys.stdin.readline()
    server.close()


if __name__ == "__main__":
    main()
