"""The fault-injection soak (tools/soak.py, code in visionipc/apps/soak/), short: ~45 s of SIGKILLs,
SIGSTOPs and restarts across msgq and VisionIPC processes, then every check
of the full soak (integrity, order, losses only with counted resets, no hang,
no crash, no leaked segment or fd, reader and lease slots reclaimed,
restarted publishers picked up)."""

import json
import subprocess
import sys

import pytest
from repo import TOOLS

SOAK = TOOLS / "soak.py"
SECONDS = 45


@pytest.mark.timeout(SECONDS + 240)
def test_soak_under_faults_loses_nothing_unaccounted_and_leaks_nothing(tmp_path):
    report = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-P", str(SOAK), "--seconds", str(SECONDS), "--json", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=SECONDS + 200,
    )
    assert report.exists(), proc.stdout[-5000:]
    result = json.loads(report.read_text())
    assert proc.returncode == 0 and result["failures"] == [], proc.stdout[-8000:]
    totals = result["totals"]
    # The faults really happened, and traffic really flowed through them.
    assert all(count >= 1 for count in totals["faults"].values()), totals["faults"]
    assert totals["kills_survived"] >= 4 and totals["restarts"] >= 2, totals
    assert totals["messages"] > 1000 and totals["frames"] > 100, totals
    assert totals["resets"] >= 1, "a reader stopped longer than its ring lasts must have been reset"
    print(proc.stdout)
