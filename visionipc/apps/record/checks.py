"""A recording is untrusted input: the checks every reader of one shares (the
reader, vipc-replay, the Spark pipeline).

- ``open_file(folder, relpath)``: a file the recording names, opened only if it is a
  regular file inside ``folder``: the path is relative with no ``..``, no component is
  a symlink (``O_NOFOLLOW`` on every step, each opened relative to the one before),
  and the last step is opened ``O_NONBLOCK`` then ``fstat``-ed, so a FIFO, device,
  socket or directory is refused instead of blocking the reader forever.
- ``parse_manifest(data, where)``: recording.json's bytes -> a checked dict (size,
  JSON nesting depth, stream names, formats, frame sizes).
- ``check_stream(name, where)``: a stream name as every VisionIPC stream is named
  (``visionipc.streams.stream_key``): never ``/``, ``..`` or a leading ``.``.
- ``reading(path)``: the one door every reader of a recording's files, an MCAP segment
  or a ROS 2 bag goes through. Whatever a parsing library raises inside it (numpy's
  ``cannot reshape``, mcap's ``RecordLengthLimitExceeded`` / ``EndOfFile``, ``KeyError``,
  protobuf's ``DecodeError``, ``ZstdError``, ``UnicodeDecodeError``, PyAV's ``FFmpegError``,
  OpenCV's ``cv2.error``, ...) leaves it as one ``RecordingError`` naming the file by its
  path and the place in it the reader had reached (``place.at``: a message, a frame
  position, a byte offset).
- ``check_size(width, height, where)``: the frame size every format may describe
  (1..MAX_SIDE a side), recordings, MCAP segments and ROS 2 bags alike.

Every failure is a ``RecordingError`` (a ``UsageError``: one line, exit status 2),
whose text shows names escaped (``msgq.printable``).
"""

import contextlib
import errno
import json
import os
import stat
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

from msgq.errors import IpcError
from msgq.tooling import printable
from visionipc.apps.record.layout import MANIFEST, manifest_path
from visionipc.optional import UsageError

MAX_MANIFEST_BYTES = 1 << 20  # recording.json is a few KiB
MAX_JSON_DEPTH = 8  # recording.json nests 4 deep
MAX_SIDE = 16384  # widest / tallest frame a recording may describe
MAX_STREAMS = 256
MAX_REASON = 240  # characters of a library's own message kept in a RecordingError


StrPath = Union[str, "os.PathLike[str]"]  # a recording's folder or file
Manifest = Dict[str, Any]  # recording.json, as parse_manifest checked it


class RecordingError(UsageError, ValueError):
    """A recording that cannot be read: missing, broken or hostile files in it."""


def _error(where: StrPath, what: str) -> RecordingError:
    return RecordingError(f"{printable(os.fspath(where))}: {what}")


def _parts(relpath: object, folder: StrPath) -> List[str]:
    if not isinstance(relpath, str):
        raise _error(folder, f"a file name in the recording must be a str, not {type(relpath).__name__}")
    parts = relpath.split("/")
    if relpath.startswith("/") or "\0" in relpath or any(p in ("", ".", "..") for p in parts):
        raise _error(folder, f"'{printable(relpath)}' is not a path inside the recording (absolute, '..' or empty)")
    return parts


def check_relpath(relpath: str, folder: StrPath) -> str:
    """``relpath`` if it can name a file inside ``folder`` (relative, no ``..``), else RecordingError."""
    _parts(relpath, folder)
    return relpath


