"""Hostile input to the tools (issue 16, items 5, 9, 12-14, 16): recordings whose files
are FIFOs, sockets, folders or symlinks out of the recording; index rows and
recording.json values that name paths outside it, absurd sizes and nesting; /dev/shm
names with terminal escapes; Host headers of other sites. Every case is refused
quickly with one line (exit status 2 for bad input), never a hang or a traceback."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import spark  # noqa: F401
from view_helpers import ViewProcess

from msgq._printable import printable
from msgq.testing import unique_name
from visionipc.apps.pipeline import synthetic
from visionipc.apps.pipeline.cli import main as analyze_main
from visionipc.apps.pipeline.export import image_name, inside
from visionipc.apps.record.checks import RecordingError, open_file, parse_manifest
from visionipc.apps.record.reader import iter_frames
from visionipc.apps.record.replay import main as replay_main

SEGMENT = "frames/road/000000.mkv"
INDEX = "index/road/000000.parquet"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A small lossless recording (one gray8 stream "road", 4 frames, 32x32) and a second one."""
    root = tmp_path_factory.mktemp("hostile")
    spec = {"road": dict(frames=4, width=32, height=32, format="gray8")}
    return synthetic.write_recording(root / "good", spec), synthetic.write_recording(root / "other", spec)


@pytest.fixture
def rec(pristine, tmp_path):
    return shutil.copytree(pristine[0], tmp_path / "rec")


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _replace(path, make):
    os.remove(path)
    make(str(path))


def _unix_socket(path):
    here = os.getcwd()
    os.chdir(os.path.dirname(path))  # a relative bind: tmp paths can be longer than sun_path
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.basename(path))
        s.close()
    finally:
        os.chdir(here)


def _rewrite_index(rec, column, value):
    path = os.path.join(rec, INDEX)
    table = pq.read_table(path)
    i = table.schema.get_field_index(column)
    table = table.set_column(i, column, pa.array([value] * table.num_rows, table.schema.field(column).type))
    pq.write_table(table, path)


HOSTILE_FILES = {
    "fifo": lambda p: os.mkfifo(p),
    "folder": lambda p: os.mkdir(p),
    "socket": _unix_socket,
    "symlink to /dev/zero": lambda p: os.symlink("/dev/zero", p),
    "symlink out of the recording": lambda p: os.symlink(os.path.join(os.path.dirname(p), "..", "..", "..", "x"), p),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
def test_a_segment_file_that_is_not_a_regular_file_inside_is_refused_not_waited_on(rec, kind):
    _replace(rec / SEGMENT, HOSTILE_FILES[kind])
    with pytest.raises(RecordingError, match=r"cannot open .*000000\.mkv: (not a regular file|a symlink)"):
        list(iter_frames(str(rec), "road"))


def test_a_symlinked_folder_on_the_way_is_refused(rec, pristine):
    shutil.rmtree(rec / "frames" / "road")
    os.symlink(os.path.join(pristine[1], "frames", "road"), rec / "frames" / "road")
    with pytest.raises(RecordingError, match="a symlink on the way"):
        list(iter_frames(str(rec), "road"))


@pytest.mark.parametrize("segment_file", ["/etc/passwd", "../other/frames/road/000000.mkv", "frames//x", ""])
def test_segment_files_outside_the_recording_are_refused(rec, segment_file):
    _rewrite_index(rec, "segment_file", segment_file)
    with pytest.raises(RecordingError, match="not a path inside the recording"):
        list(iter_frames(str(rec), "road"))


def test_open_file_hands_back_a_regular_file_inside(rec):
    fd = open_file(str(rec), "recording.json")
    try:
        assert json.loads(os.read(fd, 1 << 16))["streams"]["road"]["width"] == 32
    finally:
        os.close(fd)


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    "patch, message",
    [
        (lambda d: d["streams"]["road"].update(width=10**9), "width 1000000000 is not an int in 1..16384"),
        (lambda d: d["streams"]["road"].update(height=-4), "height -4 is not an int"),
        (lambda d: d["streams"]["road"].update(width=48), "the video is 32x32, recording.json says 48x32"),
        (lambda d: d["streams"].update({"../../x": d["streams"]["road"]}), "stream name '../../x' may only use"),
        (lambda d: d["streams"]["road"].update(format="bogus"), "format 'bogus' is not one of"),
        (lambda d: d.update(topics=["a/b"]), "topic name 'a/b' may only use"),
        (lambda d: d.update(extra=[[[[[[[[[[1]]]]]]]]]]), "JSON nested deeper than 8"),
        (DEEP, "JSON nested deeper than 8"),
        (b"\xff\xfe garbage", "not JSON"),
        (b" " * (1 << 20) + b"{}", "larger than 1048576 bytes"),
    ],
)
def test_replay_refuses_a_hostile_manifest_with_one_line(rec, capsys, patch, message):
    path = rec / "recording.json"
    if isinstance(patch, bytes):
        path.write_bytes(patch)
    else:
        doc = json.loads(path.read_bytes())
        patch(doc)
        path.write_text(json.dumps(doc))
    assert replay_main([str(rec), "--name", unique_name("replay"), "--rate", "max", "-q"]) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_replay_refuses_a_video_of_another_size_before_reserving_buffers(rec, pristine, capsys):
    bigger = synthetic.write_recording(
        rec.parent / "big", {"road": dict(frames=2, width=64, height=32, format="gray8")}
    )
    shutil.copy(os.path.join(bigger, SEGMENT), rec / SEGMENT)
    assert replay_main([str(rec), "--name", unique_name("replay"), "--rate", "max", "-q"]) == 2
    assert "the video is 64x32, recording.json says 32x32" in one_line_error(capsys.readouterr().err)


