"""Hostile files in place of the fake-event state and FIFOs (msgq.events).

The discipline is the C++ core's (cpp/common/shm_file, bound as _msgq.ShmFile and
_msgq.open_fifo), the one the topic segments follow: a symbolic link, another user's
file, a world-writable file or something that is not ours in use is refused with a
clear error and left untouched; an abandoned leftover is reused; a peer stuck on the
attach lock bounds the wait and is named; a forked child never undoes its parent's
attachment. msgq/events.py has no lock, open or owner code of its own any more.
"""

import ast
import fcntl
import multiprocessing
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import msgq
from msgq import _msgq, events
from msgq.names import current_prefix, segment_dir
from msgq.testing import unique_topic

LOCK = struct.Struct("hhqqi4x")  # struct flock (l_pid 0: an OFD lock)
WAIT = 30  # seconds: only ever reached when something hangs


def state_path(topic):
    return os.path.join(segment_dir(), events._state_basename(current_prefix(), "", topic))


def owned_fifos(handle):
    state = handle._res.state
    return [state.fifo_path(handle._res.token, which) for which in (events.RECV_CALLED, events.RECV_READY)]


def hold_lock(path, byte, exclusive):
    """Pretend to be a peer: an OFD lock on one byte of ``path``."""
    fd = os.open(path, os.O_RDWR)
    kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, LOCK.pack(kind, os.SEEK_SET, byte, 1, 0))
    return fd


@pytest.fixture(autouse=True)
def no_fake_prefix(monkeypatch):
    monkeypatch.delenv("CEREAL_FAKE_PREFIX", raising=False)


def test_events_py_carries_no_file_discipline_of_its_own():
    tree = ast.parse(Path(events.__file__).read_text())
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    own = used & {"fcntl", "F_OFD_SETLK", "F_OFD_SETLKW", "O_NOFOLLOW", "open", "fstat", "lstat", "st_uid", "geteuid"}
    assert not own, f"msgq/events.py re-implements the file discipline ({sorted(own)}): use _msgq.ShmFile / open_fifo"


def _symlink(path, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, path)
    return "symbolic link"


def _world_writable(path, tmp_path):
    Path(path).write_bytes(b"")
    os.chmod(path, 0o666)
    return "world-writable"


def _another_users(path, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a file owned by another user")
    Path(path).write_bytes(b"")
    os.chown(path, 65534, 65534)
    return "belongs to uid 65534"


@pytest.mark.parametrize("plant", [_symlink, _world_writable, _another_users], ids=lambda f: f.__name__[1:])
def test_a_hostile_file_in_place_of_the_state_is_refused_and_left_as_it_was(plant, tmp_path):
    topic = unique_topic()
    path = state_path(topic)
    words = plant(path, tmp_path)
    before = os.lstat(path)
    try:
        with pytest.raises(msgq.IpcPermissionError, match=words):
            msgq.fake_event_handle(topic)
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode, after.st_uid, after.st_size) == (
            before.st_ino,
            before.st_mode,
            before.st_uid,
            before.st_size,
        )
        assert not (tmp_path / "target").exists() or (tmp_path / "target").read_bytes() == b"keep"
    finally:
        os.unlink(path)


def test_a_foreign_file_in_use_is_refused_untouched_and_an_abandoned_one_reused():
    topic = unique_topic()
    path = state_path(topic)
    with open(path, "wb") as f:
        f.write(b"not a state, 29 bytes of it.")
    os.chmod(path, 0o600)
    peer = hold_lock(path, 1, exclusive=False)  # a live participant
    try:
        with pytest.raises(msgq.SegmentError, match="not a msgq fake-event state"):
            msgq.fake_event_handle(topic)
        assert Path(path).read_bytes() == b"not a state, 29 bytes of it."
    finally:
        os.close(peer)
    with msgq.fake_event_handle(topic, enable=True) as handle:  # nobody uses it now: a leftover
        assert handle.enabled and os.path.getsize(path) == 64
    assert not os.path.lexists(path)


