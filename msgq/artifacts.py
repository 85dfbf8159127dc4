"""Every kind of file the project makes in the shared-memory directory, in one
registry: what it is, who makes it, and how to tell that nobody uses it any more.

The publisher's stale sweep (``msgq.backends.shm.remove_stale_segments``, run by
the first publisher of a run prefix in each process), the fake-event attach
sweep, and ``msgq-top --check`` / ``--clean`` all go through :func:`scan` and
:func:`sweep`, so a new kind of file is added here once and every one of them
knows it.

All names are ``msgq@[PREFIX@]REST`` (``msgq.names.run_segment_prefix``):

======================  =====================================  ================================
kind                    REST                                   stale when
======================  =====================================  ================================
topic ring              ``TOPIC`` (VisionIPC frames too)       no live process attached [1]
ring being resized      ``TOPIC#resize``                       no live process attached [1]
ordered topic           ``NAME#ordered``                       no live process attached [1]
broadcast ring          ``NAME#broadcast``                     no live process attached [1]
broadcast large msgs    ``NAME#broadcast~TOKEN`` (directory)   its ring is absent or stale [2]
topic schema            ``TOPIC#schema`` (msgq.schemas)         its ring is absent or stale
fake-event state        ``fake@ID@ENDPOINT``, ``fake#DIGEST``  no live process attached [1]
fake-event wake-up      ``fake~PID-TOKEN.KIND`` (FIFO)         process PID is gone
======================  =====================================  ================================

[1] The segment discipline of ``cpp/common/shm_file``: every participant holds a
shared presence lock (an OFD lock, released by the kernel when the process
dies); stale means the presence lock can be taken exclusively while the init
lock is held too (nobody attaching right now). The native ``stale_file`` does
the test (and the unlink, re-checked under both locks).

[2] The queue's last process removes its directory after its ring file is gone
(``msgq._overflow``), and a writer that creates a queue alone removes earlier
ones of that name; a directory whose ring file is absent or stale belongs to a
queue whose every process died (a SIGKILLed writer with a random name is never
created again, so nothing else would remove it).

Not in the directory, so never left behind: VisionIPC pools (memfd: the kernel
frees them with their last descriptor or mapping) and VisionIPC listener sockets
(abstract Unix socket names).
"""

import contextlib
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from msgq import _msgq
from msgq.names import SEGMENT_PREFIX
from msgq.schemas import SUFFIX as SCHEMA_SUFFIX

TOPIC = "topic ring"
RESIZING = "ring being resized"
ORDERED = "ordered topic"
BROADCAST = "broadcast ring"
OVERFLOW = "broadcast large messages"
SCHEMA = "topic schema"
FAKE_STATE = "fake-event state"
FAKE_FIFO = "fake-event wake-up"
UNKNOWN = "unknown"

# a ring's own files: TOPIC + suffix (the schema's suffix is msgq.schemas')
_SUFFIXES = (("#broadcast", BROADCAST), ("#ordered", ORDERED), ("#resize", RESIZING), (SCHEMA_SUFFIX, SCHEMA))
_FIFO = re.compile(r"fake~([0-9]+)-[0-9a-f]{16}\.[a-z]+\Z")
_OVERFLOW = re.compile(r"(.+#broadcast)~[0-9a-f]{16}\Z")


@dataclass(frozen=True)
class Artifact:
    """One file (or directory) of the shared-memory directory."""

    file: str  # its name in the directory
    prefix: str  # the run prefix ("" for none)
    rest: str  # the name after ``msgq@[PREFIX@]``
    kind: str  # one of the kinds above
    stale: bool  # nobody uses it: the sweep may remove it


def split_name(basename: str) -> Optional[Tuple[str, str]]:
    """``(prefix, rest)`` of a name ``msgq@[PREFIX@]REST``, or None if not ours. Names
    and prefixes never hold ``@``; only the fake-event files' REST does (after ``fake``):
    ``msgq@fake@ID@ENDPOINT`` is ``("", "fake@ID@ENDPOINT")``, never run ``fake``'s."""
    if not basename.startswith(SEGMENT_PREFIX):
        return None
    rest = basename[len(SEGMENT_PREFIX) :]
    if rest.startswith(("fake@", "fake#", "fake~")):
        return "", rest
    prefix, sep, after = rest.partition("@")
    return (prefix, after) if sep else ("", rest)


