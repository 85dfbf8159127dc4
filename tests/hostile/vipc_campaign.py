"""Adversarial campaign for issue 16's VisionIPC items: forked children using,
closing and dropping inherited servers and clients; SIGKILLed servers; raw
socket peers that idle or send garbage. Prints what it found (RELIABILITY.md).

    .venv/bin/python tests/hostile/vipc_campaign.py [SEED]   # FORKS=200 KILLS=30 ROUNDS=40
"""

import gc
import multiprocessing
import os
import random
import signal
import socket
import struct
import sys
import time

from msgq.errors import ClosedError
from msgq.names import segment_dir
from msgq.testing import isolated_prefix
from visionipc import VisionIpcClient, _visionipc
from visionipc.streams import run_options

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_vipc_hostile import forked_server, serving  # noqa: E402

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
found = []


def note(what):
    found.append(what)
    print("FOUND", what, flush=True)


def probe(name, server, fid):
    """A fresh client in a fresh process connects and gets a frame; returns problem or None."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            c = VisionIpcClient(name, "road", False)
            ok = c.connect(False)
            os.write(w, b"c" if ok else (c.last_error or "refused").encode()[:200])
            f = c.recv(3000) if ok else None
            os.write(w, b"f" if f is not None else b"-")
        finally:
            os._exit(0)
    os.close(w)
    first = os.read(r, 200)
    if first == b"c":
        for _ in range(50):
            server.send(server.get_buffer("road"), frame_id=fid)
            time.sleep(0.005)
    rest = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    if first != b"c":
        return f"connect refused: {first!r}"
    if rest != b"f":
        return "no frame"
    return None


def forks(n):
    raw = _visionipc.Server("fkraw", **run_options())
    raw.create_buffers("road", 2, 64, 32, "gray8")
    raw.start_listener()
    held = {"server": serving("fk"), "raw": raw}
    held["client"] = VisionIpcClient("fk", "road", False)
    assert held["client"].connect(False)
    held["rawc"] = _visionipc.Client("fk", "road", False, **run_options())
    assert held["rawc"].connect()
    del raw
    actions = ["use_server", "close_server", "drop_all", "use_client", "close_client", "raw_close", "exit", "mp"]
    for i in range(n):
        act = rng.choice(actions)
        if act == "mp":
            p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
            p.start()
            p.join(10)
        else:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    if act in ("use_server", "use_client"):
                        try:
                            held["server"].get_buffer("road") if act == "use_server" else held["client"].recv(1)
                            code = 3
                        except ClosedError:
                            pass
                    elif act == "close_server":
                        held["server"].close()
                    elif act == "close_client":
                        held["client"].close()
                    elif act == "raw_close":
                        held["raw"].close()
                        held["rawc"].close()
                    elif act == "drop_all":
                        held.clear()  # the last references: destructors run here, in the child
                        gc.collect()
                finally:
                    os._exit(code)
            _, st = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(st) != 0:
                note(f"fork {i} {act}: child exit {os.waitstatus_to_exitcode(st)}")
        server, client = held["server"], held["client"]
        if i % 10 == 0:
            problem = probe("fk", server, i + 1)
            if problem:
                note(f"fork {i} after {act}: {problem}")
            c2 = VisionIpcClient("fkraw", "road", False)
            if not c2.connect(False):
                note(f"fork {i} after {act}: raw server refused: {c2.last_error}")
            c2.close()
        server.send(server.get_buffer("road"), frame_id=10_000 + i)
        f = client.recv(2000)
        while f is not None and f.frame_id < 10_000 + i:
            f = client.recv(2000)
        if f is None or f.frame_id != 10_000 + i:
            note(f"fork {i} after {act}: parent client lost frame")
        del server, client, f
    t = time.monotonic()
    for obj in held.values():
        obj.close()
    if time.monotonic() - t > 2:
        note("parent close slow")


def kills(n):
    leftovers = 0
    for i in range(n):
        pid = forked_server("kl", rng.random() * 0.004)
        c = VisionIpcClient("kl", "road", rng.random() < 0.5)
        c.connect(True)
        got = c.recv(3000)
        time.sleep(rng.random() * 0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if got is None:
            note(f"kill {i}: no frame before kill")
        leftovers += len([f for f in os.listdir(segment_dir()) if "visionipc_kl" in f])
        c.close()
    if leftovers:
        note(f"kills: {leftovers} leftover files")


def hostile_peers(rounds):
    server = serving("hp")
    addr = f"\0visionipc@{os.environ['MSGQ_PREFIX']}@hp".encode()
    for i in range(rounds):
        socks = []
        for _ in range(rng.randrange(1, 120)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(addr)
            except OSError:
                s.close()
                continue
            kind = rng.randrange(5)
            try:
                if kind == 1:
                    s.send(os.urandom(rng.randrange(1, 300)))
                elif kind == 2:
                    s.send(struct.pack("<IIII", 0x43504956, rng.randrange(5), rng.randrange(4), 0) + os.urandom(128))
                elif kind == 3:
                    s.send(struct.pack("<IIII", 0x43504956, 2, 1, 0) + b"road" + bytes(124))  # attach, then idle
            except OSError:
                pass
            socks.append(s)
        problem = probe("hp", server, i + 1)
        if problem:
            note(f"hostile round {i} ({len(socks)} sockets): {problem}")
        with VisionIpcClient("hp", "road", False) as mine:  # the crowded peer itself: admitted, or told why
            if not mine.connect(False) and "share" not in mine.last_error:
                note(f"hostile round {i}: refused without the reason: {mine.last_error}")
        for s in socks:
            s.close()
    server.close()


if __name__ == "__main__":
    with isolated_prefix():
        t = time.monotonic()
        forks(int(os.environ.get("FORKS", 200)))
        kills(int(os.environ.get("KILLS", 30)))
        hostile_peers(int(os.environ.get("ROUNDS", 40)))
        print(f"done in {time.monotonic() - t:.1f}s; found {len(found)}: {found}")
