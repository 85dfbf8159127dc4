"""Stream ids and server names, as the applications and other programs spell them:
the reference's opaque ints (and VisionStreamType members) or readable names. Both
become the stream's name on the wire: ``str(int(id))`` for ints, the str itself
otherwise; names that look like ints come back as ints."""

from typing import Dict, SupportsIndex, Union

from msgq.errors import InvalidArgumentError
from msgq.names import current_prefix, segment_dir, validate_name
from visionipc._visionipc import MAX_NAME_LENGTH

# A stream id: an int (or anything with __index__, such as VisionStreamType) or a name
StreamId = Union[SupportsIndex, str, bytes]
# A server name: str or bytes (the reference took bytes)
ServerName = Union[str, bytes]


def stream_key(stream: StreamId) -> str:
    if isinstance(stream, bool):
        raise InvalidArgumentError("a stream id is an int or a str, not a bool")
    if hasattr(stream, "__index__"):
        return str(stream.__index__())
    if isinstance(stream, (str, bytes)):
        return _vipc_name(stream, "stream name")
    raise InvalidArgumentError(f"a stream id is an int or a str, not {type(stream).__name__}")


def stream_id(key: str) -> Union[int, str]:
    try:
        return int(key)
    except ValueError:
        return key


def server_name(name: ServerName) -> str:
    return _vipc_name(name, "VisionIPC server name")


def _vipc_name(name: Union[str, bytes], kind: str) -> str:
    """A msgq name no longer than the native core's one limit for VisionIPC
    names (``MAX_NAME_LENGTH``: the socket address and topic are built from it)."""
    return validate_name(name, kind, MAX_NAME_LENGTH)


def run_options() -> Dict[str, str]:
    """Where this process's run lives (MSGQ_PREFIX, MSGQ_SHM_DIR): read here, once per object."""
    return {"prefix": current_prefix(), "shm_dir": segment_dir()}
