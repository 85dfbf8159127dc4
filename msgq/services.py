"""SubMaster and PubMaster: many topics at once, as openpilot's cereal does, over any
schema (protobuf, Cap'n Proto, JSON, or plain bytes)::

    sm = msgq.SubMaster(["pose", "gps"], frequency={"pose": 100})
    while True:
        sm.update(100)              # waits up to 100 ms for anything new, then takes all that is new
        if sm.updated["pose"]:
            use(sm["pose"])         # the newest message, decoded
        if not sm.all_checks():     # every service alive, at its frequency, valid
            ...

    pm = msgq.PubMaster(["pose"], schemas={"pose": msgq.protobuf_schema(Pose)})
    pm.send("pose", pose)           # a protobuf or pycapnp message is encoded; bytes go as they are

Decoding: ``decoders[service]`` (``bytes -> message``) if given; else from the topic's
declared schema (:mod:`msgq.schemas`): ``protobuf`` messages are decoded with a class
built from the schema's ``FileDescriptorSet``, ``jsonschema`` ones with ``json.loads``;
else the message stays ``bytes``. A message that does not decode leaves the newest good
one in place, marks the service not ``valid`` and counts it in ``decode_errors``.

Checks, per service (as openpilot's, written down here):

- ``alive``: a message arrived within 10 periods of the service's frequency
  (``frequency[service]`` if declared, else the rate measured over its last 100
  messages), or within 1 s while no frequency is known;
- ``freq_ok``: with a declared frequency, the measured one is within 0.8x-1.2x of it
  (over the last 100 messages, at least 5); without one, the same as ``alive``;
- ``valid``: the newest message decoded, and its own ``valid`` field (Cap'n Proto
  ``Event.valid``), if it has one, is true.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, TypeVar

from msgq.errors import InvalidArgumentError, IpcTypeError
from msgq.names import validate_name
from msgq.schemas import Schema, topic_schema

Decoder = Callable[[bytes], Any]
_S = TypeVar("_S", bound="_Services")
WINDOW = 100  # receive times kept per service for the measured frequency
MISSED_PERIODS = 10  # a service is not alive after this many periods without a message


def _decoder_for(schema: Optional[Schema]) -> Optional[Decoder]:
    """A decoder made from a declared schema, or None (the message stays bytes)."""
    if schema is None:
        return None
    if schema.encoding == "jsonschema":
        return json.loads
    if schema.encoding == "protobuf":
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        files = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
        pool = descriptor_pool.DescriptorPool()
        for proto in files.file:  # dependencies first, as protobuf_schema writes them
            pool.Add(proto)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name)).FromString
    return None


def _names(services: Iterable[str], what: str) -> List[str]:
    if isinstance(services, str):
        raise InvalidArgumentError(f"{what} takes a list of service names, not the string {services!r}")
    names = [validate_name(s) for s in services]
    if not names or len(set(names)) != len(names):
        raise InvalidArgumentError(f"{what} takes distinct service names, at least one: {names!r}")
    return names


class _Services:
    """What both masters share: a socket per service, closed together."""

    sock: Dict[str, Any]

    def close(self) -> None:
        for sock in self.sock.values():
            sock.close()

    def __enter__(self: "_S") -> "_S":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SubMaster(_Services):
    """The newest message of each service, with ``updated``, ``recv_time``, ``recv_frame``,
    ``alive``, ``freq_ok`` and ``valid`` per service; see the module docstring."""

    def __init__(
        self,
        services: Iterable[str],
        poll: Optional[str] = None,
        frequency: Optional[Mapping[str, float]] = None,
        decoders: Optional[Mapping[str, Decoder]] = None,
        addr: str = "127.0.0.1",
        ignore_alive: Iterable[str] = (),
        ignore_freq: Iterable[str] = (),
        ignore_valid: Iterable[str] = (),
    ) -> None:
        import msgq

        self.services = _names(services, "SubMaster")
        frequency, decoders = dict(frequency or {}), dict(decoders or {})
        for what, table in (("frequency", frequency), ("decoders", decoders)):
            unknown = set(table) - set(self.services)
            if unknown:
                raise InvalidArgumentError(f"SubMaster {what} names services it does not have: {sorted(unknown)}")
        if any(not (isinstance(f, (int, float)) and f > 0) for f in frequency.values()):
            raise InvalidArgumentError(f"SubMaster frequency takes positive numbers (Hz): {frequency!r}")
        if poll is not None and poll not in self.services:
            raise InvalidArgumentError(f"SubMaster poll={poll!r} is not one of its services")
        self.poll, self.frequency = poll, frequency
        self._decoders: Dict[str, Optional[Decoder]] = dict(decoders)  # None: the topic declares no schema
        self.ignore_alive, self.ignore_freq, self.ignore_valid = set(ignore_alive), set(ignore_freq), set(ignore_valid)
        self.frame = 0
        self.data: Dict[str, Any] = dict.fromkeys(self.services)
        self.updated = dict.fromkeys(self.services, False)
        self.recv_time = dict.fromkeys(self.services, 0.0)  # time.monotonic() of the newest message
        self.recv_frame = dict.fromkeys(self.services, 0)  # self.frame when it came
        self.alive = dict.fromkeys(self.services, False)
        self.freq_ok = dict.fromkeys(self.services, False)
        self.valid = dict.fromkeys(self.services, True)
        self.decode_errors = dict.fromkeys(self.services, 0)
        self._times: Dict[str, Deque[float]] = {s: collections.deque(maxlen=WINDOW) for s in self.services}
        self.poller = msgq.Poller()
        self.sock: Dict[str, Any] = {}
        try:
            for s in self.services:
                self.sock[s] = msgq.sub_sock(s, poller=self.poller if poll in (None, s) else None, addr=addr)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, service: str) -> Any:
        return self.data[service]

    def __contains__(self, service: str) -> bool:
        return service in self.data

    def _decode(self, service: str, data: bytes) -> Any:
        decoder = self._decoders.get(service)
        if decoder is None and service not in self._decoders:
            decoder = self._decoders[service] = _decoder_for(topic_schema(service))
        return data if decoder is None else decoder(data)

    def update(self, timeout: int = 100) -> None:
        """Wait up to ``timeout`` ms for a message (of ``poll``'s service, if given; of
        any service otherwise), then take every service's new messages: the newest of
        each is decoded and kept. Updates the checks."""
        import msgq

        self.frame += 1
        self.updated = dict.fromkeys(self.services, False)
        if timeout != 0:
            self.poller.poll(timeout)
        now = time.monotonic()
        for s in self.services:
            messages = msgq.drain_sock_raw(self.sock[s])
            if not messages:
                continue
            self._times[s].extend([now] * len(messages))
            self.updated[s], self.recv_time[s], self.recv_frame[s] = True, now, self.frame
            try:
                decoded = self._decode(s, messages[-1])
            except Exception:  # noqa: BLE001 - whatever a decoder raises: this message is not valid
                self.decode_errors[s] += 1
                self.valid[s] = False
                continue
            self.data[s] = decoded
            self.valid[s] = bool(getattr(decoded, "valid", True))
        self._check(now)

    def _rate(self, service: str) -> Optional[float]:
        times = self._times[service]
        if len(times) < 2 or times[-1] <= times[0]:
            return None
        return (len(times) - 1) / (times[-1] - times[0])

    def _check(self, now: float) -> None:
        for s in self.services:
            declared, measured = self.frequency.get(s), self._rate(s)
            rate = declared or measured
            window = MISSED_PERIODS / rate if rate else 1.0
            self.alive[s] = self.recv_time[s] > 0 and now - self.recv_time[s] < window
            if declared:
                enough = len(self._times[s]) >= 5
                self.freq_ok[s] = (
                    self.alive[s] and enough and measured is not None and 0.8 * declared <= measured <= 1.2 * declared
                )
            else:
                self.freq_ok[s] = self.alive[s]

    def _all(self, table: Dict[str, bool], ignored: set, services: Optional[Iterable[str]]) -> bool:
        names = self.services if services is None else list(services)
        return all(table[s] for s in names if s not in ignored)

    def all_alive(self, service_list: Optional[Iterable[str]] = None) -> bool:
        return self._all(self.alive, self.ignore_alive, service_list)

    def all_freq_ok(self, service_list: Optional[Iterable[str]] = None) -> bool:
        return self._all(self.freq_ok, self.ignore_freq, service_list)

    def all_valid(self, service_list: Optional[Iterable[str]] = None) -> bool:
        return self._all(self.valid, self.ignore_valid, service_list)

    def all_checks(self, service_list: Optional[Iterable[str]] = None) -> bool:
        return self.all_alive(service_list) and self.all_freq_ok(service_list) and self.all_valid(service_list)


class PubMaster(_Services):
    """A publisher per service; ``send(service, message)``. ``encoders[service]``
    (``message -> bytes``) if given; else a protobuf message is serialized
    (``SerializeToString``), a pycapnp one too (``to_bytes``), and a buffer goes as it
    is. ``schemas[service]``: the topic's declared :class:`msgq.Schema`."""

    def __init__(
        self,
        services: Iterable[str],
        encoders: Optional[Mapping[str, Callable[[Any], bytes]]] = None,
        schemas: Optional[Mapping[str, Schema]] = None,
    ) -> None:
        import msgq

        self.services = _names(services, "PubMaster")
        self._encoders, schemas = dict(encoders or {}), dict(schemas or {})
        for what, table in (("encoders", self._encoders), ("schemas", schemas)):
            unknown = set(table) - set(self.services)
            if unknown:
                raise InvalidArgumentError(f"PubMaster {what} names services it does not have: {sorted(unknown)}")
        self.sock: Dict[str, Any] = {}
        try:
            for s in self.services:
                self.sock[s] = msgq.pub_sock(s, schema=schemas.get(s))
        except BaseException:
            self.close()
            raise

    def _encode(self, service: str, message: Any) -> Any:
        encoder = self._encoders.get(service)
        if encoder is not None:
            return encoder(message)
        for method in ("SerializeToString", "to_bytes"):  # protobuf, pycapnp
            if hasattr(message, method):
                return getattr(message, method)()
        try:
            memoryview(message)
        except TypeError:
            raise IpcTypeError(
                f"PubMaster.send({service!r}, ...) takes bytes, a protobuf or a pycapnp message, "
                f"not {type(message).__name__} (or give encoders={{{service!r}: ...}})"
            ) from None
        return message

    def send(self, service: str, message: Any) -> None:
        sock = self.sock.get(service)
        if sock is None:
            raise InvalidArgumentError(f"PubMaster has no service {service!r} (it has {self.services})")
        sock.send(self._encode(service, message))

    def wait_for_readers_to_update(self, service: str, timeout: float, dt: float = 0.05) -> bool:
        """Wait up to ``timeout`` s until every reader of ``service`` has read all it was sent."""
        deadline = time.monotonic() + timeout
        while not self.sock[service].all_readers_updated():
            if time.monotonic() >= deadline:
                return False
            time.sleep(dt)
        return True

    def all_readers_updated(self, service: str) -> bool:
        return bool(self.sock[service].all_readers_updated())
