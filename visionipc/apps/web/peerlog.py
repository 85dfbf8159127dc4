"""PeerLog: what a web surface says on stderr about its peers, escaped and rate-limited.

Whatever a peer sends (a Host header, a WebSocket message, a reason for closing) is
untrusted: printed as is, an ESC sequence would act on the terminal and a newline would
forge a line of our own. Every line goes through ``msgq.tooling.printable`` (one
line, escapes visible), is cut at MAX_CHARS, and at most BURST lines plus RATE per
second reach stderr; the rest are counted and reported in one line when the log may
speak again (or at ``flush()``), so a peer that sends 10,000 bad messages costs a few
lines, not 10,000.

The same log takes aiohttp's and asyncio's own log records (``capture_library_logs``),
so a malformed request or a failing ``accept()`` is one escaped line too, never a
traceback per connection.
"""

import logging
import threading
import time
from typing import Optional, TextIO

from msgq.tooling import printable

MAX_CHARS = 300  # of one line, after escaping
BURST = 20  # lines that may come at once
RATE = 2.0  # lines per second after the burst


class PeerLog:
    def __init__(self, prog: str, stream: Optional[TextIO] = None, burst: int = BURST, rate: float = RATE) -> None:
        self.prog = prog
        self.stream = stream
        self.burst, self.rate = burst, rate
        self._tokens = float(burst)
        self._last = time.monotonic()
        self.suppressed = 0  # lines not printed since the last report of them
        self.printed = 0
        self._lock = threading.Lock()  # pump threads log too

    def _emit(self, line: str) -> None:
        """One line: to ``stream`` if one was given, else through the tool's logger
        (msgq.cli's one format on stderr, ``PROG: line``; ``--log-level warning`` hides it)."""
        if self.stream is not None:
            print(f"{self.prog}: {line}", file=self.stream, flush=True)
        else:
            logging.getLogger(self.prog).info(line)

    def say(self, text: str) -> bool:
        """Print ``prog: text`` (escaped, cut) if the rate allows; True if printed."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1:
                self.suppressed += 1
                return False
            self._tokens -= 1
            line = printable(text)
            if len(line) > MAX_CHARS:
                line = line[:MAX_CHARS] + "..."
            self._report_suppressed()
            self._emit(line)
            self.printed += 1
            return True

    def _report_suppressed(self) -> None:
        if self.suppressed:
            self._emit(f"{self.suppressed} more log lines were left out (at most {self.rate:g} a second)")
            self.printed += 1
            self.suppressed = 0

    def flush(self) -> None:
        """Say how many lines were left out, if any (at exit, or now and then)."""
        with self._lock:
            self._report_suppressed()


class _ToPeerLog(logging.Handler):
    """A library's log record as one escaped, rate-limited line (the exception's own
    message, never its traceback)."""

    def __init__(self, log: PeerLog) -> None:
        super().__init__()
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        why = f": {type(exc).__name__}: {' '.join(str(exc).split())}" if exc is not None else ""
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format
            message = str(record.msg)
        self.log.say(message + why)


LIBRARY_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.websocket", "asyncio")


def capture_library_logs(log: PeerLog) -> None:
    """Route aiohttp's and asyncio's log records to ``log`` (replacing an earlier PeerLog)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, _ToPeerLog)]:
            logger.removeHandler(handler)
        logger.addHandler(_ToPeerLog(log))
        logger.propagate = False
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
