"""``vipc-bench``: VisionIPC frame-rate benchmark against its peers, in one run."""

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from msgq import add_version_flag
from msgq.cli import parse_args
from msgq.tooling import scoped_env
from visionipc.bench import reference, transports
from visionipc.bench.harness import add_common_flags, logger, placement, write_json
from visionipc.bench.report import render, summarize
from visionipc.bench.runner import Config, Runner
from visionipc.bench.tasks import worker_setup, worker_teardown
from visionipc.bench.workers import WorkerPool, read_loadavg

FULL: Dict[str, Any] = dict(
    sizes="64x64,640x480,1920x1080,3840x2160,7680x4320",
    clients="1,2,4,8",
    paced_count=60,
    flat_seconds=1.0,
    modes=["paced", "warm", "flat"],
)
QUICK: Dict[str, Any] = dict(
    sizes="64x64,3840x2160,7680x4320", clients="1,8", paced_count=8, flat_seconds=0.15, modes=["paced", "flat"]
)

DESCRIPTION = """\
VisionIPC frame-rate benchmark: visionipc against the reference commaai/msgq (when
VIPC_REFERENCE_MSGQ names a build of it: docs/reference.md), pyzmq,
multiprocessing.shared_memory + a pipe, a bare futex wake-up and iceoryx2 (when
installed), side by side in one run,
for every chosen frame size x client count x transport. NV12 frames; one producer
process (pinned to the first CPU) and N client processes (on the other CPUs).

paced     the producer sends --fps frames/s and sleeps between frames (as a camera
          daemon does), the clients sleep too: handoff latency percentiles,
          send -> the client holds a numpy view of the frame (futex: -> the client
          is awake; the floor any sleeping receiver pays)
warm      paced, but the producer spins the last 2 ms before each frame: it sends warm
flat      the producer sends as fast as it can for --seconds: intact frames/s each
          client gets (visionipc clients conflate: they want the newest frame)
both      server and client CPU time per frame (µs, every thread of the process)

It prints a table with each peer's ratio to visionipc and the issue-4 targets
(MET / NOT MET / n/a when the run lacks the cells), and writes a PNG plot
(matplotlib: pip install 'visionipc[bench]'). Speed depends on the machine and
its load: compare ratios from one run, and run it on a quiet machine."""

EPILOG = """\
examples:
  vipc-bench --quick                                  # < 1 minute, every transport
  vipc-bench                                          # the full matrix, about 8 minutes
  vipc-bench --sizes 1920x1080 --clients 1,2 --transports visionipc,pyzmq --modes flat
  vipc-bench --json out/bench.json --plot out/bench.png
exit status: 0 done, 1 --check and a target NOT MET, 2 a measurement failed or left shared memory behind"""


def _sizes(text):
    out = []
    for part in text.split(","):
        try:
            w, h = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"frame size {part!r} is not WIDTHxHEIGHT") from None
        if w < 2 or h < 2 or w % 2 or h % 2 or w * h > 7680 * 4320 * 4:
            raise argparse.ArgumentTypeError(f"frame size {part!r}: even width and height >= 2, at most 4x 8K")
        out.append((w, h))
    return out


def _ints(text):
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints") from None
    if any(n < 1 or n > 32 for n in out):
        raise argparse.ArgumentTypeError("client counts are 1..32")
    return out


def _names(choices):
    def parse(text):
        out = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in out if x not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (got {text!r})")
        return out

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="vipc-bench", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_version_flag(ap)
    add_common_flags(
        ap, quick="short run (< 1 minute): sizes 64x64,3840x2160,7680x4320, clients 1,8, few frames per cell"
    )
    ap.add_argument("--sizes", type=_sizes, help=f"NV12 frame sizes, WxH,... (default {FULL['sizes']})")
    ap.add_argument("--clients", type=_ints, help=f"client counts (default {FULL['clients']})")
    ap.add_argument(
        "--transports",
        type=_names(list(transports.TRANSPORTS)),
        help="comma-separated, from "
        + ", ".join(transports.TRANSPORTS)
        + " (default: all installed but "
        + ", ".join(transports.ON_REQUEST)
        + ")",
    )
    ap.add_argument(
        "--modes",
        type=_names(["paced", "warm", "flat"]),
        help="paced,warm,flat (default all three, --quick paced,flat)",
    )
    add_common_flags(ap, rounds=(1, "repeat the whole matrix, transports rotating (default 1)"))
    ap.add_argument("--fps", type=float, default=30.0, help="paced frame rate (default 30)")
    ap.add_argument("--frames", type=int, help="measured frames per paced cell (default 60, --quick 8)")
    ap.add_argument("--seconds", type=float, help="duration of each flat-out cell (default 1.0, --quick 0.15)")
    ap.add_argument("--fill", action="store_true", help="flat out: write every byte of every frame, not only a stamp")
    ap.add_argument(
        "--plot", metavar="PNG", default="vipc-bench.png", help="PNG plot path (default vipc-bench.png; '' for none)"
    )
    add_common_flags(
        ap,
        json="write the summary and every raw sample as JSON",
        no_pin="do not pin the processes to CPUs",
        check="exit 1 when a target is NOT MET",
        quiet="no progress lines on stderr",
    )
    return ap


