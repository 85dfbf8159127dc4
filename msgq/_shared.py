"""Private helpers every msgq and visionipc object shares (one definition each).

``Closeable``: the resource lifecycle. A subclass defines ``close()`` (idempotent,
safe after a fork and from ``__del__``) and gets ``with obj:`` and a best-effort
close at garbage collection. ``ClosesOnExit`` is the ``with obj:`` half alone,
for objects whose native part closes itself when it is collected.

``disown_in_forked_child(obj)``: after a ``fork()`` the child calls
``obj._forget_after_fork()`` (drop the inherited descriptors without touching
the parent's locks, threads or slots), so using obj there raises ClosedError.

Argument checks and timeouts: ``check_int`` (an int in a range),
``env_int`` (the same for an environment variable), ``scoped_env`` (environment
variables set for a block, then restored),
``check_choice`` (one of a few names, such as a reader's mode),
``check_timeout_ms`` (a timeout in milliseconds as the reference takes it),
``deadline`` / ``time_left`` / ``expired`` (a timeout in seconds, ``None``
meaning no limit, as a ``time.monotonic()`` deadline).
"""

import contextlib
import math
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, Optional, TypeVar, Union

from msgq.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Buffer, TypeAlias

    # What a send takes: bytes or any other buffer-protocol object (numpy arrays named
    # too: numpy's stubs declare an array's __buffer__ only from Python 3.12 on).
    BufferLike: TypeAlias = Union[Buffer, np.ndarray]

_T = TypeVar("_T")


class ClosesOnExit:
    """``with obj:`` closes at the end of the block."""

    __slots__ = ()

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Closeable(ClosesOnExit):
    """``with obj:`` closes at the end of the block; an object dropped without
    ``close()`` is closed when it is collected (errors there are swallowed: the
    interpreter may be shutting down)."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_inherited: "weakref.WeakSet[Any]" = weakref.WeakSet()  # objects a forked child must disown


def disown_in_forked_child(obj: _T) -> _T:
    """Register ``obj`` (weakly): a forked child calls its ``_forget_after_fork()``
    right after the fork. Returns ``obj``."""
    _inherited.add(obj)
    return obj


def _forget_inherited() -> None:
    for obj in list(_inherited):
        try:
            obj._forget_after_fork()
        except Exception:  # the child must start whatever one object does
            pass


os.register_at_fork(after_in_child=_forget_inherited)


def check_int(what: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, else InvalidArgumentError (bool and floats are refused too)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{what} must be an int, not {type(value).__name__}")
    value = value.__index__()
    if not low <= value <= high:
        raise InvalidArgumentError(f"{what} must be {low} to {high}, got {value}")
    return value


def env_int(name: str, default: int, low: int, high: int) -> int:
    """Environment variable ``name`` as an int in ``[low, high]`` (``default``
    when unset or empty), else InvalidArgumentError naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name}={text!r} must be an integer from {low} to {high}") from None
    return check_int(name, value, low, high)


WAKES = ("all", "handoff")


def wake_choice(value: Optional[str] = None) -> bool:
    """How a publisher wakes sleeping subscribers: ``"all"`` (one system call wakes
    every sleeper) or ``"handoff"`` (it wakes one, that subscriber wakes the rest);
    ``None``: ``MSGQ_WAKE``, default ``"all"``. True for handoff; a bad value is an
    InvalidArgumentError naming where it came from."""
    if value is None:
        return check_choice("MSGQ_WAKE", os.environ.get("MSGQ_WAKE", "").strip() or "all", WAKES) == "handoff"
    return check_choice("wake", value, WAKES) == "handoff"


INT32_MAX = (1 << 31) - 1
INT32_MIN = -(1 << 31)
INT64_MAX = (1 << 63) - 1
MAX_SPIN_US = 1_000_000  # a subscriber's busy-wait: longer than a second is a mistake


@contextlib.contextmanager
def scoped_env(**values: Optional[str]) -> Iterator[None]:
    """Set environment variables for the block (None: unset) and restore them after."""

    def apply(env: Dict[str, Optional[str]]) -> None:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    saved = {k: os.environ.get(k) for k in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def check_timeout_ms(value: Any, what: str = "timeout") -> int:
    """A timeout in milliseconds as the reference takes it: ``None``, a
    negative number or infinity wait forever (-1); an int or float up to
    2**31 - 1 ms is that many (floats truncated). NaN, bools, strings and
    larger values are InvalidArgumentError."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidArgumentError(f"{what} must be a number of milliseconds or None, not {value!r}")
    if value < 0 or value == math.inf:
        return -1
    if value > INT32_MAX:
        raise InvalidArgumentError(f"{what} must be at most {INT32_MAX} ms (negative or None: forever), got {value}")
    return int(value)


def check_choice(what: str, value: Any, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``, else InvalidArgumentError naming them."""
    if value not in choices:
        raise InvalidArgumentError(f"{what} must be {' or '.join(repr(c) for c in choices)}, not {value!r}")
    return value


def deadline(timeout: Optional[float]) -> Optional[float]:
    """The ``time.monotonic()`` deadline of a timeout in seconds (None: no
    limit; a negative one has already passed). Anything but an int or a float
    (a bool, NaN, a str) is an InvalidArgumentError."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
        raise InvalidArgumentError(f"timeout must be a number of seconds or None, not {timeout!r}")
    return time.monotonic() + max(0.0, float(timeout))


def time_left(deadline: Optional[float], cap: Optional[float] = None) -> Optional[float]:
    """Seconds to the deadline (None: unbounded), at most ``cap``."""
    if deadline is None:
        return cap
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(left, cap)


def expired(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline
