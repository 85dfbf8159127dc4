"""What stubtest cannot see in a pybind11 module: its functions have no
``__text_signature__``, so stubtest checks that each name exists but not its
parameters. pybind11 writes the signature as the first line of each docstring
(``name(self: T, stream: str, arg1: int = 0) -> R``); this compares those
parameters with the stub's: the same names in the same order, positional-only
where pybind11 named them ``argN`` (no keyword), and the same defaults.
Methods whose docstring is not pybind11's (hand-written fastcall methods) are
skipped."""

import ast
import importlib
import re
from pathlib import Path
from typing import Any, List, Optional, Tuple

_SIGNATURE = re.compile(r"^(\w+)\(([^)]*)\)")
_POSITIONAL = re.compile(r"arg\d+")


def _split(params: str) -> List[str]:
    """Split at the commas outside brackets (types such as ``Sequence[int | None]``)."""
    parts, depth, current = [], 0, ""
    for ch in params:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*parts, current.strip()] if p]


def runtime_params(obj: Any) -> Optional[List[Tuple[str, bool]]]:
    """(name, has a default) per parameter from pybind11's docstring, or None."""
    lines = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    m = _SIGNATURE.match(lines[0]) if lines else None
    if not m or (m.group(2) and ":" not in m.group(2)):
        return None
    named = [(p.split(":")[0].split("=")[0].strip(), "=" in p) for p in _split(m.group(2))]
    return [(name, default) for name, default in named if name != "self"]


def _stub_params(func: ast.FunctionDef, method: bool) -> List[Tuple[str, bool, bool]]:
    """(name, has a default, positional-only) per parameter of a stub function."""
    a = func.args
    names = [(p.arg, True) for p in a.posonlyargs] + [(p.arg, False) for p in a.args]
    names = names[1:] if method else names
    first_default = len(names) - len(a.defaults)
    return [(name, i >= first_default, positional) for i, (name, positional) in enumerate(names)]


def _compare(where: str, runtime: List[Tuple[str, bool]], stub: List[Tuple[str, bool, bool]]) -> List[str]:
    if len(runtime) != len(stub):
        return [f"{where}: the module takes {[n for n, _ in runtime]}, the stub {[n for n, *_ in stub]}"]
    problems = []
    for (name, default), (stub_name, stub_default, positional) in zip(runtime, stub):
        if not _POSITIONAL.fullmatch(name):
            if name != stub_name:
                problems.append(f"{where}: the stub's {stub_name!r} is {name!r} in the module")
        elif not positional:
            problems.append(f"{where}: {stub_name} takes no keyword in the module ({name}): put it before '/'")
        if default != stub_default:
            problems.append(f"{where}: {stub_name} {'has' if default else 'has no'} default in the module")
    return problems


def mismatches(module: str, stub: Path) -> List[str]:
    """Every difference between the pybind11 signatures of ``module`` and its ``stub``."""
    problems: List[str] = []

    def visit(body: List[ast.stmt], owner: Any, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, getattr(owner, node.name), f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef) and not node.decorator_list:
                runtime = runtime_params(getattr(owner, node.name, None))
                if runtime is not None:
                    where = f"{module}.{prefix}{node.name}"
                    problems.extend(_compare(where, runtime, _stub_params(node, bool(prefix))))

    visit(ast.parse(stub.read_text()).body, importlib.import_module(module), "")
    return problems
