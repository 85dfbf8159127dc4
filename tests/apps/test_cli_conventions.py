"""Every command behaves as the field's tools do (issue 34, item 4; msgq.cli): shell
completion generated from its parser, ``--log-level`` over stdlib logging in one
format, ``--config FILE`` (TOML, the same options) on the long-running tools, a
progress bar only when stderr is a terminal, and bad config files in one line."""

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from camera_helpers import CAMERA, RECORD, REPLAY, finish, reap, start
from repo import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
LONG_RUNNING = ["msgq-top", "msgq-bridge", "vipc-record", "vipc-replay", "vipc-view", "vipc-foxglove", "vipc-analyze"]


@pytest.fixture(autouse=True)
def _reap():
    yield
    reap()


def tool(name, *args, timeout=120, **kw):
    path = os.path.join(os.path.dirname(sys.executable), name)
    return subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_tool_prints_a_bash_completion_script_made_from_its_parser(name):
    out = tool(name, "--print-completion", "bash")
    assert out.returncode == 0, out.stderr
    script = out.stdout
    assert "--log-level" in script and "--version" in script and "complete" in script
    if name in LONG_RUNNING or name == "vipc-camera":
        assert "--config" in script
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    zsh = tool(name, "--print-completion", "zsh")
    assert zsh.returncode == 0 and "#compdef" in zsh.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_tool_has_the_log_level_option(name):
    out = tool(name, "--help")
    assert out.returncode == 0 and "--log-level" in out.stdout
    bad = tool(name, "--log-level", "chatty")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr


def test_log_level_warning_hides_the_information_lines_and_keeps_the_format(tmp_path):
    name = f"cli{os.getpid()}"
    args = ["--name", name, "--stream", "road", "--width", "96", "--height", "48", "--fps", "200", "--frames", "3"]
    default = finish(start(CAMERA, *args))
    quiet = finish(start(CAMERA, *args, "--log-level", "warning"))
    assert default[0] == 0 and quiet[0] == 0, (default, quiet)
    info = [line for line in default[2].splitlines() if line]
    assert info and all(line.startswith("vipc-camera: ") for line in info), default[2]
    assert any("frames published" in line for line in info)
    assert quiet[2].strip() == "", quiet[2]


def test_a_config_file_gives_the_same_options_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "top.toml"
    cfg.write_text('check = true\ninterval = 0\nlog-level = "warning"\n')
    out = tool("msgq-top", "--config", cfg, "--dir", tmp_path)
    assert out.returncode in (0, 1), out.stderr
    assert "no problems" in out.stdout  # --check came from the file: a report, not the live view
    bad = tmp_path / "bad.toml"
    bad.write_text("interval = -1\ncheck = true\n")
    assert "--interval must be >= 0" in tool("msgq-top", "--config", bad).stderr
    fixed = tool("msgq-top", "--config", bad, "--interval", "0", "--dir", tmp_path)  # the command line wins
    assert fixed.returncode in (0, 1) and "no problems" in fixed.stdout, fixed.stderr


def test_a_config_file_reaches_a_subcommand_and_its_own_table(tmp_path):
    cfg = tmp_path / "bridge.toml"
    cfg.write_text('log-level = "debug"\n[in]\nhwm = 0\nfrom = "localhost"\n[out]\nhwm = 5\n')
    out = tool("msgq-bridge", "--config", cfg, "in", "carState")
    assert out.returncode == 2 and "--hwm must be at least 1" in out.stderr  # [in]'s hwm reached `in`


