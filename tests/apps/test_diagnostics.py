"""Messages that say what happened and what to do: a slow, stopped or dead
reader, a dead publisher or VisionIPC server (``msgq-top --check``), a full
shared-memory directory, a VisionIPC protocol version mismatch. (A msgq
layout version mismatch: tests/msgq/test_bad_input.py.)"""

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import msgq
from msgq.apps import top
from msgq.apps.diagnostics import process_state
from msgq.testing import unique_topic
from visionipc import VisionIpcClient


def check(capsys, interval="0.3"):
    """Run ``msgq-top --check`` on this run (its two looks ``interval`` seconds apart);
    returns (exit status, output)."""
    capsys.readouterr()
    status = top.main(["--check", "--interval", interval])
    return status, capsys.readouterr().out


def child(code):
    """A Python child in this run (same MSGQ_PREFIX) that prints 'ready' when set up."""
    proc = subprocess.Popen([sys.executable, "-P", "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def lap(pub):
    """Five rings' worth of messages (pub has an 8 KiB ring)."""
    for _ in range(40):
        pub.send(b"x" * 1000)


def test_a_healthy_run_has_no_problems(capsys):
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub, msgq.sub_sock(topic, timeout=1000) as sub:
        pub.send(b"x")
        assert sub.receive() == b"x"
        assert check(capsys) == (0, "no problems\n")


def test_a_slow_reader_is_told_how_to_keep_up(capsys):
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=8192)
    sub = msgq.sub_sock(topic, timeout=0)
    lap(pub)  # while the reader reads nothing
    status, out = check(capsys)
    assert status == 1
    assert f"reader pid {os.getpid()}" in out and "is lapped" in out, out
    assert "reads slower than the publisher writes" in out and "conflate=True" in out and "segment_size" in out, out
    sub.receive()  # catching up counts the loss
    assert sub.resets == 1
    status, out = check(capsys)
    assert "fell a whole ring behind 1 time(s)" in out, out
    sub.close()
    pub.close()


def test_a_live_reader_that_stopped_reading_is_reported_before_it_is_lapped(capsys):
    """Issue 34: ``--check`` said "no problems" for a live reader whose lag kept growing
    at 0 msg/s; it now compares two snapshots and names the reader."""
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=1 << 20)
    reader = child(
        f"""
        import msgq, time
        sub = msgq.sub_sock({topic!r})
        print("ready", flush=True)
        time.sleep(60)  # alive, not stopped, reading nothing
        """
    )
    stop = time.monotonic() + 3
    try:
        done = threading.Event()

        def publish():
            while not done.is_set() and time.monotonic() < stop:
                pub.send(b"x" * 100)
                time.sleep(0.005)

        sender = threading.Thread(target=publish)
        sender.start()
        try:
            status, out = check(capsys)
        finally:
            done.set()
            sender.join()
        assert status == 1, out
        assert f"reader pid {reader.pid}" in out and "read nothing between two looks" in out, out
        assert "alive but not receiving" in out and "falling further" in out, out
    finally:
        reader.kill()
        reader.wait()
        pub.close()


def test_a_stopped_reader_is_reported_as_stopped(capsys):
    topic = unique_topic()
    pub = msgq.pub_sock(topic, segment_size=8192)
    reader = child(f"""
        import msgq, time
        sub = msgq.sub_sock({topic!r})
        print("ready", flush=True)
        time.sleep(60)
    """)
    try:
        os.kill(reader.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(reader.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)  # the signal is delivered asynchronously
        lap(pub)
        status, out = check(capsys)
        assert status == 1
        assert f"reader pid {reader.pid}" in out and "the process is stopped" in out, out
        assert f"kill -CONT {reader.pid}" in out, out
    finally:
        reader.kill()
        reader.wait(10)
    status, out = check(capsys)  # now it is dead
    assert f"reader pid {reader.pid}" in out and "is gone" in out and "nothing to do" in out, out
    assert pub.num_readers == 0  # reclaimed
    assert check(capsys) == (0, "no problems\n")
    pub.close()


def test_a_dead_publisher_and_a_dead_visionipc_server_are_reported(capsys):
    topic = unique_topic()
    sub = msgq.sub_sock(topic, timeout=0)
    publisher = child(f"""
        import msgq, time
        pub = msgq.pub_sock({topic!r})
        print("ready", flush=True)
        time.sleep(60)
    """)
    server = child("""
        import time
        from visionipc import VisionIpcServer
        server = VisionIpcServer("cam")
        server.create_buffers("road", 2, 64, 32)
        server.start_listener()
        print("ready", flush=True)
        time.sleep(60)
    """)
    client = VisionIpcClient("cam", "road", False)
    try:
        assert client.connect(False)
        assert check(capsys) == (0, "no problems\n")
        for proc in (publisher, server):
            proc.kill()
            proc.wait(10)
        status, out = check(capsys)
        assert status == 1
        assert f"{topic}: no live publisher; its 1 reader(s) wait" in out and "Start or restart it" in out, out
        # A VisionIPC server's rings have no name (clients hold them by fd): its death leaves nothing to clean.
        assert "visionipc_cam_road" not in out, out
    finally:
        client.close()
        sub.close()
        for proc in (publisher, server):
            proc.kill()


def test_a_full_shared_memory_directory_says_what_to_do(monkeypatch, tmp_path):
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(mount)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"this test mounts a 1 MiB tmpfs (needs root, as in CI): {done.stdout}")
    try:
        monkeypatch.setenv("MSGQ_SHM_DIR", str(mount))
        topic = unique_topic()
        with pytest.raises(msgq.NoSpaceError) as info:
            msgq.pub_sock(topic, segment_size=4 << 20)
        assert isinstance(info.value, MemoryError)
        message = str(info.value)
        assert f"not enough space in {mount}" in message and "use a smaller segment_size" in message, message
        assert "--shm-size" in message, message
        assert os.listdir(mount) == []  # nothing half-made left behind
        with msgq.pub_sock(topic, segment_size=64 * 1024) as pub, msgq.sub_sock(topic, timeout=1000) as sub:
            pub.send(b"small fits")  # the directory still works for what fits
            assert sub.receive() == b"small fits"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_visionipc_server_of_another_protocol_version_is_named_as_such():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(f"\0visionipc@{os.environ['MSGQ_PREFIX']}@oldcam".encode())
    listener.listen(1)
    client = VisionIpcClient("oldcam", "road", False)
    try:

        def answer():
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.send(struct.pack("<III", 0x43504956, 99, 0) + bytes(200))  # magic, version 99, status
            return conn

        import threading

        held = []
        server = threading.Thread(target=lambda: held.append(answer()))
        server.start()
        with pytest.raises(
            msgq.IpcError, match="speaks protocol version 99, this client version 2: run the same visionipc release"
        ):
            client.connect(False)
        server.join(10)
    finally:
        client.close()
        listener.close()
