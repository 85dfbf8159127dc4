"""Typed topics and SubMaster/PubMaster (issue 34, item 3): a topic declares its schema,
kept with the topic (another process reads it; it goes with the ring, or with the stale
sweep after a SIGKILL); SubMaster decodes by the declared schema (protobuf), by a given
decoder (Cap'n Proto), or JSON, and keeps alive / freq_ok / valid per service."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import msgq
from msgq import artifacts
from msgq.names import current_prefix, segment_basename, segment_dir
from msgq.testing import unique_topic

DEADLINE_S = 20.0  # only there so that a broken check cannot hang the suite


def _schema_path(topic):
    return os.path.join(segment_dir(), segment_basename(topic, suffix="#schema"))


def _publisher(topic, rate_hz, seconds, extra=""):
    """A process that declares ``topic`` as google.protobuf.Api and publishes at ``rate_hz``."""
    code = textwrap.dedent(
        f"""
        import sys, time
        import msgq
        from google.protobuf import api_pb2
        pm = msgq.PubMaster([{topic!r}], schemas={{{topic!r}: msgq.protobuf_schema(api_pb2.Api)}})
        print("ready", flush=True)
        start = time.monotonic()
        end, i = start + {seconds}, 0
        while time.monotonic() < end:  # on a schedule: a late wake-up does not lower the rate
            pm.send({topic!r}, api_pb2.Api(name="n%d" % i, version="v1"))
            i += 1
            time.sleep(max(0.0, start + i / {rate_hz} - time.monotonic()))
        {extra}
        pm.close()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_declared_schema_is_read_by_another_process_and_goes_with_its_topic():
    topic = unique_topic("apis")
    proc = _publisher(topic, 20, 0.5)
    schema = msgq.topic_schema(topic)
    assert (schema.encoding, schema.name, schema.message_encoding) == ("protobuf", "google.protobuf.Api", "protobuf")
    from google.protobuf import api_pb2

    assert schema == msgq.protobuf_schema(api_pb2.Api)
    assert stat.S_IMODE(os.stat(_schema_path(topic)).st_mode) == 0o600
    assert proc.wait(timeout=DEADLINE_S) == 0
    assert not os.path.lexists(_schema_path(topic))  # closed with its ring
    assert msgq.topic_schema(topic) is None


def test_a_killed_publishers_schema_is_swept_with_its_ring():
    topic = unique_topic("apis")
    proc = _publisher(topic, 20, 60)
    assert msgq.topic_schema(topic) is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=DEADLINE_S)
    found = {a.file: a for a in artifacts.scan(segment_dir(), current_prefix())}
    name = os.path.basename(_schema_path(topic))
    assert found[name].kind == artifacts.SCHEMA and found[name].stale
    removed = artifacts.sweep(segment_dir(), current_prefix())
    assert name in removed and segment_basename(topic) in removed
    assert not os.path.lexists(_schema_path(topic))


def test_submaster_decodes_by_the_declared_schema_and_keeps_the_checks():
    topic, plain = unique_topic("apis"), unique_topic("raw")
    with msgq.SubMaster([topic, plain], frequency={topic: 50}) as sm:
        proc = _publisher(topic, 50, 2.0)
        deadline = time.monotonic() + DEADLINE_S
        while not (sm.alive[topic] and sm.freq_ok[topic]) and time.monotonic() < deadline:
            sm.update(100)
        assert sm.alive[topic] and sm.freq_ok[topic] and sm.valid[topic], (sm.alive, sm.freq_ok)
        message = sm[topic]
        # a class made from the declared FileDescriptorSet: this process never imported api_pb2
        assert type(message).DESCRIPTOR.full_name == "google.protobuf.Api" and message.version == "v1"
        assert sm.recv_frame[topic] <= sm.frame and sm[plain] is None and not sm.alive[plain]
        assert not sm.all_alive() and sm.all_alive([topic]) and sm.all_checks([topic])
        assert proc.wait(timeout=DEADLINE_S) == 0
        while sm.alive[topic] and time.monotonic() < deadline:  # 10 periods (0.2 s) without a message
            sm.update(50)
        assert not sm.alive[topic] and not sm.all_checks([topic])


