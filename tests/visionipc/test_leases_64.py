"""Sixty-four clients (four processes of 16, the per-process share) each holding a
lease on a frame of its own: the producer never hands out a leased buffer while one is
free, reads every client's slot (the last of the 64 included), and once a holder
process dies its buffers come back into use (L3) while the others' stay pinned."""

import time

import pytest
import vipc_helpers as h
from lease_holders import hold_frames

from visionipc import VisionIpcServer, _visionipc

pytestmark = pytest.mark.timeout(180)


def wait_clients(server, n):
    deadline = time.monotonic() + h.DEADLINE_S
    while server.num_clients(0) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.num_clients(0) == n


def test_sixty_four_leases_pin_their_buffers_until_their_holders_die():
    share, total = _visionipc.MAX_CLIENTS_PER_PEER, _visionipc.MAX_CLIENTS
    groups = total // share
    connected, results = h.Results(), h.Results()
    server = VisionIpcServer("leases64")
    server.create_buffers(0, total + 1, 64, 32)  # one buffer more than there are leases
    server.start_listener()
    procs = [
        h.start(hold_frames, f"g{g}", connected, results, "leases64", "0", 1 + g * share, share) for g in range(groups)
    ]
    try:
        h.collect(connected, groups)
        wait_clients(server, total)
        for fid in range(1, total + 1):  # frame f in buffer f - 1: all fresh, in index order
            buf = server.get_buffer(0)
            assert buf.idx == fid - 1
            server.send(buf, frame_id=fid)
            time.sleep(0.002)
        reports = h.collect(results, groups)
        held = {}  # buffer -> the group holding it
        for name, report in reports.items():
            for fid, idx, valid in report["held"]:
                assert valid and idx == fid - 1, (name, fid, idx)
                held[idx] = int(name[1:])
        assert sorted(held) == list(range(total))
        for _ in range(8):  # the one unleased buffer, every time
            buf = server.get_buffer(0)
            assert buf.idx == total
            server.send(buf)
        h.kill(procs[0])  # group 0's 16 leases go with its connections
        wait_clients(server, total - share)
        freed = {i for i, g in held.items() if g == 0}
        seen = set()
        for _ in range(2 * (share + 1)):
            buf = server.get_buffer(0)
            assert buf.idx == total or buf.idx in freed, buf.idx  # never a live holder's buffer
            seen.add(buf.idx)
            server.send(buf)
        assert seen == freed | {total}
    finally:
        for p in procs:
            h.kill(p)
        server.close()
