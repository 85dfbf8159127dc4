"""Where the repository is, for tests that run its scripts, examples and builds."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
