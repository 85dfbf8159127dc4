"""Topic names, run prefixes and where their shared memory lives.

A name is 1-128 characters of ``[A-Za-z0-9_.:-]``, not starting with ``.`` and
never containing ``..``; a prefix follows the same rule with at most 64
characters. ``MSGQ_PREFIX`` (or the reference's ``OPENPILOT_PREFIX``)
isolates every segment and socket of a run.

The rules and the file-name pattern are the C++ core's (``cpp/common/names.h``),
exported by the binding: the constants below are read from it, and the checks
and file names are made by it, so Python and the C++ API agree by construction.
"""

import os
from typing import Optional, Union

from msgq import _msgq
from msgq.errors import InvalidArgumentError, InvalidNameError

MAX_NAME_LENGTH = _msgq.MAX_TOPIC_NAME_LENGTH
MAX_PREFIX_LENGTH = _msgq.MAX_PREFIX_LENGTH
NAME_CHARACTERS = _msgq.NAME_CHARACTERS  # every character a name may use
SEGMENT_DIR = _msgq.SEGMENT_DIR  # unless MSGQ_SHM_DIR says otherwise
SEGMENT_PREFIX = _msgq.SEGMENT_PREFIX  # how every file name of the project starts


def _check(kind: str, name: Union[str, bytes], limit: int) -> str:
    """The rule itself is the C++ core's (``cpp/common/names.cc``), so Python and the
    C++ API accept exactly the same names; here only the Python types."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} must be a str, not {type(name).__name__}")
    try:
        _msgq.check_name(kind, name.encode("utf-8", "surrogateescape"), limit)
    except InvalidArgumentError as e:
        raise InvalidNameError(str(e)) from None
    return name


def validate_name(name: Union[str, bytes], kind: str = "topic name", max_length: int = MAX_NAME_LENGTH) -> str:
    """Return ``name`` as a str, or raise :class:`InvalidNameError`."""
    return _check(kind, name, max_length)


def current_prefix() -> str:
    """The run prefix from ``MSGQ_PREFIX`` or ``OPENPILOT_PREFIX`` ("" if neither is set)."""
    prefix = os.environ.get("MSGQ_PREFIX") or os.environ.get("OPENPILOT_PREFIX") or ""
    return _check("prefix", prefix, MAX_PREFIX_LENGTH) if prefix else ""


def segment_dir() -> str:
    """Directory of the segment files (``MSGQ_SHM_DIR``, default ``/dev/shm``)."""
    return os.environ.get("MSGQ_SHM_DIR", SEGMENT_DIR)


def run_segment_prefix(prefix: str) -> str:
    """How every segment file name of run ``prefix`` starts: ``msgq@PREFIX@``
    (``msgq@`` without a prefix); the C++ core's ``run_segment_prefix``."""
    return _msgq.run_segment_prefix(prefix)


def segment_basename(topic: str, prefix: Optional[str] = None, suffix: str = "", kind: str = "topic name") -> str:
    """File name of a topic's segment: ``msgq@TOPIC`` or ``msgq@PREFIX@TOPIC``,
    then ``suffix`` (``#broadcast`` and ``#ordered`` files of msgq.broadcast and
    msgq.ordered). ``kind`` names the topic in the error of an invalid one."""
    topic = validate_name(topic, kind)
    prefix = current_prefix() if prefix is None else prefix
    return _msgq.segment_basename(prefix, topic) + suffix


ZMQ_BASE_PORT = 8023
ZMQ_PORT_SPAN = 65535 - ZMQ_BASE_PORT  # 57512, as in the reference


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def zmq_port(topic: str, prefix: Optional[str] = None) -> int:
    """TCP port of a topic on the ZeroMQ backend: ``8023 + fnv1a64(key) % 57512``
    with key = ``TOPIC``, or ``PREFIX@TOPIC`` under a run prefix (the
    reference's formula, made prefix-aware so isolated runs do not collide)."""
    topic = validate_name(topic)
    prefix = current_prefix() if prefix is None else prefix
    key = f"{prefix}@{topic}" if prefix else topic
    return ZMQ_BASE_PORT + _fnv1a64(key.encode()) % ZMQ_PORT_SPAN
