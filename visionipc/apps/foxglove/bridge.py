"""vipc-foxglove: serve the streams of a VisionIPC server (and msgq topics) live over the
Foxglove WebSocket protocol, for Foxglove and Lichtblick.

Each stream is a channel ``/<stream>``: ``foxglove.CompressedImage`` (JPEG, default) or
``foxglove.CompressedVideo`` (``--encoding h264``: H.264 through PyAV, no B-frames, a
keyframe every second and one as soon as a client subscribes, so it can decode at once),
logged at the frame's timestamp_eof with that time in the message (schemas and message
encoding from the ``foxglove-sdk`` package). Each ``--topic`` is a channel ``/<topic>`` of
its raw message bytes, logged at their receive time. Every time sent is in nanoseconds
since the Unix epoch, as Foxglove, MCAP and ROS 2 expect (frames carry CLOCK_MONOTONIC
times: they are moved to the wall clock by the offset between the two clocks at that
moment), so a live view shows the real time of day. One thread per stream and topic.

The WebSocket server is our own (hub.py, aiohttp) under the policy every visionipc web
surface shares (visionipc/apps/web): the owner's per-run token in the printed URL, Host
and Origin checks (``--allow-origin https://app.foxglove.dev`` for the Foxglove web app),
a connection limit, per-client queues that keep only the newest frames, escaped and
rate-limited logging.
"""

import argparse
import asyncio
import logging
import sys
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

from visionipc.apps._cli import Stopper, UsageError, need, run_command
from visionipc.apps.record.vocabulary import CODECS
from visionipc.apps.web import flags as web_flags

if TYPE_CHECKING:
    from visionipc import VisionIpcClient
    from visionipc.apps.foxglove.hub import Hub
    from visionipc.apps.web.peerlog import PeerLog

PROG = "vipc-foxglove"
logger = logging.getLogger(PROG)
RECV_MS = 100
JPEG, VIDEO = "jpeg", "h264"  # --encoding: JPEG images, or H.264 video (vipc-record's codec of that name)
FOXGLOVE_APP = "https://app.foxglove.dev"

