"""commaai/msgq, the reference, beside us in the benchmarks.

It is never vendored into this repository: build it from source outside the tree
(docs/reference.md) and point ``VIPC_REFERENCE_MSGQ`` at that checkout. Its
compiled Cython modules (``msgq/ipc_pyx.so``, ``msgq/visionipc/visionipc_pyx.so``)
are loaded by path under their own module names, so they live in one process
beside our ``msgq`` package, whose import name they share.
"""

import contextlib
import functools
import glob
import importlib.util
import os
import shutil
import subprocess
import types
from typing import Iterator, Optional, cast

ENV = "VIPC_REFERENCE_MSGQ"
MODULES = {"ipc": "msgq/ipc_pyx.so", "visionipc": "msgq/visionipc/visionipc_pyx.so"}


def root() -> Optional[str]:
    """The reference checkout named by ``VIPC_REFERENCE_MSGQ``, or None."""
    path = os.environ.get(ENV, "").strip()
    return os.path.abspath(path) if path else None


def unavailable() -> Optional[str]:
    """None when the reference can run here, else why not (one line)."""
    top = root()
    if top is None:
        return f"set {ENV} to a built commaai/msgq checkout (docs/reference.md)"
    missing = [rel for rel in MODULES.values() if not os.path.isfile(os.path.join(top, rel))]
    if missing:
        return f"{ENV}={top}: no {', '.join(missing)} (build it: docs/reference.md)"
    return None


@functools.cache
def load(which: str) -> types.ModuleType:
    """The reference's compiled module ``which`` ("ipc" or "visionipc")."""
    why = unavailable()
    if why:
        raise ImportError(why)
    top = root()
    assert top is not None  # unavailable() said where it is
    path = os.path.join(top, MODULES[which])
    name = os.path.basename(path).split(".")[0]  # the module's init symbol is PyInit_<name>
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a path to an extension module
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def describe() -> Optional[str]:
    """The reference's commit, for a report's header (None when not in use)."""
    if unavailable():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", cast(str, root()), "log", "-1", "--format=%h %s"], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or root()
    except (OSError, subprocess.SubprocessError):
        return root()


def remove_files(*patterns: str) -> None:
    """The reference never removes its topic files (``/dev/shm/msgq_<endpoint>``) nor, after a
    kill, its listener socket: a benchmark removes its own, named by ``patterns``, once every
    worker has gone."""
    for pattern in patterns:
        for path in glob.glob(pattern):
            try:
                os.unlink(path)
            except OSError:
                pass


@contextlib.contextmanager
def prefix_dir(prefix: str) -> Iterator[str]:
    """An ``OPENPILOT_PREFIX`` for the reference's msgq: its topic files go to
    ``/dev/shm/msgq_<prefix>/`` (created here: it expects the folder), removed with
    everything in it at the end. Yields the prefix."""
    path = f"/dev/shm/msgq_{prefix}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        yield prefix
    finally:
        shutil.rmtree(path, ignore_errors=True)