def kind_of(rest: str) -> str:
    """The kind of a file by the part of its name after the run prefix."""
    if _FIFO.match(rest):
        return FAKE_FIFO
    if rest.startswith(("fake@", "fake#")):
        return FAKE_STATE
    if _OVERFLOW.match(rest):
        return OVERFLOW
    for suffix, kind in _SUFFIXES:
        if rest.endswith(suffix) and "#" not in rest[: -len(suffix)] and "~" not in rest:
            return kind
    if rest and "#" not in rest and "~" not in rest and "@" not in rest:
        return TOPIC
    return UNKNOWN


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, another user's
        return False
    return False


def _mine(path: str, want: Callable[[int], bool]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return want(st.st_mode) and st.st_uid == os.geteuid()


def _group1(pattern: "re.Pattern[str]", rest: str) -> str:
    match = pattern.match(rest)
    assert match is not None  # the artifact's kind was judged by this pattern
    return match.group(1)


def _is_stale(directory: str, name: str, kind: str, rest: str, prefix: str) -> bool:
    path = os.path.join(directory, name)
    if kind == FAKE_FIFO:
        return _mine(path, stat.S_ISFIFO) and _pid_gone(int(_group1(_FIFO, rest)))
    if kind == OVERFLOW:
        if not _mine(path, stat.S_ISDIR):
            return False
        ring = name[: len(name) - len(rest)] + _group1(_OVERFLOW, rest)
        return not os.path.lexists(os.path.join(directory, ring)) or _msgq.stale_file(directory, ring, False)
    if kind == SCHEMA:  # a plain file (no presence lock): judged by its topic's ring
        if not _mine(path, stat.S_ISREG):
            return False
        ring = name[: -len(SCHEMA_SUFFIX)]
        return not os.path.lexists(os.path.join(directory, ring)) or _msgq.stale_file(directory, ring, False)
    if kind == UNKNOWN:
        return False  # not ours to judge
    return _msgq.stale_file(directory, name, False)


def names(directory: str, prefix: Optional[str] = None) -> List[Tuple[str, str, str]]:
    """``(file, prefix, rest)`` of each name of ours in ``directory`` of run ``prefix``
    (None: every run's), sorted by name: the one reading of the directory, shared by
    :func:`scan` and ``msgq-top``'s topic list. Nothing is opened."""
    try:
        listed = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in sorted(listed):
        split = split_name(name)
        if split is not None and (prefix is None or split[0] == prefix):
            found.append((name, *split))
    return found


def scan(directory: str, prefix: Optional[str] = None) -> List[Artifact]:
    """The project's files in ``directory`` of run ``prefix`` (None: every run's),
    sorted by name, each with its kind and whether it is stale."""
    found = []
    for name, run, rest in names(directory, prefix):
        kind = kind_of(rest) if name.isascii() else UNKNOWN
        found.append(Artifact(name, run, rest, kind, _is_stale(directory, name, kind, rest, run)))
    return found


def remove(directory: str, artifact: Artifact) -> bool:
    """Remove one stale artifact, re-checking that it still is (a file a process
    attached to since the scan stays). True if it was removed."""
    path = os.path.join(directory, artifact.file)
    if artifact.kind == OVERFLOW:
        if not _is_stale(directory, artifact.file, artifact.kind, artifact.rest, artifact.prefix):
            return False
        from msgq._overflow import OverflowDir

        OverflowDir(path).remove_all()
        return not os.path.lexists(path)
    if artifact.kind in (FAKE_FIFO, SCHEMA):
        if not _is_stale(directory, artifact.file, artifact.kind, artifact.rest, artifact.prefix):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    if artifact.kind == UNKNOWN:
        return False
    return _msgq.stale_file(directory, artifact.file, True)


def sweep(directory: str, prefix: Optional[str]) -> List[str]:
    """Remove every stale artifact of run ``prefix`` (None: every run's). Files go
    before directories, so a broadcast ring and its large-message directory go in
    one sweep (a topic's schema file with its ring too). Returns the names removed."""
    removed = []
    for artifact in sorted(scan(directory, prefix), key=lambda a: a.kind in (OVERFLOW, SCHEMA)):
        # a large-message directory or a schema is judged again: its ring may have gone just now
        if (artifact.stale or artifact.kind in (OVERFLOW, SCHEMA)) and remove(directory, artifact):
            removed.append(artifact.file)
    return removed
