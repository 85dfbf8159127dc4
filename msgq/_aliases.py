"""Old module paths kept working after a move (DEPRECATED paths, not new API).

The applications moved under ``msgq.apps`` and ``visionipc.apps`` (docs/architecture.md,
"How it works"). Code written against the old paths (``msgq.top``,
``visionipc.pipeline.health``, ...) still imports: :func:`install` registers a
finder that answers an old name with the module object of its new name, so both
names are one module (one set of classes, one module state), never a copy.
Each first use of an old path emits a ``DeprecationWarning`` naming the new one.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from importlib.machinery import ModuleSpec
from typing import Dict, Optional, Sequence


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # already executed under its new name; the import system has just set
        # __spec__ to the alias's spec: give the module its own back
        module.__spec__ = self.real_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, moved: Dict[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[types.ModuleType] = None
    ) -> Optional[ModuleSpec]:
        for old, new in self.moved.items():
            if fullname == old or fullname.startswith(old + "."):
                real = new + fullname[len(old) :]
                if fullname == old:
                    warnings.warn(
                        f"{old} moved to {new}; the old path is a deprecated alias", DeprecationWarning, stacklevel=3
                    )
                real_spec = importlib.util.find_spec(real)
                if real_spec is None:
                    return None
                return importlib.util.spec_from_loader(
                    fullname, _AliasLoader(real), is_package=real_spec.submodule_search_locations is not None
                )
        return None


def install(moved: Dict[str, str]) -> None:
    """Answer every old package path in ``moved`` (old -> new) with the new module."""
    # first: for a submodule of an old path, the path finder would otherwise load a
    # second copy of the file through the aliased parent's __path__
    sys.meta_path.insert(0, _AliasFinder(moved))
