"""Mutation campaign over good files of every format (issue 31, item 4): byte flips, runs
of zeros and truncations of a lossless and a lossy MCAP segment, an H.264 and an FFV1
Matroska segment and a ROS 2 bag, each replayed by vipc-replay's ``main`` in this
process. Prints ``START i what`` before and ``DONE i rc`` / ``BAD i rc stderr`` after
each mutant, and ``PEAK_KIB n`` (peak resident memory) at the end; the caller
(test_files_mutation.py) kills it if a mutant takes too long.

    .venv/bin/python tests/hostile/files_campaign.py WORKDIR [SEED] [SECONDS]
"""

import contextlib
import faulthandler
import io
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
from make_corpus import BASES, base_recording, good_bag, segment_path  # noqa: E402

from msgq.testing import unique_name  # noqa: E402
from visionipc.apps.record.replay import main as replay_main  # noqa: E402


def mutate(data: bytes, rng: random.Random) -> tuple:
    b = bytearray(data)
    how = rng.choice(("flip", "flips", "zeros", "truncate"))
    if how == "flip":
        at = rng.randrange(len(b))
        b[at] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip bit at {at}"
    if how == "flips":
        spots = [rng.randrange(len(b)) for _ in range(rng.randint(2, 16))]
        for at in spots:
            b[at] = rng.randrange(256)
        return bytes(b), f"bytes at {spots}"
    if how == "zeros":
        at, n = rng.randrange(len(b)), rng.randint(1, 64)
        b[at : at + n] = bytes(len(b[at : at + n]))
        return bytes(b), f"{n} zeros at {at}"
    at = rng.randrange(len(b))
    return bytes(b[:at]), f"truncated at {at}"


@contextlib.contextmanager
def native_stderr(path: Path) -> Iterator[Path]:
    """File descriptor 2 into ``path`` while the block runs: what FFmpeg and OpenCV print
    from C counts towards the one line as much as Python's ``sys.stderr`` does."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield path
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(work: Path, seed: int, seconds: float) -> int:
    # SIGUSR1: every thread's Python stack on stderr (the caller asks when a mutant is slow)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rng = random.Random(seed)
    targets = {}
    for base in BASES:
        rec = base_recording(work / base, base)
        targets[base] = (rec, Path(segment_path(rec, base)))
    bag = work / "bag.mcap"
    bag.write_bytes(good_bag())
    targets["bag"] = (str(bag), bag)
    good = {name: path.read_bytes() for name, (_, path) in targets.items()}
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        name = rng.choice(sorted(targets))
        replayed, path = targets[name]
        data, how = mutate(good[name], rng)
        path.write_bytes(data)
        print(f"START {i} {name}: {how}", flush=True)
        with native_stderr(work / "stderr.txt") as native:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = replay_main([replayed, "--name", unique_name("mutant"), "--rate", "max", "-q"])
        said = native.read_text(errors="replace") + err.getvalue()
        lines = said.strip().splitlines()
        ok = (rc == 0 and not lines) or (rc == 2 and len(lines) == 1 and "/proc/self/fd" not in lines[0])
        print(f"{'DONE' if ok else 'BAD'} {i} rc={rc} {said[-2000:]!r}", flush=True)
        i += 1
    print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(Path(args[0]), int(args[1]) if len(args) > 1 else 31, float(args[2]) if len(args) > 2 else 25))
