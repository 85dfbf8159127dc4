"""Typed topics: a topic may declare the schema of its messages, kept with the topic
so that the tools show it and carry it (``msgq-top``, ``vipc-record``'s MCAP channels,
``vipc-foxglove``'s advertised channels).

A :class:`Schema` is what MCAP and Foxglove call one: an ``encoding`` (``protobuf``,
``capnp``, ``jsonschema``, ``ros2msg``, ``ros2idl``, ``flatbuffer``, ``omgidl``...), a
``name`` (``foxglove.Pose``, ``cereal.Event``) and the schema's bytes (a serialized
``FileDescriptorSet``, a JSON schema, a ``.capnp`` or ``.msg`` text). The messages stay
bytes; the schema says how to read them::

    pub = msgq.pub_sock("pose", schema=msgq.protobuf_schema(Pose))
    msgq.topic_schema("pose")            # Schema('protobuf', 'foxglove.Pose', ...)

Where it is kept: a file ``msgq@[PREFIX@]TOPIC#schema`` beside the topic's ring in the
shared-memory directory (owner-only, written atomically, the newest publisher's wins),
removed by the stale sweep once the topic's ring is gone (``msgq.artifacts``).
``msgq-bridge`` carries it to the other host (an announcement when a subscriber joins);
the ``zmq`` backend's remote subscribers do not see it.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import tempfile
from typing import Any, Callable, Optional

from msgq.errors import InvalidArgumentError, IpcError
from msgq.names import segment_basename, segment_dir

SUFFIX = "#schema"
# msgq-bridge carries a topic's schema as a two-frame ZeroMQ message [ANNOUNCE, JSON] (every
# msgq message is one frame), sent by `out` when a remote subscriber joins.
ANNOUNCE = b"\x00msgq-schema\x00"
MAX_SCHEMA_BYTES = 16 << 20  # a schema file larger than this is refused (it is someone else's)
# The JSON body of the largest schema (its bytes in base64, its names): the most a schema
# file or a bridge's announcement of one may hold.
MAX_BODY_BYTES = 4 * MAX_SCHEMA_BYTES // 3 + 1024

# What a message of each schema encoding is encoded as (MCAP's well-known encodings).
MESSAGE_ENCODING = {
    "protobuf": "protobuf",
    "capnp": "capnp",
    "jsonschema": "json",
    "ros2msg": "cdr",
    "ros2idl": "cdr",
    "omgidl": "cdr",
    "ros1msg": "ros1",
    "flatbuffer": "flatbuffer",
}


@dataclasses.dataclass(frozen=True)
class Schema:
    """What a topic's messages are: ``encoding`` (of the schema), ``name``, ``data``."""

    encoding: str
    name: str
    data: bytes = b""

    def __post_init__(self) -> None:
        for field in ("encoding", "name"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value or not value.isprintable() or len(value) > 256:
                raise InvalidArgumentError(f"a schema's {field} is a printable string of 1-256 characters: {value!r}")
        if not isinstance(self.data, (bytes, bytearray)):
            raise InvalidArgumentError(f"a schema's data is bytes, not {type(self.data).__name__}")
        if len(self.data) > MAX_SCHEMA_BYTES:
            raise InvalidArgumentError(f"a schema of {len(self.data)} bytes; at most {MAX_SCHEMA_BYTES}")
        object.__setattr__(self, "data", bytes(self.data))

    @property
    def message_encoding(self) -> str:
        """How its messages are encoded, by MCAP's names (``protobuf``, ``json``, ``cdr``...)."""
        return MESSAGE_ENCODING.get(self.encoding, self.encoding)

    def __repr__(self) -> str:
        return f"Schema({self.encoding!r}, {self.name!r}, <{len(self.data)} bytes>)"


def _path(topic: str) -> str:
    return os.path.join(segment_dir(), segment_basename(topic, suffix=SUFFIX))


def set_topic_schema(topic: str, schema: Optional[Schema]) -> None:
    """Declare ``topic``'s schema (None: remove the declaration). ``pub_sock(topic,
    schema=...)`` does this when the publisher is made."""
    path = _path(topic)
    if schema is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    if not isinstance(schema, Schema):
        raise InvalidArgumentError(f"schema= takes a msgq.Schema, not {type(schema).__name__}")
    body = _body(schema)
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + "~")  # mode 600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _body(schema: Schema) -> dict:
    return {"encoding": schema.encoding, "name": schema.name, "data": base64.b64encode(schema.data).decode()}


