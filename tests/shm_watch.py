"""What a test itself added to /dev/shm.

Under ``pytest -n`` (tools/test.sh runs the suite on every core with pytest-xdist) other
tests run beside this one and make their own segment files, each under its own
``MSGQ_PREFIX`` (``msgq@<prefix>@...``). A test that checks it left nothing behind
counts the files named under its own prefixes and every file under no scoped name (a
peer's, a stray one: see SCOPED); the session's check in tests/conftest.py still names anything at
all that is left when the whole suite ends.

Python's own ``multiprocessing`` semaphores (``sem.mp-*``) are not counted: the suite's
spawn-context queues (tests/mp_helpers.py, tests/vipc_helpers.py) make them in whichever
worker runs those tests, they live until that queue is collected, and their names say
nothing of who made them (CI once saw fifteen of a neighbour's appear while a tool's run was
watched). The end-of-session check in tests/conftest.py still names any that outlive the
suite, whoever made them."""

import os

SHM = "/dev/shm"
MULTIPROCESSING_SEMAPHORE = "sem.mp-"


def listing() -> set[str]:
    return set(os.listdir(SHM))


# Names under which a run scopes its files by a prefix of its own: msgq segments
# (``msgq@<prefix>@...``) and vipc-bench's (``vipcb<run>_...`` for its shm+pipe and
# iceoryx2 peers, ``msgq_visionipc_rvipcb<run>_...`` for the reference's; the private temporary
# folders of tests/system/test_fuzz.py ``vipc-fuzz-*``, test_cpp.py ``vipc-cpp-*`` and
# test_security.py ``vipc-group-*``, each removed by the test that made it). A file under one
# of them counts only when the test names its prefix: a neighbour's run makes them too.
SCOPED = ("msgq@", "vipcb", "msgq_visionipc_rvipcb", "vipc-fuzz-", "vipc-cpp-", "vipc-group-")


def added(before: set[str], *prefixes: str, files: tuple[str, ...] = ()) -> set[str]:
    """The entries of /dev/shm new since ``before`` that belong to this test: msgq
    segments under one of ``prefixes`` (the test's ``msgq_prefix`` fixture, a tool's run
    prefix), files whose names start with one of ``files`` (a vipc-bench run's, say), and
    anything under no scoped name at all."""
    mine = tuple(f"msgq@{p}" for p in prefixes) + files
    new = {n for n in listing() - before if not n.startswith(MULTIPROCESSING_SEMAPHORE)}
    return {n for n in new if not n.startswith(SCOPED) or n.startswith(mine)}
