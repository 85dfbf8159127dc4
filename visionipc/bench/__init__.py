"""vipc-bench: the VisionIPC frame-rate benchmark (frames/s, handoff latency, CPU per
frame) against pyzmq, shared_memory + pipe, a bare futex wake-up and iceoryx2.

    transports/  one module per transport (a Producer and a Consumer each)
    workers.py   pinned spawn worker processes kept in step by barriers
    tasks.py     what a producer / consumer worker runs for one measurement
    runner.py    the matrix of sizes x client counts x transports, in rotating order
    report.py    tables, ratios, the issue-4 targets; plot.py the PNG; cli.py ``main``
"""

from visionipc.bench.cli import main

__all__ = ["main"]
