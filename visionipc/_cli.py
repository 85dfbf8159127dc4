"""Pieces every visionipc command shares: optional imports with an install hint,
a SIGINT/SIGTERM stop flag, and one way to report a usage error."""

import importlib
import signal
import sys
import threading


class UsageError(Exception):
    """Bad input from the command line or a config file: printed, exit status 2."""


def need(module: str, extra: str):
    """Import an optional dependency or raise UsageError naming the pip extra that has it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"this command needs the Python package {module!r} ({e}); "
                         f"install it with: pip install 'visionipc[{extra}]'") from None


class Stopper:
    """SIGINT / SIGTERM set ``event`` (instead of raising KeyboardInterrupt), so loops
    stop at a point of their choosing and close files and segments properly.
    Handlers are only installed from the main thread; ``restore()`` puts the old ones back."""

    def __init__(self):
        self.event = threading.Event()
        self.signal = None
        self._saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.signal = signum
        self.event.set()

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def restore(self):
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()


def error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def run_command(prog: str, parser, run, argv=None) -> int:
    """``main``'s body for every command: parse ``argv``, ``run(args)``, and turn
    UsageError into a one-line message and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        return error(prog, str(e))