def test_replay_refuses_a_later_segment_of_another_size_and_leaves_nothing(tmp_path, capsys):
    spec = {"road": dict(frames=4, width=32, height=32, format="gray8", segment_frames=2)}
    rec = synthetic.write_recording(tmp_path / "rec", spec)
    spec["road"]["width"] = 64
    bigger = synthetic.write_recording(tmp_path / "big", spec)
    shutil.copy(os.path.join(bigger, "frames/road/000001.mkv"), os.path.join(rec, "frames/road/000001.mkv"))
    assert replay_main([rec, "--name", unique_name("replay"), "--rate", "max", "-q"]) == 2
    err = one_line_error(capsys.readouterr().err)
    assert "000001.mkv: the video is 64x32, recording.json says 32x32" in err  # the conftest checks /dev/shm


def test_vipc_analyze_failing_to_write_its_results_is_one_line_and_status_1(rec, tmp_path, capsys, spark):
    # a results folder that cannot take the run's LATEST marker (a folder is in its place):
    # the analysis ran, publishing it failed: one line, status 1 (a failure, not bad input)
    (tmp_path / "out" / "LATEST" / "x").mkdir(parents=True)
    assert analyze_main([str(rec), "--out", str(tmp_path / "out"), "--jobs", "health", "-q"]) == 1
    assert "LATEST" in one_line_error(capsys.readouterr().err)
    # --out naming a file is bad input (issue 18): status 2
    (tmp_path / "afile").write_text("a file where the results folder should be")
    assert analyze_main([str(rec), "--out", str(tmp_path / "afile"), "--jobs", "health", "-q"]) == 2
    assert "existing file" in one_line_error(capsys.readouterr().err)


def test_null_values_in_the_index_are_refused(rec, capsys):
    path = os.path.join(rec, INDEX)
    table = pq.read_table(path)
    i = table.schema.get_field_index("publish_time")
    table = table.set_column(i, "publish_time", pa.array([None] * table.num_rows, pa.int64()))
    pq.write_table(table, path)
    assert replay_main([str(rec), "--name", unique_name("replay"), "--rate", "max", "-q"]) == 2
    assert "null" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda rec: _rewrite_index(rec, "stream", "road/../../x"), "names stream(s) ['road/../../x']"),
        (lambda rec: _replace(rec / INDEX, HOSTILE_FILES["fifo"]), "not a regular file (a FIFO)"),
        (lambda rec: (rec / "recording.json").write_bytes(DEEP), "JSON nested deeper than 8"),
        (lambda rec: os.rename(rec / "index" / "road", rec / "index" / "ro\x1bad"), "ro\\x1bad"),
        (lambda rec: _rewrite_index(rec, "segment_file", "../other/" + SEGMENT), "not a path inside the recording"),
        (lambda rec: _rewrite_index(rec, "position", -1), "positions must be 0..3"),
    ],
)
def test_vipc_analyze_refuses_a_hostile_recording_before_writing_anything(rec, tmp_path, capsys, damage, message):
    damage(rec)
    out = tmp_path / "deep" / "out"
    assert analyze_main([str(rec), "--out", str(out), "--jobs", "health,export", "-q"]) == 2
    assert message in one_line_error(capsys.readouterr().err)
    assert os.listdir(tmp_path) == ["rec"]


