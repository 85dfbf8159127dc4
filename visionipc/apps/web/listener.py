"""GuardedSite: the listening socket of a web surface, with our own accept loop.

asyncio's accept loop has no connection limit, no header timeout, and on EMFILE logs a
traceback per attempt; aiohttp keeps an idle connection for an hour. Here:

- **A connection limit** (``--max-connections``, lowered to what RLIMIT_NOFILE leaves).
  When full, a new connection takes the place of the oldest one that is *not* inside a
  request (half-open: headers not complete; or idle between keep-alive requests) and is
  older than GRACE_S: a slowloris holding hundreds of half-open connections cannot keep a
  real request out, because a real request completes its headers within its grace and is
  then inside a request. If all are that young, accepting pauses a moment (the new ones
  wait in the kernel's backlog); if every connection is inside a request (live streams,
  WebSockets), the new one gets a short 503 and is closed.
- **A header timeout** (HEADER_TIMEOUT_S from accept to the first complete request) and
  **an idle timeout** (IDLE_TIMEOUT_S between requests), checked every second.
- **Accept errors** are logged once (``counts`` has the rest). EMFILE (and ENFILE, ENOBUFS,
  ENOMEM) lowers the limit to what is open, closes a few idle connections and accepts
  again as soon as their descriptors are free; with none to close (or any other error)
  accepting pauses with an exponential back-off (50 ms .. 1 s). The waiting connections
  stay in the kernel's backlog meanwhile.

A connection is "inside a request" from the moment its request reaches the ``middleware``
(headers parsed) until the handler returns (an MJPEG stream or a WebSocket: its whole life).
"""

import asyncio
import errno
import os
import resource
import socket
import stat
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple, TypedDict

from aiohttp import web

from visionipc.apps.web.flags import MAX_CONNECTIONS

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

    from visionipc.apps.web.peerlog import PeerLog

HEADER_TIMEOUT_S = 10.0  # accept -> first request's headers complete
IDLE_TIMEOUT_S = 30.0  # between two requests of one keep-alive connection
FD_RESERVE = 48  # descriptors kept for everything else (clients of the VisionIPC server, files)
ACCEPT_BATCH = 16  # connections taken per readiness event (each may close one more, freed a turn later)
BACKOFF_S = (0.05, 1.0)  # first and longest pause after an accept error
SWEEP_S = 1.0
EMFILE_MARGIN = 4  # after EMFILE: the limit goes this far below the open connections
GRACE_S = 0.1  # a new connection is never closed for a newer one before this age
RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
TRANSIENT_ERRNOS = (errno.ECONNABORTED, errno.EPROTO, errno.EAGAIN, errno.EINTR, errno.EPERM)


class _Conn:
    __slots__ = ("transport", "since", "requests", "busy")

    def __init__(self, now: float) -> None:
        self.transport: Optional[asyncio.BaseTransport] = None
        self.since = now  # accept time, then the end of its last request
        self.requests = 0
        self.busy = 0  # requests in a handler now


def descriptor_limit(wanted: int) -> int:
    """``wanted`` connections, at most what RLIMIT_NOFILE leaves after the open
    descriptors and FD_RESERVE (that, never below 4)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 32
    return min(wanted, max(4, soft - used - FD_RESERVE))


class GuardReport(TypedDict):
    """A surface's connections as its stats show them."""

    open: int
    limit: int
    accepted: int
    closed_for_newer: int
    refused_full: int
    header_timeouts: int
    idle_timeouts: int
    accept_errors: int


