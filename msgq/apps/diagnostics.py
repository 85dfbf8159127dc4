"""What is wrong with a run's topics, in words: slow or stopped readers, dead
readers and publishers, leftovers, corrupt or foreign segment files.

Each problem says what happened and what to do. ``msgq-top --check`` prints
them (exit status 1 if there are any); :func:`problems` gives them to scripts::

    from msgq.apps import top, diagnostics
    report = top.build_report({}, top.snapshot(directory, prefix))
    for line in diagnostics.problems(report):
        print(line)
"""

import os
import re
from typing import TYPE_CHECKING, List, Optional

from msgq import artifacts as _artifacts

if TYPE_CHECKING:
    from msgq.apps.top import ReaderRow, Report, TopicRow

_VIPC_TOPIC = re.compile(r"visionipc_(?P<server>.+)_(?P<stream>[^_]+)\Z")


def process_state(pid: int) -> Optional[str]:
    """The kernel's one-letter state of ``pid`` (R, S, T for stopped, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _name(topic: "TopicRow") -> str:
    return f"{topic['prefix']}@{topic['topic']}" if topic.get("prefix") else topic["topic"]


def _bytes_under(path: str) -> int:
    """Bytes of a file, or of the files directly in a directory (a large-message directory)."""
    try:
        if not os.path.isdir(path) or os.path.islink(path):
            return os.lstat(path).st_size
        with os.scandir(path) as entries:
            return sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(follow_symlinks=False))
    except OSError:
        return 0


def leftovers(directory: str, found: List[_artifacts.Artifact]) -> List[str]:
    """Problems of the files other than topic rings (``msgq.artifacts``): stale ones
    (left by killed processes), and names in our namespace we do not know."""
    out = []
    for a in found:
        name = f"{a.prefix}@{a.rest}" if a.prefix else a.rest
        if a.kind == _artifacts.UNKNOWN:
            out.append(f"{name}: not a file msgq makes, under its name prefix in {directory}; check who made it")
        elif a.stale and a.kind != _artifacts.TOPIC:
            size = _bytes_under(os.path.join(directory, a.file))
            out.append(
                f"{name}: {a.kind} ({size / 1e6:.1f} MB) left behind by killed processes; the next publisher "
                f"of this run removes it, or msgq-top --clean"
            )
    return out


def _stuck(topic: "TopicRow", reader: "ReaderRow") -> bool:
    """A live reader that read nothing between two snapshots while the publisher
    wrote (only a report built from two snapshots has the rates)."""
    return bool(topic.get("msgs_per_s")) and reader.get("msgs_per_s") == 0 and bool(reader.get("lag_bytes"))


def problems(report: "Report") -> List[str]:
    """Human-readable problems of a ``msgq-top`` report (``{"topics": [...]}``)."""
    out = []
    for t in report["topics"]:
        name = _name(t)
        if "error" in t:
            out.append(f"{name}: {t['error']}")
            continue
        if t["stale"]:
            out.append(
                f"{name}: nobody uses this segment file any more (its processes were killed); the next "
                f"publisher of this run removes it, or msgq-top --clean"
            )
            continue
        live_readers = [r for r in t["readers"] if r["alive"]]
        if t["publisher_pid"] is None and live_readers:
            vipc = _VIPC_TOPIC.match(t["topic"])
            who = (
                f"the VisionIPC server '{vipc['server']}' (stream '{vipc['stream']}') is not running"
                if vipc
                else "no live publisher"
            )
            out.append(
                f"{name}: {who}; its {len(live_readers)} reader(s) wait for messages. Start or restart "
                f"it: readers pick a restarted publisher up by themselves"
            )
        for r in t["readers"]:
            who = f"{name}: reader pid {r['pid']} (slot {r['slot']})"
            if not r["alive"]:
                out.append(
                    f"{who} is gone (killed?); its slot is reclaimed at the publisher's next "
                    f"num_readers or by the next subscriber that needs it: nothing to do"
                )
                continue
            if not (r["lapped"] or r["resets"]):
                if _stuck(t, r):
                    state = process_state(r["pid"])
                    why = (
                        f"the process is stopped (SIGSTOP or a debugger): continue it (kill -CONT {r['pid']})"
                        if state in ("T", "t")
                        else "the process is alive but not receiving (blocked elsewhere, deadlocked, or busy): "
                        f"look at its threads (py-spy dump --pid {r['pid']})"
                    )
                    out.append(
                        f"{who} read nothing between two looks while the publisher sent {t['msgs_per_s']:.0f} "
                        f"msg/s; it is {r['lag_bytes']} bytes behind and falling further: {why}; it will be "
                        f"lapped (a reader that reads less often than --interval looks the same: raise it)"
                    )
                continue
            stopped = process_state(r["pid"]) in ("T", "t")
            what = (
                "is lapped: the publisher overwrote messages it had not read yet"
                if r["lapped"]
                else f"fell a whole ring behind {r['resets']} time(s) and skipped ahead, losing messages"
            )
            if stopped:
                out.append(
                    f"{who} {what}; the process is stopped (SIGSTOP or a debugger): continue it "
                    f"(kill -CONT {r['pid']}); it resumes at the newest data and counts the loss in resets"
                )
            else:
                out.append(
                    f"{who} {what}: it reads slower than the publisher writes. Read faster "
                    f"(receive_batch, a thread of its own), subscribe with conflate=True if only the newest "
                    f"message matters, or publish with a larger segment_size (now {t['segment_size']} bytes)"
                )
    return out


__all__ = ["problems", "process_state"]
