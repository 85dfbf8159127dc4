"""msgq-top: the live msgq topics of this machine, refreshing like ``top``.

For each topic: its publisher, its readers, messages and bytes per second,
and for each reader its rate, how far it lags behind the publisher, and how
many times it was lapped and reset (drops). ``--json`` prints one document
for scripts and exits. Reading a segment never changes it.

Rates are counted between two snapshots ``--interval`` seconds apart.
"""

import argparse
import json
import os
import select
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO, TypedDict

from msgq import add_version_flag, artifacts
from msgq.cli import parse_args
from msgq.errors import IpcError
from msgq.names import current_prefix, segment_dir
from msgq.schemas import SUFFIX as SCHEMA_SUFFIX
from msgq.schemas import read_schema_file
from msgq.tooling import printable, segment_stats

CLEAR = "\x1b[H\x1b[2J"

EPILOG = """\
what the columns mean:
  PUB      pid of the publisher ('-' when none is alive)
  MSGS     messages published since the segment was created
  RATE/BW  messages and payload bytes per second over the last interval
  RDRS     attached readers; below each topic, one line per reader:
           slot, pid, rate, LAG (bytes the reader still has to read;
           'lapped' when the publisher overwrote its unread data), RESETS
           (times it was lapped and skipped ahead: dropped data)
  STATE    stale: nobody is attached, a leftover of killed processes
           (new publishers and subscribers remove or reuse it); then the
           declared schema, ENCODING:NAME (msgq.Schema; pub_sock(schema=))

examples:
  msgq-top                          this run's topics (MSGQ_PREFIX), refreshed every second
  msgq-top --all-prefixes --once    one table of every run's topics
  msgq-top --json --interval 0.5    one JSON document: {"topics": [...]}
  msgq-top --check                  what is wrong and what to do (exit status 1 if anything),
                                    from two snapshots --interval apart (a stuck reader shows)
  msgq-top --clean                  list what killed processes left (STALE topics, queues,
                                    large-message directories), ask, remove them
  msgq-top --clean --yes            remove them without asking (scripts; needed without a terminal)
"""


def list_segments(directory: str, prefix: Optional[str]) -> List[str]:
    """Topic ring file names in ``directory`` of run ``prefix`` ("" : unprefixed topics
    only; None: every run's), by ``msgq.artifacts``' names and kinds (not msgq.broadcast's
    or msgq.ordered's rings, schemas, fake-event files). A name that is not ASCII stays
    listed: ``snapshot`` shows it as an error."""
    return [name for name, _, rest in artifacts.names(directory, prefix) if artifacts.kind_of(rest) == artifacts.TOPIC]


Stats = Dict[str, Any]  # msgq.tooling.segment_stats of one file (or {"error": why}), taken at "_t"


class ReaderRow(TypedDict):
    """One reader slot of a topic in the report."""

    slot: int
    pid: int
    alive: bool
    conflate: bool
    messages: int
    bytes: int
    msgs_per_s: Optional[float]  # None: from one snapshot only
    bytes_per_s: Optional[float]
    resets: int
    lag_bytes: Optional[int]  # None: lapped
    lapped: bool


class TopicRow(TypedDict, total=False):
    """One topic of the report: ``topic``, ``prefix``, ``file`` and ``schema`` always; then
    ``error`` (a file that is not a readable segment), or the rest."""

    topic: str
    prefix: str
    file: str
    schema: Optional[Dict[str, Any]]  # {"encoding", "name", "bytes"} (or {"error"}), None: none declared
    error: str
    segment_size: int
    publisher_pid: Optional[int]  # None: no live publisher
    messages: int
    bytes: int
    msgs_per_s: Optional[float]
    bytes_per_s: Optional[float]
    readers: List[ReaderRow]
    stale: bool
    superseded: bool
    created_ns: int


class Report(TypedDict):
    """``build_report``'s document (``msgq-top --json``)."""

    topics: List[TopicRow]


def snapshot(directory: str, prefix: Optional[str]) -> Dict[str, Stats]:
    """Stats of every matching segment, by file name; a file that cannot be
    read as a segment maps to ``{"error": why}``."""
    taken: Dict[str, Stats] = {}
    for name in list_segments(directory, prefix):
        if not name.isascii():  # msgq names are ASCII: someone else's file (os.listdir kept its bytes)
            taken[name] = {"error": "not a msgq segment name (not ASCII)", "_t": time.monotonic()}
            continue
        try:
            stats = segment_stats(directory, name)
        except (IpcError, OSError) as exc:
            if not os.path.lexists(os.path.join(directory, name)):
                continue  # removed between listing and reading: its last participant left
            stats = {"error": str(exc)}
        stats["_t"] = time.monotonic()
        taken[name] = stats
    return taken


