"""Hostile conditions for the broadcast queue and the ZeroMQ channels
(issue 16, items 6, 10 and 11), with real processes, real shared memory and
real descriptor limits:

- a reader SIGKILLed at every point of taking a message, of every size
  (small, exactly a chunk, larger than a chunk, many chunks), comes back
  under its rank and loses nothing; the writer never stalls;
- descriptor, shared-memory and file-size exhaustion give a clear
  exception, never an abort, and leave nothing behind;
- nothing a BroadcastQueue opens is reachable by another local user (the
  test drops a forked child to ``nobody``), and it opens no socket.
"""

import dataclasses
import errno
import json
import os
import pickle
import pwd
import resource
import signal
import subprocess
import sys
import time
import traceback

import pytest

import msgq
from msgq import _overflow, _queues
from msgq.backends.shm import remove_stale_segments
from msgq.errors import InvalidArgumentError, IpcError, NoSpaceError
from msgq.names import segment_dir

CHUNK = 1024
RING = 4
EXACT = CHUNK - 24  # raw bytes whose frame (16-byte header, one 8-byte length) fills a chunk exactly
SIZES = {"small": 100, "exactly_a_chunk": EXACT, "one_byte_over": EXACT + 1, "many_chunks": 10 * CHUNK + 7}


def payload(seq: int, size: int) -> bytes:
    return (seq.to_bytes(4, "little") * (size // 4 + 1))[:size]


def run_child(body, timeout=30.0):
    """Fork; the child runs ``body()`` and reports its JSON result (or the
    exception) through a pipe. ``(wait status, result)``; a child that
    overruns ``timeout`` is killed and the test fails."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 0
        try:
            out = {"result": body()}
        except BaseException as e:  # noqa: BLE001 - everything is reported
            out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "type": type(e).__name__}
            code = 1
        os.write(w, json.dumps(out).encode())
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail(f"child overran {timeout} s (a hang)")
        time.sleep(0.005)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    return status, (json.loads(data) if data else None)


def shm_names(queue_name: str):
    return sorted(n for n in os.listdir(segment_dir()) if queue_name in n)


# ---------------------------------------------------------------- item 6: lossless through reader restarts


def _die_at(seq_to_die, where):
    """In the child: SIGKILL ourselves while taking message ``seq_to_die``,
    ``where`` = after reading its overflow file (before BR3), or after BR3
    (before unlinking the file), or while waiting for it."""
    real_read, real_remove = _overflow.OverflowDir.read, _overflow.OverflowDir.remove

    def read(self, seq):
        got = real_read(self, seq)
        if where == "after_read" and seq == seq_to_die:
            os.kill(os.getpid(), signal.SIGKILL)
        return got

    def remove(self, seq):
        if where == "after_consume" and seq == seq_to_die:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_remove(self, seq)

    _overflow.OverflowDir.read, _overflow.OverflowDir.remove = read, remove


# Where the reader dies: waiting for the message (any size); and, for a message in an
# overflow file, after reading the file but before BR3, and after BR3 before unlinking it.
KILL_POINTS = [(size, "waiting") for size in SIZES] + [
    (size, where) for size in ("one_byte_over", "many_chunks") for where in ("after_read", "after_consume")
]


@pytest.mark.parametrize(("size_name", "where"), KILL_POINTS, ids=[f"{s}-{w}" for s, w in KILL_POINTS])
def test_a_reader_killed_while_taking_a_message_comes_back_and_loses_nothing(size_name, where):
    size = SIZES[size_name]
    overflow = size > EXACT
    count, dies_at = 12, 2
    queue = msgq.BroadcastQueue(n_readers=2, chunk_bytes=CHUNK, max_chunks=RING)
    stays = msgq.BroadcastQueue.create_from_handle(queue.handle, 1)
    handle = queue.handle

    def reader_that_dies():
        reader = msgq.BroadcastQueue.create_from_handle(handle, 0)
        if where != "waiting":
            _die_at(dies_at, where)
        for seq in range(dies_at):
            assert reader.dequeue_bytes(timeout=10) == payload(seq, size)
        if where == "waiting":
            os.kill(os.getpid(), signal.SIGKILL)  # dies waiting for / before taking message dies_at
        reader.dequeue_bytes(timeout=10)
        return "survived"

    for seq in range(RING):  # fills the ring: the writer now needs reader 0 to go on
        queue.enqueue_bytes(payload(seq, size), timeout=10)
    got_stays = [stays.dequeue_bytes(timeout=10) for _ in range(RING)]
    status, _ = run_child(reader_that_dies)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    back = msgq.BroadcastQueue.create_from_handle(handle, 0)
    first = dies_at + 1 if where == "after_consume" else dies_at
    got_back = []
    for seq in range(RING, count):  # the writer goes on: never stalls on the dead reader
        while len(got_back) + first < seq - RING + 1:
            got_back.append(back.dequeue_bytes(timeout=10))
        queue.enqueue_bytes(payload(seq, size), timeout=10)
        got_stays.append(stays.dequeue_bytes(timeout=10))
    while len(got_back) + first < count:
        got_back.append(back.dequeue_bytes(timeout=10))
    assert got_stays == [payload(s, size) for s in range(count)]
    assert got_back == [payload(s, size) for s in range(first, count)]
    with pytest.raises(TimeoutError):
        back.dequeue_bytes(timeout=0)
    if overflow:  # every overflow file is gone once everyone consumed it
        queue.enqueue_bytes(payload(count, size), timeout=10)  # the writer drops consumed files as it goes
        assert sorted(os.listdir(handle.overflow_dir)) == [str(count)]
    for q in (queue, stays, back):
        q.close()
    assert shm_names(queue.name) == []


def test_a_writer_killed_mid_overflow_leaves_nothing_once_the_name_is_reused():
    queue_name = f"hostile{os.getpid()}"

    def writer_that_dies():
        q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING, name=queue_name)
        real_write = q._write_chunk

        def write_chunk(flags, parts, deadline, *rest):
            if flags & _queues.FLAG_OVERFLOW:  # its file is written, its chunk not yet
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(flags, parts, deadline, *rest)

        q._write_chunk = write_chunk
        q.enqueue_bytes(b"x" * (4 * CHUNK))

    status, _ = run_child(writer_that_dies)
    assert os.WIFSIGNALED(status)
    assert len(shm_names(queue_name)) == 2  # the ring and the overflow directory (with its file)
    remove_stale_segments()  # the ring of a dead run, as every first publisher does
    again = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING, name=queue_name)
    ours = sorted(os.path.basename(p) for p in (again.handle.overflow_dir, again._writer.path))
    assert shm_names(queue_name) == ours  # the dead writer's directory was swept
    again.close()
    assert shm_names(queue_name) == []


def test_readers_drain_every_large_message_of_a_killed_writer_and_the_last_one_cleans_up():
    handles = []

    def writer_that_dies():
        q = msgq.BroadcastQueue(n_readers=2, chunk_bytes=CHUNK, max_chunks=RING)
        for seq in range(3):
            q.enqueue_bytes(payload(seq, 5 * CHUNK))
        os.write(w, pickle.dumps(q.handle))
        os.close(w)
        os.kill(os.getpid(), signal.SIGKILL)  # nobody ever detaches: the ring and the files stay

    r, w = os.pipe()
    status, _ = run_child(writer_that_dies)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        handles.append(pickle.loads(f.read()))
    handle = handles[0]
    assert os.WIFSIGNALED(status)
    # Readers that attach after the writer died (before any sweep of stale rings) get every message.
    readers = [msgq.BroadcastQueue.create_from_handle(handle, rank) for rank in range(2)]
    for reader in readers:
        assert [reader.dequeue_bytes(timeout=5) for _ in range(3)] == [payload(s, 5 * CHUNK) for s in range(3)]
    assert os.listdir(handle.overflow_dir) == []  # the last reader of each message unlinked it
    for reader in readers:
        reader.close()
    assert shm_names(handle.name) == []


@pytest.mark.parametrize("damage", ["removed", "truncated", "garbage", "replaced_by_a_directory"])
def test_a_damaged_overflow_file_is_a_clear_error_and_the_next_message_still_comes(damage):
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    queue.enqueue_bytes(payload(0, 3 * CHUNK))
    queue.enqueue({"next": 1})
    path = os.path.join(queue.handle.overflow_dir, "0")
    if damage == "truncated":
        os.truncate(path, 100)
    elif damage == "garbage":
        with open(path, "r+b") as f:
            f.write(os.urandom(64))
    else:
        os.unlink(path)
        if damage == "replaced_by_a_directory":
            os.mkdir(path)
    with pytest.raises(IpcError, match="overflow file"):
        reader.dequeue_bytes(timeout=5)
    assert reader.dequeue(timeout=5) == {"next": 1}  # spent, not stuck on it
    if damage == "replaced_by_a_directory":
        os.rmdir(path)
    reader.close()
    queue.close()
    assert shm_names(queue.name) == []


def test_a_handle_cannot_point_a_reader_at_another_directory(tmp_path):
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "0").write_bytes(b"keep me")
    for bad in (str(victim), queue.handle.overflow_dir + "/..", queue.handle.overflow_dir[:-1] + "g"):
        hostile = dataclasses.replace(queue.handle, overflow_dir=bad)
        with pytest.raises(InvalidArgumentError, match="not the overflow directory"):
            msgq.BroadcastQueue.create_from_handle(hostile, 0)
    assert (victim / "0").read_bytes() == b"keep me"
    queue.close()


# ---------------------------------------------------------------- item 10: exhaustion is an exception


def _limit_descriptors(spare: int):
    used = len(os.listdir("/proc/self/fd")) - 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.parametrize("spare", [0, 1, 3, 8, 20])
def test_a_queue_at_the_descriptor_limit_raises_clearly_and_leaves_nothing(spare):
    pytest.importorskip("zmq")
    name = f"fds{spare}x{os.getpid()}"

    def body():
        _limit_descriptors(spare)
        outcome = {}
        for what, kwargs in (
            ("local", {}),
            ("remote", {"n_remote_readers": 1, "remote_host": "127.0.0.1", "remote_bind": "127.0.0.1"}),
        ):
            q = r = None
            try:
                q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING, name=name, **kwargs)
                r = msgq.BroadcastQueue.create_from_handle(q.handle, 0)
                q.enqueue_bytes(b"y" * (3 * CHUNK))  # an overflow file: opened and closed again
                assert r.dequeue_bytes(timeout=5) == b"y" * (3 * CHUNK)
                outcome[what] = "worked"
            except IpcError as e:
                outcome[what] = str(e)
            finally:
                for x in (r, q):
                    if x is not None:
                        x.close()
        return outcome

    status, out = run_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, out)  # no SIGABRT, no error
    outcome = out["result"]
    # ZeroMQ is refused with a clear reason (it would abort the process); a local queue works
    # as long as its few descriptors are there, else says why.
    assert "ulimit" in outcome["remote"] or "descriptor" in outcome["remote"] or "open files" in outcome["remote"]
    assert outcome["local"] == "worked" or "open files" in outcome["local"] or "descriptor" in outcome["local"]
    if spare >= 3:
        assert outcome["local"] == "worked"
    assert shm_names(name) == []


def test_zmq_backend_sockets_at_the_descriptor_limit_raise_instead_of_aborting():
    pytest.importorskip("zmq")
    from msgq.backends import zmq as zmq_backend

    def body():
        _limit_descriptors(6)
        out = []
        for make in (lambda: zmq_backend.Publisher("fdtopic"), lambda: zmq_backend.Subscriber("fdtopic")):
            try:
                make().close()
                out.append("worked")
            except IpcError as e:
                out.append(str(e))
        return out

    status, out = run_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, out)
    assert all("ulimit -n" in line for line in out["result"]), out


def test_shared_memory_exhaustion_raises_no_space_and_leaves_nothing():
    name = f"nospace{os.getpid()}"
    with pytest.raises(NoSpaceError):  # 8 TiB of ring: more than any /dev/shm
        msgq.BroadcastQueue(n_readers=1, chunk_bytes=1 << 31, max_chunks=4096, name=name)
    assert shm_names(name) == []

    def body():  # an overflow file larger than the process may write: NoSpaceError, the queue goes on
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING, name=name)
        r = msgq.BroadcastQueue.create_from_handle(q.handle, 0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * CHUNK, resource.RLIM_INFINITY))
        try:
            q.enqueue_bytes(b"z" * (128 * CHUNK))
            raised = None
        except NoSpaceError as e:
            raised = str(e)
        left = os.listdir(q.handle.overflow_dir)
        q.enqueue_bytes(b"z" * (8 * CHUNK))
        ok = r.dequeue_bytes(timeout=5) == b"z" * (8 * CHUNK)
        r.close()
        q.close()
        return {"raised": raised, "left": left, "ok": ok}

    status, out = run_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
    assert out["result"]["raised"] and "file size limit" in out["result"]["raised"]
    assert out["result"]["left"] == [] and out["result"]["ok"]
    assert shm_names(name) == []


def test_a_reader_out_of_memory_keeps_the_large_message_for_a_retry():
    def body():
        q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING)
        r = msgq.BroadcastQueue.create_from_handle(q.handle, 0)
        big = b"m" * (32 << 20)
        q.enqueue_bytes(big)
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + (8 << 20), hard))  # too little to map the message
        try:
            r.dequeue_bytes(timeout=1)
            raised = None
        except NoSpaceError as e:
            raised = str(e)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        ok = r.dequeue_bytes(timeout=1) == big
        r.close()
        q.close()
        return {"raised": raised, "ok": ok, "left": shm_names(q.name)}

    status, out = run_child(body)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
    assert "memory" in out["result"]["raised"] and out["result"]["ok"] and out["result"]["left"] == []


# ---------------------------------------------------------------- item 11: nothing reachable by another user


def _unix_sockets():
    with open("/proc/net/unix") as f:
        return {line.split()[-1] for line in f.readlines()[1:] if len(line.split()) > 7}


def test_large_messages_open_no_socket_and_other_users_cannot_read_them():
    before = _unix_sockets()
    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING)
    reader = msgq.BroadcastQueue.create_from_handle(queue.handle, 0)
    secret = b"s" * (3 * CHUNK)
    queue.enqueue_bytes(secret)
    opened = _unix_sockets() - before
    assert not [s for s in opened if "msgq" in s or queue.name in s]  # no side-channel socket at all
    directory = queue.handle.overflow_dir
    st = os.stat(directory)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(directory, "0")).st_mode & 0o777 == 0o600
    handle = queue.handle

    def as_nobody():
        nobody = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
        tried = {}
        for what, attempt in (
            ("list", lambda: os.listdir(directory)),
            ("open", lambda: open(os.path.join(directory, "0"), "rb").read()),
            ("attach", lambda: msgq.BroadcastQueue.create_from_handle(handle, 0)),
        ):
            try:
                attempt()
                tried[what] = "succeeded"
            except (PermissionError, IpcError) as e:
                tried[what] = getattr(e, "errno", None) or type(e).__name__
        return tried

    status, out = run_child(as_nobody)
    assert os.WIFEXITED(status), out
    tried = out["result"]
    assert tried["list"] == errno.EACCES and tried["open"] == errno.EACCES, tried
    assert tried["attach"] != "succeeded", tried
    assert reader.dequeue_bytes(timeout=5) == secret  # the owner's reader still gets it
    reader.close()
    queue.close()
    assert not os.path.exists(directory)


def _killed_writer_leftovers(n_messages=18):
    """A default (random) named BroadcastQueue writer SIGKILLed with ``n_messages``
    1 MiB messages unread: its ring file and its large-message directory stay."""
    r, w = os.pipe()

    def writer_that_dies():
        q = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=n_messages + 2)
        for seq in range(n_messages):
            q.enqueue_bytes(payload(seq, 1 << 20))
        os.write(w, pickle.dumps(q.handle))
        os.close(w)
        os.kill(os.getpid(), signal.SIGKILL)

    status, _ = run_child(writer_that_dies)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        handle = pickle.loads(f.read())
    assert os.WIFSIGNALED(status)
    assert len(os.listdir(handle.overflow_dir)) == n_messages  # 18 MB nobody would ever remove before
    return handle


def test_msgq_top_check_and_clean_see_a_killed_queues_large_message_directory():
    """Issue 31 item 8: every kind of file is in one registry (msgq.artifacts) that
    msgq-top --check / --clean and the publisher's sweep use; before, none of them saw
    the directory of a SIGKILLed queue (18 MB left in /dev/shm for good)."""
    from msgq.apps import top

    handle = _killed_writer_leftovers()
    overflow = os.path.basename(handle.overflow_dir)
    check = subprocess.run(
        [sys.executable, "-m", "msgq.apps.top", "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 1, check.stdout + check.stderr
    assert "broadcast large messages (18.9 MB) left behind by killed processes" in check.stdout, check.stdout
    assert "msgq-top --clean" in check.stdout
    assert top.main(["--clean", "--yes"]) == 0
    assert not os.path.lexists(handle.overflow_dir)
    assert shm_names(handle.name) == [], "the ring and its directory are both gone"
    assert overflow not in os.listdir(segment_dir())


def test_the_next_publisher_of_the_run_sweeps_a_killed_queues_leftovers():
    handle = _killed_writer_leftovers(3)
    removed = remove_stale_segments(os.environ["MSGQ_PREFIX"])  # what a publisher runs once per prefix
    assert os.path.basename(handle.overflow_dir) in removed
    assert shm_names(handle.name) == []


def test_a_live_queues_directory_is_never_swept():
    from msgq import artifacts

    queue = msgq.BroadcastQueue(n_readers=1, chunk_bytes=CHUNK, max_chunks=RING)
    queue.enqueue_bytes(payload(0, 3 * CHUNK))
    found = {a.file: a for a in artifacts.scan(segment_dir(), os.environ["MSGQ_PREFIX"])}
    mine = found[os.path.basename(queue.handle.overflow_dir)]
    assert (mine.kind, mine.stale) == (artifacts.OVERFLOW, False)
    assert remove_stale_segments(os.environ["MSGQ_PREFIX"]) == []
    assert os.listdir(queue.handle.overflow_dir) == ["0"]
    queue.close()
    assert shm_names(queue.name) == []
