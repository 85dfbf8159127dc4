"""Write the man page of every command-line tool (``man1/TOOL.1``), made from each
tool's own parser (``TOOL --print-man``, msgq.cli; needs argparse-manpage):

    python tools/make_man.py build/man && man -M build/man vipc-record
    sudo python tools/make_man.py /usr/local/share/man
"""

import os
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python tools/make_man.py MANDIR", file=sys.stderr)
        return 2
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tools = sorted(tomllib.load(f)["project"]["scripts"])
    folder = os.path.join(argv[0], "man1")
    os.makedirs(folder, exist_ok=True)
    bindir = os.path.dirname(sys.executable)
    for tool in tools:
        out = subprocess.run([os.path.join(bindir, tool), "--print-man"], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            print(f"make_man: {tool}: {out.stderr.strip() or out.returncode}", file=sys.stderr)
            return 1
        with open(os.path.join(folder, f"{tool}.1"), "w") as f:
            f.write(out.stdout)
    print(f"make_man: {len(tools)} man pages in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
