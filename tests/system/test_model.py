"""Model-check the MSGQ ring protocol with spin (cpp/msgq/model/ring.pml), how its
readers sleep and are woken (cpp/msgq/model/wake.pml: both wake modes), the
wait point every queue sleeps on (cpp/common/model/wait_point.pml), and
VisionIPC's read leases with the producer's probe (cpp/visionipc/model/lease.pml).

The unmodified model must verify with a complete search of its state space
(errors: 0, no truncated depth, no memory bound hit). Each mutation, a
``-D`` switch in the same file that removes a validity check or undoes an
ordering a fence provides, must produce a counterexample that violates the
property it protects. cpp/msgq/model/README.md maps the model to ring.h.

A missing ``spin`` or ``gcc`` is a failure, not a skip: this is the only
exhaustive check of the protocol's interleavings.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from repo import ROOT

MODEL = ROOT / "cpp" / "msgq" / "model" / "ring.pml"
WAIT_POINT_MODEL = ROOT / "cpp" / "common" / "model" / "wait_point.pml"
WAKE_MODEL = ROOT / "cpp" / "msgq" / "model" / "wake.pml"
LEASE_MODEL = ROOT / "cpp" / "visionipc" / "model" / "lease.pml"
# Each undoes one step that keeps a held frame from being written (server.cc leased()).
LEASE_MUTATIONS = ["REPLY_BEFORE_BIT", "MASK_BEFORE_PROBE", "NO_RECHECK"]
# The msgq wake-up: both modes must verify (KILL: a reader may be killed after
# its wake-up, before it could hand it on, or not: HANDOFF,KILL covers HANDOFF).
# -DSPURIOUS (one early return from each FUTEX_WAIT) verifies too but takes
# minutes: the model README's longer runs.
WAKE_MODES = ["", "HANDOFF,KILL"]
# Each undoes one step of the handoff; each must leave a reader asleep.
WAKE_MUTATIONS = [
    "HANDOFF,NO_PASS_ON",
    "HANDOFF,FLAG_AFTER_WAKE",
    "HANDOFF,FLAG_BEFORE_BUMP",
    "HANDOFF,KILL,CLEAR_MASK",
]
# Each of these undoes one step of wait_point.h; each must leave a waiter
# asleep forever (spin: "invalid end state").
WAIT_POINT_MUTATIONS = ["NO_RECHECK", "LOAD_FIRST", "WAKE_ONE", "KEEP_OLD_WORD"]

# pan: safety properties only, exact state compression, bounded memory.
PAN_CFLAGS = ["-DSAFETY", "-DCOLLAPSE", "-DVECTORSZ=1024", "-DMEMLIM=2048"]
PAN_DEPTH = "-m100000"  # the full search of the model reaches depth ~720

# What a violated assertion looks like in pan's output (macros expanded).
DELIVERED_WRONG = ("(got==pseq)", "(pseq!=0)", "(pseq>last)")  # torn, foreign or out of order
OUT_OF_RING = ("+k)<8)",)  # the copy indexes past the ring (N = 8 words)

# mutation (-D switches) -> the assertions one of which its counterexample violates
MUTATIONS = {
    "NO_R5": DELIVERED_WRONG,
    "R5_BEFORE_R3": DELIVERED_WRONG,
    "NO_W1": DELIVERED_WRONG,
    "W2_BEFORE_W1": DELIVERED_WRONG,
    "W3_BEFORE_W2": DELIVERED_WRONG,
    "R1_BEFORE_R0": DELIVERED_WRONG,
    "NO_R2,NO_SIZE_CHECK": OUT_OF_RING,
    "R2_BEFORE_R1,NO_SIZE_CHECK": OUT_OF_RING,
    "CONFLATE,NO_R5": DELIVERED_WRONG,
}

# Checks this model finds no use for (README.md, "What the model shows"): ring.h's
# size bounds check plus R5 cover a missing R2, and at this scale a reset without
# its recheck is still safe. Pinned so that a change making either one necessary
# is noticed (and the README updated).
REDUNDANT = ["NO_R2", "NO_X3_RECHECK"]


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"`{tool}` is not installed; `bash tools/setup.sh` installs it (Debian package `{tool}`)")
    return path


def _check(tmp_path: Path, defines: str, exhaustive: bool = True, model: Path = MODEL) -> str:
    """Generate, compile and run the verifier; return pan's output.

    A counterexample is found within a few thousand states, so a mutation's
    verifier is compiled without optimisation (faster to build than to run)."""
    spin, gcc = _require("spin"), _require("gcc")
    flags = [f"-D{name}" for name in defines.split(",") if name]
    shutil.copy(model, tmp_path / model.name)
    gen = subprocess.run([spin, *flags, "-a", model.name], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0 and (tmp_path / "pan.c").exists(), f"spin -a failed:\n{gen.stdout}{gen.stderr}"
    opt = "-O1" if exhaustive else "-O0"
    cc = subprocess.run(
        [gcc, opt, *PAN_CFLAGS, "-o", "pan", "pan.c"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert cc.returncode == 0, f"compiling pan failed:\n{cc.stderr}"
    run = subprocess.run(["./pan", PAN_DEPTH], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return run.stdout + run.stderr


def _errors(out: str) -> int:
    match = re.search(r"errors: (\d+)", out)
    assert match, f"no result in pan's output:\n{out}"
    return int(match.group(1))


def _assert_complete_and_clean(out: str) -> None:
    assert _errors(out) == 0, f"the model has a counterexample:\n{out}"
    for truncated in ("search depth too small", "Search not completed", "reached -DMEMLIM bound"):
        assert truncated not in out, f"the search was not exhaustive ({truncated}):\n{out}"
    assert "Full statespace search" in out, out
    states = re.search(r"(\d+) states, stored", out)
    assert states and int(states.group(1)) > 100_000, f"suspiciously small state space:\n{out}"


@pytest.mark.parametrize("defines", ["", "CONFLATE"], ids=["two_readers", "one_reader_conflating"])
def test_ring_model_verifies_with_an_exhaustive_search(tmp_path, defines):
    _assert_complete_and_clean(_check(tmp_path, defines))


@pytest.mark.parametrize("defines", list(MUTATIONS))
def test_each_mutation_has_a_counterexample(tmp_path, defines):
    out = _check(tmp_path, defines, exhaustive=False)
    assert _errors(out) > 0, f"-D{defines} should break the protocol but spin found no counterexample:\n{out}"
    violated = re.search(r"assertion violated (.*)", out)
    assert violated, f"-D{defines}: the error is not an assertion:\n{out}"
    assert any(s in violated.group(1) for s in MUTATIONS[defines]), (
        f"-D{defines} violated an unexpected property: {violated.group(1)}"
    )
    assert (tmp_path / "ring.pml.trail").exists(), "pan left no counterexample trail"


@pytest.mark.parametrize("defines", REDUNDANT)
def test_redundant_checks_have_no_counterexample(tmp_path, defines):
    _assert_complete_and_clean(_check(tmp_path, defines))


@pytest.mark.parametrize("defines", ["", "RETRY"], ids=["notifier_gives_up_on_a_lost_race", "notifier_retries"])
def test_wait_point_model_loses_no_wake_up(tmp_path, defines):
    _assert_complete_and_clean(_check(tmp_path, defines, model=WAIT_POINT_MODEL))


@pytest.mark.parametrize("defines", WAKE_MODES, ids=["wake_all", "handoff_and_a_reader_killed_or_not"])
def test_msgq_wake_model_loses_no_wake_up(tmp_path, defines):
    _assert_complete_and_clean(_check(tmp_path, defines, model=WAKE_MODEL))


@pytest.mark.parametrize(
    "model,defines",
    [(WAIT_POINT_MODEL, d) for d in WAIT_POINT_MUTATIONS] + [(WAKE_MODEL, d) for d in WAKE_MUTATIONS],
    ids=lambda v: v.stem if isinstance(v, Path) else v,
)
def test_each_wake_up_mutation_leaves_a_sleeper_asleep(tmp_path, model, defines):
    out = _check(tmp_path, defines, exhaustive=False, model=model)
    assert _errors(out) > 0, f"-D{defines} should lose a wake-up but spin found no counterexample:\n{out}"
    assert "invalid end state" in out, f"-D{defines}: the error is not a sleeper left asleep:\n{out}"
    assert (tmp_path / f"{model.name}.trail").exists(), "pan left no counterexample trail"


def test_lease_model_never_writes_a_held_frame(tmp_path):
    """The producer reads only the admitted clients' lease slots (issue 36) and still
    never writes a frame a client holds."""
    _assert_complete_and_clean(_check(tmp_path, "", model=LEASE_MODEL))


@pytest.mark.parametrize("defines", LEASE_MUTATIONS)
def test_each_lease_mutation_lets_the_producer_write_a_held_frame(tmp_path, defines):
    out = _check(tmp_path, defines, exhaustive=False, model=LEASE_MODEL)
    assert _errors(out) > 0, f"-D{defines} should break the lease but spin found no counterexample:\n{out}"
    violated = re.search(r"assertion violated (.*)", out)
    assert violated and "meta[i]==g" in violated.group(1), f"-D{defines}: not a held frame written:\n{out}"
    assert (tmp_path / "lease.pml.trail").exists(), "pan left no counterexample trail"
