"""The Python blocks of README.md and docs/ against an installed visionipc, run from a folder outside the checkout.

    /path/to/venv/bin/python tools/wheel_smoke.py [--workdir DIR]

Run it with the interpreter of the environment that holds the wheel: tests/system/test_wheel.py
does (a fresh virtual environment), and so do ``tools/build_wheels.sh --all`` (one fresh venv per
CPython 3.10-3.13) and cibuildwheel (pyproject.toml's test-command).
Every plain block runs (not those that need inputs made by the checkout, ``setup=``, nor the
one that is a pytest file), each under its own MSGQ_PREFIX, which must be left clean. Exits 1
naming the block that failed, 2 when msgq or visionipc would not import from this
environment's site-packages (but, say, from the checkout's source folders).
"""

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # readme_blocks: how the pages' blocks are found and read
from readme_blocks import page_blocks  # noqa: E402


def _installed(workdir, env):
    """Where msgq and visionipc import from, as a block run in ``workdir`` sees them: this
    environment's site-packages, not the checkout's source folders."""
    code = "import msgq, visionipc; print(msgq.__file__); print(visionipc.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"wheel_smoke: msgq/visionipc do not import in {sys.prefix}:\n{out.stderr}")
    site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    for found in out.stdout.split():
        if not site.intersection(Path(found).resolve().parents):
            print(f"wheel_smoke: {found} is not in {sys.prefix}'s site-packages (the checkout?)", file=sys.stderr)
            sys.exit(2)
    return out.stdout.split()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="an empty folder outside the checkout (default: a new temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        from msgq.testing import isolated_prefix  # the installed package's helper (checked just below)

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        print("importing", *_installed(workdir, env))
        for block in page_blocks(ROOT):
            if block.lang != "python" or block.setup or block.runner != "python":
                continue
            with isolated_prefix() as prefix:
                proc = subprocess.run(
                    [sys.executable, "-"],
                    input=block.code,
                    cwd=workdir,
                    env={**env, "MSGQ_PREFIX": prefix},
                    capture_output=True,
                    text=True,
                    timeout=block.timeout,
                )
            if proc.returncode != 0:
                print(f"{block.page} line {block.line} failed:\n{proc.stdout}{proc.stderr}", file=sys.stderr)
                return 1
            print(f"ok: {block.page} line {block.line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
