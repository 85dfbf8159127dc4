#!/usr/bin/env python3
"""Fault-injection soak: many processes on msgq topics and a VisionIPC stream,
killed, stopped and restarted at random moments; afterwards, proof that
nothing was torn, reordered, silently lost or leaked.

Processes (each a separate ``python -P tools/soak.py --role ...``):

- msgq publishers on two topics: ``firehose`` (a 16 KiB ring written fast, so
  a stopped reader is lapped) and ``mixed`` (random sizes up to ~100 KB, random
  bursts and pauses). Every message carries (epoch, sequence number, length,
  CRC-32) and random bytes; the epoch changes when a publisher restarts;
- msgq subscribers (plain and conflating) that check every message;
- a VisionIPC server publishing stamped frames (every byte of frame N encodes
  N) and clients (plain, conflating, and a conflating "holder" that keeps each
  frame leased for 50 ms, so a kill lands mid-frame).

Faults, in shuffled rounds so each kind happens: SIGKILL a subscriber, a
client mid-frame, a publisher, the server (the last two are restarted);
SIGSTOP a subscriber of the firehose for longer than its ring lasts, then
SIGCONT; SIGSTOP a client holding a lease.

Checks at the end (any failure: exit status 1 and the reasons):
- every message a subscriber got was intact (length, CRC) and in order;
  every gap in a plain subscriber's sequence coincides with a counted reset
  (``sub.resets``); conflating subscribers may skip, never go back;
- every valid frame a client got was intact; frames never went back in a
  server's sequence; a frame overwritten under a reader was reported invalid;
- no hang: every process stops within 20 s when asked; no survivor crashed;
- restarted publishers / servers were picked up: each surviving reader's last
  message came from the final publisher incarnation;
- reader slots reclaimed: no live reader slot remains once subscribers have
  left, and each final publisher reports 0 readers after reclaiming the dead;
  the server's lease slots all freed (0 clients);
- nothing leaked: no segment file of the run's MSGQ_PREFIX left in the shm
  directory, no file descriptor left open in a child that closed its sockets.

    python tools/soak.py --seconds 300           # the full soak (prints totals)
    python tools/soak.py --seconds 45 --json out.json   # what tests/system/test_soak.py runs
"""

import argparse
import gc
import heapq
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

HEADER = struct.Struct("<QQII")  # epoch, sequence number, body length, CRC-32 of the body
TOPICS = {  # name -> (segment_size, largest body, pause between bursts in s)
    "firehose": (16384, 2000, 0.002),
    "mixed": (256 * 1024, 100_000, 0.02),
}
VIPC_SERVER, VIPC_STREAM = "soakcam", "road"
STOP_GRACE_S = 20.0


# ----------------------------------------------------------------- children


def _stop_requested(path):
    return os.path.exists(path)


def _fds():
    return set(os.listdir("/proc/self/fd"))


