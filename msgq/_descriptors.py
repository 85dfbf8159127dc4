"""Descriptor headroom before ZeroMQ is touched.

libzmq aborts the whole process (an assertion, SIGABRT: "Too many open
files") when it cannot create the eventfds / epoll descriptors of its
context, I/O thread and sockets. Every place the project opens a ZeroMQ
context or socket (``msgq.broadcast``, ``msgq.backends.zmq``,
``msgq.apps.bridge``) calls :func:`ensure_descriptors` first, so a process
near its ``RLIMIT_NOFILE`` gets a clear exception instead, before anything
was created (and its caller removes what it made so far).
"""

import errno
import os
import resource
from typing import Optional

from msgq.errors import IpcError

# Free descriptors a ZeroMQ context with one socket needs, with room to spare:
# the context's reaper and I/O thread (a mailbox eventfd and an epoll each),
# the socket's mailbox, a listener or connection, a ZAP (CURVE) handler's pair.
ZMQ_HEADROOM = 32


class DescriptorsExhaustedError(IpcError, OSError):
    """Too few file descriptors are left for what was asked (``ulimit -n``)."""


def free_descriptors() -> Optional[int]:
    """Descriptors this process may still open (``RLIMIT_NOFILE`` minus those
    open), or None where that cannot be read."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    except OSError as e:
        return 0 if e.errno in (errno.EMFILE, errno.ENFILE) else None
    return soft - used


def ensure_descriptors(what: str, needed: int = ZMQ_HEADROOM) -> None:
    """Raise :class:`DescriptorsExhaustedError` naming ``what`` unless at least
    ``needed`` more descriptors may be opened."""
    free = free_descriptors()
    if free is not None and free < needed:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise DescriptorsExhaustedError(
            f"{what}: only {max(free, 0)} file descriptors left under the limit of {soft} (`ulimit -n`), and "
            f"ZeroMQ needs about {needed} (it would abort the process without them): raise the limit or close "
            f"descriptors"
        )
