"""The demo: a synthetic camera, an OpenCV consumer and vipc-view, on this machine.

    bash tools/demo.sh                  # set-up, then this; open the printed URL (it has the
                                        # per-run token: only you can watch), Ctrl-C stops
    python tools/demo.py --seconds 20   # a bounded run

Starts three processes under one run prefix (MSGQ_PREFIX; a fresh one unless set):
  camera    vipc-camera --source synthetic (a moving test pattern, frame id burned in)
  consumer  examples/opencv_consumer.py: Canny edges + motion on every frame, zero-copy
  view      vipc-view: the live stream with fps / latency / drops, in the browser
  foxglove  vipc-foxglove: the same stream for Foxglove / Lichtblick (ws://127.0.0.1:8765/?token=...)
Their output is shown with a [name] prefix. Ctrl-C (or SIGTERM, or --seconds) stops
the viewers first and the camera last, waits for each, and checks that no process
and no shared-memory segment of the run is left. Exit status 0 only if all of that holds.
"""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
SERVER, STREAM = "demo", "road"
STOP_TIMEOUT_S = 10


def _die_with_parent():
    """In the child, before exec: get SIGTERM if the demo itself dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    def __init__(self, label, argv, on_line=None):
        self.label = label
        # Own session: a Ctrl-C in the terminal reaches only the demo, which stops the
        # children in order (viewers before the camera).
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.on_line = on_line
        print(
            f"demo: started {label} (pid {self.proc.pid}): {' '.join(os.path.basename(a) for a in argv[:2])} ...",
            flush=True,
        )
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self):
        for line in self.proc.stdout:
            print(f"[{self.label}] {line}", end="", flush=True)
            if self.on_line:
                self.on_line(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"demo: {self.label} did not stop within {STOP_TIMEOUT_S} s; killing it", flush=True)
            self.proc.kill()
            code = self.proc.wait()
        self.pump.join(2)
        return code


def _parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=0, help="stop after this long (default: until Ctrl-C)")
    p.add_argument("--port", type=int, default=8080, help="vipc-view's port on 127.0.0.1 (default 8080; 0: any free)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=float, default=30)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from msgq.names import current_prefix
    from msgq.testing import unique_name, wait_until_gone

    if not os.environ.get("MSGQ_PREFIX") and not os.environ.get("OPENPILOT_PREFIX"):
        os.environ["MSGQ_PREFIX"] = unique_name("demo")
    prefix = current_prefix()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def view_line(line):
        if "serving http://" in line:
            url = line.split("serving ", 1)[1].split()[0]
            print(
                f"\ndemo: open {url} in a browser (camera {args.width}x{args.height} @ {args.fps:g} fps); "
                f"Ctrl-C stops everything\n",
                flush=True,
            )

    def foxglove_line(line):
        if "serving " in line and "ws://" in line:
            url = line.split(" on ", 1)[1].split()[0]
            print(f"\ndemo: Foxglove / Lichtblick: open connection -> Foxglove WebSocket -> {url}\n", flush=True)

    size = ["--width", str(args.width), "--height", str(args.height), "--fps", f"{args.fps:g}"]
    children = [
        Child(
            "camera",
            [os.path.join(BIN, "vipc-camera"), "--name", SERVER, "--stream", STREAM, "--source", "synthetic", *size],
        )
    ]
    children.append(
        Child(
            "consumer",
            [
                sys.executable,
                os.path.join(ROOT, "examples", "opencv_consumer.py"),
                "--name",
                SERVER,
                "--stream",
                STREAM,
            ],
        )
    )
    children.append(
        Child(
            "view",
            [os.path.join(BIN, "vipc-view"), "--name", SERVER, "--http", f"127.0.0.1:{args.port}"],
            on_line=view_line,
        )
    )
    children.append(
        Child(
            "foxglove",
            [os.path.join(BIN, "vipc-foxglove"), "--name", SERVER, "--port", "0" if args.port == 0 else "8765"],
            on_line=foxglove_line,
        )
    )

    deadline = time.monotonic() + args.seconds if args.seconds else None
    failed = None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        failed = next((c for c in children if c.proc.poll() is not None), None)
        if failed:
            print(f"demo: {failed.label} exited early (status {failed.proc.returncode}); stopping the rest", flush=True)
            break
        stop.wait(0.2)

    print("demo: stopping", flush=True)
    codes = {c.label: c.stop() for c in reversed(children)}  # viewers first, the camera last
    left = wait_until_gone(prefix, timeout=5.0)
    alive = [c.label for c in children if _alive(c.proc.pid)]
    ok = failed is None and not any(codes.values()) and not left and not alive
    print(
        f"demo: exit status {codes}; shared memory left: {left or 'none'}; processes left: {alive or 'none'}",
        flush=True,
    )
    print("demo: stopped cleanly" if ok else "demo: did NOT stop cleanly", flush=True)
    return 0 if ok else 1


def _alive(pid) -> bool:
    return os.path.exists(f"/proc/{pid}")


if __name__ == "__main__":
    sys.exit(main())
