"""The name rules and the segment file-name pattern live in the C++ core
(cpp/common/names.h) and reach Python through the binding, as the format table
does: msgq.names reads its constants from _msgq and has the core build the file
names, so Python, the C++ API and VisionIPC accept, refuse and name alike."""

import ast
import os
from pathlib import Path

import pytest

import msgq
from msgq import _msgq, names
from msgq.errors import InvalidArgumentError, InvalidNameError
from msgq.testing import unique_topic
from visionipc import VisionIpcServer, _visionipc

HOSTILE = [
    "",
    ".",
    "..",
    "a..b",
    ".hidden",
    "a/b",
    "/abs",
    "a@b",  # '@' separates the prefix in file names: never in a name
    "a#b",
    "a~b",
    "sp ace",
    "tab\t",
    "nul\0byte",
    "esc\x1b[2J",
    "ünïcode",
    "rtl\u202eabc",
    "x" * 101,
    "x" * 128,
    "x" * 129,
    "ok_A-9.:z",
    "-dash",
    "a.b",
]


def python_verdict(name, kind, limit):
    try:
        names.validate_name(name, kind, limit)
    except InvalidNameError as e:
        return str(e)
    return None


def core_verdict(name, kind, limit):
    try:
        _msgq.check_name(kind, name.encode("utf-8", "surrogateescape"), limit)
    except InvalidArgumentError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", HOSTILE)
def test_python_and_the_core_refuse_each_hostile_name_in_the_same_words(name):
    for kind, limit in (("topic name", names.MAX_NAME_LENGTH), ("prefix", names.MAX_PREFIX_LENGTH)):
        assert python_verdict(name, kind, limit) == core_verdict(name, kind, limit)
    # VisionIPC's server names: the same rule with its own limit, checked by its C++ server too
    python = python_verdict(name, "server name", _visionipc.MAX_NAME_LENGTH)
    try:
        _visionipc.Server(name).close()
        native = None
    except InvalidArgumentError as e:
        native = str(e)
    assert (python is None) == (native is None), (python, native)
    if python is not None:
        with pytest.raises(InvalidNameError):
            VisionIpcServer(name)


def test_every_character_is_judged_by_the_exported_character_set():
    allowed = set(names.NAME_CHARACTERS)
    assert allowed == set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")
    for code in range(1, 256):
        ch = chr(code)
        assert (core_verdict("a" + ch, "topic name", 128) is None) == (ch in allowed), repr(ch)
        assert (python_verdict("a" + ch, "topic name", 128) is None) == (ch in allowed), repr(ch)


@pytest.mark.parametrize("prefix", ["", "run-1"])
def test_the_segment_file_name_is_the_cores(prefix, monkeypatch):
    assert names.SEGMENT_PREFIX == _msgq.SEGMENT_PREFIX == "msgq@"
    assert names.SEGMENT_DIR == _msgq.SEGMENT_DIR == "/dev/shm"
    assert names.run_segment_prefix(prefix) == (f"msgq@{prefix}@" if prefix else "msgq@")
    assert names.segment_basename("t", prefix, "#ordered") == names.run_segment_prefix(prefix) + "t#ordered"
    if prefix:
        monkeypatch.setenv("MSGQ_PREFIX", prefix)
    topic = unique_topic()
    with msgq.pub_sock(topic) as pub:  # the file a real publisher made, named by the core
        assert os.path.basename(pub._impl.path) == names.segment_basename(topic)


def test_names_py_states_no_rule_of_its_own():
    tree = ast.parse(Path(names.__file__).read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    literals = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }
    assert not {lit for lit in literals if "msgq@" in lit or "/dev/shm" in lit or "A-Za-z" in lit}
