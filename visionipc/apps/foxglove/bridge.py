"""vipc-foxglove: serve the streams of a VisionIPC server (and msgq topics) live over the
Foxglove WebSocket protocol (the ``foxglove-sdk`` package), for Foxglove and Lichtblick.

Each stream is a channel ``/<stream>``: ``foxglove.CompressedImage`` (JPEG, default) or
``foxglove.CompressedVideo`` (``--encoding h264``: H.264 through PyAV, no B-frames, a
keyframe every second and one as soon as a client subscribes, so it can decode at once),
logged at the frame's timestamp_eof with that time in the
message. Each ``--topic`` is a channel ``/<topic>`` of its raw message bytes, logged at
their receive time (CLOCK_MONOTONIC). One thread per stream and topic; a client that is
slower than the camera gets the newest frames (the VisionIPC client skips the others).
"""

import argparse
import sys
import threading
import time

from visionipc.apps._cli import Stopper, UsageError, need, run_command

PROG = "vipc-foxglove"
RECV_MS = 100

EPILOG = """\
examples:
  vipc-foxglove --name camd                                 # every stream as JPEG, ws://127.0.0.1:8765
  vipc-foxglove --name camd --stream road --encoding h264 --topic events --port 9000

Open it in Foxglove (app.foxglove.dev or the desktop app) or Lichtblick: Open connection ->
Foxglove WebSocket -> ws://127.0.0.1:8765, then an Image panel on /<stream>.
"""


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Serve VisionIPC streams and msgq topics over the Foxglove WebSocket protocol.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", required=True, help="VisionIPC server name")
    p.add_argument("--stream", action="append", help="stream to serve; repeat for more (default: every stream)")
    p.add_argument("--topic", action="append", default=[], help="msgq topic to serve as raw bytes; repeatable")
    p.add_argument("--encoding", choices=("jpeg", "h264"), default="jpeg", help="image encoding (default jpeg)")
    p.add_argument("--quality", type=int, default=80, help="JPEG quality 1..100 (default 80)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="WebSocket port (default 8765; 0: any free port)")
    p.add_argument("--duration", type=float, help="stop after SEC seconds")
    p.add_argument("--connect-timeout", type=float, default=10.0, help="how long to wait for the server (default 10 s)")
    return p


class StreamPump(threading.Thread):
    """One stream: receive, encode, log to its channel. Invariant: only this thread touches
    the client and the encoder; ``sent`` is written here only."""

    def __init__(self, client, encoding, quality, context, stop, keyframe=None):
        super().__init__(daemon=True)
        self.keyframe = keyframe or threading.Event()  # set: the next frame is a keyframe
        import foxglove.channels as channels
        import foxglove.messages as messages

        self.client, self.encoding, self.quality, self.stop = client, encoding, quality, stop
        self.stream, self.messages = str(client.stream), messages
        kind = channels.CompressedVideoChannel if encoding == "h264" else channels.CompressedImageChannel
        self.channel = kind(f"/{self.stream}", context=context)
        self.encoder = self.storage = None
        self.sent, self.error = 0, None

    def run(self):
        try:
            while not self.stop.is_set():
                frame = self.client.recv(RECV_MS)
                if frame is None:
                    continue
                with frame:
                    msg = self._encode(frame)
                    if not frame.valid:  # overwritten while we read it
                        continue
                if msg is not None:
                    self.channel.log(msg, log_time=frame.timestamp_eof)
                    self.sent += 1
        except BaseException as e:
            self.error = e
            self.stop.set()

    def _stamp(self, frame):
        t = frame.timestamp_eof
        return self.messages.Timestamp(sec=t // 10**9, nsec=t % 10**9)

    def _encode(self, frame):
        if self.encoding == "jpeg":
            cv2 = need("cv2", "view")
            ok, jpeg = cv2.imencode(".jpg", frame.to_bgr(), [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            data = jpeg.tobytes()
            return self.messages.CompressedImage(
                timestamp=self._stamp(frame), frame_id=self.stream, data=data, format="jpeg"
            )
        from visionipc.apps.record import codecs, mcap_io

        if self.encoder is None or (frame.format, frame.width, frame.height) != (
            self.storage.fmt,
            self.storage.width,
            self.storage.height,
        ):
            self.storage = codecs.AvStorage(frame.format, frame.width, frame.height, "h264", preset="ultrafast", gop=30)
            self.encoder, self.pts = mcap_io.open_video_encoder(self.storage, 30, live=True), 0
        video = mcap_io.video_frame(self.storage, self.storage.capture(frame))
        video.pts, self.pts = self.pts, self.pts + 1
        if self.keyframe.is_set():  # a client subscribed: it decodes from a keyframe
            self.keyframe.clear()
            video.pict_type = need("av", "record").video.frame.PictureType.I
        data = b"".join(bytes(p) for p in self.encoder.encode(video))
        if not data:
            return None
        return self.messages.CompressedVideo(
            timestamp=self._stamp(frame), frame_id=self.stream, data=data, format="h264"
        )


class TopicPump(threading.Thread):
    """One msgq topic's messages, as raw bytes, to its channel."""

    def __init__(self, topic, context, stop):
        super().__init__(daemon=True)
        import foxglove

        import msgq

        self.topic, self.stop = topic, stop
        self.sock = msgq.sub_sock(topic, timeout=RECV_MS)
        # schemaless raw bytes (msgq messages have no schema of their own)
        schema = foxglove.Schema(name="msgq.raw", encoding="", data=b"")
        self.channel = foxglove.Channel(f"/{topic}", message_encoding="raw", schema=schema, context=context)
        self.sent, self.error = 0, None

    def run(self):
        try:
            while not self.stop.is_set():
                data = self.sock.receive()
                if data is not None:
                    self.channel.log(bytes(data), log_time=time.monotonic_ns())
                    self.sent += 1
        except BaseException as e:
            self.error = e
            self.stop.set()
        finally:
            self.sock.close()


class Subscriptions:
    """A foxglove ServerListener: a client subscribing to a stream's channel asks its pump
    for a keyframe (H.264 decodes only from one; the next periodic one may be a second away)."""

    def __init__(self):
        self.keyframe = {}  # channel topic -> threading.Event of its StreamPump

    def on_subscribe(self, client, channel):
        event = self.keyframe.get(channel.topic)
        if event is not None:
            event.set()


def run(args) -> int:
    if not 1 <= args.quality <= 100:
        raise UsageError(f"--quality must be in 1..100, got {args.quality}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    need("foxglove", "record")
    need("cv2", "view")
    if args.encoding == "h264":
        need("av", "record")
    import foxglove

    from visionipc.apps.record.recorder import connect_streams

    stopper = Stopper()
    stop = stopper.event
    pumps, clients, server = [], [], None
    try:
        clients = connect_streams(args.name, args.stream, args.connect_timeout, stop)
        context = foxglove.Context()
        subscriptions = Subscriptions()
        subscriptions.keyframe = {f"/{c.stream}": threading.Event() for c in clients}
        try:
            server = foxglove.start_server(
                name=PROG, host=args.host, port=args.port, context=context, server_listener=subscriptions
            )
        except Exception as e:
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {e}") from None
        try:
            pumps = [TopicPump(t, context, stop) for t in args.topic]
        except ValueError as e:
            raise UsageError(f"--topic: {e}") from None
        pumps += [
            StreamPump(c, args.encoding, args.quality, context, stop, subscriptions.keyframe[f"/{c.stream}"])
            for c in clients
        ]
        url = f"ws://{args.host}:{server.port}"
        print(f"{PROG}: serving {', '.join('/' + str(c.stream) for c in clients)} on {url}", file=sys.stderr)
        print(
            f"{PROG}: open in Foxglove: https://app.foxglove.dev/~/view?ds=foxglove-websocket&ds.url={url}",
            file=sys.stderr,
            flush=True,
        )
        for p in pumps:
            p.start()
        start = time.monotonic()
        while not stop.wait(0.05):
            if args.duration and time.monotonic() - start >= args.duration:
                break
        stop.set()
        for p in pumps:
            p.join()
        failed = [p for p in pumps if p.error]
        for p in failed:
            print(f"{PROG}: {type(p.error).__name__}: {p.error}", file=sys.stderr)
        return 1 if failed else 0
    finally:
        _shut_down(stop, pumps, server, clients)
        stopper.restore()


def _shut_down(stop, pumps, server, clients):
    """Pumps first (they use the clients and the server's channels), then the server."""
    stop.set()
    for p in (p for p in pumps if p.is_alive()):
        p.join()
    if server is not None:
        server.stop()
    for c in clients:
        c.close()


def main(argv=None) -> int:
    return run_command(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
