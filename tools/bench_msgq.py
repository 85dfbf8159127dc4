#!/usr/bin/env python3
"""msgq vs pyzmq ipc:// benchmark: ``visionipc.bench.suites.msgq_vs_zmq`` (``--help`` for the options)."""

import sys

from visionipc.bench.suites.msgq_vs_zmq import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
