#!/usr/bin/env bash
# The main job: sets everything up, then runs the demo (a synthetic camera, an
# OpenCV consumer and vipc-view in the browser; see tools/demo.py). Extra
# arguments go to the demo: --seconds N, --port P, --width W --height H --fps F.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python tools/demo.py "$@"