def make_config(
    args: argparse.Namespace, ap: argparse.ArgumentParser
) -> Tuple[Config, List[Tuple[str, Optional[str]]]]:
    base = QUICK if args.quick else FULL
    names = args.transports or [n for n in transports.TRANSPORTS if n not in transports.ON_REQUEST]
    skipped = [(n, transports.unavailable(n)) for n in names if transports.unavailable(n)]
    if args.transports and skipped:
        ap.error("; ".join(f"{n}: {why}" for n, why in skipped))
    if (
        args.rounds < 1
        or args.fps <= 0
        or (args.frames is not None and args.frames < 1)
        or (args.seconds is not None and args.seconds <= 0)
    ):
        ap.error("--rounds, --fps, --frames and --seconds must be positive")
    cfg = Config(
        sizes=args.sizes or _sizes(base["sizes"]),
        clients=args.clients or _ints(base["clients"]),
        transports=[n for n in names if not transports.unavailable(n)],
        modes=args.modes or base["modes"],
        rounds=args.rounds,
        paced_fps=args.fps,
        paced_count=args.frames or base["paced_count"],
        paced_warmup=2 if args.quick else 5,
        flat_seconds=args.seconds or base["flat_seconds"],
        fill=args.fill,
    )
    return cfg, skipped


def _own_files(run: str) -> List[str]:
    try:
        return sorted(os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm") if n.startswith(f"vipcb{run}_"))
    except FileNotFoundError:
        return []


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = build_parser()
    args = parse_args(ap, argv)
    cfg, skipped = make_config(args, ap)
    log = logger(args.quiet)
    from msgq.testing import isolated_prefix, segments, unique_name

    run = unique_name("")
    cpus, pinned = placement(1 + max(cfg.clients), args.no_pin)
    meta: Dict[str, Any] = {
        "argv": sys.argv if argv is None else ["vipc-bench", *argv],
        "run": run,  # its files' names: MSGQ_PREFIX vipcbench<run>, /dev/shm/vipcb<run>_*
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "reference": reference.describe() if "reference" in cfg.transports else None,
        "platform": platform.platform(),
        "cpus": cpus,
        "pinned": pinned,
        "loadavg_start": read_loadavg(),
        "config": vars(cfg) | {"sizes": [list(s) for s in cfg.sizes]},
    }
    started = time.monotonic()
    pool = runner = None
    leftovers = []
    with (
        tempfile.TemporaryDirectory(prefix="vipc-bench-") as ipc_dir,
        isolated_prefix(f"vipcbench{run}", check_leaks=False) as prefix,
        scoped_env(VIPC_BENCH_RUN=run, VIPC_BENCH_IPC_DIR=ipc_dir, MSGQ_BACKEND="msgq"),
    ):
        try:
            log(
                f"vipc-bench: {', '.join(cfg.transports)}; MSGQ_PREFIX={prefix}; "
                f"producer on CPU {pinned[0]}, clients on "
                f"{sorted(set(pinned[1:]), key=str)}; load {meta['loadavg_start']}"
            )
            pool = WorkerPool(pinned, setup=worker_setup, teardown=worker_teardown)
            runner = Runner(pool, cfg, log)
            runner.run()
        except KeyboardInterrupt:
            log("interrupted")
            return 130
        finally:
            if pool is not None:
                pool.close()
            transports.after_run(cfg.transports, run)
            leftovers = [os.path.join("/dev/shm", n) for n in segments(prefix)] + _own_files(run)
            for path in leftovers:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    summary = summarize(runner.results)
    meta.update(elapsed_s=time.monotonic() - started, loadavg_end=read_loadavg(), leftovers=leftovers)
    print(
        f"vipc-bench: {meta['elapsed_s']:.0f} s, {cfg.rounds} round(s); load {meta['loadavg_start']} -> "
        f"{meta['loadavg_end']}; producer on CPU {pinned[0]}, clients on {sorted(set(pinned[1:]), key=str)}"
    )
    if meta["reference"]:
        print(f"reference: commaai/msgq {meta['reference']} ({reference.root()})")
    print(render(summary, skipped))
    print(f"/dev/shm after the run: {'clean' if not leftovers else 'LEFTOVERS (removed): ' + ', '.join(leftovers)}")
    for e in runner.errors:
        print(
            f"FAILED: {e['mode']} {e['transport']} {e['frame']} x{e['clients']}: {e['error'].strip().splitlines()[-1]}"
        )
    if args.json:
        write_json(
            args.json,
            {
                "meta": meta,
                "summary": summary,
                "skipped": dict(skipped),
                "results": runner.results,
                "errors": runner.errors,
            },
        )
        log(f"results: {args.json}")
    if args.plot:
        try:
            from visionipc.bench.plot import write_png

            write_png(summary, args.plot, f"vipc-bench, {platform.node()}, {meta['time']}")
            print(f"plot: {args.plot}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install 'visionipc[bench]')", file=sys.stderr)
            return 2
    if runner.errors or leftovers:
        return 2
    if args.check and any(t["verdict"] == "NOT MET" for t in summary["targets"]):
        return 1
    return 0