def test_a_peer_stuck_on_the_attach_lock_bounds_the_wait_and_is_named(monkeypatch):
    topic = unique_topic()
    with msgq.fake_event_handle(topic):
        holder = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-c",
                textwrap.dedent(
                    """
                    import fcntl, os, struct, sys
                    fd = os.open(sys.argv[1], os.O_RDWR)
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 1, 0))
                    print("held", flush=True)
                    sys.stdin.read()
                    """
                ),
                state_path(topic),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline() == "held\n"
            monkeypatch.setenv("MSGQ_LOCK_TIMEOUT_S", "0.3")
            with pytest.raises(msgq.IpcTimeoutError, match=f"held by pid {holder.pid} "):
                msgq.fake_event_handle(topic, override=False)
        finally:
            holder.stdin.close()
            holder.wait(WAIT)


def test_a_thread_of_this_process_holding_the_lock_is_waited_for_without_the_gil(monkeypatch):
    # The holder runs Python under the lock (as close() and a take-over do): a waiter that
    # kept the GIL would stall it until the patience ran out (IpcTimeoutError).
    monkeypatch.setenv("MSGQ_LOCK_TIMEOUT_S", "5")
    topic = unique_topic()
    with msgq.fake_event_handle(topic) as owner:
        holding, waiter_started = threading.Event(), threading.Event()

        def hold():
            with owner._res.state.locked():
                holding.set()
                waiter_started.wait(WAIT)
                time.sleep(0.2)  # Python under the lock, while the other thread waits for it

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(WAIT)
        waiter_started.set()
        with msgq.fake_event_handle(topic, override=False) as follower:  # waits for the lock twice
            assert not follower.owner
        holder.join(WAIT)


@pytest.mark.parametrize("squat", ["symlink", "regular file"])
def test_a_replaced_fifo_is_refused_by_a_follower(squat, tmp_path):
    topic = unique_topic()
    with msgq.fake_event_handle(topic) as owner:
        called = owned_fifos(owner)[events.RECV_CALLED]
        os.unlink(called)
        if squat == "symlink":
            os.mkfifo(tmp_path / "elsewhere", 0o600)
            os.symlink(tmp_path / "elsewhere", called)
        else:
            Path(called).write_bytes(b"")
        with pytest.raises(msgq.IpcPermissionError, match=re.escape(called)):
            msgq.fake_event_handle(topic, override=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a FIFO owned by another user")
def test_another_users_fifo_is_refused():
    topic = unique_topic()
    with msgq.fake_event_handle(topic) as owner:
        ready = owned_fifos(owner)[events.RECV_READY]
        os.chown(ready, 65534, 65534)
        with pytest.raises(msgq.IpcPermissionError, match="belongs to uid 65534"):
            msgq.fake_event_handle(topic, override=False)


def test_open_fifo_reports_an_absent_fifo_or_one_nobody_reads_as_minus_one(tmp_path):
    path = str(tmp_path / "fifo")
    assert _msgq.open_fifo(path, os.O_RDONLY) == -1
    os.mkfifo(path, 0o600)
    assert _msgq.open_fifo(path, os.O_WRONLY) == -1  # nobody reads
    reader = _msgq.open_fifo(path, os.O_RDONLY)
    writer = _msgq.open_fifo(path, os.O_WRONLY)
    try:
        assert reader >= 0 and writer >= 0 and os.get_blocking(reader) is False
    finally:
        os.close(reader)
        os.close(writer)


def test_a_forked_child_closing_its_copy_keeps_the_parents_attachment():
    topic = unique_topic()
    handle = msgq.fake_event_handle(topic, enable=True)
    try:
        child = multiprocessing.get_context("fork").Process(target=handle.close)  # closes what it inherited
        child.start()
        child.join(WAIT)
        assert child.exitcode == 0
        assert os.path.exists(state_path(topic)) and all(os.path.exists(p) for p in owned_fifos(handle))
        with msgq.fake_event_handle(topic, override=False) as follower:
            assert follower.enabled  # the state is still ours, still shared
            handle.recv_ready_event.set()
            assert follower.recv_ready_event.peek()
    finally:
        handle.close()
    assert not os.path.lexists(state_path(topic))