def _from_body(body: Any) -> Schema:
    return Schema(body["encoding"], body["name"], base64.b64decode(body["data"], validate=True))


def announcement(schema: Schema) -> list:
    """The frames msgq-bridge sends to carry ``schema``: ``[ANNOUNCE, JSON]``."""
    return [ANNOUNCE, json.dumps(_body(schema)).encode()]


def from_announcement(frames: list) -> Optional[Schema]:
    """The schema in frames from the network, None if they are not an announcement;
    IpcError if they claim to be one but are malformed (a peer's bytes)."""
    if len(frames) != 2 or bytes(frames[0]) != ANNOUNCE:
        return None
    if len(frames[1]) > MAX_BODY_BYTES:
        raise IpcError("a schema announcement larger than any schema")
    try:
        return _from_body(json.loads(bytes(frames[1])))
    except (ValueError, KeyError, TypeError, InvalidArgumentError) as e:
        raise IpcError(f"a malformed schema announcement ({e})") from None


def forget_schema(topic: str, publisher: bool, backend: str) -> None:
    """After a socket of ``topic`` closed: remove its schema file once nothing declares it
    any more (the shared-memory ring is gone: its last participant left; with the zmq
    backend, which has no ring, when the publisher closes). Errors are ignored: the
    stale sweep removes what is left (msgq.artifacts)."""
    try:
        path = _path(topic)
        if not os.path.lexists(path):
            return
        ring = path[: -len(SUFFIX)]
        if (backend == "zmq" and publisher) or (backend != "zmq" and not os.path.lexists(ring)):
            os.unlink(path)
    except (OSError, IpcError):
        pass


def topic_schema(topic: str) -> Optional[Schema]:
    """``topic``'s declared schema, or None. A file that is not ours (another user's, a
    link, too large, malformed) raises :class:`IpcError` saying so."""
    return read_schema_file(_path(topic), topic)


def read_schema_file(path: str, topic: str) -> Optional[Schema]:
    """The schema in file ``path`` (``TOPIC#schema``), or None if there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise IpcError(f"topic {topic!r}: cannot read its schema file {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            raise IpcError(f"topic {topic!r}: its schema file {path} belongs to another user")
        raw = f.read(MAX_BODY_BYTES)
    try:
        return _from_body(json.loads(raw))
    except (ValueError, KeyError, TypeError, InvalidArgumentError) as e:
        raise IpcError(f"topic {topic!r}: its schema file {path} is malformed ({e})") from None


# ------------------------------------------------------------------ helpers for two schema languages


def protobuf_schema(message_class: Any) -> Schema:
    """The schema of a protobuf message class: its ``FileDescriptorSet`` (with every file
    it imports), as MCAP and Foxglove take it."""
    from google.protobuf import descriptor_pb2

    files, seen = descriptor_pb2.FileDescriptorSet(), set()

    def add(fd):
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            add(dep)
        fd.CopyToProto(files.file.add())

    descriptor = message_class.DESCRIPTOR
    add(descriptor.file)
    return Schema("protobuf", descriptor.full_name, files.SerializeToString())


def protobuf_decoder(message_class: Any) -> Callable[[bytes], Any]:
    """``bytes -> message`` for :class:`msgq.SubMaster`'s ``decoders``."""
    return message_class.FromString


def capnp_schema(struct: Any, source: str) -> Schema:
    """The schema of a Cap'n Proto struct (pycapnp): the ``.capnp`` file's text
    (``source``: its path) and the struct's name."""
    with open(source, "rb") as f:
        text = f.read()
    name = getattr(getattr(struct, "schema", None), "node", None)
    display = getattr(name, "displayName", None) or getattr(struct, "__name__", "struct")
    return Schema("capnp", str(display), text)


def capnp_decoder(struct: Any) -> Callable[[bytes], Any]:
    """``bytes -> message`` (a struct reader of pycapnp; the bytes are kept alive with it)."""

    def decode(data: bytes) -> Any:
        with struct.from_bytes(data) as message:  # pycapnp >= 2: a context manager
            return message.as_builder()

    return decode


def capnp_encoder() -> Callable[[Any], bytes]:
    """``message -> bytes`` for :class:`msgq.PubMaster`'s ``encoders`` (``to_bytes()``)."""
    return lambda message: message.to_bytes()
