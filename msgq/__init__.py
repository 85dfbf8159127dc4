"""msgq: lock-free single-publisher / multi-subscriber messaging over shared memory.

A drop-in for commaai's ``msgq`` Python API (``Context``, ``PubSocket``,
``SubSocket``, ``Poller``, ``pub_sock``, ``sub_sock``, ``drain_sock_raw``...),
without its limits: 64 readers per topic reclaimed one by one, clear errors
instead of aborts, no signals, sleeping receivers that use no CPU.
"""

import importlib.util as _util
import os as _os
import typing as _typing  # as a private name: msgq's namespace holds only msgq's names

if _typing.TYPE_CHECKING:
    import argparse as _argparse

if _util.find_spec("msgq._msgq") is None or _util.find_spec("msgq._queues") is None:
    raise ImportError(
        f"msgq's compiled modules are not in {_os.path.dirname(__file__)}: this is a source checkout that was "
        "not built; build it in place (bash tools/setup.sh, or pip install -e .) or run Python outside the "
        "checkout so that the installed package is imported"
    )

from msgq import _aliases  # noqa: E402
from msgq import errors as _errors
from msgq.broadcast import BroadcastHandle, BroadcastQueue
from msgq.errors import (
    ClosedError,
    InvalidArgumentError,
    InvalidNameError,
    IpcError,
    IpcPermissionError,
    IpcTimeoutError,
    IpcTypeError,
    MessageTooLargeError,
    MultiplePublishersError,
    NoSpaceError,
    QueueShutdownError,
    SegmentError,
    TooManyReadersError,
)
from msgq.events import (
    Event,
    SocketEventHandle,
    delete_fake_prefix,
    get_fake_prefix,
    set_fake_prefix,
    toggle_fake_events,
    wait_for_one_event,
)
from msgq.ordered import OrderedProducer, OrderedReader
from msgq.schemas import Schema, protobuf_schema, set_topic_schema, topic_schema
from msgq.services import PubMaster, SubMaster
from msgq.sockets import Context, Loan, Poller, PubSocket, SubSocket

# DEPRECATED paths: msgq-top, msgq-bridge and their diagnostics moved to msgq.apps
_aliases.install(
    {"msgq.top": "msgq.apps.top", "msgq.bridge": "msgq.apps.bridge", "msgq.diagnostics": "msgq.apps.diagnostics"}
)

__all__ = [
    "Context",
    "Poller",
    "SubSocket",
    "PubSocket",
    "SocketEventHandle",
    "Event",
    "Loan",
    *_errors.__all__,
    "BroadcastQueue",
    "BroadcastHandle",
    "OrderedProducer",
    "OrderedReader",
    "toggle_fake_events",
    "set_fake_prefix",
    "get_fake_prefix",
    "delete_fake_prefix",
    "wait_for_one_event",
    "NO_TRAVERSAL_LIMIT",
    "context",
    "fake_event_handle",
    "pub_sock",
    "sub_sock",
    "drain_sock_raw",
    "Schema",
    "set_topic_schema",
    "topic_schema",
    "protobuf_schema",
    "SubMaster",
    "PubMaster",
]

NO_TRAVERSAL_LIMIT = 2**64 - 1


def _version() -> str:
    """The installed distribution's (``visionipc``) version, read on first use."""
    version = globals().get("__version__")
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("visionipc")
        except metadata.PackageNotFoundError:  # a checkout on sys.path without an install
            version = "unknown (not installed)"
        globals()["__version__"] = version
    return version


# Type checkers see __version__ as a str and no module __getattr__ (which would make any
# misspelt name of msgq pass as one).
__version__: str

if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> str:
        """``msgq.__version__``: the installed distribution's (``visionipc``), read on first use."""
        if name == "__version__":
            return _version()
        raise AttributeError(f"module 'msgq' has no attribute {name!r}")


def add_version_flag(parser: "_argparse.ArgumentParser") -> None:
    """``--version`` for a command-line tool's argparse parser: "PROG VERSION"."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")


context = Context()


def fake_event_handle(
    endpoint: str,
    identifier: _typing.Optional[_typing.Union[str, bytes]] = None,
    override: bool = True,
    enable: bool = False,
) -> SocketEventHandle:
    """The fake-event handle of ``endpoint`` for ``identifier`` (default: the
    ``CEREAL_FAKE_PREFIX`` fake subscribers use). ``override`` creates fresh
    events and sets ``enabled`` to ``enable``; see :mod:`msgq.events`."""
    handle = SocketEventHandle(endpoint, get_fake_prefix() if identifier is None else identifier, override)
    if override:
        handle.enabled = enable
    return handle


def pub_sock(
    endpoint: str, segment_size: int = 0, wake: _typing.Optional[str] = None, schema: _typing.Optional[Schema] = None
) -> PubSocket:
    """A publisher on ``endpoint``. ``segment_size`` (bytes of ring; 0: the
    existing size, or 1 MiB for a new topic) bounds the largest message.
    ``wake`` (``"all"`` or ``"handoff"``; None: ``MSGQ_WAKE``, else ``"all"``):
    how a send wakes subscribers asleep in a blocking receive. ``schema``: what
    the topic's messages are (:class:`msgq.Schema`; see :mod:`msgq.schemas`)."""
    sock = PubSocket()
    sock.connect(context, endpoint, segment_size, wake)
    if schema is not None:
        try:
            set_topic_schema(endpoint, schema)
        except BaseException:
            sock.close()
            raise
    return sock


def sub_sock(
    endpoint: str,
    poller: _typing.Optional[Poller] = None,
    addr: str = "127.0.0.1",
    conflate: bool = False,
    timeout: _typing.Optional[float] = None,
    segment_size: int = 0,
) -> SubSocket:
    """A subscriber on ``endpoint``; ``conflate`` keeps only the newest
    message, ``timeout`` (ms) bounds each receive, ``poller`` registers it."""
    sock = SubSocket()
    sock.connect(context, endpoint, addr, conflate, segment_size)
    if timeout is not None:
        sock.setTimeout(timeout)
    if poller is not None:
        poller.registerSocket(sock)
    return sock


def drain_sock_raw(sock: SubSocket, wait_for_one: bool = False) -> list[bytes]:
    """Every message waiting on ``sock``; with ``wait_for_one``, first wait
    (up to the socket's timeout) until there is at least one."""
    ret: list[bytes] = []
    while True:
        dat = sock.receive() if wait_for_one and not ret else sock.receive(non_blocking=True)
        if dat is None:
            return ret
        ret.append(dat)