EPILOG = """\
examples:
  vipc-foxglove --name camd                        # every stream as JPEG, ws://127.0.0.1:8765/?token=...
  vipc-foxglove --name camd --stream road --encoding h264 --topic events --port 9000
  vipc-foxglove --name camd --allow-origin https://app.foxglove.dev   # for the Foxglove web app

Open it in Foxglove (the desktop app, or app.foxglove.dev with --allow-origin) or Lichtblick:
Open connection -> Foxglove WebSocket -> the printed ws://127.0.0.1:8765/?token=... URL,
then an Image panel on /<stream>. The token is made per run (owner only; other local
users get 401); --no-auth drops it on a trusted machine. A client that reads slower than
the camera gets the newest frame whenever it is ready for one; a client that stops
reading holds one frame, and is closed after --client-timeout (30 s).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Serve VisionIPC streams and msgq topics over the Foxglove WebSocket protocol.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", required=True, help="VisionIPC server name")
    p.add_argument("--stream", action="append", help="stream to serve; repeat for more (default: every stream)")
    p.add_argument("--topic", action="append", default=[], help="msgq topic to serve as raw bytes; repeatable")
    p.add_argument("--encoding", choices=(JPEG, VIDEO), default=JPEG, help="image encoding (default jpeg)")
    p.add_argument("--quality", type=int, default=80, help="JPEG quality 1..100 (default 80)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="WebSocket port (default 8765; 0: any free port)")
    p.add_argument("--duration", type=float, help="stop after SEC seconds")
    p.add_argument("--connect-timeout", type=float, default=10.0, help="how long to wait for the server (default 10 s)")
    p.add_argument(
        "--client-timeout",
        type=float,
        default=30.0,
        metavar="SEC",
        help="close a client that has read nothing for SEC seconds (default 30; it holds one frame meanwhile)",
    )
    web_flags.add_arguments(p, PROG)
    return p


class StreamPump(threading.Thread):
    """One stream: receive, encode (only while a client subscribes), publish to its
    channel. Invariant: only this thread touches the client and the encoder; ``sent`` is
    written here only."""

    def __init__(
        self, client: "VisionIpcClient", encoding: str, quality: int, hub: "Hub", stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        import foxglove.messages as messages

        from visionipc.apps.foxglove.hub import IMAGE_CHANNEL, VIDEO_CHANNEL  # loaded: ``hub`` exists

        self.client, self.encoding, self.quality, self.stop, self.hub = client, encoding, quality, stop, hub
        self.stream, self.messages = str(client.stream), messages
        kind = messages.CompressedVideo if encoding == VIDEO else messages.CompressedImage
        schema = kind.get_schema()
        self.channel = hub.add_channel(
            f"/{self.stream}",
            VIDEO_CHANNEL if encoding == VIDEO else IMAGE_CHANNEL,
            "protobuf",
            schema.name,
            schema.encoding,
            schema.data,
        )
        self.keyframe = self.channel.keyframe_wanted  # set: the next frame is a keyframe
        self.encoder: Any = None  # PyAV's codec context, made for the first frame
        self.storage: Any = None  # its codecs.AvStorage
        self.sent = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        from visionipc.apps.record.mcap_io import wall_ns

        try:
            while not self.stop.is_set():
                frame = self.client.recv(RECV_MS)
                if frame is None:
                    continue
                with frame:  # the read lease, released here even when nobody watches
                    if not self.channel.subscribers:
                        continue
                    when = wall_ns(frame.timestamp_eof)  # log time and message time, one value
                    out = self._encode(frame, when)
                    if not frame.valid:  # overwritten while we read it
                        continue
                if out is not None:
                    msg, keyframe = out
                    self.hub.publish(self.channel, when, msg.encode(), keyframe)
                    self.sent += 1
        except BaseException as e:
            self.error = e
            self.stop.set()

    def _stamp(self, t):
        return self.messages.Timestamp(sec=t // 10**9, nsec=t % 10**9)

    def _encode(self, frame, when):
        if self.encoding == JPEG:
            cv2 = need("cv2", "view")
            ok, jpeg = cv2.imencode(".jpg", frame.to_bgr(), [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            data = jpeg.tobytes()
            image = self.messages.CompressedImage(
                timestamp=self._stamp(when), frame_id=self.stream, data=data, format=JPEG
            )
            return image, True
        from visionipc.apps.record import codecs, mcap_io

        if self.encoder is None or (frame.format, frame.width, frame.height) != (
            self.storage.fmt,
            self.storage.width,
            self.storage.height,
        ):
            self.storage = codecs.AvStorage(frame.format, frame.width, frame.height, VIDEO, preset="ultrafast", gop=30)
            self.encoder, self.pts = mcap_io.open_video_encoder(self.storage, 30, live=True), 0
        video = mcap_io.video_frame(self.storage, self.storage.capture(frame))
        video.pts, self.pts = self.pts, self.pts + 1
        if self.keyframe.is_set():  # a client subscribed: it decodes from a keyframe
            self.keyframe.clear()
            video.pict_type = need("av", "record").video.frame.PictureType.I
        packets = self.encoder.encode(video)
        data = b"".join(bytes(p) for p in packets)
        if not data:
            return None
        keyframe = any(p.is_keyframe for p in packets)
        message = self.messages.CompressedVideo(
            timestamp=self._stamp(when), frame_id=self.stream, data=data, format=CODECS[VIDEO].foxglove
        )
        return message, keyframe


class TopicPump(threading.Thread):
    """One msgq topic's messages, as raw bytes, to its channel."""

    def __init__(self, topic: str, hub: "Hub", stop: threading.Event) -> None:
        super().__init__(daemon=True)
        import msgq
        from visionipc.apps.foxglove.hub import RAW_CHANNEL  # loaded: ``hub`` exists

        self.topic, self.stop, self.hub = topic, stop, hub
        self.sock = msgq.sub_sock(topic, timeout=RECV_MS)
        schema = msgq.topic_schema(topic)  # declared by its publisher (msgq.Schema), else raw bytes
        if schema is None:
            self.channel = hub.add_channel(f"/{topic}", RAW_CHANNEL, "raw", "msgq.raw")
        else:
            self.channel = hub.add_channel(
                f"/{topic}", RAW_CHANNEL, schema.message_encoding, schema.name, schema.encoding, schema.data
            )
        self.sent = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                data = self.sock.receive()
                if data is not None and self.channel.subscribers:
                    self.hub.publish(self.channel, time.time_ns(), bytes(data))
                    self.sent += 1
        except BaseException as e:
            self.error = e
            self.stop.set()
        finally:
            self.sock.close()


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.quality <= 100:
        raise UsageError(f"--quality must be in 1..100, got {args.quality}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if not 0.1 <= args.client_timeout <= 86400:
        raise UsageError(f"--client-timeout must be in 0.1..86400 s, got {args.client_timeout:g}")
    try:
        web_flags.policy_from_args(args, PROG, args.host)  # the values, before anything starts
    except ValueError as e:
        raise UsageError(str(e)) from None
    need("aiohttp", "view")
    need("foxglove", "record")
    need("cv2", "view")
    if args.encoding == VIDEO:
        need("av", "record")
    from visionipc.apps.foxglove.hub import Hub
    from visionipc.apps.record.recorder import connect_streams
    from visionipc.apps.web.peerlog import PeerLog, capture_library_logs

    stopper = Stopper()
    stop = stopper.event
    pumps: List[Union[TopicPump, StreamPump]] = []
    clients: List["VisionIpcClient"] = []
    log = PeerLog(PROG)
    capture_library_logs(log)
    try:
        clients = connect_streams(args.name, args.stream, args.connect_timeout, stop)
        hub = Hub(PROG, log, args.client_timeout)
        try:
            pumps = [TopicPump(t, hub, stop) for t in args.topic]
        except ValueError as e:
            raise UsageError(f"--topic: {e}") from None
        pumps += [StreamPump(c, args.encoding, args.quality, hub, stop) for c in clients]
        code = asyncio.run(_serve(args, hub, pumps, stop, log))
        failed = [p for p in pumps if p.error]
        for p in failed:
            logger.error(f"{type(p.error).__name__}: {p.error}")
        return code or (1 if failed else 0)
    finally:
        _shut_down(stop, pumps, clients)
        log.flush()
        stopper.restore()


async def _serve(
    args: argparse.Namespace,
    hub: "Hub",
    pumps: Sequence[Union[TopicPump, StreamPump]],
    stop: threading.Event,
    log: "PeerLog",
) -> int:
    """Serve until ``stop`` (a signal, a failed pump) or --duration; pumps start once it listens."""
    from visionipc.apps.web.listener import Guard, start_site

    policy = web_flags.policy_from_args(args, PROG, args.host, log)
    guard = Guard(PROG, args.max_connections, log)
    app = hub.app([guard.middleware, policy.middleware])
    app["extra_stats"] = lambda: {"connections": guard.report(), "refused": dict(policy.counts)}
    try:
        runner, site = await start_site(app, args.host, args.port, guard)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    try:
        shown = f"[{args.host}]" if ":" in args.host else args.host
        url = f"ws://{shown}:{site.port}/{policy.url_query()}"
        streams = ", ".join(p.channel.topic for p in pumps if isinstance(p, StreamPump))
        logger.info(f"serving {streams} on {url}")
        if FOXGLOVE_APP in policy.origins:
            link = f"{FOXGLOVE_APP}/~/view?ds=foxglove-websocket&ds.url={urllib.parse.quote(url, safe='')}"
            logger.info(f"open in Foxglove: {link}")
        else:
            logger.info(
                f"for the Foxglove web app ({FOXGLOVE_APP}) start with --allow-origin {FOXGLOVE_APP} "
                "(an app whose origin is refused is named in this log)"
            )
        for p in pumps:
            p.start()
        start = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.05)
            if args.duration and time.monotonic() - start >= args.duration:
                break
        return 0
    finally:
        stop.set()
        await runner.cleanup()


def _shut_down(stop: threading.Event, pumps: Sequence[threading.Thread], clients: Sequence["VisionIpcClient"]) -> None:
    """Pumps first (they use the clients), then the clients."""
    stop.set()
    for p in (p for p in pumps if p.is_alive()):
        p.join()
    for c in clients:
        c.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, build_parser(), run, argv, config=True)


if __name__ == "__main__":
    sys.exit(main())
