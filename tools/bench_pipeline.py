#!/usr/bin/env python3
"""The Spark pipeline (vipc-analyze) vs pandas and a process pool:
``visionipc.bench.suites.pipeline`` (``--help`` for the options)."""

import sys

from visionipc.bench.suites.pipeline import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
