"""Helpers for testing code that uses msgq (ours and yours).

Every test gets its own run prefix so tests can run in parallel, and in the
same machine as a live system, without sharing a single segment::

    from msgq.testing import isolated_prefix, unique_topic

    def test_my_node():
        with isolated_prefix() as prefix:
            pub = msgq.pub_sock(unique_topic())
            ...
        # leaving the block fails if a segment of the run is left behind

The prefix travels to child processes through ``MSGQ_PREFIX``.
"""

import contextlib
import gc
import os
import secrets
import shutil
import time
from typing import Iterable, Iterator, Optional, Set

from msgq.names import run_segment_prefix, segment_dir, zmq_port


def unique_name(stem: str = "t") -> str:
    """A topic (or prefix) name no other test uses: ``stem`` plus 12 random hex digits."""
    return f"{stem}{secrets.token_hex(6)}"


def _ports_in_use() -> Set[int]:
    ports: Set[int] = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        ports.update(int(line.split()[1].rsplit(":", 1)[1], 16) for line in lines if line.strip())
    return ports


def _ephemeral_ports() -> range:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def unique_topic(stem: str = "topic", companions: Iterable[str] = ()) -> str:
    """A topic name no other test uses, usable with every backend: under the
    current prefix its ZeroMQ port (and those of ``name + suffix`` for each
    suffix in ``companions``) lies outside the ephemeral port range, is in
    no socket's use (so no outgoing connection, every closed one staying in
    TIME_WAIT for a minute, can hold it) and was not handed out before by this
    process."""
    ephemeral, used = _ephemeral_ports(), _ports_in_use() | _HANDED_OUT
    while True:
        name = unique_name(stem)
        ports = [zmq_port(name + suffix) for suffix in ("", *companions)]
        if len(set(ports)) == len(ports) and not any(port in ephemeral or port in used for port in ports):
            _HANDED_OUT.update(ports)
            return name


# Ports of the topics this process has handed out: never handed out twice, so two topics of
# one test (or a test and one before it whose publisher is still closing) cannot share a port.
_HANDED_OUT: Set[int] = set()


def segments(prefix: str) -> list:
    """Names of the segment files of run ``prefix`` present right now."""
    start = run_segment_prefix(prefix)
    try:
        return sorted(n for n in os.listdir(segment_dir()) if n.startswith(start))
    except FileNotFoundError:
        return []


def wait_until_gone(prefix: str, timeout: float = 5.0) -> list:
    """Collect garbage and wait up to ``timeout`` s for the run's segments to
    disappear (a child process may still be exiting); return what is left."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        left = segments(prefix)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


@contextlib.contextmanager
def isolated_prefix(prefix: Optional[str] = None, check_leaks: bool = True) -> Iterator[str]:
    """Run the block under its own ``MSGQ_PREFIX`` (restored afterwards).

    With ``check_leaks``, raise ``AssertionError`` naming the segment files the
    block left behind in shared memory (they are removed either way).
    """
    prefix = prefix or unique_name("run")
    saved = {k: os.environ.get(k) for k in ("MSGQ_PREFIX", "OPENPILOT_PREFIX")}
    os.environ["MSGQ_PREFIX"] = prefix
    os.environ.pop("OPENPILOT_PREFIX", None)
    failed = False
    try:
        yield prefix
    except BaseException:
        failed = True
        raise
    finally:
        left = wait_until_gone(prefix, timeout=5.0 if check_leaks and not failed else 0.0)
        for name in left:
            path = os.path.join(segment_dir(), name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(path) and not os.path.islink(path):  # a BroadcastQueue's overflow directory
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if left and check_leaks and not failed:
            raise AssertionError(f"segments left behind in {segment_dir()}: {left}")
