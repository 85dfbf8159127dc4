"""Share of public functions and methods that declare a return type (and annotate every parameter).

    python tools/typing_coverage.py [PACKAGE_DIR ...]   (default: msgq visionipc)
    python tools/typing_coverage.py --missing [PACKAGE_DIR ...]
    python tools/typing_coverage.py --missing-apps [PACKAGE_DIR ...]
    python tools/typing_coverage.py --missing-all [PACKAGE_DIR ...]

Public: a function or method whose name and enclosing classes have no leading underscore
(dunder methods count), defined at module or class level, in any module of the package.
Each package is counted whole and as its library (without the command-line tools under apps/ and bench/).
``--missing`` lists the library's public functions that are not fully annotated (exit status 1 if any);
``--missing-apps`` the same for the library and its command-line tools under apps/ (not bench/);
``--missing-all`` for every module (the library, apps/ and the benchmarks under bench/).
"""

import ast
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
APPS = ("apps", "bench")


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _functions(tree: ast.Module) -> Iterator[Tuple[ast.FunctionDef, bool]]:
    """(function, is_method) for each public module-level function and public method of a public class."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            yield node, False
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(item.name):
                    yield item, True


def _params_annotated(func: ast.FunctionDef, is_method: bool) -> bool:
    args = func.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
    staticmethod_ = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list)
    if is_method and not staticmethod_ and params:
        params = params[1:]  # self / cls
    return all(p.annotation is not None for p in params)


def _modules(package: Path, library_only: bool, keep: Tuple[str, ...] = ()) -> Iterator[Path]:
    """The package's modules; ``library_only``: without APPS, except the folders in ``keep``."""
    for path in sorted(package.rglob("*.py")):
        top = path.relative_to(package).parts[0]
        if not (library_only and top in APPS and top not in keep):
            yield path


def coverage(package: Path, library_only: bool = False) -> Tuple[int, int, int]:
    """(public functions, with a return annotation, with every parameter and the return annotated)."""
    total = returns = full = 0
    for path in _modules(package, library_only):
        for func, is_method in _functions(ast.parse(path.read_text(), str(path))):
            total += 1
            returns += func.returns is not None
            full += func.returns is not None and _params_annotated(func, is_method)
    return total, returns, full


def missing(package: Path, keep: Tuple[str, ...] = ()) -> List[str]:
    """``path:line: name`` of each public library function (and of the folders of APPS in ``keep``)
    not fully annotated."""
    found = []
    for path in _modules(package, library_only=True, keep=keep):
        for func, is_method in _functions(ast.parse(path.read_text(), str(path))):
            if func.returns is None or not _params_annotated(func, is_method):
                found.append(f"{path.relative_to(ROOT)}:{func.lineno}: {func.name}")
    return found


def main(argv: List[str]) -> int:
    scopes = {"--missing": (), "--missing-apps": ("apps",), "--missing-all": APPS}
    if argv[:1] and argv[0] in scopes:
        keep = scopes[argv[0]]
        found = [line for name in argv[1:] or ["msgq", "visionipc"] for line in missing(ROOT / name, keep)]
        print("\n".join(found))
        return 1 if found else 0
    for name in argv or ["msgq", "visionipc"]:
        for label, library_only in ((name, False), (f"{name} library", True)):
            total, returns, full = coverage(ROOT / name, library_only)
            print(
                f"{label}: {total} public functions, {returns} ({100 * returns / max(total, 1):.0f} %) declare a "
                f"return type, {full} ({100 * full / max(total, 1):.0f} %) fully annotated"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