def _emit(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _emit_final(record, fds_before, errors=None):
    """A role's last record, after it closed everything: the descriptors it
    leaked and (for a receiving role) the first errors and their count."""
    gc.collect()
    if errors is not None:
        record.update(errors=errors[:20], error_count=len(errors))
    _emit({**record, "leaked_fds": sorted(_fds() - fds_before)})


def role_publisher(spec):
    import msgq

    rng = random.Random(spec["seed"])
    segment_size, largest, pause = TOPICS[spec["topic"]]
    fds_before = _fds()
    pub = msgq.pub_sock(spec["topic"], segment_size=segment_size)
    largest = min(largest, pub.max_message_size - HEADER.size)
    epoch = rng.getrandbits(63)
    _emit({"ready": True, "epoch": epoch})
    seq = sent_bytes = 0
    next_reclaim = time.monotonic()
    while not _stop_requested(spec["stop"]):
        for _ in range(rng.randint(1, 20)):
            size = rng.choice((rng.randint(0, 64), rng.randint(0, 1024), rng.randint(0, largest)))
            body = rng.randbytes(size)
            pub.send(HEADER.pack(epoch, seq, size, zlib.crc32(body)) + body)
            seq += 1
            sent_bytes += size
        if time.monotonic() >= next_reclaim:
            _ = pub.num_readers  # reclaims the slots of dead readers
            next_reclaim = time.monotonic() + 0.5
        time.sleep(rng.uniform(0, pause))
    readers = pub.num_readers  # subscribers have all left by now: dead slots reclaimed, live ones released
    pub.close()
    _emit_final({"sent": seq, "bytes": sent_bytes, "epoch": epoch, "readers_at_end": readers}, fds_before)
    return 0


def role_subscriber(spec):
    import msgq

    conflate = spec["conflate"]
    fds_before = _fds()
    sub = msgq.sub_sock(spec["topic"], timeout=100, conflate=conflate)
    _emit({"ready": True})
    errors, epochs = [], []
    received = nbytes = gaps = 0
    last_seq, last_resets = None, 0
    while not _stop_requested(spec["stop"]):
        msg = sub.receive()
        if msg is None:
            continue
        resets = sub.resets
        if len(msg) < HEADER.size:
            errors.append(f"message of {len(msg)} bytes has no header")
            continue
        epoch, seq, size, crc = HEADER.unpack_from(msg)
        body = memoryview(msg)[HEADER.size :]
        if len(body) != size or zlib.crc32(body) != crc:
            errors.append(f"torn message: epoch {epoch} seq {seq}")
            continue
        if not epochs or epoch != epochs[-1]:
            if epoch in epochs:
                errors.append(f"epoch {epoch} came back after a newer publisher")
            elif epochs and seq != 0 and resets == last_resets and not conflate:
                errors.append(f"restarted publisher: first {seq} messages lost without a reset")
            epochs.append(epoch)
        elif seq <= last_seq:
            errors.append(f"out of order: seq {seq} after {last_seq}")
        elif seq != last_seq + 1:
            gaps += seq - last_seq - 1
            if resets == last_resets and not conflate:
                errors.append(f"{seq - last_seq - 1} messages lost before seq {seq} without a reset")
        last_seq, last_resets = seq, resets
        received += 1
        nbytes += len(msg)
    resets = sub.resets
    sub.close()
    record = {"received": received, "bytes": nbytes, "resets": resets, "skipped": gaps, "epochs": epochs}
    _emit_final(record, fds_before, errors)
    return 0


def _stamp(data, frame_id):
    """``data``: a frame's whole buffer (``frame.data``, a writable memoryview)."""
    import numpy as np

    data = np.frombuffer(data, np.uint8)
    data[:] = frame_id % 251
    data[:8] = np.frombuffer(struct.pack("<Q", frame_id), np.uint8)


def _stamp_problem(data, frame_id):
    import numpy as np

    data = np.frombuffer(data, np.uint8)
    head = struct.unpack("<Q", bytes(data[:8]))[0]
    if head != frame_id:
        return f"frame {frame_id}: header says {head}"
    if np.count_nonzero(data[8:] != frame_id % 251):
        return f"frame {frame_id}: pixels of another frame"
    return None


def role_server(spec):
    from visionipc import VisionIpcServer

    rng = random.Random(spec["seed"])
    srv = VisionIpcServer(VIPC_SERVER)
    srv.create_buffers(VIPC_STREAM, 6, 320, 240, "nv12")
    srv.start_listener()
    _emit({"ready": True, "server_id": srv._native.id})
    frame_id = 0
    while not _stop_requested(spec["stop"]):
        frame_id += 1
        buf = srv.get_buffer(VIPC_STREAM)
        _stamp(buf.data, frame_id)
        srv.send(buf, frame_id=frame_id, timestamp_sof=frame_id, timestamp_eof=frame_id)
        time.sleep(rng.uniform(0.001, 0.02))
    deadline = time.monotonic() + 5  # clients have left; their hang-ups reach the listener thread
    while srv.num_clients(VIPC_STREAM) and time.monotonic() < deadline:
        time.sleep(0.01)
    clients = srv.num_clients(VIPC_STREAM)
    srv.close()
    _emit({"sent": frame_id, "clients_at_end": clients})
    return 0


def role_client(spec):
    from visionipc import VisionIpcClient

    fds_before = _fds()
    client = VisionIpcClient(VIPC_SERVER, VIPC_STREAM, spec["conflate"])
    while not client.connect(False):
        if _stop_requested(spec["stop"]):
            break
        time.sleep(0.02)
    _emit({"ready": True})
    errors, server_ids = [], []
    frames = invalid = 0
    last_frame = 0
    while not _stop_requested(spec["stop"]):
        frame = client.recv(100)
        if frame is None:
            continue
        server_id = client._native.server_id
        if not server_ids or server_ids[-1] != server_id:
            server_ids.append(server_id)
            last_frame = 0
        with frame:  # leased: the producer must not reuse this buffer meanwhile
            if spec["hold_s"]:
                time.sleep(spec["hold_s"])  # a kill now lands mid-frame
            problem = _stamp_problem(frame.data, frame.frame_id)
            valid = frame.valid
        if not valid:
            invalid += 1  # overwritten and told so: allowed
        elif problem:
            errors.append(f"torn frame reported valid: {problem}")
        if frame.frame_id <= last_frame:
            errors.append(f"frame {frame.frame_id} after {last_frame}")
        last_frame = frame.frame_id
        frames += 1
    client.close()
    _emit_final({"frames": frames, "invalid": invalid, "server_ids": server_ids}, fds_before, errors)
    return 0


ROLES = {"publisher": role_publisher, "subscriber": role_subscriber, "server": role_server, "client": role_client}


# ------------------------------------------------------------- orchestrator


class Child:
    def __init__(self, run, role, group, **spec):
        self.role, self.group, self.spec = role, group, spec
        self.name = f"{role}-{group}-{len(run.children)}"
        self.out_path = os.path.join(run.workdir, self.name + ".out")
        self.started = time.monotonic()
        self.killed = self.stopped = False
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", os.path.abspath(__file__), "--role", role, "--spec", json.dumps(spec)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=run.env,
            )
        run.children.append(self)

    def records(self):
        out = []
        with open(self.out_path) as f:
            for line in f:
                if line.startswith("{"):
                    out.append(json.loads(line))
        return out

    def report(self):
        done = [r for r in self.records() if "ready" not in r]
        return done[-1] if done else None

    def ready_record(self):
        ready = [r for r in self.records() if "ready" in r]
        return ready[0] if ready else None

    def output(self):
        with open(self.out_path) as f:
            return f.read()[-3000:]


