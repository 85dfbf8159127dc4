"""Backends: the one place where a process picks how messages travel.

Every backend module exports the same contract (checked on load):

``NAME``
    its name, as accepted by ``MSGQ_BACKEND`` and ``Context(backend=...)``.
``Publisher(endpoint, segment_size=0)``
    ``send(data)``, ``loan(n)`` / ``commit(n)`` / ``cancel_loan()``,
    ``num_readers()``, ``all_readers_updated()``, ``close()``, ``closed``.
``Subscriber(endpoint, address, conflate, segment_size)``
    ``receive(non_blocking=False)``, ``receive_batch(max_messages, timeout_ms)``,
    ``set_timeout(ms)``, ``ready()``, ``fileno()``, ``arm()``, ``disarm()``,
    ``close()``, ``closed``.
``Poller()``
    ``add(subscriber)``, ``poll(timeout_ms) -> [indices]``, ``fileno()``.
"""

import importlib
import os

from msgq.errors import InvalidArgumentError

_MODULES = {
    "msgq": "msgq.backends.shm",
}

CONTRACT = ("NAME", "Publisher", "Subscriber", "Poller")


def available() -> tuple:
    """Names of the backends this installation provides."""
    return tuple(_MODULES)


def choose(name=None) -> str:
    """The backend to use: ``name`` if given, else ``MSGQ_BACKEND``, else ``msgq``."""
    if name is None:
        name = os.environ.get("MSGQ_BACKEND") or "msgq"
    if name not in _MODULES:
        raise InvalidArgumentError(f"unknown msgq backend {name!r}; choose one of {', '.join(_MODULES)}")
    return name


def load(name=None):
    """Import the chosen backend and check that it exports the whole contract."""
    module = importlib.import_module(_MODULES[choose(name)])
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing:
        raise ImportError(f"backend {module.__name__} lacks {', '.join(missing)}")
    return module