def test_export_never_builds_a_path_outside_out(tmp_path):
    with pytest.raises(RecordingError, match="may only use"):
        image_name("rec1", "road/../../x", 7, "jpg")
    with pytest.raises(RecordingError, match="not a relative path"):
        image_name("/abs", "road", 7, "jpg")
    os.symlink("/", tmp_path / "escape")
    with pytest.raises(RecordingError, match="outside"):
        inside(str(tmp_path), "escape/etc/x.jpg")
    assert inside(str(tmp_path), image_name("rec1", "road", 7, "jpg")).startswith(str(tmp_path))


def test_parse_manifest_accepts_what_the_recorder_writes(pristine):
    with open(os.path.join(pristine[0], "recording.json"), "rb") as f:
        assert parse_manifest(f.read(), "recording.json")["streams"]["road"]["format"] == "gray8"


def test_msgq_top_escapes_other_users_file_names(tmp_path):
    names = [
        b"msgq@evil\x1b]0;owned\x07\x1b[2J",
        b"msgq@two\nlines",
        b"msgq@run@bad\xffutf8",
        b"msgq@rtl\xe2\x80\xaeabc",
    ]
    for name in names:
        with open(os.path.join(os.fsencode(tmp_path), name), "wb") as f:
            f.write(b"not a segment")
    top = os.path.join(os.path.dirname(sys.executable), "msgq-top")
    for mode in ("--once", "--check"):
        run = subprocess.run(
            [top, "--dir", str(tmp_path), "--all-prefixes", mode, "--interval", "0"],
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        )
        assert run.returncode in (0, 1), run.stderr
        text = run.stdout.decode("ascii")  # nothing but escaped ASCII
        assert not any(ch < " " and ch != "\n" for ch in text), text
        assert "\\x1b]0;owned\\x07\\x1b[2J" in text and "two\\nlines" in text and "bad\\xffutf8" in text
        assert "rtl\\u202eabc" in text


def test_vipc_tool_messages_escape_names(tmp_path, capsys):
    hostile = str(tmp_path / "rec\x1b[2J\nfake: ok")
    assert replay_main([hostile, "--name", "x"]) == 2
    assert "rec\\x1b[2J\\nfake: ok" in one_line_error(capsys.readouterr().err)
    assert analyze_main([hostile, "--out", str(tmp_path / "out")]) == 2
    assert "\x1b" not in one_line_error(capsys.readouterr().err)


def test_printable_keeps_ordinary_names_and_escapes_the_rest():
    assert printable("cam_road-1.x:y") == "cam_road-1.x:y"
    assert printable("a\\b\r\n\x1b\u2028") == "a\\b\\r\\n\\x1b\\u2028"
    assert printable(printable("\x1b")) == printable("\x1b")
    assert printable(b"\xff") == "\\xff"


def test_vipc_view_answers_only_its_own_host_names():
    import http.client

    from visionipc.apps.view.cli import main as view_main

    with ViewProcess("--name", unique_name("cam"), "--allow-host", "cam.lan") as view:
        port = int(view.url.rsplit(":", 1)[1])

        def get(*hosts):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest("GET", "/stats", skip_host=True)
            for host in hosts:
                conn.putheader("Host", host)
            conn.putheader("Authorization", f"Bearer {view.token}")
            conn.endheaders()
            r = conn.getresponse()
            body = r.read().decode()
            conn.close()
            return r.status, body

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", "[::1]:1", f"cam.lan:{port}"):
            assert get(host)[0] == 200, host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "10.0.0.1", "cam.lan.evil"):
            status, body = get(host)
            assert status == 421 and "--allow-host" in body, (host, status, body)
        status, body = get("\x1b[2Jevil")
        assert status in (400, 421) and "\x1b" not in body
        assert get(f"127.0.0.1:{port}", "evil.example")[0] == 400  # a duplicate Host
        view.out.wait_for("Duplicate 'Host' header", 10)  # logged as one line, not a traceback
        assert "Traceback" not in view.out.text()
    with pytest.raises(SystemExit):
        view_main(["--name", "cam", "--allow-host", "evil:80"])