class Soak:
    def __init__(self, seconds, seed, workdir):
        self.seconds, self.rng, self.workdir = seconds, random.Random(seed), workdir
        self.children = []
        self.prefix = f"soak{os.getpid()}x{self.rng.getrandbits(24):06x}"
        self.env = dict(os.environ, MSGQ_PREFIX=self.prefix)
        self.env.pop("OPENPILOT_PREFIX", None)
        self.stop_readers = os.path.join(workdir, "stop-readers")
        self.stop_writers = os.path.join(workdir, "stop-writers")
        self.faults = {
            k: 0
            for k in (
                "kill_subscriber",
                "kill_client_mid_frame",
                "kill_publisher",
                "kill_server",
                "stop_reader",
                "stop_client",
            )
        }
        self.restarts = 0
        self.failures = []
        self.log = []  # what happened when, for the report
        self.t0 = time.monotonic()

    # -- processes
    def seed(self):
        return self.rng.getrandbits(32)

    def start_publisher(self, topic):
        return Child(self, "publisher", topic, topic=topic, seed=self.seed(), stop=self.stop_writers)

    def start_subscriber(self, topic, conflate=False):
        return Child(self, "subscriber", topic, topic=topic, conflate=conflate, stop=self.stop_readers)

    def start_server(self):
        return Child(self, "server", "vipc", seed=self.seed(), stop=self.stop_writers)

    def start_client(self, conflate=False, hold_s=0.0):
        return Child(self, "client", "vipc", conflate=conflate, hold_s=hold_s, stop=self.stop_readers)

    def live(self, role, group=None):
        return [
            c
            for c in self.children
            if c.role == role and (group is None or c.group == group) and not c.killed and c.proc.poll() is None
        ]

    def kill(self, child):
        child.killed = True
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)

    # -- faults
    def fault(self, kind, now, events):
        rng = self.rng
        if kind == "kill_subscriber":
            victim = rng.choice(self.live("subscriber"))
            self.kill(victim)
            self.start_subscriber(victim.group, victim.spec["conflate"])
        elif kind == "kill_client_mid_frame":
            holders = [c for c in self.live("client") if c.spec["hold_s"] and not c.stopped]
            victim = rng.choice(holders or self.live("client"))
            self.kill(victim)
            replacement = self.start_client(victim.spec["conflate"], victim.spec["hold_s"])
            self.log.append(f"{now - self.t0:6.2f} replaced by {replacement.name}")
        elif kind == "kill_publisher":
            if not self.live("publisher"):
                return False
            victim = rng.choice(self.live("publisher"))
            self.kill(victim)
            heapq.heappush(events, (now + rng.uniform(0, 0.5), "restart_publisher", victim.group))
        elif kind == "kill_server":
            if not self.live("server"):
                return False  # already down, restarting
            victim = self.live("server")[0]
            self.kill(victim)
            heapq.heappush(events, (now + rng.uniform(0, 0.5), "restart_server", None))
        elif kind in ("stop_reader", "stop_client"):
            pool = self.live("subscriber", "firehose") if kind == "stop_reader" else self.live("client")
            pool = [c for c in pool if not c.stopped]
            if not pool:
                return False
            victim = rng.choice(pool)
            victim.stopped = True
            victim.proc.send_signal(signal.SIGSTOP)
            # The firehose ring (16 KiB) lasts a few ms at its rate: any of these outlasts it.
            heapq.heappush(events, (now + rng.uniform(0.5, 1.5), "continue", victim))
        self.faults[kind] += 1
        self.log.append(f"{now - self.t0:6.2f} {kind} {victim.name if kind != 'kill_server' else ''}")
        return True

    def run(self):
        fds_before = _fds()
        for topic in TOPICS:
            self.start_publisher(topic)
            self.start_subscriber(topic)
            self.start_subscriber(topic)
            self.start_subscriber(topic, conflate=True)
        self.start_server()
        self.start_client()
        self.start_client(conflate=True)
        self.start_client(conflate=True, hold_s=0.05)  # slow, so it wants the newest frame only

        start = time.monotonic()
        end = start + self.seconds
        events = []  # (time, action, arg)
        kinds = list(self.faults)
        order = []
        next_fault = start + 2.0  # let everyone start first
        while True:
            now = time.monotonic()
            while events and events[0][0] <= now:
                _, action, arg = heapq.heappop(events)
                if action == "continue":
                    arg.stopped = False
                    if arg.proc.poll() is None:
                        arg.proc.send_signal(signal.SIGCONT)
                elif action == "restart_publisher":
                    self.log.append(f"{now - self.t0:6.2f} restart {self.start_publisher(arg).name}")
                    self.restarts += 1
                elif action == "restart_server":
                    self.log.append(f"{now - self.t0:6.2f} restart {self.start_server().name}")
                    self.restarts += 1
            if now >= end and not events:
                break
            if now >= next_fault and now < end - 3.0:  # the last seconds run fault-free
                if not order:
                    order = kinds[:]
                    self.rng.shuffle(order)
                if not self.fault(order[-1], now, events):
                    order.insert(0, order[-1])  # not possible right now: try it later in the round
                order.pop()
                next_fault = now + self.rng.uniform(0.6, 1.6)
            self.check_unexpected_deaths()
            time.sleep(0.02)
        self.shutdown()
        leaked = sorted(_fds() - fds_before)
        if leaked:
            self.failures.append(f"the orchestrator leaked file descriptors {leaked}")
        return self.verdict()

    def check_unexpected_deaths(self):
        for c in self.children:
            if not c.killed and not getattr(c, "reported_death", False) and c.proc.poll() is not None:
                c.reported_death = True
                self.failures.append(f"{c.name} died on its own (exit {c.proc.returncode}):\n{c.output()}")

    def stop_group(self, role_names, flag):
        open(flag, "w").close()
        for c in self.children:
            if c.role in role_names and not c.killed:
                try:
                    c.proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.failures.append(f"{c.name} did not stop within {STOP_GRACE_S} s (hang):\n{c.output()}")
                    self.kill(c)
                    continue
                if c.proc.returncode != 0 and not getattr(c, "reported_death", False):
                    self.failures.append(f"{c.name} exited {c.proc.returncode}:\n{c.output()}")

    def shutdown(self):
        from msgq import _msgq
        from msgq.names import run_segment_prefix, segment_dir

        for c in self.children:
            if c.stopped and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGCONT)
        self.stop_group(("subscriber", "client"), self.stop_readers)
        # Readers are gone: no reader slot may still belong to a live process.
        for name in os.listdir(segment_dir()):
            if name.startswith(run_segment_prefix(self.prefix)):
                try:
                    stats = _msgq.segment_stats(segment_dir(), name)
                except Exception as exc:  # noqa: BLE001 - reported, not fatal here
                    self.failures.append(f"cannot read {name}: {exc}")
                    continue
                alive = [r for r in stats["readers"] if r["alive"]]
                if alive:
                    self.failures.append(f"{name}: reader slots still held after every reader left: {alive}")
        self.stop_group(("publisher", "server"), self.stop_writers)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.leftover_segments():
            time.sleep(0.05)
        left = self.leftover_segments()
        if left:
            self.failures.append(f"segment files left in {segment_dir()}: {left}")
            for name in left:
                os.unlink(os.path.join(segment_dir(), name))

    def leftover_segments(self):
        from msgq.names import run_segment_prefix, segment_dir

        return sorted(n for n in os.listdir(segment_dir()) if n.startswith(run_segment_prefix(self.prefix)))

    def verdict(self):
        totals = {
            "messages": 0,
            "bytes": 0,
            "resets": 0,
            "skipped_with_reset": 0,
            "frames": 0,
            "frames_invalid": 0,
            "kills_survived": 0,
            "restarts": self.restarts,
            "faults": self.faults,
            "processes": len(self.children),
        }
        survivors = [c for c in self.children if not c.killed]
        totals["kills_survived"] = sum(1 for c in self.children if c.killed)
        final_epoch = {}
        final_server = None
        for c in survivors:
            if c.role == "publisher":
                final_epoch[c.group] = (c.ready_record() or {}).get("epoch"), c.started
            if c.role == "server":
                final_server = (c.ready_record() or {}).get("server_id"), c.started
        for c in survivors:
            r = c.report()
            if r is None:
                self.failures.append(f"{c.name} gave no report:\n{c.output()}")
                continue
            if r.get("leaked_fds"):
                self.failures.append(f"{c.name} left file descriptors open after closing: {r['leaked_fds']}")
            if r.get("error_count"):
                self.failures.append(f"{c.name}: {r['error_count']} errors, e.g. {r['errors'][:5]}")
            if c.role == "publisher" and r["readers_at_end"] != 0:
                self.failures.append(f"{c.name}: {r['readers_at_end']} reader slots not reclaimed")
            if c.role == "server" and r["clients_at_end"] != 0:
                self.failures.append(f"{c.name}: {r['clients_at_end']} lease slots not freed")
            if c.role == "subscriber":
                totals["messages"] += r["received"]
                totals["bytes"] += r["bytes"]
                totals["resets"] += r["resets"]
                totals["skipped_with_reset"] += r["skipped"]
                epoch, since = final_epoch.get(c.group, (None, 0))
                if epoch is not None and c.started < since and (not r["epochs"] or r["epochs"][-1] != epoch):
                    self.failures.append(f"{c.name} never picked up the restarted publisher (epochs {r['epochs']})")
            if c.role == "client":
                totals["frames"] += r["frames"]
                totals["frames_invalid"] += r["invalid"]
                if (
                    final_server
                    and c.started < final_server[1]
                    and (not r["server_ids"] or r["server_ids"][-1] != final_server[0])
                ):
                    self.failures.append(
                        f"{c.name} never picked up the restarted server {final_server[0]} "
                        f"(got {r['frames']} frames from {r['server_ids']})"
                    )
        return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status 0: every check held. The JSON report has every count.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=180.0, help="how long faults are injected (default 180)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random; printed)")
    parser.add_argument("--json", metavar="PATH", help="also write the totals and failures as JSON")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        return ROLES[args.role](json.loads(args.spec))
    if args.seconds < 5:
        parser.error("--seconds must be at least 5")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    with tempfile.TemporaryDirectory(prefix="vipc-soak-") as workdir:
        soak = Soak(args.seconds, seed, workdir)
        started = time.monotonic()
        try:
            totals = soak.run()
        finally:
            for c in soak.children:  # nothing outlives the soak, whatever happened
                if c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGCONT)
                    c.proc.kill()
                    c.proc.wait(10)
    totals["seconds"] = round(time.monotonic() - started, 1)
    totals["seed"] = seed
    print(f"soak: {totals['seconds']} s, seed {seed}, {totals['processes']} processes")
    print(
        f"  messages {totals['messages']} ({totals['bytes'] / 1e6:.1f} MB), resets {totals['resets']} "
        f"(skipped {totals['skipped_with_reset']} messages, every one with a counted reset)"
    )
    print(f"  frames {totals['frames']} ({totals['frames_invalid']} reported overwritten, none torn)")
    print(f"  kills survived {totals['kills_survived']}, restarts {totals['restarts']}")
    print("  faults: " + ", ".join(f"{k} {v}" for k, v in totals["faults"].items()))
    for failure in soak.failures:
        print("FAIL: " + failure)
    if soak.failures:
        print("events:\n  " + "\n  ".join(soak.log))
    print("soak " + ("FAILED" if soak.failures else "passed"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"totals": totals, "failures": soak.failures, "events": soak.log}, f, indent=2)
    return 1 if soak.failures else 0


if __name__ == "__main__":
    sys.exit(main())
