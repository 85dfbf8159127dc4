"""One door for untrusted files (issue 31, item 4): every file of the committed corpus of
hostile MCAP segments, Matroska segments and ROS 2 bags (tests/hostile/corpus/, written by
make_corpus.py) is refused by vipc-replay with one line naming the file by its path (never
a /proc/self/fd descriptor) and the place in it, exit status 2; and vipc-analyze, whose
Spark tasks decode the segments, says the same reason, exit status 2. On main 2d8d5c3 they
ended in 23-31 line tracebacks (exit 1), "An exception was thrown from the Python worker:"
without the reason, or a 1 GB buffer pool for a 1.7 KB bag."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import spark  # noqa: F401

from msgq.testing import unique_name
from visionipc.apps.pipeline.cli import main as analyze_main
from visionipc.apps.record.replay import main as replay_main

CORPUS = Path(__file__).resolve().parent / "corpus"
sys.path.insert(0, str(CORPUS))
from make_corpus import BASES, base_recording, segment_path  # noqa: E402

FILES = sorted(p.name for p in CORPUS.glob("*--*"))


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {base: base_recording(root / base, base) for base in BASES}


def hostile_input(name: str, bases: dict, folder: Path) -> tuple:
    """(what to replay, the file the error must name) for the corpus file ``name``."""
    base = name.partition("--")[0]
    if base == "bag":
        return str(CORPUS / name), str(CORPUS / name)
    recording = shutil.copytree(bases[base], folder / "rec")
    segment = segment_path(recording, base)
    shutil.copyfile(CORPUS / name, segment)
    return str(recording), segment


def test_the_corpus_covers_every_format():
    kinds = {name.partition("--")[0] for name in FILES}
    assert kinds == set(BASES) | {"bag"} and len(FILES) >= 30, FILES


@pytest.mark.parametrize("name", FILES)
def test_vipc_replay_refuses_each_hostile_file_with_one_line_naming_it(name, bases, tmp_path, capsys):
    target, named = hostile_input(name, bases, tmp_path)
    rc = replay_main([target, "--name", unique_name("hostile"), "--rate", "max", "-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = one_line_error(err)
    assert named in line and "/proc/self/fd" not in line, line
    assert "\x1b" not in line and "\x07" not in line, line


@pytest.mark.parametrize("name", ["bag--too-wide-32768.mcap", "bag--png-bomb-header.mcap"])
def test_a_tiny_bag_describing_huge_frames_is_refused_before_any_memory_is_taken(name, tmp_path):
    """A 1.7 KB bag made vipc-replay reserve 1.09 GB before: sizes are checked first now."""
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent
    # across fork and exec (a pytest process of 430 MiB made every child "peak" there).
    code = (
        "import sys\n"
        "from visionipc.apps.record.replay import main\n"
        "rc = main([sys.argv[1], '--name', sys.argv[2], '--rate', 'max', '-q'])\n"
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(rc, hwm)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(CORPUS / name), unique_name("bomb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    rc, peak_kib = map(int, run.stdout.split())
    assert rc == 2 and "1..16384" in one_line_error(run.stderr), run.stderr
    assert peak_kib < 400 << 10, f"{peak_kib >> 10} MiB"  # imports (numpy, pyarrow, PyAV, OpenCV): ~250 MiB


def test_vipc_analyze_passes_the_task_s_reason_on_to_the_driver(bases, tmp_path, capsys, spark):  # noqa: F811
    """A Spark task decoding a truncated MCAP segment: the reason, not "An exception was
    thrown from the Python worker:", and exit status 2 (bad input, as on the driver)."""
    target, named = hostile_input("mcap-raw--truncated.mcap", bases, tmp_path)
    rc = analyze_main([target, "--out", str(tmp_path / "out"), "--jobs", "metrics", "-q"])
    line = one_line_error(capsys.readouterr().err)
    assert rc == 2 and named in line and "Python worker" not in line, line
