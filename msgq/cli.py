"""What every command-line tool of msgq and visionipc does alike (``msgq-top``,
``msgq-bridge``, ``vipc-camera``, ``vipc-record``, ``vipc-replay``, ``vipc-view``,
``vipc-analyze``, ``vipc-bench``, ``vipc-foxglove``):

- ``--version``: "PROG VERSION";
- ``--log-level {debug,info,warning,error}`` (default ``info``, or ``$VIPC_LOG_LEVEL``):
  stdlib :mod:`logging` to stderr in one format, ``PROG: message`` for information and
  ``PROG: warning: message`` (``error``, ``debug``) otherwise; the libraries' loggers
  (``msgq.broadcast``, ``msgq.zmq``, ...) print through the same handler;
- ``--config FILE`` on the long-running tools: a TOML file holding the same options as
  the command line, by their long names (``segment-seconds = 60`` for
  ``--segment-seconds 60``; ``true``/``false`` for switches; a list for an option that
  takes several values or may be repeated); the command line wins over the file (a
  repeated option gets the file's values first). A tool with subcommands
  (``msgq-bridge in|out``) reads the file's keys for the subcommand given on the
  command line, and a table named after it (``[in]``) for that subcommand alone;
- ``--print-completion {bash,zsh,tcsh}``: a shell completion script generated from the
  parser (`shtab`), e.g. ``eval "$(vipc-record --print-completion bash)"``;
- :func:`progress`: a progress bar (tqdm) on stderr when stderr is a terminal, nothing
  otherwise (logs and pipes stay clean).

Each tool calls :func:`parse_args` instead of ``parser.parse_args`` and gets this.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from typing import Any, Dict, Iterable, Optional, Sequence

LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "VIPC_LOG_LEVEL"


# ------------------------------------------------------------------ logging


class _Format(logging.Formatter):
    """``PROG: message`` for INFO, ``PROG: level: message`` for the other levels."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.levelno >= logging.ERROR:
            text = f"{text} ({record.exc_info[1]!r})"  # one line, no traceback
        if record.levelno == logging.INFO:
            return f"{self.prog}: {text}"
        return f"{self.prog}: {record.levelname.lower()}: {text}"


class _Stderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record comes (a test's capture, a
    stream replaced after start-up), never on one it kept and that may be closed."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


OWN_LOGGERS = ("msgq", "visionipc")  # the libraries' loggers, at the tool's level


def setup_logging(prog: str, level: str = "info") -> logging.Logger:
    """Every log record to stderr in the one format: the tool's own logger and the
    libraries' (``msgq.*``, ``visionipc.*``) at ``level``, other packages' at warning
    and above (at ``debug``, everything). Called again (a tool's ``main`` run twice in
    one process), it replaces its handler. Returns the tool's logger."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_msgq_cli", False):
            root.removeHandler(handler)
    handler = _Stderr()
    handler._msgq_cli = True  # type: ignore[attr-defined]
    handler.setFormatter(_Format(prog))
    root.addHandler(handler)
    number = logging.getLevelName(level.upper())
    root.setLevel(min(number, logging.WARNING) if number == logging.DEBUG else max(number, logging.WARNING))
    for name in (prog, *OWN_LOGGERS):
        logging.getLogger(name).setLevel(number)
    return logging.getLogger(prog)


# ------------------------------------------------------------------ config files


class ConfigError(ValueError):
    """A config file that cannot be read or names an option the tool does not have."""


def _load_toml(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read --config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path} is not valid TOML: {e}") from None


_RESERVED = {"help", "version", "config", "print_completion"}


def _options(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    """dest -> the option's action, for every ``--long`` option a config file may set."""
    found: Dict[str, argparse.Action] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and action.dest not in _RESERVED and action.help != argparse.SUPPRESS:
            found.setdefault(action.dest, action)
            for s in longs:
                found.setdefault(s[2:].replace("-", "_"), action)
    return found


def _tokens(parser: argparse.ArgumentParser, values: dict, where: str) -> list:
    """Command-line tokens saying what ``values`` (a TOML table) says."""
    options = _options(parser)
    out: list = []
    for key, value in values.items():
        action = options.get(key.replace("-", "_"))
        if action is None:
            close = difflib.get_close_matches(key.replace("_", "-"), [k.replace("_", "-") for k in options], 1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown option {key!r}{hint}")
        flag = max((s for s in action.option_strings if s.startswith("--")), key=len)
        if action.nargs == 0:  # a switch: store_true / store_false / store_const / count
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} is a switch: true or false, not {value!r}")
            if isinstance(action, argparse.BooleanOptionalAction):
                out.append(flag if value else "--no-" + flag[2:])
            elif value == (not isinstance(action, argparse._StoreFalseAction)):
                out.append(flag)
            continue
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, (dict, list)) for v in items):
            raise ConfigError(f"{where}: {key} takes plain values, not {value!r}")
        text = [str(v).lower() if isinstance(v, bool) else str(v) for v in items]
        if isinstance(action, argparse._AppendAction):
            for v in text:
                out += [flag, v]
        elif action.nargs is None or action.nargs == "?":
            if len(text) != 1:
                raise ConfigError(f"{where}: {key} takes one value, not {value!r}")
            out += [flag, text[0]]
        else:
            out += [flag, *text]
    return out


