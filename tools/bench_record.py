#!/usr/bin/env python3
"""Camera + recorder throughput, lossless vs lossy: ``visionipc.bench.suites.record`` (``--help`` for the options)."""

import sys

from visionipc.bench.suites.record import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
