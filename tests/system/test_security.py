"""Who may attach: segments and VisionIPC servers are owner-only by default; a
process of another user (``nobody``, via setpriv) is refused with a message
saying what to change; the documented options (a shared group directory +
MSGQ_TRUSTED_UIDS for msgq, ``allowed_uids`` / ``trusted_uids`` for
VisionIPC) let a listed user in; squatted or wrong-size files and squatted
server names are refused. Needs root (to become nobody), as in CI."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import msgq
from msgq import _msgq
from msgq.names import segment_basename, segment_dir
from msgq.testing import unique_topic
from visionipc import VisionIpcClient, VisionIpcServer

NOBODY_UID, NOGROUP_GID = 65534, 65534
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-P", "-c"]

if os.geteuid() != 0 or shutil.which("setpriv") is None:
    if os.environ.get("CI") == "true":
        pytest.fail("CI runs as root with setpriv (util-linux): the cross-user tests must run", pytrace=False)
    pytestmark = pytest.mark.skip(reason="needs root and setpriv to run a process as nobody")


def nobody(code, env=None, timeout=60):
    """Run ``code`` as nobody (same MSGQ_PREFIX); returns its stdout + stderr."""
    proc = subprocess.run(
        AS_NOBODY + [textwrap.dedent(code)],
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.stdout


def nobody_process(code, env=None):
    """Start ``code`` as nobody with line-based stdin/stdout."""
    return subprocess.Popen(
        AS_NOBODY + [textwrap.dedent(code)],
        env=dict(os.environ, **(env or {})),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


TRY = """
import msgq, sys
try:
    {call}
    print("ATTACHED")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_another_user_cannot_attach_to_a_segment_by_default():
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    sub = msgq.sub_sock(topic, timeout=1000)
    path = os.path.join(segment_dir(), segment_basename(topic))
    assert os.stat(path).st_mode & 0o777 == 0o600
    for call in (f"msgq.sub_sock({topic!r})", f"msgq.pub_sock({topic!r})"):
        out = nobody(TRY.format(call=call))
        assert out.startswith("IpcPermissionError"), out
        assert "belongs to uid 0 with mode 600" in out and "MSGQ_TRUSTED_UIDS" in out, out
    pub.send(b"still ours")  # nothing was touched
    assert sub.receive() == b"still ours"
    assert pub.num_readers == 1


@pytest.fixture
def group_dir():
    """A setgid directory of group nogroup: files created in it belong to that group."""
    path = tempfile.mkdtemp(prefix="vipc-group-", dir="/dev/shm")
    os.chown(path, 0, NOGROUP_GID)
    os.chmod(path, 0o2770)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_group_directory_and_trusted_uids_share_a_topic_with_another_user(monkeypatch, group_dir):
    monkeypatch.setenv("MSGQ_SHM_DIR", group_dir)
    monkeypatch.setenv("MSGQ_SHM_MODE", "660")
    topic = unique_topic()
    pub = msgq.pub_sock(topic)
    path = os.path.join(group_dir, segment_basename(topic))
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, NOGROUP_GID, 0o660)

    out = nobody(TRY.format(call=f"msgq.sub_sock({topic!r})"))  # group access alone is not trust
    assert out.startswith("IpcPermissionError") and "belongs to uid 0" in out and "MSGQ_TRUSTED_UIDS" in out, out

    child = nobody_process(
        f"""
        import msgq
        sub = msgq.sub_sock({topic!r}, timeout=10000)
        print("ready", flush=True)
        print(sub.receive().decode(), flush=True)
        sub.close()
    """,
        env={"MSGQ_TRUSTED_UIDS": "0"},
    )
    try:
        assert child.stdout.readline() == "ready\n"
        assert pub.num_readers == 1
        pub.send(b"hello nobody")
        assert child.stdout.readline() == "hello nobody\n"
        assert child.wait(30) == 0
    finally:
        child.kill()
    pub.close()
    assert os.listdir(group_dir) == []