def _rate(new: int, old: Optional[int], seconds: float) -> Optional[float]:
    if old is None or seconds <= 0 or new < old:
        return None
    return round((new - old) / seconds, 3)


def lag_bytes(write_pointer: int, read_pointer: int, data_size: int) -> Optional[int]:
    """Ring bytes between a reader and the writer (None: lapped, or garbage)."""
    wc, wo = write_pointer >> 32, write_pointer & 0xFFFFFFFF
    rc, ro = read_pointer >> 32, read_pointer & 0xFFFFFFFF
    if wo > data_size or ro > data_size:
        return None
    if rc == wc:
        return wo - ro if wo >= ro else None
    if (wc - rc) & 0xFFFFFFFF == 1 and ro >= wo:
        return data_size - ro + wo
    return None


def _schema(directory: Optional[str], name: str, topic: str) -> Optional[Dict[str, Any]]:
    """The topic's declared schema (msgq.schemas) as ``{"encoding", "name", "bytes"}``, or None."""
    if directory is None:
        return None
    try:
        schema = read_schema_file(os.path.join(directory, name + SCHEMA_SUFFIX), topic)
    except IpcError as exc:
        return {"error": str(exc)}
    return None if schema is None else {"encoding": schema.encoding, "name": schema.name, "bytes": len(schema.data)}


def build_report(before: Dict[str, Stats], after: Dict[str, Stats], directory: Optional[str] = None) -> Report:
    """The ``{"topics": [...]}`` document from two snapshots (of ``directory``: with each
    topic's declared schema)."""
    topics: List[TopicRow] = []
    for name, cur in after.items():
        prefix, topic = artifacts.split_name(name) or ("", name)  # snapshot() lists topic rings only
        entry: TopicRow = {"topic": topic, "prefix": prefix, "file": name, "schema": _schema(directory, name, topic)}
        if "error" in cur:
            entry["error"] = cur["error"]
            topics.append(entry)
            continue
        old = before.get(name)
        if old is not None and ("error" in old or old["created_ns"] != cur["created_ns"]):
            old = None  # the file was re-created: its counters restarted
        seconds = cur["_t"] - old["_t"] if old is not None else 0.0
        old_readers = {(r["slot"], r["pid"]): r for r in old["readers"]} if old is not None else {}
        readers: List[ReaderRow] = []
        for r in cur["readers"]:
            o = old_readers.get((r["slot"], r["pid"]))
            readers.append(
                {
                    "slot": r["slot"],
                    "pid": r["pid"],
                    "alive": r["alive"],
                    "conflate": r["conflate"],
                    "messages": r["messages"],
                    "bytes": r["bytes"],
                    "msgs_per_s": _rate(r["messages"], o and o["messages"], seconds),
                    "bytes_per_s": _rate(r["bytes"], o and o["bytes"], seconds),
                    "resets": r["resets"],
                    "lag_bytes": lag_bytes(cur["write_pointer"], r["read_pointer"], cur["data_size"])
                    if r["valid"]
                    else None,
                    "lapped": not r["valid"],
                }
            )
        entry.update(
            {
                "segment_size": cur["data_size"],
                "publisher_pid": cur["publisher_pid"] if cur["publisher_alive"] else None,
                "messages": cur["messages_written"],
                "bytes": cur["bytes_written"],
                "msgs_per_s": _rate(
                    cur["messages_written"], old["messages_written"] if old is not None else None, seconds
                ),
                "bytes_per_s": _rate(cur["bytes_written"], old["bytes_written"] if old is not None else None, seconds),
                "readers": readers,
                "stale": not cur["attached"],
                "superseded": cur["superseded"],
                "created_ns": cur["created_ns"],
            }
        )
        topics.append(entry)
    topics.sort(key=lambda t: (t["prefix"], t["topic"]))
    return {"topics": topics}


def _human(n: Optional[float], unit: str = "") -> str:
    if n is None:
        return "-"
    for suffix in ("", "K", "M", "G"):
        if abs(n) < 1000 or suffix == "G":
            text = f"{n:.0f}" if suffix == "" and float(n).is_integer() else f"{n:.1f}"
            return f"{text}{suffix}{unit}"
        n /= 1000.0
    return str(n)


