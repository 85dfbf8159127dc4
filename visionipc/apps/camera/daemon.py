"""vipc-camera: a camera daemon that publishes one or more streams into a VisionIPC server."""

import argparse
import collections
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Sequence, Tuple

from visionipc.apps._cli import Stopper, UsageError, add_wait_clients, add_wake, run_command
from visionipc.apps.camera.config import DEFAULT_FPS, StreamConfig, build_streams, load_toml
from visionipc.apps.camera.sources import FrameSource, open_source
from visionipc.formats import FORMAT_TABLE, FORMATS

if TYPE_CHECKING:
    from visionipc import VisionBuf, VisionIpcServer

PROG = "vipc-camera"
log = logging.getLogger(PROG)
DEFAULT_BUFFERS = 8
WAIT_GRACE_S = 0.1  # after --wait-clients is met: lets the last client finish subscribing

EPILOG = """\
sources:
  synthetic        moving colour bars; frame id and time burned in as text, and the frame id
                   stamped machine-readably in the top-left cells (visionipc.apps.camera.pattern.read_stamp)
  PATH             a video file (OpenCV), resized to --width x --height; --loop restarts it at the end
  /dev/videoN, N   a V4L2/USB camera (OpenCV); it sets the pace, --fps is asked of the device

examples:
  vipc-camera --name camd --stream road --source synthetic --width 640 --height 480 --fps 20
  vipc-camera --name camd --stream road --stream wide --fps 30 --format bgr
  vipc-camera --name camd --stream road --source clip.mp4 --loop --width 1280 --height 720 --fps 30
  vipc-camera --name camd --config cams.toml        # per-stream source/size/fps/format/faults
  vipc-camera --name camd --stream road --fps 30 --wake handoff   # server CPU per frame flat in the clients

  # fault injection (tests, pipelines): frames 10, 20, 35 never published (ids keep counting);
  # frame 30 published 50 ms and frame 40 120 ms after their timestamp_eof
  vipc-camera --name camd --stream road --frames 100 --drop-frames 10,20,35 --delay-frames 30:50,40:120

cams.toml:
  name = "camd"
  wake = "handoff"       # optional: as --wake
  [[stream]]
  name = "road"
  source = "synthetic"
  width = 640
  height = 480
  fps = 20
  format = "nv12"
  drop_frames = [10, 20]
  [[stream]]
  name = "driver"
  source = "/dev/video0"
  format = "bgr"

Frame ids count from 0; --frames N captures ids 0..N-1 (dropped ones included), then exits 0.
Capture runs on absolute deadlines (start + k / fps, no drift); a slot missed entirely
(overload) is skipped, not made up in a burst. timestamp_sof is the capture deadline
(device/file: before the read), timestamp_eof when the pixels are in the buffer, both
CLOCK_MONOTONIC ns. SIGINT/SIGTERM stop cleanly (exit 0). Exit 2: bad input.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Publish camera frames (synthetic, video file or V4L2 "
        "camera) into a VisionIPC server, converted straight into the shared buffers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", help="VisionIPC server name (clients connect to it)")
    p.add_argument("--stream", action="append", help="stream name; repeat for several streams with the same settings")
    p.add_argument("--source", default="synthetic", help="synthetic | video file | /dev/videoN (default: synthetic)")
    p.add_argument("--width", type=int, default=640, help="frame width (default 640)")
    p.add_argument("--height", type=int, default=480, help="frame height (default 480)")
    p.add_argument("--fps", type=float, help="frames per second (default: a video file's own rate, else 20)")
    p.add_argument("--frames", type=int, default=0, help="stop after frame ids 0..N-1 (default 0: run until stopped)")
    aliases = ", ".join(alias for f in FORMAT_TABLE if f.selectable for alias in f.aliases)
    p.add_argument("--format", default="nv12", help=f"{' | '.join(FORMATS)} (or {aliases}; default nv12)")
    p.add_argument("--loop", action="store_true", help="video files: start again at the end instead of stopping")
    p.add_argument("--config", help="TOML file with [[stream]] tables (see below)")
    p.add_argument(
        "--buffers",
        type=int,
        default=DEFAULT_BUFFERS,
        help=f"buffers per stream (default {DEFAULT_BUFFERS}; more when --delay-frames needs them)",
    )
    add_wait_clients(p)
    add_wake(p)
    p.add_argument("--drop-frames", default="", metavar="ID,ID,...", help="frame ids never published")
    p.add_argument(
        "--delay-frames",
        default="",
        metavar="ID:MS,...",
        help="publish frame ID MS milliseconds after its timestamp_eof",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no start and summary lines")
    return p


class StreamRunner(threading.Thread):
    """Captures one stream on its schedule and publishes it.

    Invariants: only this thread touches its source, its checked-out buffers
    and its stream's get_buffer/send (a server takes one producer thread per
    stream, all sending at once). ``pending`` holds captured frames
    in frame-id order; the head is published once its time has come, so a
    delayed frame holds back (never reorders) the frames behind it."""

    def __init__(
        self,
        cfg: StreamConfig,
        source: FrameSource,
        server: "VisionIpcServer",
        stop: threading.Event,
        start_ns: int,
    ) -> None:
        super().__init__(name=f"camera-{cfg.name}", daemon=True)
        self.cfg, self.source, self.server, self.stop = cfg, source, server, stop
        self.start_ns = start_ns
        self.published = self.dropped = self.skipped_slots = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # reported by main
            self.error = e

    def _loop(self) -> None:
        assert self.cfg.fps is not None  # resolved once the source was open
        cfg, period = self.cfg, 1e9 / self.cfg.fps
        pending: Deque[Tuple[int, "VisionBuf", int, int, int]] = (
            collections.deque()
        )  # (publish_at_ns, buf, frame_id, sof, eof)
        spare: Optional["VisionBuf"] = None  # a checked-out buffer whose frame was dropped: reused for the next one
        frame_id, slot, capturing = 0, 0, True
        while not self.stop.is_set():
            now = time.monotonic_ns()
            while pending and pending[0][0] <= now:
                _, buf, fid, sof, eof = pending.popleft()
                self.server.send(buf, frame_id=fid, timestamp_sof=sof, timestamp_eof=eof)
                self.published += 1
            if capturing and cfg.frames and frame_id >= cfg.frames:
                capturing = False
            if not capturing and not pending:
                return
            deadline = self.start_ns + int(slot * period) if self.source.paced else now
            wake = min(deadline if capturing else float("inf"), pending[0][0] if pending else float("inf"))
            if wake > now:
                self.stop.wait((wake - now) / 1e9)
                continue
            if self.source.paced and now - deadline > period:  # overloaded: skip the missed slots
                behind = int((now - self.start_ns) // period)
                self.skipped_slots += behind - slot
                slot = behind
                deadline = self.start_ns + int(slot * period)
            if spare is None:
                spare = self.server.get_buffer(cfg.name)
            buf, spare = spare, None
            stamps = self.source.fill(buf, frame_id, deadline)
            if stamps is None:  # the file ended
                capturing = False
                continue
            slot += 1
            if frame_id in cfg.drop_frames:
                self.dropped += 1
                spare = buf
            else:
                delay_ms = cfg.delay_frames.get(frame_id, 0)
                pending.append((stamps[1] + int(delay_ms * 1e6), buf, frame_id, stamps[0], stamps[1]))
            frame_id += 1


def _wait_for_clients(
    server: "VisionIpcServer", streams: List[StreamConfig], count: int, stop: threading.Event
) -> None:
    while not stop.is_set():
        if all(server.num_clients(s.name) >= count for s in streams):
            stop.wait(WAIT_GRACE_S)
            return
        stop.wait(0.01)


def run(args: argparse.Namespace) -> int:
    from visionipc import VisionIpcServer
    from visionipc.formats import MAX_BUFFERS

    config = load_toml(args.config) if args.config else {}
    name = args.name or config.get("name")
    if not name:
        raise UsageError("give the server's --name (or name = ... in --config)")
    streams = build_streams(args, config)
    if not 1 <= args.buffers <= MAX_BUFFERS:
        raise UsageError(f"--buffers must be in 1..{MAX_BUFFERS}, got {args.buffers}")
    if args.wait_clients < 0:
        raise UsageError("--wait-clients must be >= 0")
    sources: Dict[str, FrameSource] = {}
    stopper = Stopper()
    server: Optional["VisionIpcServer"] = None
    try:
        for s in streams:
            sources[s.name] = open_source(s.source, s.format, s.width, s.height, s.fps or DEFAULT_FPS, s.loop)
            s.resolve_fps(sources[s.name])
        try:
            server = VisionIpcServer(name, wake=args.wake or config.get("wake"))
            for s in streams:
                server.create_buffers(
                    s.name, min(MAX_BUFFERS, args.buffers + s.max_delay_frames()), s.width, s.height, s.format
                )
        except ValueError as e:
            raise UsageError(str(e)) from None
        server.start_listener()
        if not args.quiet:
            for s in streams:
                log.info(
                    f"{name}/{s.name}: {s.width}x{s.height} {s.format} @ {s.fps:g} fps from "
                    f"{sources[s.name].description}"
                )
        if args.wait_clients:
            _wait_for_clients(server, streams, args.wait_clients, stopper.event)
        start_ns = time.monotonic_ns()
        runners = [StreamRunner(s, sources[s.name], server, stopper.event, start_ns) for s in streams]
        for r in runners:
            r.start()
        while any(r.is_alive() for r in runners) and not stopper.event.wait(0.05):
            if any(r.error for r in runners):
                break
        stopper.event.set()
        for r in runners:
            r.join()
        failed = [r for r in runners if r.error]
        for r in failed:
            log.error(f"stream {r.cfg.name}: {type(r.error).__name__}: {r.error}")
        if not args.quiet:
            for r in runners:
                log.info(
                    f"{name}/{r.cfg.name}: {r.published} frames published, {r.dropped} dropped "
                    f"(--drop-frames), {r.skipped_slots} slots skipped (late), "
                    f"{server.readers_woken(r.cfg.name)} sleeping clients woken by the server (wake {server.wake})"
                )
        return 1 if failed else 0
    finally:
        for src in sources.values():
            src.close()
        if server is not None:
            server.close()
        stopper.restore()


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
