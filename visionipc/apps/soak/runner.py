"""The soak's orchestrator: starts the roles, injects the faults, checks the
reports (see the package docstring)."""

import argparse
import heapq
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .roles import ROLES, STOP_GRACE_S, TOPICS, Record, open_fds

Event = Tuple[float, str, Any]  # (time, action, its argument: a Child, a topic or None)

# ------------------------------------------------------------- orchestrator


class Child:
    def __init__(self, run: "Soak", role: str, group: str, **spec: Any) -> None:
        self.role, self.group, self.spec = role, group, spec
        self.name = f"{role}-{group}-{len(run.children)}"
        self.out_path = os.path.join(run.workdir, self.name + ".out")
        self.started = time.monotonic()
        self.killed = self.stopped = False
        self.reported_death = False
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __package__, "--role", role, "--spec", json.dumps(spec)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=run.env,
            )
        run.children.append(self)

    def records(self) -> List[Record]:
        out = []
        with open(self.out_path) as f:
            for line in f:
                if line.startswith("{"):
                    out.append(json.loads(line))
        return out

    def report(self) -> Optional[Record]:
        done = [r for r in self.records() if "ready" not in r]
        return done[-1] if done else None

    def ready_record(self) -> Optional[Record]:
        ready = [r for r in self.records() if "ready" in r]
        return ready[0] if ready else None

    def output(self) -> str:
        with open(self.out_path) as f:
            return f.read()[-3000:]


class Soak:
    def __init__(self, seconds: float, seed: int, workdir: str) -> None:
        self.seconds, self.rng, self.workdir = seconds, random.Random(seed), workdir
        self.children: List[Child] = []
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
        self.failures: List[str] = []
        self.log: List[str] = []  # what happened when, for the report
        self.t0 = time.monotonic()

    # -- processes
    def seed(self) -> int:
        return self.rng.getrandbits(32)

    def start_publisher(self, topic: str) -> Child:
        return Child(self, "publisher", topic, topic=topic, seed=self.seed(), stop=self.stop_writers)

    def start_subscriber(self, topic: str, conflate: bool = False) -> Child:
        return Child(self, "subscriber", topic, topic=topic, conflate=conflate, stop=self.stop_readers)

    def start_server(self) -> Child:
        return Child(self, "server", "vipc", seed=self.seed(), stop=self.stop_writers)

    def start_client(self, conflate: bool = False, hold_s: float = 0.0) -> Child:
        return Child(self, "client", "vipc", conflate=conflate, hold_s=hold_s, stop=self.stop_readers)

    def live(self, role: str, group: Optional[str] = None) -> List[Child]:
        return [
            c
            for c in self.children
            if c.role == role and (group is None or c.group == group) and not c.killed and c.proc.poll() is None
        ]

    def kill(self, child: Child) -> None:
        child.killed = True
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)

    # -- faults
    def fault(self, kind: str, now: float, events: List[Event]) -> bool:
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

    def run(self) -> Dict[str, Any]:
        fds_before = open_fds()
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
        events: List[Event] = []  # (time, action, arg)
        kinds = list(self.faults)
        order: List[str] = []
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
        leaked = sorted(open_fds() - fds_before)
        if leaked:
            self.failures.append(f"the orchestrator leaked file descriptors {leaked}")
        return self.verdict()

    def check_unexpected_deaths(self) -> None:
        for c in self.children:
            if not c.killed and not getattr(c, "reported_death", False) and c.proc.poll() is not None:
                c.reported_death = True
                self.failures.append(f"{c.name} died on its own (exit {c.proc.returncode}):\n{c.output()}")

    def stop_group(self, role_names: Sequence[str], flag: str) -> None:
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

    def shutdown(self) -> None:
        from msgq.names import run_segment_prefix, segment_dir
        from msgq.tooling import segment_stats

        for c in self.children:
            if c.stopped and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGCONT)
        self.stop_group(("subscriber", "client"), self.stop_readers)
        # Readers are gone: no reader slot may still belong to a live process.
        for name in os.listdir(segment_dir()):
            if name.startswith(run_segment_prefix(self.prefix)):
                try:
                    stats = segment_stats(segment_dir(), name)
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

    def leftover_segments(self) -> List[str]:
        from msgq.names import run_segment_prefix, segment_dir

        return sorted(n for n in os.listdir(segment_dir()) if n.startswith(run_segment_prefix(self.prefix)))

    def verdict(self) -> Dict[str, Any]:
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=(sys.modules[__package__].__doc__ or "").split("\n\n")[0],
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
