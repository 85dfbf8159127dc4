#!/usr/bin/env python3
"""Lossless broadcast, msgq.BroadcastQueue vs a pure-Python seed ring vs mp.Queue:
``visionipc.bench.suites.broadcast`` (``--help`` for the options)."""

import os
import sys

# visionipc imports numpy in every process, readers included. OpenBLAS then starts a
# worker thread per core that spins for ~0.1 s of CPU after the import: in a run of well
# under a second on 2 cores that steals a random share of the measured window from
# whichever transport is running. Nothing here calls BLAS; one thread (no spinning
# helper) keeps the harness out of the numbers. Children inherit the setting.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from visionipc.bench.suites.broadcast import main  # noqa: E402

if __name__ == "__main__":  # the readers are spawned: they must not re-run this
    sys.exit(main())
