"""The ``vipc-view`` command: live preview of a VisionIPC server's streams in a browser."""

import argparse
import asyncio
import signal
import sys
import threading
from typing import Optional, Sequence, Tuple, Union

from msgq import add_version_flag
from msgq.cli import parse_args
from msgq.errors import IpcError
from visionipc.apps.web import flags as web_flags
from visionipc.streams import server_name, stream_key

DEFAULT_HTTP = "127.0.0.1:8080"

EPILOG = """\
examples:
  vipc-view --name camerad                       every stream of server camerad, at the printed
                                                 http://127.0.0.1:8080/?token=... (open that URL)
  vipc-view --name camerad --stream road --http :9000
  vipc-view --name camerad --http 0.0.0.0:8080   reachable from other hosts (with the token)
  vipc-view --name camerad --http 0.0.0.0:8080 --allow-host cam.lan   also answer http://cam.lan:8080/
  vipc-view --name camerad --http unix:$XDG_RUNTIME_DIR/view.sock      a socket file only you can open
                                                 (no token; curl --unix-socket PATH http://localhost/stats)
  curl -o road.jpg 'http://127.0.0.1:8080/snapshot/road.jpg?token=TOKEN'
  curl -H 'Authorization: Bearer TOKEN' http://127.0.0.1:8080/stats

Pages: /  (all streams live, MJPEG, with fps / frame id / latency / drops),
/stream/<stream>.mjpg, /snapshot/<stream>.jpg, /stats (JSON).
Each stream is received once and JPEG-encoded once per frame, only while someone
watches; every browser tab gets the newest encoded frame, so slow tabs skip frames
and never slow the producer. Streams that appear later and a restarted server are
picked up on their own.

Who is answered (one policy for every visionipc web surface): the owner, who has the
per-run token of the printed URL (the page keeps it in a cookie; other local users
get 401; --no-auth on a trusted machine); requests whose Host is the bound address,
localhost or an --allow-host name (others: 421, against DNS rebinding); pages of its
own origin or an --allow-origin one (others: 403). At most --max-connections open
connections: a new one closes the oldest idle or half-open one (slowloris); headers
must come within 10 s. Ctrl-C (SIGINT) or SIGTERM stops it.
"""


def parse_http(text: str) -> Tuple[str, Union[int, str]]:
    """``PORT``, ``:PORT``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); host defaults to 127.0.0.1.
    ``unix:PATH`` -> ("unix", PATH): a Unix-domain socket."""
    if text.startswith("unix:"):
        if len(text) == 5 or "\0" in text:
            raise ValueError(f"--http unix: wants a socket path, got {text!r}")
        return "unix", text[5:]
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http wants HOST:PORT with a port in 0..65535, got {text!r}")
    return host, int(port)


def _parser():
    p = argparse.ArgumentParser(
        prog="vipc-view",
        description="Live preview of VisionIPC streams in a browser (and an OpenCV window).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(p)
    p.add_argument("--name", required=True, help="the VisionIPC server name (VisionIpcServer(name))")
    p.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="S",
        help="a stream to show (repeat for more); default: every stream of the server, "
        "including ones that appear later",
    )
    p.add_argument(
        "--http",
        default=DEFAULT_HTTP,
        metavar="HOST:PORT",
        help=f"where to serve the page (default {DEFAULT_HTTP}; port 0 picks a free one, printed at start)",
    )
    web_flags.add_arguments(p, "vipc-view")
    p.add_argument("--quality", type=int, default=80, help="JPEG quality 1-100 (default 80)")
    p.add_argument(
        "--window",
        action="store_true",
        help="also show the streams in OpenCV windows (needs a display and opencv-python)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parse_args(parser, argv, config=True)
    try:
        host, port = parse_http(args.http)
        name = server_name(args.name)
        streams = list(dict.fromkeys(stream_key(s) for s in args.stream))
        web_flags.policy_from_args(args, "vipc-view", host)  # checks the values; _serve makes its own
    except (ValueError, IpcError) as exc:
        parser.error(str(exc))
    if not 1 <= args.quality <= 100:
        parser.error(f"--quality must be in 1..100, got {args.quality}")
    try:
        import aiohttp  # noqa: F401
        import cv2  # noqa: F401
    except ImportError as exc:
        print(f"vipc-view: {exc.name} is missing: pip install 'visionipc[view]'", file=sys.stderr)
        return 2
    if args.window:
        from visionipc.apps.view.window import WindowError, check_window_support

        try:
            check_window_support()
        except WindowError as exc:
            print(f"vipc-view: error: {exc}", file=sys.stderr)
            return 2
    settings = dict(name=name, streams=streams, host=host, port=port, quality=args.quality, web_args=args)
    if args.window:
        from visionipc.apps.view.window import run_with_windows

        return run_with_windows(_serve, settings)
    return asyncio.run(_serve(**settings))


async def _serve(name, streams, host, port, quality, keep_bgr=False, on_started=None, web_args=None) -> int:
    """Serve until SIGINT/SIGTERM (in the main thread) or until the ``stop`` event passed
    to ``on_started(loop, stop, view)`` is set; 0 on a clean stop, 1 if the port is taken.
    ``web_args``: parsed web_policy flags (default: none given)."""
    from visionipc.apps.view.web import ViewServer
    from visionipc.apps.web.listener import Guard, start_site
    from visionipc.apps.web.peerlog import PeerLog, capture_library_logs

    if web_args is None:
        web_args = _parser().parse_args(["--name", name])
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    log = PeerLog("vipc-view")
    capture_library_logs(log)
    unix = port if host == "unix" else None  # a socket file of mode 600 is the owner-only door: no token
    if unix:
        web_args.no_auth = True
    policy = web_flags.policy_from_args(web_args, "vipc-view", "localhost" if unix else host, log)
    guard = Guard("vipc-view", web_args.max_connections, log)
    view = ViewServer(name, streams, quality, keep_bgr=keep_bgr, policy=policy, guard=guard)
    try:
        runner, site = await start_site(view.app, host, port, guard, path=unix)
    except OSError as exc:
        print(f"vipc-view: error: cannot serve on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        print(_serving_line(name, streams, host, site, policy, unix), flush=True)
        if guard.limit < guard.wanted:
            print(f"vipc-view: at most {guard.limit} connections (what RLIMIT_NOFILE leaves)", flush=True)
        if on_started is not None:
            on_started(loop, stop, view)
        await stop.wait()
        return 0
    finally:
        await runner.cleanup()
        log.flush()
        print("vipc-view: stopped", flush=True)


def _serving_line(name, streams, host, site, policy, unix) -> str:
    """The first line: where to open it (with the token), what it shows."""
    what = f"(VisionIPC server {name!r}, streams: {', '.join(streams) or 'all'}); Ctrl-C stops"
    if unix:
        how = f"owner only: mode 600; curl --unix-socket {unix} http://localhost/stats"
        return f"vipc-view: serving unix:{unix} ({how}) {what}"
    shown = f"[{host}]" if ":" in host else host
    return f"vipc-view: serving http://{shown}:{site.port}/{policy.url_query()} {what}"
