#!/usr/bin/env bash
# The whole test suite: sets everything up, then runs pytest (C++ tests,
# sanitizer builds and multi-process tests included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/pytest -p no:cacheprovider "$@"
