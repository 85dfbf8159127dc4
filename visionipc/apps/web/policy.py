"""Who a web surface answers: the Host, Origin and owner checks, as one aiohttp middleware.

A request is answered only if all three hold (else the status in brackets, with a line
that says what to change):

- **Host** [421] is the bound address, a localhost name or an ``--allow-host`` name: a page
  of another site whose name is made to resolve to this machine (DNS rebinding) sends
  that name as Host.
- **Origin** [403]: a request a browser makes for a page of another site carries that
  site's Origin (and ``Sec-Fetch-Site: cross-site``); only the tool's own origin (a file
  it serves itself) and the ``--allow-origin`` ones (e.g. https://app.foxglove.dev) pass.
  Browsers let any site open a WebSocket to 127.0.0.1, so the loopback address alone
  protects nothing. A request without Origin and Sec-Fetch-Site is not a browser's
  cross-site request (curl, a Python client) and passes this check.
- **Owner** [401]: the per-run secret printed in the URL (``?token=...``, as Jupyter),
  or in an ``Authorization: Bearer`` header, or in the cookie the first answer with a
  right token sets (HttpOnly, SameSite=Strict), so a page's own requests carry it.
  Other local users cannot read it (it is made at start, never on a command line), so
  they get 401 where every shared-memory path already refuses them. ``--no-auth``
  turns this check off on a trusted machine; ``$VIPC_WEB_TOKEN`` sets the secret
  instead of a random one (scripts that restart the tool).

Every refusal is counted (``counts``) and logged escaped through the PeerLog.
"""

import hashlib
import hmac
import ipaddress
import os
import secrets
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple

from aiohttp import web

from msgq.tooling import printable
from visionipc.apps.web.flags import host_of, normal_origin

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

    from visionipc.apps.web.peerlog import PeerLog

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")
TOKEN_ENV = "VIPC_WEB_TOKEN"
FOREIGN_FETCH_SITES = ("cross-site", "same-site")  # Sec-Fetch-Site of another origin's request


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class HostCheck:
    """Which ``Host`` headers a surface answers: the bound address, localhost names, and
    the ``--allow-host`` names. Bound to every address (0.0.0.0, ::), any IP literal is
    the bound address; a name never is, unless allowed."""

    def __init__(self, bound_host: str, allowed: Iterable[str] = ()) -> None:
        self.bound: Optional[str] = host_of(bound_host) if bound_host not in WILDCARDS else None
        self.names = {host_of(h) for h in allowed} | set(LOCAL_NAMES)
        if self.bound is not None:
            self.names.add(self.bound)

    def allows(self, header: Optional[str]) -> bool:
        if header is None:
            return True  # HTTP/1.0 without Host: not a browser, nothing to rebind
        host = host_of(header)
        return host in self.names or (self.bound is None and _is_ip(host))


class WebPolicy:
    """The three checks of one surface (``prog`` names it in messages); ``middleware``
    applies them to every request, before any handler."""

    def __init__(
        self,
        prog: str,
        bound_host: str = "127.0.0.1",
        allow_hosts: Iterable[str] = (),
        allow_origins: Iterable[str] = (),
        auth: bool = True,
        token: Optional[str] = None,
        log: Optional["PeerLog"] = None,
    ) -> None:
        self.prog = prog
        self.hosts = HostCheck(bound_host, allow_hosts)
        self.origins = {normal_origin(o) for o in allow_origins}
        self.auth = auth
        self.token: Optional[str] = (token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)) if auth else None
        # one cookie name per secret: two tools on one host (cookies ignore ports) keep theirs
        digest = hashlib.sha256((self.token or "").encode()).hexdigest()[:12]
        self.cookie = f"vipc-{digest}"
        self.log = log
        self.counts: Dict[str, int] = {"wrong_host": 0, "foreign_origin": 0, "no_token": 0}

    def url_query(self) -> str:
        """What the printed URL ends with: ``?token=...`` (nothing with --no-auth)."""
        return f"?token={self.token}" if self.auth else ""

    def _refuse(self, request: web.Request, kind: str, what: str) -> None:
        self.counts[kind] += 1
        if self.log is not None:
            peer = request.remote or "?"
            self.log.say(f"refused {request.method} {request.path[:80]} from {peer}: {what}")

    # -- the three checks --------------------------------------------------------

    def origin_allowed(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            # a link followed from another site's page shows that page nothing it could read
            headers = request.headers
            opened = headers.get("Sec-Fetch-Mode") == "navigate" and headers.get("Sec-Fetch-Dest") == "document"
            return opened or request.headers.get("Sec-Fetch-Site", "") not in FOREIGN_FETCH_SITES
        origin = normal_origin(origin)
        if origin in self.origins:
            return True
        own = {f"http://{request.host.lower()}", f"ws://{request.host.lower()}"}
        return origin in {normal_origin(o) for o in own} and (
            request.headers.get("Sec-Fetch-Site", "same-origin") not in FOREIGN_FETCH_SITES
        )

    def token_of(self, request: web.Request) -> Tuple[Optional[str], bool]:
        """(token the request shows, whether it came in the URL)."""
        query = request.query.get("token")
        if query is not None:
            return query, True
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() in ("bearer", "token") and value:
            return value.strip(), False
        return request.cookies.get(self.cookie), False

    def owner(self, request: web.Request) -> bool:
        shown, _ = self.token_of(request)
        assert self.token is not None, "owner() is asked only with auth on"
        return shown is not None and hmac.compare_digest(shown.encode("utf-8", "surrogateescape"), self.token.encode())

    @web.middleware
    async def middleware(self, request: web.Request, handler: "Handler") -> web.StreamResponse:
        header = request.headers.get("Host")
        if header is not None and not self.hosts.allows(header):  # (allows a missing Host)
            shown, name = printable(header)[:100], printable(host_of(header))[:100]
            self._refuse(request, "wrong_host", f"Host '{shown}'")
            raise web.HTTPMisdirectedRequest(
                text=f"{self.prog} does not answer Host '{shown}' (it answers its own address and localhost); "
                f"if that name is really this machine, start {self.prog} with --allow-host {name}\n"
            )
        if not self.origin_allowed(request):
            origin = printable(request.headers.get("Origin", "(none)"))[:100]
            self._refuse(request, "foreign_origin", f"Origin '{origin}'")
            raise web.HTTPForbidden(
                text=f"{self.prog} does not answer pages of other sites (Origin '{origin}'); "
                f"to let one in, start {self.prog} with --allow-origin ORIGIN (e.g. https://app.foxglove.dev)\n"
            )
        from_url = False
        if self.auth:
            if not self.owner(request):
                self._refuse(request, "no_token", "no or wrong token")
                raise web.HTTPUnauthorized(
                    text=f"{self.prog} answers its owner only: open the URL it printed at start "
                    f"(it ends with ?token=...), or send 'Authorization: Bearer TOKEN'; "
                    f"on a trusted machine, start it with --no-auth\n",
                    headers={"WWW-Authenticate": 'Bearer realm="visionipc"'},
                )
            from_url = self.token_of(request)[1]
        response = await handler(request)
        if from_url and self.token is not None and not response.prepared:  # the page's own requests carry it
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        if not response.prepared:
            response.headers.setdefault("Referrer-Policy", "no-referrer")
        return response