def _size(n: float) -> str:
    for suffix in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or suffix == "GiB":
            return f"{n:.0f}{suffix}" if suffix == "B" else f"{n:.1f}{suffix}"
        n /= 1024
    return str(n)


def render(report: Report, show_prefix: bool, header: str = "") -> str:
    """A plain-text table of a report."""
    lines = [header] if header else []
    name_width = max([len(_label(t, show_prefix)) for t in report["topics"]] + [5])
    lines.append(
        f"{'TOPIC':<{name_width}}  {'SIZE':>8} {'PUB':>8} {'MSGS':>9} {'RATE':>8} {'BW':>9} {'RDRS':>4}  STATE"
    )
    for t in report["topics"]:
        label = _label(t, show_prefix)
        if "error" in t:
            lines.append(f"{label:<{name_width}}  error: {printable(t['error'])}")
            continue
        state = "stale" if t["stale"] else "superseded" if t["superseded"] else ""
        schema = t.get("schema")
        if schema:
            state = (state + " " if state else "") + printable(
                f"schema error: {schema['error']}" if "error" in schema else f"{schema['encoding']}:{schema['name']}"
            )
        pub = "-" if t["publisher_pid"] is None else str(t["publisher_pid"])
        lines.append(
            f"{label:<{name_width}}  {_size(t['segment_size']):>8} {pub:>8} {_human(t['messages']):>9} "
            f"{_human(t['msgs_per_s'], '/s'):>8} {_human(t['bytes_per_s'], 'B/s'):>9} {len(t['readers']):>4}  {state}"
        )
        for r in t["readers"]:
            lag = "lapped" if r["lapped"] else "-" if r["lag_bytes"] is None else _size(r["lag_bytes"])
            extra = " conflate" if r["conflate"] else ""
            extra += "" if r["alive"] else " dead"
            lines.append(
                f"  slot {r['slot']:>2} pid {r['pid']:>7} {_human(r['msgs_per_s'], '/s'):>8} "
                f"lag {lag:>9} resets {r['resets']}{extra}"
            )
    if not report["topics"]:
        lines.append("(no topics)")
    return "\n".join(lines) + "\n"


def _label(topic: TopicRow, show_prefix: bool) -> str:
    """The topic's name as printed: escaped (file names in /dev/shm may be anyone's)."""
    return printable(f"{topic['prefix']}@{topic['topic']}" if show_prefix and topic["prefix"] else topic["topic"])


class _Keys:
    """Reads lines from a pipe (the live view without a terminal: ``q`` quits);
    ``wait(s)`` returns True when 'q' came. A terminal gets curses instead (``_live``)."""

    def __init__(self, stream) -> None:
        try:
            self.fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.fd = None

    def wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.fd is None:
                time.sleep(left)
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return False
            data = os.read(self.fd, 64)
            if not data:  # end of input: only the timer is left
                self.fd = None
                continue
            if b"q" in data.lower():
                return True


def _live(refresh, interval: float) -> None:
    """The live view on a terminal, drawn with curses (the standard library's terminal
    UI: it restores the terminal on every exit, follows resizes and redraws only what
    changed); ``refresh()`` gives the screen's lines; q or Esc quits."""
    import curses

    def loop(screen) -> None:
        curses.curs_set(0)
        screen.timeout(max(1, int(interval * 1000)))
        while True:
            lines = refresh()
            height, width = screen.getmaxyx()
            screen.erase()
            for row, line in enumerate(lines[:height]):
                screen.addnstr(row, 0, line, max(0, width - 1))
            screen.refresh()
            key = screen.getch()  # waits up to the interval
            if key in (ord("q"), ord("Q"), 27):
                return

    curses.wrapper(loop)


def _shown(name: str) -> str:
    """A file name as printed: control and non-ASCII characters escaped."""
    return name.encode("unicode_escape", "backslashreplace").decode("ascii")


