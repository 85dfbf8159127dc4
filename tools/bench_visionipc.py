#!/usr/bin/env python3
"""VisionIPC frame-rate benchmark, the same as ``vipc-bench``: ``visionipc.bench`` (``--help`` for the options)."""

import sys

from visionipc.bench import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
