#!/usr/bin/env python3
"""VisionIPC frame-rate benchmark: a thin wrapper around the installed ``vipc-bench``
(visionipc.bench.cli). ``python tools/bench_visionipc.py --help`` for the options."""

import os
import sys

# Run from the repository root, the source tree's visionipc (no compiled
# extension) would shadow the installed package: keep the root off sys.path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO]

from visionipc.bench import main  # noqa: E402

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
