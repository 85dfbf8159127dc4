#!/usr/bin/env python3
"""Fault-injection soak across msgq and VisionIPC processes (the code:
visionipc/apps/soak/). ``python tools/soak.py --seconds 300`` is the full
soak; tests/system/test_soak.py runs a short one."""

import sys

from visionipc.apps.soak import main

if __name__ == "__main__":
    sys.exit(main())