class Guard:
    """The connections of one surface: limit, timeouts, counters; ``middleware`` marks
    the ones inside a request."""

    def __init__(self, prog: str, max_connections: int = MAX_CONNECTIONS, log: Optional["PeerLog"] = None) -> None:
        self.prog = prog
        self.wanted = max_connections
        self.limit = descriptor_limit(max_connections)
        self.log = log
        self.conns: Dict[Any, _Conn] = {}  # transport -> _Conn, for connections handed to aiohttp
        self.connecting = 0  # accepted, not yet handed over
        self.counts: Dict[str, int] = {
            "accepted": 0,
            "closed_for_newer": 0,
            "refused_full": 0,
            "header_timeouts": 0,
            "idle_timeouts": 0,
            "accept_errors": 0,
        }
        self._said_full = False

    def report(self) -> GuardReport:
        return {"open": len(self.conns), "limit": self.limit, **self.counts}  # type: ignore[typeddict-item]

    def prune(self) -> None:
        for transport in [t for t in self.conns if t.is_closing()]:
            del self.conns[transport]

    def full(self) -> bool:
        if len(self.conns) + self.connecting < self.limit:
            return False
        self.prune()
        return len(self.conns) + self.connecting >= self.limit

    def close_oldest_idle(self, grace: float = GRACE_S) -> bool:
        """Close the connection that has waited longest outside a request (at least
        ``grace`` s: a new one gets that long to send its headers); False if none."""
        before = asyncio.get_running_loop().time() - grace
        idle = [(c.since, t) for t, c in self.conns.items() if not c.busy and c.since <= before]
        if not idle:
            return False
        _, transport = min(idle, key=lambda pair: pair[0])
        transport.abort()
        del self.conns[transport]
        return True

    def make_room(self) -> str:
        """Room for one more connection? "yes" (closing the oldest idle one if full),
        "wait" (the full ones are still being handed over: try again in a moment) or
        "no" (every one is inside a request)."""
        if not self.full():
            return "yes"
        if not self._said_full and self.log is not None:
            self._said_full = True
            self.log.say(
                f"connection limit {self.limit} reached: each new connection now closes the oldest idle or "
                "half-open one (logged once; counted in the stats)"
            )
        if self.close_oldest_idle():
            self.counts["closed_for_newer"] += 1
            return "yes"
        young = any(not c.busy for c in self.conns.values())
        return "wait" if self.connecting or young else "no"

    def sweep(self, now: float) -> None:
        """Close the connections past their header or idle timeout."""
        for transport, conn in list(self.conns.items()):
            if transport.is_closing():
                del self.conns[transport]
            elif not conn.busy:
                first = conn.requests == 0
                if now - conn.since > (HEADER_TIMEOUT_S if first else IDLE_TIMEOUT_S):
                    self.counts["header_timeouts" if first else "idle_timeouts"] += 1
                    transport.abort()
                    del self.conns[transport]

    @web.middleware
    async def middleware(self, request: web.Request, handler: "Handler") -> web.StreamResponse:
        conn = self.conns.get(request.transport)
        if conn is None:  # already closed for a newer one, or not ours
            return await handler(request)
        conn.busy += 1
        conn.requests += 1
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.since = asyncio.get_running_loop().time()


class _Listening:
    """What aiohttp's runner expects of a site's server: ``sockets`` and ``close()``."""

    def __init__(self, site: "GuardedSite", sock: socket.socket) -> None:
        self.site = site
        self.sockets = [sock]

    def close(self) -> None:
        self.site._close()


class GuardedSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: Guard,
        backlog: int = 1024,
        path: Optional[str] = None,
    ) -> None:
        """``path``: listen on a Unix-domain socket there instead (mode 600: its owner only)."""
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self.guard, self.path = host, port, guard, path
        self._inode: Optional[int] = None
        self._sock: Optional[socket.socket] = None
        self._started_loop: Optional[asyncio.AbstractEventLoop] = None
        self._timers: List[asyncio.Handle] = []
        self._backoff = BACKOFF_S[0]
        self._said_errors: Set[str] = set()
        self._tasks: "Set[asyncio.Task[None]]" = set()

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self._started_loop is not None, "start() first"
        return self._started_loop

    @property
    def _listening(self) -> socket.socket:
        assert self._sock is not None, "start() first"
        return self._sock

    @property
    def name(self) -> str:
        return f"unix:{self.path}" if self.path else f"http://{self._host}:{self.port}"

    @property
    def port(self) -> Optional[int]:
        if self.path:
            return None
        return self._sock.getsockname()[1] if self._sock else self._port

    def _unix_socket(self) -> socket.socket:
        """A listening socket at ``path``, mode 600 from the start (a stale socket of ours
        with nobody listening is replaced; anything else there is EADDRINUSE / EEXIST)."""
        path = self.path
        assert path is not None  # start() calls this with a path only
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
                raise OSError(errno.EEXIST, f"{path} exists and is not a socket of ours")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise OSError(errno.EADDRINUSE, f"another server listens on {path}")
            except ConnectionRefusedError:
                os.unlink(path)  # left by a server that died
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._inode = os.lstat(path).st_ino
        return sock

    async def start(self) -> None:
        await super().start()
        self._started_loop = asyncio.get_running_loop()
        if self.path:
            self._listen(self._unix_socket())
            return
        family, _, _, _, address = socket.getaddrinfo(
            self._host or None, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and self._host in ("", "::"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
        except OSError:
            sock.close()
            raise
        self._listen(sock)

    def _listen(self, sock: socket.socket) -> None:
        try:
            sock.listen(self._backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._server = _Listening(self, sock)  # type: ignore[assignment]  # the runner uses .sockets and .close()
        self._loop.add_reader(sock.fileno(), self._accept)
        self._timers.append(self._loop.call_later(SWEEP_S, self._sweep))

    def _close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        if self.path and self._inode is not None:
            try:
                if os.lstat(self.path).st_ino == self._inode:  # ours, not a successor's
                    os.unlink(self.path)
            except OSError:
                pass
            self._inode = None

    def _sweep(self) -> None:
        self.guard.sweep(self._loop.time())
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(self._loop.call_later(SWEEP_S, self._sweep))

    def _say_once(self, key: str, text: str) -> None:
        if key not in self._said_errors and self.guard.log is not None:
            self._said_errors.add(key)
            self.guard.log.say(text)

    def _pause(self) -> None:
        self._loop.remove_reader(self._listening.fileno())
        self._timers.append(self._loop.call_later(self._backoff, self._resume))
        self._backoff = min(BACKOFF_S[1], self._backoff * 2)

    def _resume(self) -> None:
        if self._listening.fileno() >= 0:
            self._loop.add_reader(self._listening.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            room = self.guard.make_room()  # before accepting: over the limit, nothing is taken in
            if room == "wait":  # the idle ones are all new: give them their grace, then look again
                self._loop.remove_reader(self._listening.fileno())
                self._timers.append(self._loop.call_later(GRACE_S / 4, self._resume))
                return
            try:
                conn, _ = self._listening.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                self.guard.counts["accept_errors"] += 1
                code = exc.errno or 0  # accept() sets it
                if code in TRANSIENT_ERRNOS:
                    continue
                name = errno.errorcode.get(code, str(code))
                if code in RESOURCE_ERRNOS:
                    # the descriptors end below the limit: lower it to what is open now, close a few
                    # idle connections (their descriptors are free on the next turn of the loop)
                    guard = self.guard
                    guard.prune()
                    guard.limit = max(4, min(guard.limit, len(guard.conns) + guard.connecting - EMFILE_MARGIN))
                    freed = sum(guard.close_oldest_idle(grace=0) for _ in range(EMFILE_MARGIN))
                    self._say_once(
                        name,
                        f"accept() failed: {name} ({os.strerror(code)}): connection limit lowered to "
                        f"{guard.limit}; idle connections closed to make room, accepting paused meanwhile "
                        "(logged once; counted in the stats)",
                    )
                    if freed:
                        self._loop.remove_reader(self._listening.fileno())
                        self._timers.append(self._loop.call_soon(self._resume))
                        return
                else:
                    self._say_once(name, f"accept() failed: {name} ({os.strerror(code)}) (logged once)")
                self._pause()
                return
            self._backoff = BACKOFF_S[0]
            self.guard.counts["accepted"] += 1
            if room == "no":
                self._refuse(conn)
                continue
            conn.setblocking(False)
            self.guard.connecting += 1
            task = self._loop.create_task(self._hand_over(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refuse(self, conn: socket.socket) -> None:
        self.guard.counts["refused_full"] += 1
        body = f"{self.guard.prog}: every one of its {self.guard.limit} connections is in use; try again later\n"
        head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        try:
            conn.setblocking(False)
            conn.send(f"{head}Connection: close\r\n\r\n{body}".encode())
        except OSError:
            pass
        conn.close()

    async def _hand_over(self, conn: socket.socket) -> None:
        record = _Conn(self._loop.time())
        try:
            server = self._runner.server
            assert server is not None  # the runner was set up before start()
            transport, _ = await self._loop.connect_accepted_socket(server, conn)
        except Exception:
            conn.close()
            return
        finally:
            self.guard.connecting -= 1
        record.transport = transport
        self.guard.conns[transport] = record


async def start_site(
    app: web.Application, host: str, port: int, guard: Guard, path: Optional[str] = None
) -> Tuple[web.AppRunner, GuardedSite]:
    """Run ``app`` on a GuardedSite at host:port (or the Unix-domain socket ``path``):
    (runner, site); OSError if it cannot listen (the runner is cleaned up then).
    aiohttp's own keep-alive limit is set to IDLE_TIMEOUT_S too."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=IDLE_TIMEOUT_S, shutdown_timeout=1.0)
    await runner.setup()
    site = GuardedSite(runner, host, port, guard, path=path)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, site
