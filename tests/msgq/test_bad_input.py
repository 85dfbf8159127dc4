"""Bad names, sizes, payloads, environments and hostile files: a clear Python
exception of a documented type, never a crash, a hang or a leaked segment."""

import fcntl
import os
import struct

import pytest

import msgq
from msgq import _msgq
from msgq.names import segment_basename, segment_dir
from msgq.testing import unique_topic


def seg_path(topic):
    return os.path.join(segment_dir(), segment_basename(topic))


@pytest.mark.parametrize(
    "name",
    ["", "a/b", "/abs", "..", "a..b", ".hidden", "x" * 129, "nul\0byte", "sp ace", "ünïcode", 42, None],
)
@pytest.mark.parametrize("make", [msgq.pub_sock, msgq.sub_sock])
def test_invalid_topic_names_raise_invalid_name_error(make, name):
    with pytest.raises(msgq.InvalidNameError) as info:
        make(name)
    assert isinstance(info.value, ValueError)  # usable as a plain ValueError too
    assert not os.listdir(segment_dir()) or not any(
        n.startswith("msgq@" + os.environ["MSGQ_PREFIX"]) for n in os.listdir(segment_dir())
    )


def test_longest_valid_name_works():
    topic = "t" * 128
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=1000)
    pub.send(b"ok")
    assert sub.receive() == b"ok"


@pytest.mark.parametrize("name", ["with space", "..", "a\x1b[2Jb", "", "x" * 129, ".hidden", "ünïcode", "ok_A-9.:z"])
def test_python_and_the_native_core_apply_one_name_rule(name):
    """One rule (cpp/common/names.cc): what the C++ API refuses, msgq refuses in the same
    words; before, ``vipc::Publisher`` made segments of ``"with space"``, ``".."``, ``""``."""
    try:
        _msgq.check_name("topic name", name.encode(), 128)
        native = None
    except msgq.InvalidArgumentError as e:
        native = str(e)
    try:
        msgq.names.validate_name(name)
        python = None
    except msgq.InvalidNameError as e:
        python = str(e)
    assert python == native
    assert (native is None) == (name == "ok_A-9.:z")
    if native is not None:
        assert "\x1b" not in native  # escaped: a name never drives the terminal


@pytest.mark.parametrize("prefix", ["a/b", "..", "x" * 65])
def test_invalid_prefix_is_refused(monkeypatch, prefix):
    monkeypatch.setenv("MSGQ_PREFIX", prefix)
    with pytest.raises(msgq.InvalidNameError, match="prefix"):
        msgq.pub_sock("topic")


def test_openpilot_prefix_isolates_like_msgq_prefix(monkeypatch):
    monkeypatch.delenv("MSGQ_PREFIX")
    prefix = os.environ.get("PYTEST_XDIST_WORKER", "") + "op" + unique_topic("")
    monkeypatch.setenv("OPENPILOT_PREFIX", prefix)
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub:
        assert os.path.basename(pub._impl.path) == f"msgq@{prefix}@{topic}"


@pytest.mark.parametrize("size", [-1, 1, 4095, 2**31 + 1, 2**40])
def test_out_of_range_segment_sizes_raise(size):
    with pytest.raises((msgq.InvalidArgumentError, OverflowError, TypeError)) as info:
        msgq.pub_sock(unique_topic(), segment_size=size)
    if isinstance(info.value, msgq.InvalidArgumentError):
        assert "segment_size" in str(info.value)


def test_a_message_larger_than_the_ring_raises_and_the_process_lives_on():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=100)
    with pytest.raises(msgq.MessageTooLargeError, match="larger segment_size"):
        pub.send(b"x" * (pub.segment_size + 1))
    with pytest.raises(msgq.MessageTooLargeError):
        pub.send(b"x" * (pub.max_message_size + 1))
    assert sub.receive() is None
    pub.send(b"still fine")
    assert sub.receive() == b"still fine"


def test_publisher_and_subscriber_with_different_segment_sizes_just_work():
    topic = unique_topic()
    sub_small = msgq.sub_sock(topic, segment_size=8192, timeout=2000)  # creates the ring at 8 KiB
    pub = msgq.pub_sock(topic, segment_size=1 << 20)  # the publisher's size wins
    assert pub.segment_size == 1 << 20
    sub_other = msgq.sub_sock(topic, segment_size=65536, timeout=2000)  # a hint only: joins the 1 MiB ring
    big = os.urandom(100_000)
    pub.send(big)
    assert sub_small.receive() == big
    assert sub_other.receive() == big


def test_unknown_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MSGQ_BACKEND", "carrier-pigeon")
    with pytest.raises(msgq.InvalidArgumentError, match="unknown msgq backend"):
        msgq.SubSocket().connect(msgq.Context(), "x")


@pytest.mark.parametrize("mode", ["666", "602", "400", "rw", "1777"])
def test_unsafe_or_invalid_segment_modes_are_refused(monkeypatch, mode):
    monkeypatch.setenv("MSGQ_SHM_MODE", mode)
    with pytest.raises(msgq.InvalidArgumentError, match="MSGQ_SHM_MODE"):
        msgq.pub_sock(unique_topic())


def test_group_mode_is_applied(monkeypatch):
    monkeypatch.setenv("MSGQ_SHM_MODE", "660")
    topic = unique_topic()
    with msgq.pub_sock(topic):
        assert os.stat(seg_path(topic)).st_mode & 0o777 == 0o660
    monkeypatch.delenv("MSGQ_SHM_MODE")
    with msgq.pub_sock(topic):
        assert os.stat(seg_path(topic)).st_mode & 0o777 == 0o600


def test_a_symlink_in_place_of_a_segment_is_refused(tmp_path):
    topic = unique_topic()
    target = tmp_path / "target"
    target.write_bytes(b"")
    os.symlink(target, seg_path(topic))
    try:
        with pytest.raises(msgq.IpcPermissionError, match="symbolic link"):
            msgq.pub_sock(topic)
        assert target.read_bytes() == b""
    finally:
        os.unlink(seg_path(topic))


def test_a_world_writable_segment_is_refused():
    topic = unique_topic()
    fd = os.open(seg_path(topic), os.O_CREAT | os.O_RDWR, 0o600)
    os.fchmod(fd, 0o666)
    try:
        with pytest.raises(msgq.IpcPermissionError, match="world-writable"):
            msgq.sub_sock(topic)
    finally:
        os.close(fd)
        os.unlink(seg_path(topic))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a file owned by another user")
def test_a_segment_owned_by_another_user_is_refused():
    topic = unique_topic()
    fd = os.open(seg_path(topic), os.O_CREAT | os.O_RDWR, 0o600)
    os.fchown(fd, 65534, 65534)  # nobody
    try:
        with pytest.raises(msgq.IpcPermissionError, match="belongs to uid 65534"):
            msgq.pub_sock(topic)
    finally:
        os.close(fd)
        os.unlink(seg_path(topic))


def _hold_presence(path):
    """Pretend to be a live participant: a shared OFD lock on the presence byte."""
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, 1, 1, 0))
    return fd


def test_a_corrupt_segment_in_use_raises_segment_error_without_touching_it():
    topic = unique_topic()
    garbage = os.urandom(_msgq.HEADER_SIZE + 8192)
    with open(seg_path(topic), "wb") as f:
        f.write(garbage)
    os.chmod(seg_path(topic), 0o600)
    fd = _hold_presence(seg_path(topic))
    try:
        with pytest.raises(msgq.SegmentError, match="not a msgq segment"):
            msgq.sub_sock(topic)
        with open(seg_path(topic), "rb") as f:
            assert f.read() == garbage
    finally:
        os.close(fd)
        os.unlink(seg_path(topic))


def test_a_segment_of_another_layout_version_in_use_is_refused_loudly():
    topic = unique_topic()
    with msgq.pub_sock(topic):
        fd = _hold_presence(seg_path(topic))
    try:
        with open(seg_path(topic), "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 99))
        with pytest.raises(msgq.SegmentError, match="incompatible msgq layout version 99"):
            msgq.pub_sock(topic)
    finally:
        os.close(fd)
        os.unlink(seg_path(topic))


def test_an_abandoned_corrupt_segment_is_reinitialised():
    topic = unique_topic()
    with open(seg_path(topic), "wb") as f:
        f.write(b"\xff" * 100)  # truncated garbage, no one attached
    os.chmod(seg_path(topic), 0o600)
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=1000)
    pub.send(b"fresh")
    assert sub.receive() == b"fresh"


def test_corrupt_header_fields_written_by_a_hostile_peer_do_not_crash_a_reader():
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=8192)
    sub = msgq.sub_sock(topic, timeout=100)
    pub.send(b"a" * 100)
    with open(seg_path(topic), "r+b") as f:  # scribble over the first size prefix
        f.seek(_msgq.HEADER_SIZE)
        f.write(struct.pack("<q", 2**40))
    assert sub.receive() is None  # dropped as corrupt, counted as a reset
    assert sub.resets >= 1
    pub.send(b"after")
    assert sub.receive() == b"after"
