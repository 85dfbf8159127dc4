"""Where the repository is, for tests that run its scripts, examples and builds."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"

# A limit for compiling (C++ builds, wheels) that only catches a hung build, never a slow
# one: beside the suite's other workers on a loaded 2-core machine, a sanitizer build
# that takes 53 s quietly once took over 280 s.
BUILD_TIMEOUT = 1200
