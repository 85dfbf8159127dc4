#!/usr/bin/env python3
"""msgq's zmq backend vs raw pyzmq over tcp://127.0.0.1:
``visionipc.bench.suites.zmq_backend`` (``--help`` for the options)."""

import sys

from visionipc.bench.suites.zmq_backend import main

if __name__ == "__main__":  # the benchmark's workers are spawned: they must not re-run this
    sys.exit(main())
