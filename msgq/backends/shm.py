"""The shared-memory backend: the C++ MSGQ ring (default on Linux)."""

import os
import weakref

from msgq import _msgq
from msgq.names import segment_basename, segment_dir

NAME = "msgq"

DEFAULT_SPIN_US = 50
_live = weakref.WeakSet()  # native objects to disown in a forked child


def _mode() -> int:
    """Permissions of segments we create (``MSGQ_SHM_MODE``, octal; default 600)."""
    return int(os.environ.get("MSGQ_SHM_MODE", "600"), 8)


def _track(obj):
    _live.add(obj)
    return obj


def Publisher(endpoint, segment_size=0):
    return _track(_msgq.Publisher(segment_dir(), segment_basename(endpoint), int(segment_size), _mode()))


def Subscriber(endpoint, address="127.0.0.1", conflate=False, segment_size=0):
    sub = _msgq.Subscriber(segment_dir(), segment_basename(endpoint), int(segment_size), bool(conflate), _mode())
    sub.spin_us = int(os.environ.get("MSGQ_SPIN_US", DEFAULT_SPIN_US))
    return _track(sub)


Poller = _msgq.Poller


def remove_stale_segments(prefix=None):
    """Unlink this user's segments that no live process uses (left behind when
    every participant was killed); returns their file names. With ``prefix``,
    only that run prefix's segments."""
    start = f"msgq@{prefix}@" if prefix else "msgq@"
    return _msgq.remove_stale_segments(segment_dir(), start)


def _forget_after_fork():
    # A forked child shares its parent's descriptors; using them would corrupt
    # the parent's reader slots, and closing them normally would release the
    # parent's locks. Drop them silently instead.
    for obj in list(_live):
        obj._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
