"""The shared-memory backend: the C++ MSGQ ring (default on Linux)."""

import os
import weakref
from typing import List, Optional, Set, TypeVar, Union

from msgq import _msgq, artifacts
from msgq._shared import MAX_SPIN_US, env_int, wake_choice
from msgq.errors import InvalidArgumentError
from msgq.names import current_prefix, segment_basename, segment_dir

NAME = "msgq"

DEFAULT_SPIN_US = 50
# native objects to disown in a forked child
_live: "weakref.WeakSet[Union[_msgq.Publisher, _msgq.Subscriber]]" = weakref.WeakSet()


def _mode() -> int:
    """Permissions of segments we create (``MSGQ_SHM_MODE``, octal; default 600,
    e.g. 660 to share topics with a group). World-writable modes are refused."""
    text = os.environ.get("MSGQ_SHM_MODE", "600")
    try:
        mode = int(text, 8)
    except ValueError:
        raise InvalidArgumentError(f"MSGQ_SHM_MODE={text!r} is not an octal file mode such as 600 or 660") from None
    if mode & ~0o777 or mode & 0o002 or not mode & 0o600 == 0o600:
        raise InvalidArgumentError(
            f"MSGQ_SHM_MODE={text!r}: segments must be readable and writable by their owner and not world-writable"
        )
    return mode


def _trusted_uids() -> List[int]:
    """Owners besides us whose segment files we accept (``MSGQ_TRUSTED_UIDS``,
    comma-separated uids; default none): for topics shared between users."""
    text = os.environ.get("MSGQ_TRUSTED_UIDS", "").strip()
    try:
        return [int(u) for u in text.split(",") if u.strip()]
    except ValueError:
        raise InvalidArgumentError(
            f"MSGQ_TRUSTED_UIDS={text!r} must be comma-separated numeric uids, e.g. 1000,1001"
        ) from None


_T = TypeVar("_T", _msgq.Publisher, _msgq.Subscriber)


def _track(obj: _T) -> _T:
    _live.add(obj)
    return obj


_swept: Set[str] = set()  # run prefixes whose stale segments this process already removed


def Publisher(endpoint: str, segment_size: int = 0, wake: Optional[str] = None) -> _msgq.Publisher:
    prefix = current_prefix()
    if prefix not in _swept:
        _swept.add(prefix)
        remove_stale_segments(prefix)
    handoff = wake_choice(wake)  # (or MSGQ_WAKE) checked before anything is created
    pub = _msgq.Publisher(segment_dir(), segment_basename(endpoint), int(segment_size), _mode(), _trusted_uids())
    pub.handoff_wakes = handoff
    return _track(pub)


def Subscriber(
    endpoint: str, address: str = "127.0.0.1", conflate: bool = False, segment_size: int = 0
) -> _msgq.Subscriber:
    sub = _msgq.Subscriber(
        segment_dir(), segment_basename(endpoint), int(segment_size), bool(conflate), _mode(), _trusted_uids()
    )
    sub.spin_us = env_int("MSGQ_SPIN_US", DEFAULT_SPIN_US, 0, MAX_SPIN_US)
    return _track(sub)


Poller = _msgq.Poller


def remove_stale_segments(prefix: Optional[str] = None) -> List[str]:
    """Unlink this user's files that no live process uses (left behind when every
    participant was killed): every kind ``msgq.artifacts`` knows (topic rings,
    ordered topics, broadcast rings and large-message directories, fake-event
    files); returns their names. With ``prefix``, only that run prefix's files
    (without one, as before: every run's)."""
    return artifacts.sweep(segment_dir(), prefix or None)


def _forget_after_fork() -> None:
    # A forked child shares its parent's descriptors; using them would corrupt
    # the parent's reader slots, and closing them normally would release the
    # parent's locks. Drop them silently instead.
    for obj in list(_live):
        obj._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