@pytest.mark.parametrize(
    "text, says",
    [
        ("intervall = 1\n", "unknown option 'intervall' (did you mean 'interval'?)"),
        ("check = 'yes'\n", "check is a switch: true or false"),
        ("interval = [1, 2]\n", "interval takes one value"),
        ("check = \n", "is not valid TOML"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path, text, says):
    cfg = tmp_path / "top.toml"
    cfg.write_text(text)
    out = tool("msgq-top", "--config", cfg)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    missing = tool("vipc-record", "--config", tmp_path / "none.toml")
    assert missing.returncode == 2 and "cannot read --config" in missing.stderr and missing.stderr.count("\n") == 1


def _run_on_a_terminal(argv, timeout=60):
    """``argv`` with stderr on a pseudo-terminal: (exit status, what it wrote there)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # 100 columns for the bar
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the terminal's other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def test_record_and_replay_show_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path):
    name = f"prog{os.getpid()}"
    camera = start(
        CAMERA, "--name", name, "--stream", "road", "--width", "96", "--height", "48", "--fps", "30", "--frames", "0"
    )
    common = ["--name", name, "--stream", "road", "--frames", "40", "--connect-timeout", "20"]
    code, shown = _run_on_a_terminal(
        [sys.executable, "-P", "-m", RECORD, *common, "--out", str(tmp_path / "tty")], timeout=90
    )
    assert code == 0, shown
    assert "recording:" in shown and "/40 [" in shown and "frame/s" in shown, shown  # tqdm's bar
    piped = finish(start(RECORD, *common, "--out", tmp_path / "pipe"), timeout=90)
    camera.terminate()
    assert piped[0] == 0, piped
    assert "\r" not in piped[2] and "frame/s" not in piped[2] and "40/40" not in piped[2], piped[2]
    assert piped[2].startswith("vipc-record: road: 40 frames"), piped[2]
    replayed = [sys.executable, "-P", "-m", REPLAY, str(tmp_path / "tty"), "--name", f"{name}r", "--rate", "4"]
    code, shown = _run_on_a_terminal(replayed, timeout=90)
    assert code == 0 and "replaying (pass 1):" in shown and "msg/s" in shown, shown
    piped = finish(start(REPLAY, tmp_path / "tty", "--name", f"{name}p", "--rate", "4"), timeout=90)
    assert piped[0] == 0 and "replaying" not in piped[2] and "40 frames of road published" in piped[2], piped


def test_the_docs_config_file_records_as_it_says(tmp_path):
    text = (ROOT / "docs" / "tools.md").read_text()
    block = text.split("# record.toml: vipc-record --config record.toml --out rec7\n", 1)[1].split("```", 1)[0]
    cfg = tmp_path / "record.toml"
    cfg.write_text("\n".join(line.strip() for line in block.splitlines()) + "\n")
    assert tomllib.loads(cfg.read_text())["segment-seconds"] == 30
    camera = start(
        CAMERA,
        "--name",
        "camd",
        "--stream",
        "road",
        "--stream",
        "wide",
        "--width",
        "96",
        "--height",
        "48",
        "--fps",
        "30",
    )
    code, _, err = finish(start(RECORD, "--config", cfg, "--out", tmp_path / "rec7", "--frames", "10"), timeout=90)
    camera.terminate()
    assert code == 0 and err == "", err  # log-level = "warning": no summary lines
    manifest = json.loads((tmp_path / "rec7" / "recording.json").read_text())
    assert sorted(manifest["streams"]) == ["road", "wide"]
    assert all(s["frames"] == 10 and s["codec"] == "ffv1" for s in manifest["streams"].values()), manifest


def test_man_pages_are_made_from_every_tools_parser(tmp_path):
    make = [sys.executable, str(ROOT / "tools" / "make_man.py"), str(tmp_path)]
    out = subprocess.run(make, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    pages = sorted(p.name for p in (tmp_path / "man1").iterdir())
    assert pages == [f"{name}.1" for name in SCRIPTS]
    for name in SCRIPTS:
        page = (tmp_path / "man1" / f"{name}.1").read_text()
        assert page.startswith(f'.TH {name.upper().replace("-", chr(92) + "-")} "1"'), page[:80]
        assert ".SH SYNOPSIS" in page and ".SH OPTIONS" in page and "log\\-level" in page


def test_an_option_that_starts_like_config_is_not_taken_for_it(tmp_path):
    import argparse

    from msgq import cli

    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--conf", action="append", default=[])
    cfg = tmp_path / "demo.toml"
    cfg.write_text('conf = ["a=1"]\n')
    args = cli.parse_args(parser, ["--conf", "spark.executor.memory=64g", "--config", str(cfg)], config=True)
    assert args.conf == ["a=1", "spark.executor.memory=64g"]  # vipc-analyze --conf KEY=VALUE
