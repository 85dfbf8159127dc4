"""The pipeline's PySpark worker daemon (daemon.py): Spark's workers are forked from it
with PySpark (from bytecode) and the task-side modules loaded, the daemon holds no
thread when it forks, and it hands over to PySpark's own daemon when it cannot."""

import os
import subprocess
import sys

from pipeline_helpers import camera_recordings, recordings, spark  # noqa: F401

from visionipc.apps.pipeline import daemon, health, jobs
from visionipc.apps.pipeline.cluster import task_slots
from visionipc.apps.pipeline.read import find_recordings, index_files, read_index_pandas

LOADED = ("libarrow.so", "pandas/_libs", "_visionipc")  # shared objects of PRELOAD, as /proc/PID/maps names them


def _read_proc(pid) -> dict:
    """What /proc says of a process: its command line, memory map and thread count (raw)."""
    import os

    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return {"cmdline": cmdline, "maps": maps, "threads": len(os.listdir(f"/proc/{pid}/task"))}


def _daemon_facts(raw) -> dict:
    return {
        "cmdline": [a.decode() for a in raw["cmdline"].split(b"\0") if a],
        "threads": raw["threads"],
        "loaded": [lib for lib in LOADED if lib in raw["maps"]],
    }


def test_workers_fork_from_the_pipeline_daemon_and_health_numbers_are_unchanged(spark, recordings, camera_recordings):
    def probe(_):
        import os
        import sys
        import zipimport

        import pyspark

        raw = _read_proc(os.getppid())  # the daemon this worker was forked from
        raw["pyspark"] = pyspark.__file__
        raw["zip_importers"] = [k for k, v in sys.path_importer_cache.items() if isinstance(v, zipimport.zipimporter)]
        yield raw

    from pyspark import cloudpickle

    this = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(this)  # the workers cannot import this test module
    try:
        found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    finally:
        cloudpickle.unregister_pickle_by_value(this)
    for raw in found:
        facts = {**raw, **_daemon_facts(raw)}
        assert facts["cmdline"][-3:] == ["-m", daemon.NAME, "pyspark.worker"]
        assert facts["loaded"] == list(
            LOADED
        )  # numpy, pyarrow, pandas and the pipeline: in the daemon, before any fork
        assert facts["threads"] == 1  # PySpark's rule: nothing but the forking thread
        assert ".zip" not in facts["pyspark"] and facts["zip_importers"] == []  # the installed PySpark, bytecode
    paths = [camera_recordings["lossless"], recordings["faults"], recordings["quality"]]
    got = jobs.health_pass(spark, index_files(find_recordings(paths)), task_slots(spark))
    index = read_index_pandas(paths)
    for kind, local, keys in (
        ("health", health.health_pandas, health.KEYS),
        ("drops", health.drops_pandas, health.KEYS + ["after_frame_id"]),
    ):
        expected = local(index).sort_values(keys, ignore_index=True)
        on_spark = got[kind].sort_values(keys, ignore_index=True)
        assert len(expected) > 0
        for column in expected.columns:
            a, b = on_spark[column].tolist(), expected[column].tolist()
            if column == "dropped_frame_ids":
                a, b = [list(x) for x in a], [list(x) for x in b]
            assert a == b, (kind, column)


def _start_daemon(env):
    """``python -m visionipc.apps.pipeline.daemon pyspark.worker`` as Spark starts it; returns
    the process once it has told its port (it serves from then on)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}  # Spark sets OMP_NUM_THREADS for its Python workers
    p = subprocess.Popen(
        [sys.executable, "-m", daemon.NAME, "pyspark.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    port = p.stdout.read(4)
    assert len(port) == 4 and int.from_bytes(port, "big") > 0
    return p


def _stop(p) -> str:
    """Close the daemon's stdin as Spark does to stop it; returns what it wrote to stderr."""
    p.stdin.close()  # PySpark's daemon exits then (status 1, its own way)
    p.wait(timeout=30)
    p.stdout.close()
    with p.stderr:
        return p.stderr.read().decode()


def test_daemon_preloads_alone_and_falls_back_to_pysparks_own_when_a_module_fails(tmp_path):
    p = _start_daemon({})
    try:
        facts = _daemon_facts(_read_proc(p.pid))
    finally:
        said = _stop(p)
    assert "using pyspark.daemon" not in said
    assert facts["cmdline"][-2:] == [daemon.NAME, "pyspark.worker"]
    assert facts["loaded"] == list(LOADED) and facts["threads"] == 1

    broken = tmp_path / "pandas"  # a pandas that cannot be imported, first on the path
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('no pandas here')\n")
    p = _start_daemon({"PYTHONPATH": str(tmp_path)})
    try:
        facts = _daemon_facts(_read_proc(p.pid))
    finally:
        said = _stop(p)
    assert said.splitlines()[0] == f"{daemon.NAME}: using pyspark.daemon (ImportError: no pandas here)"
    assert facts["cmdline"][-3:] == ["-m", "pyspark.daemon", "pyspark.worker"]  # the same process, exec'd
    assert facts["loaded"] == [] and facts["threads"] == 1


def test_archives_leave_the_path_only_where_the_same_packages_are_installed(tmp_path):
    import zipfile

    import pyspark

    site = os.path.dirname(os.path.dirname(pyspark.__file__))
    with open(os.path.join(site, "pyspark", "version.py"), "rb") as f:
        version = f.read()

    def archive(name, files):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            for member, data in files.items():
                z.writestr(member, data)
        return str(path)

    same = archive("same.zip", {"pyspark/__init__.py": "", "pyspark/version.py": version})
    other = archive("other.zip", {"pyspark/__init__.py": "", "pyspark/version.py": b'__version__ = "0.0.1"\n'})
    unversioned = archive("unversioned.zip", {"pyspark/__init__.py": ""})
    foreign = archive(
        "foreign.zip", {"not_installed_anywhere/__init__.py": "", "not_installed_anywhere/version.py": "v"}
    )
    no_python = archive("classes.jar", {"org/apache/Thing.class": b"\xca\xfe"})
    path = [same, other, unversioned, foreign, no_python, str(tmp_path / "missing.zip"), site]
    assert daemon.prune_archives(path) == [other, unversioned, foreign, str(tmp_path / "missing.zip"), site]
