"""The fenced ``python`` and ``sh`` blocks of README.md and of the docs pages in
``PAGES``, and how each one is run.

A block runs as written. A block that needs more than one terminal, a device,
or runs until Ctrl-C says so in an HTML comment right above its fence, which
GitHub does not show but a reader of the source does::

    <!-- readme-test: stop-after=5 setup="python make_inputs.py" -->

Options (shell words):

``cwd=root|tmp``
    where it runs: the repository root (default for python blocks) or a fresh
    folder (default for sh blocks, which write files).
``stop-after=S`` or ``stop-after=REGEX:S``
    sh: a command still running after S seconds is stopped with Ctrl-C (SIGINT)
    and must then exit cleanly (servers, viewers, ``--loop``); with REGEX, only
    for the lines it matches (they must otherwise finish).
``setup=CMD``
    a shell command run first in the same folder and environment (inputs the
    block reads, e.g. recordings).
``not-run=REGEX:REASON``
    sh: lines matching REGEX are not run, for REASON (a camera device, a
    cluster, this very test suite). May be given more than once.
``runner=pytest``
    python: the block is a test file; pytest runs it.
``timeout=S``
    the most a python block or one sh command may take (default 180).

In sh blocks each line is one command; a line ending in ``&`` runs in the
background for the rest of the block and is stopped with Ctrl-C at its end
(it must exit 0).
"""

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

# The pages whose blocks are run (tests/system/test_readme.py), type-checked
# (tests/system/test_typing.py) and run against an installed wheel (tools/wheel_smoke.py).
# Pages not listed (docs/cpp.md's build commands, BENCHMARKS.md's benchmark runs) are not run.
PAGES = (
    "README.md",
    "docs/install.md",
    "docs/msgq.md",
    "docs/tools.md",
    "docs/visionipc.md",
    "docs/queues.md",
    "docs/camera.md",
    "docs/recording.md",
    "docs/viewing.md",
    "docs/analyze.md",
    "docs/benchmarking.md",
)

FENCE = re.compile(r"^```(\w*)\s*$")
ANNOTATION = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    code: str
    cwd: str = ""
    stop_after: Optional[float] = None
    stop_after_lines: List[Tuple[re.Pattern, float]] = field(default_factory=list)
    setup: Optional[str] = None
    not_run: List[Tuple[re.Pattern, str]] = field(default_factory=list)
    runner: str = "python"
    timeout: float = 180.0
    page: str = "README.md"

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}-{self.lang}"

    def stop_after_for(self, line: str) -> Optional[float]:
        return next((s for rx, s in self.stop_after_lines if rx.search(line)), self.stop_after)

    def commands(self):
        """sh: (command, background, reason-not-run or None) per line."""
        for raw in self.code.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            reason = next((why for rx, why in self.not_run if rx.search(line)), None)
            code = line.split(" #")[0].rstrip() if " #" in line else line
            background = code.endswith("&")
            yield (code[:-1].rstrip() if background else line), background, reason


def _apply(block: Block, options: str) -> None:
    for word in shlex.split(options):
        key, _, value = word.partition("=")
        if key == "cwd" and value in ("root", "tmp"):
            block.cwd = value
        elif key == "stop-after":
            rx, _, seconds = value.rpartition(":")
            if rx:
                block.stop_after_lines.append((re.compile(rx), float(seconds)))
            else:
                block.stop_after = float(seconds)
        elif key == "setup":
            block.setup = value
        elif key == "not-run":
            rx, _, why = value.partition(":")
            block.not_run.append((re.compile(rx), why.strip()))
        elif key == "runner" and value in ("python", "pytest"):
            block.runner = value
        elif key == "timeout":
            block.timeout = float(value)
        else:
            raise ValueError(f"readme-test annotation: unknown option {word!r}")


def blocks(text: str, page: str = "README.md") -> List[Block]:
    """Every ``python`` and ``sh`` block of a Markdown text, with its annotation."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if lang in ("python", "sh"):
            block = Block(lang, start + 1, "\n".join(lines[start + 1 : end]) + "\n", page=page)
            block.cwd = "root" if lang == "python" else "tmp"
            j = start - 1
            while j >= 0 and ANNOTATION.match(lines[j]):
                _apply(block, ANNOTATION.match(lines[j]).group(1))
                j -= 1
            found.append(block)
        i = end + 1
    return found


def page_blocks(root: Path) -> List[Block]:
    """Every block of every page in ``PAGES`` (``root``: the repository)."""
    return [block for page in PAGES for block in blocks((root / page).read_text(), page)]
