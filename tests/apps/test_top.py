"""msgq-top: the live topics of the machine, read from the segment headers."""

import io
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

import msgq
from msgq.apps import top
from msgq.names import segment_basename
from msgq.testing import unique_topic

PREFIX_BYTES = 8  # the ring's size prefix (cpp/msgq/README.md, "Data")


def ring_bytes(payload_len: int) -> int:
    return PREFIX_BYTES + (payload_len + 7) // 8 * 8


def run_json(capsys, *args) -> dict:
    assert top.main(["--json", "--interval", "0", *args]) == 0
    return json.loads(capsys.readouterr().out)


def topic_entry(report: dict, topic: str) -> dict:
    found = [t for t in report["topics"] if t["topic"] == topic]
    assert len(found) == 1, report
    return found[0]


class Traffic:
    """Publishes on a background thread until stopped (load for rate measurements)."""

    def __init__(self, pub, payload=b"x" * 100):
        self.pub, self.payload, self.sent = pub, payload, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            self.pub.send(self.payload)
            self.sent += 1
            self.stop.wait(0.001)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def test_json_from_another_process_shows_a_live_topic(msgq_prefix):
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic) as sub, msgq.sub_sock(topic, conflate=True):
        with Traffic(pub) as traffic:
            while traffic.sent < 5:  # the publisher is running before the first snapshot
                time.sleep(0.001)
            out = subprocess.run(
                [sys.executable, "-P", "-m", "msgq.apps.top", "--json", "--interval", "0.3"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        entry = topic_entry(report, topic)
        assert entry["prefix"] == msgq_prefix
        assert entry["file"] == segment_basename(topic)
        assert "error" not in entry
        assert entry["segment_size"] == pub.segment_size
        assert entry["publisher_pid"] == os.getpid()
        assert 0 < entry["messages"] <= traffic.sent
        # The two counters are read a few instructions apart while messages keep coming.
        assert abs(entry["bytes"] - entry["messages"] * 100) <= 100
        assert entry["msgs_per_s"] > 0 and entry["bytes_per_s"] > 0
        assert entry["stale"] is False
        readers = sorted(entry["readers"], key=lambda r: r["conflate"])
        assert [(r["pid"], r["conflate"], r["resets"], r["alive"]) for r in readers] == [
            (os.getpid(), False, 0, True),
            (os.getpid(), True, 0, True),
        ]
        assert readers[0]["messages"] == 0 and readers[0]["lag_bytes"] > 0 and readers[0]["lapped"] is False
        sub.receive()


def test_reader_lag_lapping_and_resets_are_reported(capsys):
    topic = unique_topic()
    with msgq.pub_sock(topic, segment_size=4096) as pub, msgq.sub_sock(topic) as sub:
        assert topic_entry(run_json(capsys), topic)["readers"][0]["lag_bytes"] == 0
        pub.send(b"a" * 100)
        pub.send(b"b" * 13)
        assert topic_entry(run_json(capsys), topic)["readers"][0]["lag_bytes"] == ring_bytes(100) + ring_bytes(13)
        assert sub.receive() == b"a" * 100
        reader = topic_entry(run_json(capsys), topic)["readers"][0]
        assert (reader["messages"], reader["bytes"], reader["lag_bytes"]) == (1, 100, ring_bytes(13))

        for _ in range(2 * 4096 // ring_bytes(500)):  # two rings' worth: the reader is lapped
            pub.send(b"c" * 500)
        reader = topic_entry(run_json(capsys), topic)["readers"][0]
        assert reader["lapped"] is True and reader["lag_bytes"] is None and reader["resets"] == 0

        assert sub.receive(non_blocking=True) is None  # the lapped reader skips ahead: a drop
        reader = topic_entry(run_json(capsys), topic)["readers"][0]
        assert reader["lapped"] is False and reader["lag_bytes"] == 0
        assert reader["resets"] == sub.resets == 1


def test_once_prints_a_table_and_help_explains_the_columns(capsys):
    topic = unique_topic()
    with msgq.pub_sock(topic), msgq.sub_sock(topic, conflate=True):
        assert top.main(["--once", "--interval", "0"]) == 0
        table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["TOPIC", "SIZE", "PUB"]
    assert any(line.startswith(topic) and str(os.getpid()) in line for line in table.splitlines())
    assert f"pid {os.getpid():>7}" in table and "conflate" in table

    with pytest.raises(SystemExit) as exit_info:
        top.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    usage = "msgq-top [--prefix P | --all-prefixes] [--interval S] [--once] [--json] [--check] [--clean [--yes]]"
    assert usage + " [--dir DIR]" in text
    for word in ("RESETS", "LAG", "STALE", "--json"):
        assert word in text


def test_prefix_selection(capsys, msgq_prefix, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    with msgq.pub_sock(topic):
        monkeypatch.setenv("MSGQ_PREFIX", "otherrun")
        with msgq.pub_sock(topic):
            monkeypatch.delenv("MSGQ_PREFIX")
            with msgq.pub_sock(topic):
                assert {(t["prefix"], t["topic"]) for t in run_json(capsys)["topics"]} == {("", topic)}
                assert {(t["prefix"], t["topic"]) for t in run_json(capsys, "--all-prefixes")["topics"]} == {
                    ("", topic),
                    ("otherrun", topic),
                    (msgq_prefix, topic),
                }
                assert [t["prefix"] for t in run_json(capsys, "--prefix", "otherrun")["topics"]] == ["otherrun"]
            monkeypatch.setenv("MSGQ_PREFIX", msgq_prefix)
            assert [t["prefix"] for t in run_json(capsys)["topics"]] == [msgq_prefix]


def test_leftover_of_killed_processes_is_flagged_stale(capsys, msgq_prefix, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic):
        pub.send(b"hello")
        # A byte-for-byte copy is what a segment looks like after every user was killed.
        shutil.copyfile(tmp_path / segment_basename(topic), tmp_path / segment_basename("leftover"))
        report = run_json(capsys)
    live, leftover = topic_entry(report, topic), topic_entry(report, "leftover")
    assert live["stale"] is False and live["publisher_pid"] == os.getpid()
    assert leftover["stale"] is True and leftover["publisher_pid"] is None
    assert leftover["messages"] == 1 and [r["alive"] for r in leftover["readers"]] == [False]


def test_corrupt_foreign_and_odd_files_are_listed_with_an_error(capsys, msgq_prefix, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    name = segment_basename
    with msgq.pub_sock(topic, segment_size=4096) as pub:
        pub.send(b"x")
        good = (tmp_path / name(topic)).read_bytes()
        header_size = msgq._msgq.HEADER_SIZE
        assert len(good) == header_size + 4096

        def patched(offset, fmt, value):
            data = bytearray(good)
            struct.pack_into(fmt, data, offset, value)
            return bytes(data)

        files = {
            "garbage": os.urandom(len(good)),
            "empty": b"",
            "short": b"msgq",
            "truncated": good[: header_size + 1024],
            "padded": good + bytes(4096),  # file size no longer header + ring
            "wrongversion": patched(8, "<I", 99),  # layout_version follows the 8-byte magic
            "hugering": patched(16, "<Q", 1 << 30),  # data_size: larger than the file
            "notmsgq": b"\0" * len(good),
        }
        for stem, data in files.items():
            (tmp_path / name(stem)).write_bytes(data)
        (tmp_path / name("link")).symlink_to(tmp_path / name(topic))
        (tmp_path / name("directory")).mkdir()
        os.mkfifo(tmp_path / name("fifo"))  # opening it would block: it must not be opened

        report = run_json(capsys)

    errors = {t["topic"]: t.get("error") for t in report["topics"]}
    assert set(errors) == {topic, "link", "directory", "fifo", *files}
    assert errors.pop(topic) is None
    assert all(errors.values()), errors
    assert "symbolic link" in errors["link"]
    assert "not a regular file" in errors["fifo"] and "not a regular file" in errors["directory"]
    assert "version 99" in errors["wrongversion"]
    assert "corrupt header" in errors["hugering"] and "corrupt header" in errors["padded"]
    assert "too small" in errors["truncated"] and "too small" in errors["short"] and "empty" in errors["empty"]
    assert "magic" in errors["garbage"] and "magic" in errors["notmsgq"]

    assert top.main(["--once", "--interval", "0", "--dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.count("error:") == len(errors)


def test_only_topic_rings_are_listed_by_the_core_name_rules(capsys, msgq_prefix, tmp_path, monkeypatch):
    # The names are split as msgq.artifacts splits them: "msgq@fake@..." is a fake-event file,
    # not topic "@topic" of run "fake"; queues, schemas and names no topic can have are not topics.
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    others = [
        "msgq@fake@@topic",
        "msgq@fake@1234@ipc:endpoint",
        "msgq@fake#0123abcd",
        "msgq@fake~99999999-0123456789abcdef.fifo",
        "msgq@run@a@b",
        f"msgq@{topic}#broadcast",
        f"msgq@{topic}#ordered",
        f"msgq@{topic}~x",
        "msgq@",
        "msgq@run@",
    ]
    with msgq.pub_sock(topic):
        for name in others:
            (tmp_path / name).write_bytes(b"")
        assert top.list_segments(str(tmp_path), None) == [segment_basename(topic)]
        report = run_json(capsys, "--all-prefixes")
    assert [(t["prefix"], t["topic"]) for t in report["topics"]] == [(msgq_prefix, topic)]


@pytest.mark.parametrize("how", ["q", "sigint"])
def test_interactive_mode_refreshes_until_q_or_ctrl_c(how):
    topic = unique_topic()
    with msgq.pub_sock(topic), msgq.sub_sock(topic):
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "msgq.apps.top", "--interval", "0.05"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        chunks = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read1(4096), b"")), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 30
            while b"".join(chunks).count(top.CLEAR.encode()) < 2:  # refreshed at least twice
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.01)
            if how == "q":
                proc.stdin.write(b"q\n")
                proc.stdin.flush()
            else:
                proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0, proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(10)
        screens = b"".join(chunks).decode().split(top.CLEAR)
        assert topic in screens[-1] and "q: quit" in screens[-1]


def test_clean_lists_and_removes_only_topics_whose_users_are_all_dead(capsys, msgq_prefix, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGQ_SHM_DIR", str(tmp_path))
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic):
        pub.send(b"hello")
        # Byte-for-byte copies are what segments look like after every user was killed.
        for name in ("leftover", "gone"):
            shutil.copyfile(tmp_path / segment_basename(topic), tmp_path / segment_basename(name))
        monkeypatch.setattr(sys, "stdin", io.StringIO())  # no terminal: asking is impossible
        assert top.main(["--clean"]) == 2
        assert "pass --yes" in capsys.readouterr().err
        assert (tmp_path / segment_basename("leftover")).exists()
        assert top.main(["--clean", "--yes"]) == 0
        out = capsys.readouterr().out
        assert segment_basename("leftover") in out and segment_basename("gone") in out  # listed
        assert "removed 2 segment(s)" in out
        assert sorted(os.listdir(tmp_path)) == [segment_basename(topic)]  # the live topic stays
        assert top.main(["--clean", "--yes"]) == 0
        assert "nothing to clean" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        top.main(["--yes"])
    assert exc.value.code == 2


def test_on_a_terminal_the_live_view_is_drawn_with_curses_and_q_restores_the_terminal():
    import fcntl
    import pty
    import termios

    topic = unique_topic()
    with msgq.pub_sock(topic), msgq.sub_sock(topic):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        env = dict(os.environ, TERM="xterm")
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "msgq.apps.top", "--interval", "0.05"],
            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        shown, deadline = b"", time.monotonic() + 30
        try:
            while topic.encode() not in shown or b"q: quit" not in shown:
                assert proc.poll() is None and time.monotonic() < deadline, shown[-2000:]
                if select.select([master], [], [], 0.1)[0]:
                    shown += os.read(master, 65536)
            os.write(master, b"q")
            assert proc.wait(timeout=30) == 0
            while select.select([master], [], [], 0.2)[0]:
                try:
                    shown += os.read(master, 65536)
                except OSError:
                    break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(master)
    # curses took the alternate screen and gave it back on the way out (the terminal restored)
    assert b"\x1b[?1049h" in shown and b"\x1b[?1049l" in shown[shown.rindex(b"\x1b[?1049h") :]
