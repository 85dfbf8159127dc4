"""The error kinds are written in five places (issue 35: "with no test that they agree"):
the core's enum (cpp/common/errors.h), the public C++ API's (cpp/include/vipc/error.h),
the translation between them (cpp/api/errors.cc), the Python exception each kind
becomes (cpp/python/bindings.h) and the Python classes (msgq/errors.py). This test reads
all five and fails on any kind that one of them lacks or maps elsewhere."""

import re

from repo import ROOT

import msgq.errors

CPP = ROOT / "cpp"


def _enum(path, pattern):
    body = re.search(r"enum class ErrorKind \{(.*?)\};", path.read_text(), re.S).group(1)
    return re.findall(pattern, body, re.M)


def _snake(kind):
    return re.sub(r"(?<!^)([A-Z])", r"_\1", kind[1:]).lower()  # kMessageTooLarge -> message_too_large


def test_the_core_and_the_public_api_have_the_same_kinds_in_the_same_order():
    core = _enum(
        CPP / "common" / "errors.h",
        r"^\s*(k[A-Za-z]+),",
    )
    public = _enum(CPP / "include" / "vipc" / "error.h", r"^\s*([a-z_]+),")
    assert len(core) >= 10 and [_snake(k) for k in core] == public


def test_the_api_translates_every_core_kind_to_its_namesake():
    text = (CPP / "api" / "errors.cc").read_text()
    pairs = dict(re.findall(r"case ErrorKind::(k[A-Za-z]+):\s*out = vipc::ErrorKind::([a-z_]+);", text))
    core = _enum(CPP / "common" / "errors.h", r"^\s*(k[A-Za-z]+),")
    assert sorted(pairs) == sorted(core)
    assert all(_snake(k) == v for k, v in pairs.items())


def test_every_core_kind_becomes_a_python_exception_of_msgq_errors():
    text = (CPP / "python" / "bindings.h").read_text()
    mapped = dict(re.findall(r'case vipc::common::ErrorKind::(k[A-Za-z]+):\s*return "([A-Za-z]+)";', text))
    core = _enum(CPP / "common" / "errors.h", r"^\s*(k[A-Za-z]+),")
    assert re.search(r"case vipc::common::ErrorKind::kIpc:\s*break;", text)  # kIpc: the base class, IpcError
    assert sorted(mapped) == sorted(k for k in core if k != "kIpc")
    for kind, name in mapped.items():
        cls = getattr(msgq.errors, name)
        assert issubclass(cls, msgq.errors.IpcError) and name in msgq.errors.__all__, (kind, name)
    assert len(set(mapped.values())) == len(mapped)  # no two kinds share an exception


def test_every_python_error_is_an_ipc_error_and_exported():
    for name in msgq.errors.__all__:
        cls = getattr(msgq.errors, name)
        assert isinstance(cls, type) and issubclass(cls, msgq.errors.IpcError), name
        assert getattr(msgq, name) is cls  # msgq re-exports every one
