"""The tests' shared Spark session outlives its JVM: when a test kills it (or times out and
takes the JVM with it), the next test that asks for ``spark`` gets a new working session
instead of "SparkSession$ does not exist in the JVM"."""

import os
import signal

import pipeline_helpers
import pytest
from pipeline_helpers import spark  # noqa: F401

KILLED = []  # (application id, JVM pid) of the sessions whose JVM a test here killed
STOPPED = []  # (application id, JVM pid) of the sessions a test here stopped


def _jvm_pid(session) -> int:
    return session.sparkContext._gateway.proc.pid  # spark-submit execs the JVM


def test_a_test_kills_the_jvm_of_the_shared_session(spark):
    before = spark.sparkContext.applicationId
    pid = _jvm_pid(spark)
    os.kill(pid, signal.SIGKILL)
    spark.sparkContext._gateway.proc.wait(timeout=30)
    with pytest.raises(Exception):  # noqa: B017 - py4j's connection error, whichever it is
        spark.range(3).count()
    KILLED.append((before, pid))  # the next test's fixture finds it dead


def test_the_next_test_runs_jobs_on_the_fixture(spark):
    for application, pid in KILLED:  # the previous test killed the shared session's JVM
        assert spark.sparkContext.applicationId != application and _jvm_pid(spark) != pid
    assert spark is pipeline_helpers.live_spark()  # and the new session is shared again
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string").groupBy("s").count().collect()
    assert sorted((r.s, r["count"]) for r in rows) == [("a", 1), ("b", 1)]
    STOPPED.append((spark.sparkContext.applicationId, _jvm_pid(spark)))
    spark.stop()  # a test that stops the shared session: the next one gets another, in the same JVM


def test_a_stopped_session_is_replaced_in_its_jvm(spark):
    for application, pid in STOPPED:
        assert spark.sparkContext.applicationId != application and _jvm_pid(spark) == pid
    assert spark.range(4).count() == 4