def clean(directory: str, prefix: Optional[str], yes: bool, out: TextIO) -> int:
    """``--clean``: list every stale file of the run (``msgq.artifacts``: topic rings,
    ordered topics, broadcast rings and their large-message directories, fake-event
    files), confirm (unless ``yes``), remove them. Removal re-checks each one (a file
    a process attached to since the listing stays). Exit 2 when asking is impossible
    (no terminal, no ``--yes``)."""
    stale = [a for a in artifacts.scan(directory, prefix) if a.stale]
    if not stale:
        out.write("nothing to clean: nothing in %s has only dead users\n" % _shown(directory))
        return 0
    out.write("left behind by processes that are all dead, in %s:\n" % _shown(directory))
    out.write("".join(f"  {_shown(a.file)}  ({a.kind})\n" for a in stale))
    out.flush()
    if not yes:
        if not sys.stdin.isatty():
            sys.stderr.write("msgq-top: error: --clean asks before removing; without a terminal, pass --yes\n")
            return 2
        try:
            answer = input(f"remove these {len(stale)} file(s)? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            out.write("nothing removed\n")
            return 0
    # files before directories: a broadcast ring goes before its large-message directory
    ordered = sorted(stale, key=lambda a: a.kind == artifacts.OVERFLOW)
    removed = [a.file for a in ordered if artifacts.remove(directory, a)]
    in_use = [a.file for a in stale if a.file not in removed]
    out.write(f"removed {len(removed)} segment(s)\n")
    if in_use:
        out.write("kept (in use again): " + ", ".join(_shown(n) for n in in_use) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="msgq-top",
        usage="msgq-top [--prefix P | --all-prefixes] [--interval S] [--once] [--json] [--check] "
        "[--clean [--yes]] [--dir DIR]",
        description="Show the live msgq topics of this machine: publisher, readers, message rate, "
        "bandwidth, reader lag and resets (drops). Refreshes like top; press q or Ctrl-C to quit.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--prefix",
        metavar="P",
        help="show run prefix P (default: MSGQ_PREFIX or OPENPILOT_PREFIX; unprefixed topics when neither is set)",
    )
    which.add_argument("--all-prefixes", action="store_true", help="show the topics of every run prefix")
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between snapshots (default: 1)"
    )
    parser.add_argument("--once", action="store_true", help="print one table after one interval and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON document after one interval and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="print what is wrong (slow, stopped or dead readers, dead publishers, leftovers, corrupt "
        "files) and what to do, then exit: status 1 if anything is",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove every file of the run whose users are all dead (stale topics, queues, "
        "large-message directories, fake-event files), after listing them and asking",
    )
    parser.add_argument("--yes", action="store_true", help="with --clean: remove without asking")
    parser.add_argument(
        "--dir", metavar="DIR", help="directory of the segment files (default: MSGQ_SHM_DIR or /dev/shm)"
    )
    add_version_flag(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parse_args(parser, argv, config=True)
    if args.interval < 0:
        parser.error("--interval must be >= 0")
    directory = args.dir or segment_dir()
    if args.all_prefixes:
        prefix = None
    elif args.prefix is not None:
        prefix = args.prefix
    else:
        try:
            prefix = current_prefix()
        except IpcError as exc:
            parser.error(str(exc))
    show_prefix = prefix is None
    out = sys.stdout

    if args.yes and not args.clean:
        parser.error("--yes only goes with --clean")
    try:
        if args.clean:
            return clean(directory, prefix, args.yes, out)
        if args.check:
            from msgq.apps.diagnostics import leftovers, problems

            before = snapshot(directory, prefix)  # two snapshots: a reader that stopped reading shows
            time.sleep(args.interval)
            found = problems(build_report(before, snapshot(directory, prefix), directory))
            found += leftovers(directory, artifacts.scan(directory, prefix))
            out.write("\n".join(printable(line) for line in found) + "\n" if found else "no problems\n")
            out.flush()
            return 1 if found else 0
        if args.json or args.once:
            before = snapshot(directory, prefix)
            time.sleep(args.interval)
            report = build_report(before, snapshot(directory, prefix), directory)
            out.write(json.dumps(report, indent=2) + "\n" if args.json else render(report, show_prefix))
            out.flush()
            return 0

        interval = args.interval or 1.0
        state = {"before": snapshot(directory, prefix)}

        def screen() -> str:
            after = snapshot(directory, prefix)
            title = (
                f"msgq-top  {time.strftime('%H:%M:%S')}  dir {printable(directory)}  "
                f"prefix {'(all)' if prefix is None else printable(prefix) or '(none)'}  "
                f"every {interval:g}s  q: quit"
            )
            text = render(build_report(state["before"], after, directory), show_prefix, title)
            state["before"] = after
            return text

        if sys.stdin.isatty() and out.isatty() and os.environ.get("TERM", "dumb") != "dumb":
            _live(lambda: screen().splitlines(), interval)
            return 0
        keys = _Keys(sys.stdin)  # a pipe: plain screens, each after a clear-screen sequence
        while not keys.wait(interval):
            out.write(CLEAR + screen())
            out.flush()
        return 0
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `msgq-top --once | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
