"""Run directories: every ``vipc-analyze`` run writes into a new folder under ``--out``
and publishes it only when complete.

Layout of ``--out`` (a local folder or a URI, fs.py)::

    OUT/run-20261126T034512Z-1a2b3c/   one per run: results, report.html, run.json, _SUCCESS
    OUT/LATEST                         the newest complete run's folder name

Publication: on a local filesystem the run is written to a hidden ``.run-...tmp``
folder and renamed into place (atomic); on object storage (no rename) it is written
in place and ``_SUCCESS`` is written last: a folder without ``_SUCCESS`` is not a
result (Spark/Hadoop's convention). A failed or interrupted run removes its folder.
``run.json`` is the run manifest: inputs, times, master, version, command.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from visionipc.apps.pipeline import fs

SUCCESS = "_SUCCESS"
MANIFEST = "run.json"
LATEST = "LATEST"


class OutputError(ValueError):
    """``--out`` cannot hold runs (bad input: exit 2)."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_out(out: str) -> str:
    """The normalised ``--out`` location; OutputError when it names a file."""
    out = fs.normalize(out)
    try:
        if fs.isfile(out):
            raise OutputError(f"--out {out!r} is an existing file (it must be a folder for the run folders)")
    except OSError as e:
        raise OutputError(f"--out {out!r}: {e}") from None
    return out


def completed_runs(out: str) -> List[str]:
    """Names of the published runs in ``out``, oldest first."""
    names = [n for n, is_dir, _ in fs.listdir(out) if is_dir and n.startswith("run-")]
    return [n for n in sorted(names) if fs.isfile(fs.join(out, n, SUCCESS))]


def analysed_recordings(out: str) -> Set[Tuple[str, str]]:
    """``(recording id, fingerprint)`` of every recording a published run in ``out``
    analysed (tables.fingerprint: by content, not by location; runs made before the
    fingerprint was kept name none, so their recordings are analysed again)."""
    done: Set[Tuple[str, str]] = set()
    for name in completed_runs(out):
        try:
            manifest = json.loads(fs.read_bytes(fs.join(out, name, MANIFEST)))
        except (OSError, ValueError):
            continue
        done.update((i["id"], i["fingerprint"]) for i in manifest.get("inputs", []) if "fingerprint" in i)
    return done


class Run:
    """One run's folder: ``stage`` is where it is written, ``final`` where it is published."""

    def __init__(self, out: str, command: Optional[Sequence[str]] = None) -> None:
        self.out = out
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.name = f"run-{stamp}-{secrets.token_hex(3)}"
        self.final = fs.join(out, self.name)
        self.stage = fs.join(out, f".{self.name}.tmp") if fs.is_local(out) else self.final
        self.made: list[str] = []  # the folders begin() made for out, the deepest first
        self.manifest: Dict[str, Any] = {
            "run": self.name,
            "version": _version(),
            "command": list(command if command is not None else sys.argv),
            "started": _now(),
        }

    def path(self, *parts: str) -> str:
        """Where a result goes while the run is written."""
        return fs.join(self.stage, *parts)

    def begin(self) -> Run:
        self.made = _missing_folders(self.out) if fs.is_local(self.out) else []
        fs.makedirs(self.stage)
        return self

    def publish(self, **manifest: Any) -> str:
        """Write run.json and _SUCCESS, move the run into place, point LATEST at it."""
        self.manifest.update(manifest, finished=_now())
        fs.write_bytes(self.path(MANIFEST), json.dumps(self.manifest, indent=2, default=str).encode())
        fs.write_bytes(self.path(SUCCESS), b"")
        if self.stage != self.final:
            os.rename(self.stage, self.final)
        if fs.is_local(self.out):
            tmp = fs.join(self.out, f".{LATEST}.{self.name}")
            fs.write_bytes(tmp, self.name.encode() + b"\n")
            os.replace(tmp, fs.join(self.out, LATEST))
        else:
            fs.write_bytes(fs.join(self.out, LATEST), self.name.encode() + b"\n")
        return self.final

    def abandon(self) -> None:
        """Remove what a failed run wrote (best effort: the error that got here matters more)."""
        try:
            fs.delete_dir(self.stage)
            # a task of the failed job that was still writing when the folder went (between
            # the listing and the last rmdir): its file is removed with a second pass; it
            # cannot make the folder again (fs.makedirs_below)
            for pause in (0.2, 1.0):
                if not fs.is_local(self.stage) or not os.path.exists(self.stage):
                    break
                time.sleep(pause)
                fs.delete_dir(self.stage)
            # the folders this run made for --out (a table's folder Spark began), when empty:
            # bad input found by a task leaves nothing behind, as bad input the driver finds
            for made in self.made:
                for folder, _, _ in os.walk(made, topdown=False):
                    with contextlib.suppress(OSError):  # not empty: something else is in it
                        os.rmdir(folder)
        except Exception:  # noqa: BLE001 - never mask the run's own error
            pass


def _missing_folders(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet, the deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def latest(out: str) -> str:
    """The folder of the newest published run in ``out``."""
    return fs.join(out, fs.read_bytes(fs.join(out, LATEST)).decode().strip())


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("visionipc")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        return "unknown"
