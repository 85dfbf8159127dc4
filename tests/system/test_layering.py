"""The applications use the libraries' public names only (issue 35): no module of
msgq/apps, visionipc/apps or visionipc/bench imports a private module of msgq or
visionipc (``msgq._printable``, ``visionipc._streams``, ...); what they need is public
(``msgq.tooling``, ``visionipc.streams``, ``visionipc.optional``)."""

import ast

from repo import ROOT

APPS = ("msgq/apps", "visionipc/apps", "visionipc/bench")


def _private_imports(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(tuple(f"{folder.replace('/', '.')}." for folder in APPS)):
                continue  # the applications' own modules (visionipc.apps._cli, ...)
            parts = name.split(".")
            if parts[0] in ("msgq", "visionipc") and any(p.startswith("_") and p != "__version__" for p in parts[1:]):
                yield node.lineno, name


def test_no_application_imports_a_private_module_of_the_libraries():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for folder in APPS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name in _private_imports(path)
    ]
    assert found == []


def test_the_check_sees_a_private_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from msgq._printable import printable\nfrom msgq import _msgq\nimport visionipc._streams\n")
    assert [name for _, name in _private_imports(sample)] == ["msgq._printable", "msgq._printable.printable",
                                                              "msgq._msgq", "visionipc._streams"]  # fmt: skip
