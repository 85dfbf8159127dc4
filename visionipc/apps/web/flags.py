"""The flags every web surface has, and the checks of their values (no aiohttp needed:
a command parses its arguments before it looks for its optional packages)."""

import argparse
import re
import urllib.parse
from typing import TYPE_CHECKING, Optional

from msgq.tooling import printable

if TYPE_CHECKING:
    from visionipc.apps.web.peerlog import PeerLog
    from visionipc.apps.web.policy import WebPolicy

MAX_CONNECTIONS = 256  # default of --max-connections (listener.py enforces it)


def host_of(header: str) -> str:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower case,
    without a trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):
        host = header[1:].partition("]")[0]
    else:
        host = header.rpartition(":")[0] if header.count(":") == 1 else header
    return host.rstrip(".")


def check_host_name(text: str) -> str:
    """An --allow-host value: a DNS name or an IP address, without a port."""
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|\[?[0-9A-Fa-f:.]+\]?", text or ""):
        raise ValueError(f"--allow-host wants a host name or address without a port, got '{printable(text)}'")
    return text.strip("[]")


def normal_origin(text: str) -> str:
    """``scheme://host[:port]`` lower case, without a default port (80 for http, 443 for https)."""
    parts = urllib.parse.urlsplit(text.strip())
    if not parts.scheme or not parts.hostname:  # "null" (a file:// page, a sandboxed frame), garbage
        return text.strip().lower()
    scheme, host = parts.scheme.lower(), parts.hostname.rstrip(".")
    try:
        port = parts.port
    except ValueError:
        port = None
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443), ("ws", 80), ("wss", 443)):
        host = f"{host}:{port}"
    return f"{scheme}://{host}"


def check_origin(text: str) -> str:
    """An --allow-origin value: ``scheme://host[:port]``, nothing after it, or ``null`` (what
    a page loaded from a file sends, e.g. a desktop app's window)."""
    if text == "null":
        return text
    parts = urllib.parse.urlsplit(text or "")
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or not port_ok
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
    ):
        raise ValueError(
            f"--allow-origin wants scheme://host[:port] like https://app.foxglove.dev, got '{printable(text)}'"
        )
    return normal_origin(text)


def add_arguments(parser: argparse.ArgumentParser, prog: str) -> None:
    """The flags every web surface has: --allow-host, --allow-origin, --no-auth,
    --max-connections (see listener.py)."""
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (repeatable); by default only the bound address and "
        "localhost are answered, so a web page cannot reach the frames through DNS rebinding",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also answer browser pages of this origin, scheme://host[:port] or null (repeatable), e.g. "
        "https://app.foxglove.dev; by default only "
        f"{prog}'s own pages and clients that send no Origin; a refused origin is named in the log",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="answer anyone who can connect, without the per-run token of the printed URL "
        "(only on a trusted machine: any local user could read the frames)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"open connections at most (default {MAX_CONNECTIONS}); when full, the oldest idle or "
        "half-open one is closed for a new one",
    )


def policy_from_args(
    args: argparse.Namespace, prog: str, bound_host: str, log: Optional["PeerLog"] = None
) -> "WebPolicy":
    """The WebPolicy of parsed ``add_arguments`` flags; ValueError for a bad value."""
    hosts = [check_host_name(h) for h in args.allow_host]
    origins = [check_origin(o) for o in args.allow_origin]
    if not 1 <= args.max_connections <= 100000:
        raise ValueError(f"--max-connections must be in 1..100000, got {args.max_connections}")
    from visionipc.apps.web.policy import WebPolicy

    return WebPolicy(prog, bound_host, hosts, origins, auth=not args.no_auth, log=log)
