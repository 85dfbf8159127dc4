#!/usr/bin/env bash
# The whole test suite: sets everything up, then runs pytest (C++ tests,
# sanitizer builds and multi-process tests included). Extra arguments go to pytest.
#   bash tools/test.sh            the whole suite (README's command, CI's .ci/run)
#   bash tools/test.sh --quick    for development: unit tests and the quick system tests,
#                                 without Spark, Chromium, sanitizer builds or slow ones
#                                 (the tiers are pytest markers, given in tests/conftest.py)
# The tests run on every core and one more (pytest-xdist, at most 4 workers; VIPC_TEST_WORKERS=N
# sets it, 0 runs them in this one process): much of the suite waits on other processes (JVMs
# starting, streaming triggers, peers' timeouts), so one worker a core kept a 2-core machine
# 58 % busy. 5 workers took 13:40 on a quiet 2-core machine (3: 17-18 min before OneFileAhead), but two runs of
# three there had load-sensitive tests fail (Spark Connect, a recorder's frames, a benchmark
# cell), so the default stays at 3 there: VIPC_TEST_WORKERS=5 for a quicker local run.
# Each worker takes whole test files, so a file's shared fixtures (recordings, a Spark
# session) are made once; files go out in the order tests/conftest.py gives them (the
# longest, Spark's, first), one at a time as a worker needs the next (OneFileAhead there).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=()
if [ "${1:-}" = "--quick" ]; then
  shift
  tier=(-m "not (spark or browser or sanitizer or slow)")
fi
bash tools/setup.sh
workers=${VIPC_TEST_WORKERS:-$(($(nproc) + 1))}
((workers <= 4)) || workers=4
parallel=()
((workers == 0)) || parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
# pytest's temporary folders live under build/ (removed at the next run), not in
# /tmp: the suite checks that it leaves nothing behind there (tests/conftest.py)
exec .venv/bin/pytest -p no:cacheprovider --basetemp="$PWD/build/pytest-tmp" "${parallel[@]}" "${tier[@]}" "$@"
