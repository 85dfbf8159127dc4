"""The mutation campaign (files_campaign.py) in CI: a fixed seed and a time budget; every
mutant of a good MCAP segment, Matroska segment or ROS 2 bag ends in success or in one
line on stderr (what FFmpeg and OpenCV print from C included) and exit status 2 (no
traceback) within MUTANT_TIMEOUT_S, and the whole campaign
stays under PEAK_LIMIT_KIB of resident memory. On main 2d8d5c3 mutants of MCAP segments
and bags ended in tracebacks (exit 1), and a lossy MCAP replay could hang."""

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CAMPAIGN = Path(__file__).resolve().parent / "files_campaign.py"
SEED, BUDGET_S = 31, 25
MUTANT_TIMEOUT_S = 20  # one replay of a 4-frame 32x24 recording takes ~20 ms
PEAK_LIMIT_KIB = 1 << 20  # 1 GiB: the imports alone are ~250 MiB


def stacks(child: subprocess.Popen, errors: Path) -> str:
    """What the stuck campaign is doing: every thread's Python stack (faulthandler, on
    SIGUSR1) and, where gdb is installed, every thread's native stack."""
    child.send_signal(signal.SIGUSR1)
    time.sleep(1)
    native = ""
    if shutil.which("gdb"):
        bt = ["gdb", "-p", str(child.pid), "-batch", "-ex", "thread apply all bt"]
        native = subprocess.run(bt, capture_output=True, text=True, timeout=60).stdout
    return errors.read_text(errors="replace")[-6000:] + "\n" + native[-6000:]


def test_mutants_of_every_format_end_in_success_or_one_line_within_the_time_limit(tmp_path):
    # The campaign's own stderr goes to a file: a pipe nobody reads until the end fills at
    # 64 KiB and stops the campaign in its next write (the stall CI saw after START 1191).
    errors = tmp_path / "campaign-stderr.txt"
    with open(errors, "wb") as sink:
        child = subprocess.Popen(
            [sys.executable, str(CAMPAIGN), str(tmp_path), str(SEED), str(BUDGET_S)],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
    lines, got_line = [], threading.Event()

    def read():
        for line in child.stdout:
            lines.append(line.rstrip("\n"))
            got_line.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    last, limit = time.monotonic(), 60  # the base recordings are written first
    while reader.is_alive():
        reader.join(0.2)
        if got_line.is_set():
            got_line.clear()
            last, limit = time.monotonic(), MUTANT_TIMEOUT_S
        elif time.monotonic() - last > limit:
            seen = stacks(child, errors)
            child.kill()
            child.wait()
            raise AssertionError(f"a mutant took over {limit} s: {lines[-1:] or 'setup'}\n{seen}")
    reader.join()
    err = errors.read_text(errors="replace")
    assert child.wait() == 0, f"{lines[-2:]} {err[-3000:]}"
    bad = [line for line in lines if line.startswith("BAD")]
    started = [line for line in lines if line.startswith("START")]
    assert not bad, (len(bad), bad[:5], [s for s in started if s.split()[1] in {b.split()[1] for b in bad}][:5])
    peak = int(lines[-1].split()[1])
    assert len(started) >= 100 and peak < PEAK_LIMIT_KIB, (len(started), peak)
