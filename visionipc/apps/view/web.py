"""The HTTP side of vipc-view (aiohttp): the page, MJPEG streams, snapshots and /stats.

    GET /                      the page: every stream live, with fps / frame id / latency / drops
    GET /stream/<stream>.mjpg  multipart/x-mixed-replace JPEG stream (newest frame each time)
    GET /snapshot/<stream>.jpg one JPEG of the newest frame
    GET /stats                 JSON: per stream fps, frame_id, latency, drops, viewers, frames encoded

Every request passes the shared web policy first (visionipc/apps/web: Host, Origin, the
owner's token; connection limit and timeouts). Every handler runs on the event-loop
thread; the feeds' contract is in feed.py.
"""

import asyncio
import json
import logging
import pathlib
import socket
import time
from typing import Any, Dict, Iterable, Optional

from aiohttp import web

from visionipc.apps.view.feed import BOUNDARY, StreamFeed
from visionipc.apps.web.listener import Guard
from visionipc.apps.web.policy import WebPolicy
from visionipc.client import available_streams

log = logging.getLogger("vipc-view")

DISCOVERY_INTERVAL_S = 0.5  # how often a viewer of "every stream" asks the server for new ones
SNAPSHOT_WAIT_S = 1.0  # a snapshot waits this long for a fresh frame, then takes the newest it has
KEEPALIVE_S = 1.0  # MJPEG handlers look at the stop flag at least this often
# Kernel send buffer of an MJPEG viewer's socket. Linux would grow it to megabytes,
# i.e. seconds of stale video queued for a slow viewer; this small one makes its
# write wait early, so it skips to the newest frame instead (the kernel doubles it).
SEND_BUFFER_BYTES = 128 * 1024
PAGE = pathlib.Path(__file__).with_name("page.html")


class ViewServer:
    """The feeds of one VisionIPC server and the aiohttp application serving them.

    ``streams``: the streams to show; empty means every stream the server offers,
    including ones that appear later (asked every DISCOVERY_INTERVAL_S).
    """

    def __init__(
        self,
        name: str,
        streams: Iterable[str] = (),
        quality: int = 80,
        keep_bgr: bool = False,
        policy: Optional[WebPolicy] = None,
        guard: Optional[Guard] = None,
    ) -> None:
        """``policy``: a WebPolicy (default: bound to 127.0.0.1, with a token); ``guard``:
        the listener's Guard (connection limit and timeouts)."""
        self.name = name
        self.policy = policy or WebPolicy("vipc-view")
        self.guard = guard or Guard("vipc-view")
        self.fixed_streams = list(streams)
        self.quality = quality
        self.keep_bgr = keep_bgr
        # stream name -> StreamFeed; changed on the event-loop thread only (the window
        # thread reads a copy, list(feeds.items()), taken in one step under the GIL)
        self.feeds: Dict[str, StreamFeed] = {}
        self.started = time.monotonic()
        self._discovery: "Optional[asyncio.Task[None]]" = None
        self.app = web.Application(middlewares=[self.guard.middleware, self.policy.middleware])
        self.app.add_routes(
            [
                web.get("/", self.page),
                web.get("/stats", self.stats),
                web.get("/stream/{stream}.mjpg", self.mjpeg),
                web.get("/snapshot/{stream}.jpg", self.snapshot),
            ]
        )
        self.app.on_startup.append(self._start)
        self.app.on_shutdown.append(self._stop)

    async def _start(self, app: web.Application) -> None:
        for stream in self.fixed_streams:
            self._add(stream)
        if not self.fixed_streams:
            self._discovery = asyncio.create_task(self._discover())

    async def _stop(self, app: web.Application) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
        for feed in self.feeds.values():
            feed.close()
        loop = asyncio.get_running_loop()
        for feed in self.feeds.values():  # a worker is at most one receive timeout + one encode away
            await loop.run_in_executor(None, feed.join)

    def _add(self, stream: str) -> None:
        if stream not in self.feeds:
            self.feeds[stream] = StreamFeed(self.name, stream, self.quality, self.keep_bgr)

    async def _discover(self) -> None:
        loop = asyncio.get_running_loop()
        last_error = None
        while True:
            # A server that restarts with other streams keeps the old ones on the page (not live).
            try:
                for stream in await loop.run_in_executor(None, available_streams, self.name, False):
                    self._add(str(stream))
                last_error = None
            except Exception as exc:  # e.g. a server of another version: say so once, keep asking
                if repr(exc) != last_error:
                    log.warning(f"cannot list the streams of {self.name!r}: {exc}")
                    last_error = repr(exc)
            await asyncio.sleep(DISCOVERY_INTERVAL_S)

    def _feed(self, request: web.Request) -> StreamFeed:
        stream = request.match_info["stream"]
        feed = self.feeds.get(stream)
        if feed is None:
            known = ", ".join(sorted(self.feeds)) or "none yet"
            raise web.HTTPNotFound(
                text=f"unknown stream {stream!r} of VisionIPC server {self.name!r} (streams: {known})\n"
            )
        return feed

    # -- handlers -----------------------------------------------------------------

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE.read_text(encoding="utf-8"), content_type="text/html")

    async def stats(self, request: web.Request) -> web.Response:
        body: Dict[str, Any] = {
            "server": self.name,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "streams": {stream: feed.report() for stream, feed in sorted(self.feeds.items())},
            "connections": self.guard.report(),
            "refused": dict(self.policy.counts),
        }
        return web.json_response(body, dumps=lambda o: json.dumps(o, indent=1))

    async def snapshot(self, request: web.Request) -> web.Response:
        feed = self._feed(request)
        latest = feed.latest
        feed.snapshot_waiters += 1  # asks the worker to encode its next frame
        try:
            fresh = await feed.newer_than(latest.seq if latest else 0, SNAPSHOT_WAIT_S)
        finally:
            feed.snapshot_waiters -= 1
        frame = fresh or feed.latest
        if frame is None:
            raise web.HTTPServiceUnavailable(
                text=f"no frame from stream {feed.stream!r} of VisionIPC server "
                f"{self.name!r} yet (is the producer running?)\n"
            )
        return web.Response(
            body=frame.jpeg,
            content_type="image/jpeg",
            headers={"X-Frame-Id": str(frame.frame_id), "Cache-Control": "no-store"},
        )

    async def mjpeg(self, request: web.Request) -> web.StreamResponse:
        feed = self._feed(request)
        response = web.StreamResponse(
            headers={
                "Content-Type": f"multipart/x-mixed-replace; boundary={BOUNDARY}",
                "Cache-Control": "no-store",
            }
        )
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        await response.prepare(request)
        feed.viewers += 1
        last = 0
        try:
            while not feed.stopping:
                frame = await feed.newer_than(last, KEEPALIVE_S)
                if frame is None:
                    continue
                if last:
                    feed.frames_skipped += frame.seq - last - 1
                last = frame.seq
                # write() waits while this viewer's socket is full: only this handler waits,
                # and when it comes back it takes the newest frame, skipping the rest.
                await response.write(frame.part)
                feed.frames_sent += 1
        except ConnectionError:
            pass  # the browser went away
        finally:
            feed.viewers -= 1
        return response