def test_pubmaster_and_submaster_with_capnp_and_a_valid_field(tmp_path):
    capnp = pytest.importorskip("capnp")  # the 'typed' extra installs pycapnp
    source = tmp_path / "reading.capnp"
    source.write_text("@0xd5b5d2ba5e5e8a11;\nstruct Reading {\n  value @0 :Float64;\n  valid @1 :Bool;\n}\n")
    reading = capnp.load(str(source)).Reading
    topic = unique_topic("reading")
    schema = msgq.schemas.capnp_schema(reading, str(source))
    assert schema.encoding == "capnp" and b"struct Reading" in schema.data and "Reading" in schema.name
    with (
        msgq.PubMaster([topic], schemas={topic: schema}) as pm,
        msgq.SubMaster([topic], decoders={topic: msgq.schemas.capnp_decoder(reading)}) as sm,
    ):
        for value, valid in ((1.5, True), (2.5, False)):
            pm.send(topic, reading.new_message(value=value, valid=valid))
            deadline = time.monotonic() + DEADLINE_S
            sm.update(100)
            while not sm.updated[topic] and time.monotonic() < deadline:
                sm.update(100)
            assert sm[topic].value == value and sm.valid[topic] is valid
        assert msgq.topic_schema(topic) == schema


def test_json_messages_decode_and_a_bad_message_only_marks_the_service_not_valid():
    topic = unique_topic("json")
    schema = msgq.Schema("jsonschema", "Reading", json.dumps({"type": "object"}).encode())
    with msgq.PubMaster([topic], schemas={topic: schema}) as pm, msgq.SubMaster([topic]) as sm:
        for data in (b'{"v": 1}', b"{not json"):
            pm.send(topic, data)
            deadline = time.monotonic() + DEADLINE_S
            sm.update(100)
            while not sm.updated[topic] and time.monotonic() < deadline:
                sm.update(100)
        assert sm[topic] == {"v": 1} and not sm.valid[topic] and sm.decode_errors[topic] == 1


@pytest.mark.parametrize(
    "make, error, says",
    [
        (lambda: msgq.SubMaster("carState"), msgq.InvalidArgumentError, "a list of service names"),
        (lambda: msgq.SubMaster(["a", "a"]), msgq.InvalidArgumentError, "distinct service names"),
        (lambda: msgq.SubMaster(["a"], frequency={"b": 1}), msgq.InvalidArgumentError, "does not have"),
        (lambda: msgq.SubMaster(["a"], frequency={"a": 0}), msgq.InvalidArgumentError, "positive numbers"),
        (lambda: msgq.SubMaster(["a"], poll="b"), msgq.InvalidArgumentError, "not one of its services"),
        (lambda: msgq.Schema("", "x"), msgq.InvalidArgumentError, "encoding"),
        (lambda: msgq.Schema("protobuf", "x", "text"), msgq.InvalidArgumentError, "bytes"),
        (lambda: msgq.pub_sock(unique_topic("t"), schema="protobuf"), msgq.InvalidArgumentError, "msgq.Schema"),
    ],
)
def test_bad_input_is_one_clear_error(make, error, says):
    with pytest.raises(error, match=says):
        make()


def test_pubmaster_refuses_what_it_cannot_send_and_a_malformed_schema_file_is_one_error():
    topic = unique_topic("t")
    with msgq.PubMaster([topic]) as pm:
        with pytest.raises(msgq.IpcTypeError, match="encoders="):
            pm.send(topic, {"not": "bytes"})
        with pytest.raises(msgq.InvalidArgumentError, match="no service"):
            pm.send("other", b"x")
        with open(_schema_path(topic), "w") as f:
            f.write("{garbage")
        with pytest.raises(msgq.IpcError, match="malformed"):
            msgq.topic_schema(topic)


def test_msgq_top_shows_each_topics_schema():
    topic = unique_topic("apis")
    proc = _publisher(topic, 20, 60)
    try:
        top = os.path.join(os.path.dirname(sys.executable), "msgq-top")
        out = subprocess.run([top, "--json", "--interval", "0"], capture_output=True, text=True, timeout=60)
        table = subprocess.run([top, "--once", "--interval", "0"], capture_output=True, text=True, timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE_S)
        artifacts.sweep(segment_dir(), current_prefix())  # what the killed publisher left
    entry = next(t for t in json.loads(out.stdout)["topics"] if t["topic"] == topic)
    assert entry["schema"]["encoding"] == "protobuf" and entry["schema"]["name"] == "google.protobuf.Api"
    assert "protobuf:google.protobuf.Api" in table.stdout