def _config_argv(parser: argparse.ArgumentParser, argv: list) -> list:
    """``argv`` with the tokens of its ``--config FILE`` (if any) put in front of the
    command line's own (after the subcommand, for a tool that has subcommands)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # --conf is not --config
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if not known.config:
        return argv
    values = _load_toml(known.config)
    where = f"--config {known.config}"
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return _tokens(parser, values, where) + argv
    choices = subs[0].choices
    at = next((i for i, tok in enumerate(argv) if tok in choices), None)
    if at is None:
        return argv  # argparse says a subcommand is missing
    name = argv[at]
    unknown = [k for k, v in values.items() if isinstance(v, dict) and k not in choices]
    if unknown:
        raise ConfigError(f"{where}: unknown table [{unknown[0]}] (subcommands: {', '.join(choices)})")
    common = {k: v for k, v in values.items() if not isinstance(v, dict)}
    top_level = _options(parser)  # --log-level and the like go before the subcommand
    before = {k: v for k, v in common.items() if k.replace("-", "_") in top_level}
    after = {k: v for k, v in common.items() if k not in before}
    after.update(values.get(name, {}))
    return argv[:at] + _tokens(parser, before, where) + [name] + _tokens(choices[name], after, where) + argv[at + 1 :]


# ------------------------------------------------------------------ the parser


def add_common(parser: argparse.ArgumentParser, config: bool = False) -> None:
    """``--version``, ``--log-level``, ``--print-completion`` and (``config``) ``--config``."""
    from msgq import add_version_flag

    have = {s for a in parser._actions for s in a.option_strings}
    if "--version" not in have:
        add_version_flag(parser)
    if "--log-level" not in have:
        parser.add_argument(
            "--log-level",
            choices=LEVELS,
            default=os.environ.get(LOG_LEVEL_ENV, "info").lower(),
            help=f"what to print on stderr (default: ${LOG_LEVEL_ENV}, else info)",
        )
    if config and "--config" not in have:
        parser.add_argument(
            "--config",
            metavar="FILE",
            help="TOML file with the same options by their long names (the command line wins)",
        )
    if "--print-completion" not in have:
        parser.add_argument(
            "--print-completion",
            choices=("bash", "zsh", "tcsh"),
            action=_Completion,
            help='print a shell completion script and exit: eval "$(PROG --print-completion bash)"',
        )
        parser.add_argument("--print-man", nargs=0, action=_ManPage, help=argparse.SUPPRESS)


class _Completion(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=1, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            import shtab
        except ImportError:
            parser.exit(2, f"{parser.prog}: error: --print-completion needs shtab: pip install shtab\n")
        print(shtab.complete(parser, shell=values[0]))
        parser.exit(0)


class _ManPage(argparse.Action):
    """``--print-man`` (hidden): the tool's man page in roff, made from its parser
    (argparse-manpage); ``tools/make_man.py`` writes every tool's into a ``man1`` folder."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            from argparse_manpage.manpage import Manpage
        except ImportError:
            parser.exit(2, f"{parser.prog}: error: --print-man needs argparse-manpage: pip install argparse-manpage\n")
        from msgq import __version__

        data = {
            "project_name": "visionipc",
            "version": __version__,
            "manual_title": "visionipc manual",
            "manual_section": 1,
            "url": "https://github.com/commaai/msgq (the API it reimplements)",
        }
        print(str(Manpage(parser, data)))
        parser.exit(0)


def parse_args(
    parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None, config: bool = False
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with the common options (:func:`add_common`), the
    config file's options in front of the command line's, and logging set up."""
    add_common(parser, config)
    argv = list(sys.argv[1:] if argv is None else argv)
    if config:
        try:
            argv = _config_argv(parser, argv)
        except ConfigError as e:
            parser.exit(2, f"{parser.prog}: error: {e}\n")
    args = parser.parse_args(argv)
    setup_logging(parser.prog, getattr(args, "log_level", "info"))
    return args


# ------------------------------------------------------------------ progress


def progress(
    iterable: Optional[Iterable[Any]] = None,
    total: Optional[float] = None,
    desc: Optional[str] = None,
    unit: str = "it",
    stream: Any = None,
) -> Any:
    """A tqdm progress bar on ``stream`` (stderr) when it is a terminal, else a silent
    one (same methods, prints nothing); silent too where tqdm is not installed."""
    stream = sys.stderr if stream is None else stream
    on_terminal = hasattr(stream, "isatty") and stream.isatty()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Silent(iterable)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, disable=not on_terminal, leave=False)


class _Silent:
    def __init__(self, iterable=None):
        self.iterable, self.n = iterable, 0

    def __iter__(self):
        return iter(self.iterable or ())

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, *_a, **_k):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
