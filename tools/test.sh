#!/usr/bin/env bash
# The whole test suite: sets everything up, then runs pytest (C++ tests,
# sanitizer builds and multi-process tests included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# pytest's temporary folders live under build/ (removed at the next run), not in
# /tmp: the suite checks that it leaves nothing behind there (tests/conftest.py)
exec .venv/bin/pytest -p no:cacheprovider --basetemp="$PWD/build/pytest-tmp" "$@"
