#!/usr/bin/env python3
"""Ordered topics with 1..4 producers: ``visionipc.bench.suites.ordered`` (``--help`` for the options)."""

import sys

from visionipc.bench.suites.ordered import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
