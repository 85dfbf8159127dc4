"""Exceptions raised by msgq. Every error is an :class:`IpcError`; the more
specific classes also derive from the built-in exception a caller would expect
(``ValueError`` for bad arguments, ``PermissionError`` for refused access, ...).

The native modules raise these by name, so keep the names stable.
"""


class IpcError(RuntimeError):
    """Any failure of the messaging layer (the reference's base class)."""


class MultiplePublishersError(IpcError):
    """Another publisher took the topic over ("last publisher wins"); this one can no longer send."""


class MessageTooLargeError(IpcError, ValueError):
    """The payload can never fit in the topic's ring; publish with a larger ``segment_size``."""


class SegmentError(IpcError):
    """A shared-memory segment is corrupt, of another layout version, or not ours."""


class TooManyReadersError(IpcError):
    """Every reader slot of the topic belongs to a live subscriber."""


class ClosedError(IpcError, ValueError):
    """The socket was closed (or never connected)."""


class IpcPermissionError(IpcError, PermissionError):
    """Owner, mode or peer-credential checks refused access."""


class InvalidArgumentError(IpcError, ValueError):
    """A bad size, count or option."""


class IpcTypeError(IpcError, TypeError):
    """An argument of the wrong type (a str where bytes go, a float where an int goes, ...)."""


class InvalidNameError(InvalidArgumentError):
    """A topic, prefix or server name that is empty, too long, or not made of [A-Za-z0-9_.:-]."""


class NoSpaceError(IpcError, MemoryError):
    """Shared memory (/dev/shm or memfd) could not provide the bytes asked for."""


class IpcTimeoutError(IpcError, TimeoutError):
    """A bounded wait ran out."""


class QueueShutdownError(ClosedError):
    """A broadcast queue or ordered topic was shut down (``shutdown()``): nothing more will come."""


__all__ = [
    "IpcError",
    "MultiplePublishersError",
    "MessageTooLargeError",
    "SegmentError",
    "TooManyReadersError",
    "ClosedError",
    "IpcPermissionError",
    "InvalidArgumentError",
    "IpcTypeError",
    "InvalidNameError",
    "NoSpaceError",
    "IpcTimeoutError",
    "QueueShutdownError",
]