def test_another_user_cannot_connect_to_a_visionipc_server_by_default():
    server = VisionIpcServer("cam")
    server.create_buffers("road", 3, 64, 32)
    server.start_listener()
    try:
        out = nobody(
            TRY.format(
                call="""
    from visionipc import VisionIpcClient
    VisionIpcClient("cam", "road", False).connect(True)"""
            )
        )
        assert out.startswith("IpcPermissionError"), out
        assert "refused this client (uid 65534)" in out and "allowed_uids=[65534]" in out, out
        assert server.num_clients("road") == 0
    finally:
        server.close()


def test_allowed_uids_let_a_listed_user_receive_frames():
    server = VisionIpcServer("cam", allowed_uids=[NOBODY_UID])
    server.create_buffers("road", 4, 64, 32, "gray8")
    server.start_listener()
    child = nobody_process("""
        from visionipc import VisionIpcClient
        client = VisionIpcClient("cam", "road", False)
        assert client.connect(True)
        print("ready", flush=True)
        frame = None
        while frame is None:
            frame = client.recv(1000)
        with frame:
            print(frame.frame_id, int(frame.array.min()), int(frame.array.max()), frame.valid, flush=True)
        client.close()
    """)
    try:
        assert child.stdout.readline() == "ready\n"
        assert server.num_clients("road") == 1
        buf = server.get_buffer("road")
        buf.array[:] = 77
        server.send(buf, frame_id=5)
        assert child.stdout.readline().split() == ["5", "77", "77", "True"]
        assert child.wait(30) == 0
    finally:
        child.kill()
        server.close()


def test_a_client_refuses_a_server_name_squatted_by_another_user():
    squatter = nobody_process("""
        import sys
        from visionipc import VisionIpcServer
        server = VisionIpcServer("cam", allowed_uids=[0])  # would even admit us
        server.create_buffers("road", 2, 64, 32)
        server.start_listener()
        print("ready", flush=True)
        sys.stdin.readline()
        server.close()
    """)
    try:
        assert squatter.stdout.readline() == "ready\n"
        client = VisionIpcClient("cam", "road", False)
        with pytest.raises(msgq.IpcPermissionError, match="run by uid 65534.*squatting"):
            client.connect(False)
        client.close()
        trusting = VisionIpcClient("cam", "road", False, trusted_uids=[NOBODY_UID])
        assert trusting.connect(False)  # on purpose: now it is trusted
        trusting.close()
        with pytest.raises(msgq.IpcError, match="held by another user, uid 65534 \\(pid [0-9]+\\)"):
            VisionIpcServer("cam")  # a server of ours is told who holds the name
        squatter.stdin.write("\n")
        squatter.stdin.flush()
        assert squatter.wait(30) == 0
    finally:
        squatter.kill()
        squatter.wait(10)


def test_a_segment_file_of_the_wrong_size_is_refused_while_in_use():
    topic = unique_topic()
    path = os.path.join(segment_dir(), segment_basename(topic))
    pub = msgq.pub_sock(topic, segment_size=8192)
    with open(path, "r+b") as f:  # a valid header, but the file grew under it
        f.truncate(_msgq.HEADER_SIZE + 8192 + 4096)
    with pytest.raises(msgq.SegmentError, match="sizes do not match the file"):
        msgq.sub_sock(topic)
    pub.close()  # once nobody uses it, the next user starts it afresh
    with msgq.pub_sock(topic) as again, msgq.sub_sock(topic, timeout=1000) as sub:
        again.send(b"fresh")
        assert sub.receive() == b"fresh"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "a..b", ".hidden", "x" * 129, "sp ace", "nul\0"])
def test_visionipc_names_are_validated_everywhere(bad, monkeypatch):
    from visionipc import available_streams, get_endpoint_name

    for make in (
        lambda: VisionIpcServer(bad),
        lambda: VisionIpcClient(bad, "road"),
        lambda: VisionIpcClient("cam", bad),
        lambda: available_streams(bad),
        lambda: get_endpoint_name("cam", bad),
    ):
        with pytest.raises(msgq.InvalidNameError):
            make()
    monkeypatch.setenv("MSGQ_PREFIX", "a/b")  # a bad run prefix is refused too
    for make in (lambda: VisionIpcServer("cam"), lambda: VisionIpcClient("cam", "road")):
        with pytest.raises(msgq.InvalidNameError):
            make()
