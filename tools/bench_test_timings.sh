#!/usr/bin/env bash
# The timings the tests measure but no longer assert (issue 35: a test checks behaviour,
# never a duration): runs those tests and prints their "measured:" lines, e.g.
#   how soon vipc-replay stops after Ctrl-C while decoding (mcap, mkv),
#   how old the frames are that a slow vipc-foxglove client is handed,
#   vipc-view's request latency (p50, p99) under slowloris connections,
#   vipc-replay --rate 2's span against its schedule,
#   vipc-foxglove / vipc-view memory with 1 and 20 stuck clients.
# Run it on a quiet machine (the numbers are the machine's, not pass/fail):
#   bash tools/bench_test_timings.sh
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/pytest -p no:cacheprovider --basetemp="$PWD/build/pytest-tmp-timings" -q -s \
  tests/apps/test_record_decoding.py::test_ctrl_c_stops_a_decoding_replay \
  tests/apps/test_record.py::test_replay_keeps_ids_scales_timing_and_loops \
  tests/apps/test_web_limits.py | grep "measured: " | sed 's/^.*measured: //'
