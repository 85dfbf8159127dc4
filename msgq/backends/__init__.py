"""Backends: the one place where a process picks how messages travel.

Every backend module exports the same contract (the names are checked on
load; the conformance suite in tests/msgq/test_conformance.py checks behaviour):

``NAME``
    its name, as accepted by ``MSGQ_BACKEND`` and ``Context(backend=...)``.
``Publisher(endpoint, segment_size=0, wake=None)``
    ``send(data)`` (bytes or any C-contiguous buffer; ``TypeError`` otherwise),
    ``loan(n)`` -> a writable buffer-protocol object of n bytes, ``commit(n)``,
    ``cancel_loan()``, ``num_readers()``, ``all_readers_updated()``,
    properties ``max_message_size``, ``segment_size``, ``messages_sent``,
    ``handoff_wakes`` (``wake``, else ``MSGQ_WAKE``, is "handoff"; a bad
    value is an ``InvalidArgumentError`` before anything is made),
    ``readers_woken``, ``closed``, and ``close()``.
``Subscriber(endpoint, address, conflate, segment_size)``
    ``receive(non_blocking=False)`` -> bytes or None (honours ``set_timeout``),
    ``receive_batch(max_messages, timeout_ms)`` -> list of bytes,
    ``set_timeout(ms)`` (-1: forever), ``ready()``, ``fileno()``,
    ``arm()`` (True if a message is already there, else the fd becomes
    readable when one may be), ``disarm()``, properties ``resets``,
    ``spin_us`` (settable), ``conflate``, ``segment_size``, ``closed``, and
    ``close()``. Errors are the classes of ``msgq.errors``.
``Poller()``
    ``add(subscriber)``, ``poll(timeout_ms) -> [indices in add order]``,
    ``fileno()``.
"""

import importlib
import os
import types
from typing import Optional

from msgq.errors import InvalidArgumentError

_MODULES = {
    "msgq": "msgq.backends.shm",
    "zmq": "msgq.backends.zmq",
    "fake": "msgq.backends.fake",
}

CONTRACT = ("NAME", "Publisher", "Subscriber", "Poller")


def available() -> tuple:
    """Names of the backends this installation provides."""
    return tuple(_MODULES)


def choose(name: Optional[str] = None) -> str:
    """The backend to use: ``name`` if given, else ``MSGQ_BACKEND``, else the
    reference's switches (``CEREAL_FAKE`` set: ``fake``; ``ZMQ`` set: ``zmq``),
    else ``msgq``."""
    if name is None:
        name = os.environ.get("MSGQ_BACKEND")
    if not name:
        name = "fake" if os.environ.get("CEREAL_FAKE") else "zmq" if os.environ.get("ZMQ") else "msgq"
    if name not in _MODULES:
        raise InvalidArgumentError(f"unknown msgq backend {name!r}; choose one of {', '.join(_MODULES)}")
    return name


def load(name: Optional[str] = None) -> types.ModuleType:
    """Import the chosen backend and check that it exports the whole contract."""
    module = importlib.import_module(_MODULES[choose(name)])
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing:
        raise ImportError(f"backend {module.__name__} lacks {', '.join(missing)}")
    return module