def open_file(folder: StrPath, relpath: str) -> int:
    """A descriptor (O_RDONLY, close-on-exec; the caller closes it) of the regular file
    ``relpath`` (``/``-separated) inside the recording ``folder``, or RecordingError."""
    parts = _parts(relpath, folder)
    shown = f"{printable(os.fspath(folder))}/{printable(relpath)}"
    step = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    fd: Optional[int] = None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = os.open(part, step | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = nxt
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RecordingError(f"cannot open {shown}: not a regular file ({_kind(mode)})")
        os.set_blocking(fd, True)
        opened, fd = fd, None
        return opened
    except FileNotFoundError:
        raise RecordingError(f"cannot open {shown}: no such file") from None
    except OSError as e:  # ELOOP / ENOTDIR: a symlink or a non-folder on the way
        why = (
            "a symlink on the way"
            if e.errno in (errno.ELOOP, errno.ENOTDIR)
            else "not a regular file (a socket or a device)"
            if e.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP)
            else e.strerror
        )
        raise RecordingError(f"cannot open {shown}: {why}") from None
    finally:
        if fd is not None:
            os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def read_file(folder: StrPath, relpath: str, limit: int) -> bytes:
    """The bytes of ``open_file(folder, relpath)``; larger than ``limit``: RecordingError."""
    with os.fdopen(open_file(folder, relpath), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _error(os.path.join(folder, relpath), f"larger than {limit} bytes: not a file this format writes")
    return data


class Place:
    """Where a reader is in an untrusted file: ``at`` ("message 3", "frame position 5", ...)
    is set by the reader as it goes and named in the error of anything that fails there;
    ``alias`` is another name a library knows the file by (the checked descriptor's
    /proc/self/fd path FFmpeg opens), shown as ``path`` in its messages."""

    def __init__(self, path: StrPath, at: str = "", alias: Optional[str] = None) -> None:
        self.path, self.at, self.alias = os.fspath(path), at, alias

    def error(self, what: str) -> "RecordingError":
        where = f"{printable(self.path)}: {self.at}" if self.at else printable(self.path)
        return RecordingError(f"{where}: {what}")


@contextlib.contextmanager
def reading(path: StrPath, at: str = "", alias: Optional[str] = None) -> Iterator[Place]:
    """``with reading(path) as place:`` the one door for parsing an untrusted file: any
    exception the parsing raises (a library's error, or a RecordingError that does not name
    the file) leaves as a RecordingError naming ``path`` and ``place.at``, its type and
    reason kept on the same line. UsageError (a missing package) and BaseExceptions
    (Ctrl-C, a closed generator) pass as they are."""
    place = Place(path, at, alias)
    try:
        yield place
    except RecordingError as e:
        if printable(place.path) in str(e):
            raise
        raise place.error(str(e)) from None
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a parser of hostile bytes raises
        reason = str(e).replace(place.alias, place.path) if place.alias else str(e)
        reason = printable(reason) or "(no message)"
        if len(reason) > MAX_REASON:
            reason = reason[:MAX_REASON] + "..."
        raise place.error(f"{type(e).__name__}: {reason}") from None


def check_size(width: object, height: object, where: StrPath) -> None:
    """RecordingError unless ``width`` x ``height`` is a frame size a recording may hold."""
    for key, value in (("width", width), ("height", height)):
        _side({key: value}, key, where)


def proc_path(fd: int) -> str:
    """A path naming the open file ``fd`` itself (for libraries that want a path, such as
    FFmpeg): opening it reaches the checked file, whatever is renamed meanwhile."""
    return f"/proc/self/fd/{fd}"


def check_stream(name: object, where: StrPath) -> str:
    from visionipc.streams import stream_key

    try:
        if not isinstance(name, str):
            raise IpcError(f"a stream name is a str, not {type(name).__name__}")
        return stream_key(name)
    except IpcError as e:
        raise _error(where, printable(str(e))) from None


def _depth(doc: object) -> int:
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        todo.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def _side(info: Mapping[str, object], key: str, where: StrPath) -> int:
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
        raise _error(where, f"{key} {printable(repr(value))[:40]} is not an int in 1..{MAX_SIDE}")
    return value


def parse_manifest(data: bytes, where: StrPath) -> Manifest:
    """recording.json's bytes -> its dict, checked: at most MAX_MANIFEST_BYTES, nested at
    most MAX_JSON_DEPTH deep, ``streams`` named like VisionIPC streams, each with a known
    format and a width and height in 1..MAX_SIDE; ``topics`` a list of topic names.

    Written out rather than with jsonschema (issue 34, item 5 asked why), measured on the
    2-core VM (2026-11-27): ``import jsonschema`` alone took 100-185 ms, paid by every
    vipc-replay and vipc-analyze start and every Spark task that opens a recording, while
    these checks take 65 µs for a 4-stream recording.json; the names are checked by the
    core's name rule, which a JSON Schema pattern would only copy."""
    from msgq.names import validate_name
    from visionipc.formats import FORMATS

    if len(data) > MAX_MANIFEST_BYTES:
        raise _error(where, f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise _error(where, f"JSON nested deeper than {MAX_JSON_DEPTH}") from None
    except ValueError as e:  # also UnicodeDecodeError
        raise _error(where, f"not JSON ({printable(str(e))})") from None
    if not isinstance(doc, dict):
        raise _error(where, "not a JSON object")
    if _depth(doc) > MAX_JSON_DEPTH:
        raise _error(where, f"JSON nested deeper than {MAX_JSON_DEPTH}")
    streams = doc.get("streams", {})
    if not isinstance(streams, dict) or len(streams) > MAX_STREAMS:
        raise _error(where, f"'streams' must be an object of at most {MAX_STREAMS} streams")
    for name, info in streams.items():
        check_stream(name, where)
        if not isinstance(info, dict):
            raise _error(where, f"stream {name!r} is not an object")
        if info.get("format") not in FORMATS:
            raise _error(
                where, f"stream {name!r}: format {printable(repr(info.get('format')))[:40]} is not one of {FORMATS}"
            )
        _side(info, "width", where)
        _side(info, "height", where)
    topics = doc.get("topics", [])
    if not isinstance(topics, list):
        raise _error(where, "'topics' must be a list of topic names")
    for topic in topics:
        try:
            validate_name(topic, "topic name")
        except IpcError as e:
            raise _error(where, printable(str(e))) from None
    return doc


def read_manifest_file(folder: str) -> Manifest:
    """``folder/recording.json`` read safely and checked (``parse_manifest``)."""
    return parse_manifest(read_file(folder, MANIFEST, MAX_MANIFEST_BYTES), manifest_path(folder))
