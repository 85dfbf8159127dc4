"""The ``vipc-view`` command: live preview of a VisionIPC server's streams in a browser."""

import argparse
import asyncio
import logging
import re
import signal
import sys
import threading

from msgq._printable import printable
from msgq.errors import IpcError
from visionipc._streams import server_name, stream_key

DEFAULT_HTTP = "127.0.0.1:8080"

EPILOG = """\
examples:
  vipc-view --name camerad                       every stream of server camerad, at http://127.0.0.1:8080/
  vipc-view --name camerad --stream road --http :9000
  vipc-view --name camerad --http 0.0.0.0:8080   reachable from other hosts (no authentication!)
  vipc-view --name camerad --http 0.0.0.0:8080 --allow-host cam.lan   also answer http://cam.lan:8080/
  curl -o road.jpg http://127.0.0.1:8080/snapshot/road.jpg
  curl http://127.0.0.1:8080/stats

Pages: /  (all streams live, MJPEG, with fps / frame id / latency / drops),
/stream/<stream>.mjpg, /snapshot/<stream>.jpg, /stats (JSON).
Each stream is received once and JPEG-encoded once per frame, only while someone
watches; every browser tab gets the newest encoded frame, so slow tabs skip frames
and never slow the producer. Streams that appear later and a restarted server are
picked up on their own. Only requests whose Host is the bound address, localhost
or an --allow-host name are answered (others: 421), against DNS rebinding.
Ctrl-C (SIGINT) or SIGTERM stops it.
"""


def parse_http(text: str):
    """``PORT``, ``:PORT``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); host defaults to 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--http wants HOST:PORT with a port in 0..65535, got {text!r}")
    return host, int(port)


def check_host_name(text: str) -> str:
    """An --allow-host value: a DNS name or an IP address, without a port."""
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})|\[?[0-9A-Fa-f:.]+\]?", text or ""):
        raise ValueError(f"--allow-host wants a host name or address without a port, got '{printable(text)}'")
    return text.strip("[]")


def _parser():
    p = argparse.ArgumentParser(
        prog="vipc-view",
        description="Live preview of VisionIPC streams in a browser (and an OpenCV window).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests for this host name (repeatable); by default only the bound address and "
        "localhost are answered, so a web page cannot reach the frames through DNS rebinding",
    )
    p.add_argument("--quality", type=int, default=80, help="JPEG quality 1-100 (default 80)")
    p.add_argument(
        "--window",
        action="store_true",
        help="also show the streams in OpenCV windows (needs a display and opencv-python)",
    )
    return p


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        host, port = parse_http(args.http)
        name = server_name(args.name)
        streams = list(dict.fromkeys(stream_key(s) for s in args.stream))
        allow_hosts = [check_host_name(h) for h in args.allow_host]
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
    settings = dict(name=name, streams=streams, host=host, port=port, quality=args.quality, allow_hosts=allow_hosts)
    if args.window:
        from visionipc.apps.view.window import run_with_windows

        return run_with_windows(_serve, settings)
    return asyncio.run(_serve(**settings))


class _OneLineLog(logging.Handler):
    """aiohttp's server log (a malformed request: duplicate or missing Host...) as one escaped
    line on stderr, not a traceback per request a stranger sends."""

    def emit(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        why = f": {' '.join(str(exc).split())}" if exc is not None else ""
        print(f"vipc-view: {printable(record.getMessage() + why)}", file=sys.stderr, flush=True)


def _quiet_server_log():
    log = logging.getLogger("aiohttp.server")
    if not any(isinstance(h, _OneLineLog) for h in log.handlers):
        log.addHandler(_OneLineLog())
    log.propagate = False


async def _serve(name, streams, host, port, quality, keep_bgr=False, on_started=None, allow_hosts=()) -> int:
    """Serve until SIGINT/SIGTERM (in the main thread) or until the ``stop`` event passed
    to ``on_started(loop, stop, view)`` is set; 0 on a clean stop, 1 if the port is taken."""
    from aiohttp import web

    from visionipc.apps.view.web import HostCheck, ViewServer

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    _quiet_server_log()
    view = ViewServer(name, streams, quality, keep_bgr=keep_bgr, hosts=HostCheck(host, allow_hosts))
    runner = web.AppRunner(view.app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, shutdown_timeout=1.0)
        try:
            await site.start()
        except OSError as exc:
            print(f"vipc-view: error: cannot serve on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        print(
            f"vipc-view: serving http://{shown}:{bound}/ (VisionIPC server {name!r}, "
            f"streams: {', '.join(streams) or 'all'}); Ctrl-C stops",
            flush=True,
        )
        if on_started is not None:
            on_started(loop, stop, view)
        await stop.wait()
        return 0
    finally:
        await runner.cleanup()
        print("vipc-view: stopped", flush=True)
