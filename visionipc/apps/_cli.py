"""Pieces every visionipc command shares: a SIGINT/SIGTERM stop flag and one way
to report a usage error (optional imports with an install hint live in the
library, ``visionipc.optional``)."""

import argparse
import signal
import sys
import threading
from typing import Any, Callable, Dict, Optional, Sequence

from msgq.cli import parse_args
from msgq.errors import IpcError
from msgq.tooling import printable
from visionipc.optional import UsageError, need  # noqa: F401  (re-exported for the apps)


class Stopper:
    """SIGINT / SIGTERM set ``event`` (instead of raising KeyboardInterrupt), so loops
    stop at a point of their choosing and close files and segments properly.
    Handlers are only installed from the main thread; ``restore()`` puts the old ones back."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: Optional[int] = None
        self._saved: Dict[int, Any] = {}  # signal -> its previous handler
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signal = signum
        self.event.set()

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()


def error(prog: str, message: str) -> int:
    """``message`` as one escaped line (msgq.tooling.printable: names from files and other users'
    processes may hold terminal escapes), exit status 2."""
    print(f"{prog}: error: {printable(message)}", file=sys.stderr)
    return 2


def run_command(
    prog: str,
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    argv: Optional[Sequence[str]] = None,
    config: bool = False,
) -> int:
    """``main``'s body for every command: parse ``argv`` with the common options
    (``msgq.cli``: --version, --log-level, --print-completion, and ``config``: --config
    FILE), ``run(args)``, and turn UsageError into a one-line message and exit status 2,
    and an error of the libraries (``msgq.IpcError``: a server name taken, no shared
    memory left, ...) into a one-line message and exit status 1."""
    args = parse_args(parser, argv, config=config)
    try:
        return run(args)
    except UsageError as e:
        return error(prog, str(e))
    except IpcError as e:
        print(f"{prog}: error: {printable(str(e))}", file=sys.stderr)
        return 1


def add_wake(parser: argparse.ArgumentParser) -> None:
    """``--wake all|handoff`` of the commands that publish frames (vipc-camera, vipc-replay):
    VisionIpcServer's ``wake=`` (default: ``MSGQ_WAKE``, else ``all``)."""
    parser.add_argument(
        "--wake",
        choices=("all", "handoff"),
        help="how a frame wakes sleeping clients: all (default; each as early as it can) or handoff "
        "(the server wakes one, that client the others: the server's CPU per frame stays flat "
        "in the number of clients); default: $MSGQ_WAKE, else all",
    )


def add_wait_clients(parser: argparse.ArgumentParser) -> None:
    """``--wait-clients N`` of the commands that publish frames (vipc-camera, vipc-replay)."""
    parser.add_argument(
        "--wait-clients",
        type=int,
        default=0,
        metavar="N",
        help="before the first frame, wait until every stream has N clients",
    )
