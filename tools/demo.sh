#!/usr/bin/env bash
# The main job: sets everything up, then runs the demo. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python tools/demo_msgq.py "$@"
