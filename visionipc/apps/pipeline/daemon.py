"""PySpark's Python worker daemon, started ready for the pipeline's tasks.

``session.spark_session`` sets ``spark.python.daemon.module`` to this module. PySpark
starts one daemon per executor on its first Python task and forks a worker from it per
task slot; with the stock ``pyspark.daemon`` every executor start paid, before its
first task could run (timestamps inside tasks, ``-X importtime``, cProfile; see
BENCHMARKS.md, issue 18):

- PySpark compiled from source, in the daemon (~1 s of CPU) and again in each worker
  for what it imports lazily: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip``, py4j's
  zip and the spark-core jar first on the workers' ``PYTHONPATH``, and a zip holds no
  bytecode (the same PySpark installed in site-packages imports in 0.3 s).
- Every archive's directory re-read in each worker: a worker's first task adds its
  files folder to ``sys.path`` and calls ``importlib.invalidate_caches()``, which before
  Python 3.12 re-reads an archive's directory once per cached importer (pyspark.zip 15
  times, the 6,000-entry jar twice: ~0.45 s of CPU per worker, both slots at once).
- numpy, pyarrow, pandas and the pipeline imported in each worker (~0.7 s of CPU each).

Here, before PySpark's own daemon loop (``pyspark.daemon.manager``) starts:

1. ``prune_archives``: archives on ``sys.path`` whose packages are installed elsewhere
   on it with the same ``version.py`` (the pip-installed PySpark and py4j), or that hold
   no Python at all (the jar), leave ``sys.path``; anything else (a Spark distribution
   without an installed PySpark, another version) stays where Spark put it.
2. ``PRELOAD`` is imported once, so the workers are forked with it loaded.
3. Fork safety, PySpark's rule: no thread may exist when the daemon forks (a lock held
   by another thread stays locked in the child). numpy starts none with
   ``OMP_NUM_THREADS=1`` (Spark sets it for its Python workers unless told otherwise);
   pyarrow's bundled jemalloc starts a background purging thread unless told not to
   (``JE_ARROW_MALLOC_CONF``, set only while importing; a worker forked from a daemon with
   that thread would lose it anyway: jemalloc disables it in a fork's child). The daemon
   then counts its threads (``/proc/self/task``) and serves only when it is alone.

Anything else -- an import failing, a thread found, no ``/proc`` -- and the daemon
``exec``s ``python -m pyspark.daemon`` with the same arguments before it has said a word
to the JVM: the stock daemon, as if this module had not been configured. ``gc.freeze()``
keeps the preloaded objects out of the workers' garbage collections (fewer copied pages).
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import os
import sys
import zipfile

from msgq.tooling import scoped_env

# what a health task imports, pyarrow's lazy imports of its first read included
PRELOAD = (
    "numpy",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pyarrow.pandas_compat",
    "pandas",
    "visionipc.apps.pipeline.jobs",
)
IMPORT_ENV = {"JE_ARROW_MALLOC_CONF": "background_thread:false"}  # only while importing PRELOAD
STOCK_DAEMON = "pyspark.daemon"
NAME = "visionipc.apps.pipeline.daemon"  # as spark.python.daemon.module names it (``__name__`` is __main__)


def _archive_packages(path: str) -> dict:
    """``{top-level package or module: its version.py bytes (b"" if none)}`` of a zip or jar."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        tops = {n.split("/", 1)[0].removesuffix(".py") for n in names if n.endswith(".py")}
        return {t: (z.read(f"{t}/version.py") if f"{t}/version.py" in names else b"") for t in tops}


def _installed_version(name: str, folders: list) -> bytes | None:
    """``version.py`` of the package ``name`` as the folders on the path hold it (None: not there)."""
    spec = importlib.machinery.PathFinder.find_spec(name, folders)
    for location in (spec and spec.submodule_search_locations) or ():
        try:
            with open(os.path.join(location, "version.py"), "rb") as f:
                return f.read()
        except OSError:
            return None
    return None


def prune_archives(path: list) -> list:
    """``path`` without the archives (zip, jar) that hold no Python, or whose every package
    is installed in one of ``path``'s folders with the same non-empty ``version.py``."""
    folders = [p for p in path if p and os.path.isdir(p)]
    kept = []
    for entry in path:
        if entry and os.path.isfile(entry):
            try:
                packages = _archive_packages(entry)
            except (OSError, zipfile.BadZipFile):
                packages = None
            if packages is not None and all(
                v and _installed_version(name, folders) == v for name, v in packages.items()
            ):
                continue
        kept.append(entry)
    return kept


def threads() -> int | None:
    """Threads of this process (None where ``/proc`` does not tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _preload() -> None:
    with scoped_env(**IMPORT_ENV):
        for name in PRELOAD:
            importlib.import_module(name)


def stock_argv() -> list:
    """This interpreter's command line with ``-m pyspark.daemon`` in place of this module."""
    argv = list(getattr(sys, "orig_argv", []))
    try:
        at = argv.index("-m")
    except ValueError:
        return [sys.executable, "-m", STOCK_DAEMON, *sys.argv[1:]]
    return [*argv[: at + 1], STOCK_DAEMON, *argv[at + 2 :]]


def main() -> None:
    try:
        pruned = prune_archives(sys.path)
        for entry in set(sys.path) - set(pruned):  # and the importers already cached for them
            for key in [k for k in sys.path_importer_cache if k == entry or k.startswith(entry + os.sep)]:
                del sys.path_importer_cache[key]
        sys.path[:] = pruned
        _preload()
        alone = threads()
        why = None if alone == 1 else f"{alone} threads after the imports" if alone else "no /proc to count threads"
    except Exception as e:  # noqa: BLE001 - any failure: PySpark's own daemon, untouched
        why = f"{type(e).__name__}: {e}"
    if why is not None:  # one line in the executor's log, then the stock daemon
        print(f"{NAME}: using {STOCK_DAEMON} ({why})", file=sys.stderr, flush=True)
        os.execv(sys.executable, stock_argv())
    gc.freeze()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
