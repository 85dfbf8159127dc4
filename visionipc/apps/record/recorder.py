"""vipc-record: record VisionIPC streams (and msgq topics) into a recording folder
(docs/recording-format.md)."""

import argparse
import errno
import json
import logging
import os
import queue
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from msgq.cli import progress
from msgq.tooling import printable
from visionipc.apps._cli import Stopper, UsageError, need, run_command
from visionipc.apps.record import codecs, index, layout
from visionipc.apps.record.storage import storage_for
from visionipc.apps.record.writer import StreamWriter

if TYPE_CHECKING:
    from visionipc import VisionIpcClient
    from visionipc.apps.record.av_frames import Image
    from visionipc.apps.record.codecs import AvStorage
    from visionipc.apps.record.index import FrameMeta
    from visionipc.apps.record.storage import Storage

PROG = "vipc-record"
log = logging.getLogger(PROG)
EXIT_DISK_FULL = 3  # the file system filled up (ENOSPC, EDQUOT, EFBIG): complete segments kept
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
QUEUE_BYTES = 256 << 20  # frames waiting for the encoder, per stream; beyond it frames are missed (counted)
RECV_MS = 100  # longest wait before a receiver checks for a stop request

EPILOG = """\
examples:
  vipc-record --name camd --stream road --out rec1 --duration 30
  vipc-record --name camd --stream road --stream wide --topic events --out rec2 --segment-seconds 10
  vipc-record --name camd --out rec3 --lossless          # every stream of camd, bit-exact (FFV1)
  vipc-record --name camd --out rec4 --codec hevc --crf 26 --preset fast
  vipc-record --name camd --out rec5 --format mcap       # segments as MCAP files (Foxglove, Lichtblick)

Layout (docs/recording-format.md): DIR/recording.json, DIR/frames/<stream>/<NNNNNN>.mkv,
DIR/index/<stream>/<NNNNNN>.parquet (one row per frame: ids, timestamps, segment, position),
DIR/topics/<topic>/<NNNNNN>.parquet. A segment is written under a hidden .partial name and
renamed when complete, so stopping (SIGINT/SIGTERM, --duration, --frames, --idle-timeout)
never leaves a corrupt segment, and SIGKILL leaves at most hidden .partial files.
A full disk (or quota) stops the recording: the segment being written is dropped, the
complete ones are kept, recording.json says "failed" with the reason, exit status 3.
Default storage is lossy H.264 (--codec: hevc, av1, NVENC; FFmpeg through PyAV, fed the
stream's own YUV/gray planes); --lossless stores the exact pixels (FFV1; raw16 is always
lossless). The index of a lossy stream also holds each frame's brightness, contrast,
sharpness and motion measured as captured (--frame-metrics), so vipc-analyze reports the
same numbers for a frame stored lossy or lossless. Frames the recorder could not keep (its
encoder fell behind, or a frame was overwritten before it was copied) are counted and
printed, as are gaps in frame ids.
"""


# --frame-metrics -> StreamWriter's measure (None: for lossy streams only)
FRAME_METRICS = {"lossy": None, "all": True, "none": False}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Record VisionIPC streams and msgq topics into a folder "
        "of video segments with a Parquet frame index.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", required=True, help="VisionIPC server name")
    p.add_argument("--stream", action="append", help="stream to record; repeat for more (default: every stream)")
    p.add_argument("--topic", action="append", default=[], help="msgq topic to record beside the frames; repeatable")
    p.add_argument("--out", required=True, help="recording folder to create (must not hold files yet)")
    p.add_argument("--duration", type=float, help="stop after SEC seconds")
    p.add_argument("--segment-seconds", type=float, default=60.0, help="start a new segment every N s (default 60)")
    p.add_argument("--lossless", action="store_true", help="bit-exact pixels (FFV1) instead of lossy H.264")
    codecs.add_codec_args(p)
    p.add_argument(
        "--frame-metrics",
        choices=list(FRAME_METRICS),
        default="lossy",
        help="measure brightness/contrast/sharpness/motion of each frame as captured and keep them in the index: "
        "for lossy streams (default: the analysis then sees the frames before the codec changed them), "
        "all streams (vipc-analyze's metrics job then decodes nothing) or none",
    )
    p.add_argument("--frames", type=int, default=0, help="stop each stream after N frames")
    p.add_argument("--idle-timeout", type=float, default=0, help="stop once no frame arrived for SEC s")
    p.add_argument("--connect-timeout", type=float, default=10.0, help="how long to wait for the server (default 10 s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    return p


class StreamRecorder:
    """A receiver thread copies each frame out of the pool (``Storage.capture``) and
    queues it; an encoder thread writes segments. Invariant: the queue is the only
    data shared by the two threads; counters are written by the receiver only.
    Frames of another geometry than the stream had at the start (its server was
    restarted with another size or format) are not recorded but counted as missed."""

    def __init__(
        self,
        client: "VisionIpcClient",
        storage: "Union[Storage, AvStorage]",
        writer: StreamWriter,
        max_frames: int,
        stop: threading.Event,
    ) -> None:
        self.client, self.storage, self.writer, self.max_frames, self.stop = client, storage, writer, max_frames, stop
        frame_bytes = storage.image_size[0] * storage.image_size[1] * (3 if storage.is_color else 1)
        self.queue: "queue.Queue[Optional[Tuple[Image, FrameMeta]]]" = queue.Queue(max(8, QUEUE_BYTES // frame_bytes))
        self.geometry = (storage.fmt, storage.width, storage.height)
        self.received = self.missed_invalid = self.missed_queue = self.missed_geometry = self.gaps = 0
        self.last_id: Optional[int] = None
        self.last_frame_s = time.monotonic()
        self.error: Optional[BaseException] = None
        self.receiver = threading.Thread(target=self._guard, args=(self._receive,), daemon=True)
        self.encoder = threading.Thread(target=self._guard, args=(self._encode,), daemon=True)

    def start(self) -> None:
        self.encoder.start()
        self.receiver.start()

    def _guard(self, fn):
        try:
            fn()
        except BaseException as e:
            self.error = e
            self.stop.set()

    def _receive(self):
        try:
            while not self.stop.is_set() and not (self.max_frames and self.received >= self.max_frames):
                frame = self.client.recv(RECV_MS)
                if frame is None:
                    continue
                if (frame.format, frame.width, frame.height) != self.geometry:  # a restarted server, resized
                    self.missed_geometry += 1
                    continue
                with frame:
                    image = self.storage.capture(frame)
                    intact = frame.valid
                if not intact:  # overwritten while we copied it
                    self.missed_invalid += 1
                    continue
                self.last_frame_s = time.monotonic()
                if self.last_id is not None and frame.frame_id > self.last_id + 1:
                    self.gaps += frame.frame_id - self.last_id - 1
                self.last_id = frame.frame_id
                meta = dict(
                    frame_id=frame.frame_id,
                    timestamp_sof=frame.timestamp_sof,
                    timestamp_eof=frame.timestamp_eof,
                    publish_time=frame.timestamp_publish,
                    receive_time=frame.timestamp_recv,
                )
                try:
                    self.queue.put_nowait((image, meta))
                    self.received += 1
                except queue.Full:
                    self.missed_queue += 1
        finally:
            while self.encoder.is_alive():
                try:
                    self.queue.put(None, timeout=0.1)
                    break
                except queue.Full:
                    pass

    def _encode(self):
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    return
                self.writer.add(*item)
        finally:
            self.writer.close_segment()

    def join(self) -> None:
        self.receiver.join()
        self.encoder.join()
        self.client.close()

    def summary(self) -> Dict[str, int]:
        return {
            "frames": self.writer.frames,
            "segments": self.writer.segments,
            "missed": self.missed_invalid + self.missed_queue + self.missed_geometry,
            "gaps": self.gaps,
        }


class TopicRecorder(threading.Thread):
    """Messages of one msgq topic, with their receive time, into Parquet segments."""

    def __init__(
        self, folder: str, topic: str, segment_seconds: float, stop: threading.Event, mcap: bool = False
    ) -> None:
        super().__init__(daemon=True)
        self.mcap = mcap  # --format mcap: each segment as MCAP too (mcap_io.write_topic)
        import msgq

        self.topic, self.stop = topic, stop
        self.segment_ns = int(segment_seconds * 1e9) if segment_seconds else 0
        self.folder, self.dir = folder, os.path.join(folder, layout.TOPICS, topic)
        self.sock = msgq.sub_sock(topic, timeout=RECV_MS)
        self.messages = self.segments = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        rows: Optional[index.Columns] = None
        start = 0
        try:
            os.makedirs(self.dir, exist_ok=True)
            while not self.stop.is_set():
                data = self.sock.receive()
                now = time.monotonic_ns()
                if rows is not None and self.segment_ns and now - start >= self.segment_ns:
                    self._flush(rows)
                    rows = None
                if data is None:
                    continue
                if rows is None:
                    rows, start = {k: [] for k in index.TOPIC_COLUMNS}, now
                for key, value in zip(
                    index.TOPIC_COLUMNS, (self.topic, self.messages, now, bytes(data), self.segments)
                ):
                    rows[key].append(value)
                self.messages += 1
            if rows is not None:
                self._flush(rows)
        except BaseException as e:
            self.error = e
        finally:
            self.sock.close()

    def _flush(self, rows):
        index.write_table(
            rows, index.topic_schema(), os.path.join(self.folder, layout.topic_file(self.topic, self.segments))
        )
        if self.mcap:
            import msgq
            from visionipc.apps.record import mcap_io

            path = os.path.join(self.folder, layout.topic_file(self.topic, self.segments, layout.MCAP))
            mcap_io.write_topic(rows, path, msgq.topic_schema(self.topic))
        self.segments += 1


def _connect(
    name: str, streams: Optional[Sequence[str]], timeout: float, stop: threading.Event
) -> List["VisionIpcClient"]:
    from visionipc import VisionIpcClient, available_streams

    deadline = time.monotonic() + timeout
    while True:
        offered = {str(s) for s in available_streams(name)}
        if offered:
            break
        if time.monotonic() > deadline:
            raise UsageError(
                f"no VisionIPC server {name!r} answered within {timeout:g} s (is vipc-camera running, "
                f"under the same MSGQ_PREFIX?)"
            )
        if stop.wait(0.02):
            return []
    streams = streams or sorted(offered)
    unknown = [s for s in streams if s not in offered]
    if unknown:
        raise UsageError(
            f"server {name!r} has no stream {', '.join(map(repr, unknown))} (it has: {', '.join(sorted(offered))})"
        )
    clients = []
    for s in streams:
        client = VisionIpcClient(name, s)
        while not client.connect(False):
            if time.monotonic() > deadline:
                raise UsageError(f"could not connect to stream {s!r} of {name!r}")
            time.sleep(0.01)
        clients.append(client)
    return clients


def _geometry(client: "VisionIpcClient") -> Tuple[str, int, int]:
    """A connected client's (format, width, height)."""
    fmt, width, height = client.format, client.width, client.height
    assert fmt is not None and width is not None and height is not None  # known once connected
    return fmt, width, height


connect_streams = _connect  # (name, streams, timeout, stop) -> connected clients; vipc-foxglove's too


def _prepare_out(out):
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise UsageError(f"--out {out!r} exists and is not a folder")
        if os.listdir(out):
            raise UsageError(f"--out {out!r} is not empty (a recording needs a new folder)")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create --out {out!r}: {e}") from None


def _check_args(args):
    for flag, value in (
        ("--duration", args.duration),
        ("--segment-seconds", args.segment_seconds),
        ("--idle-timeout", args.idle_timeout),
        ("--connect-timeout", args.connect_timeout),
    ):
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be >= 0, got {value}")
    if args.frames < 0:
        raise UsageError(f"--frames must be >= 0, got {args.frames}")
    if args.stream and len(set(args.stream)) != len(args.stream):
        raise UsageError("a --stream is given twice")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    cv2 = need("cv2", "record")
    codecs.check_args(args)
    # The heavy imports happen before connecting: from the connect on, frames wait in
    # the pool only as long as it has buffers, and a receiver must be running by then.
    index.pa()
    codecs.av()
    stopper = Stopper()
    stop = stopper.event
    recorders: List[StreamRecorder] = []
    topics: List[TopicRecorder] = []
    clients: List["VisionIpcClient"] = []
    try:
        clients = _connect(args.name, args.stream, args.connect_timeout, stop)
        if stop.is_set():
            return 0
        storages = [storage_for(args, cv2, *_geometry(c)) for c in clients]
        _prepare_out(args.out)
        try:
            topics = [
                TopicRecorder(args.out, t, args.segment_seconds, stop, args.format == layout.MCAP) for t in args.topic
            ]
        except ValueError as e:
            raise UsageError(f"--topic: {e}") from None
        manifest: Dict[str, Any] = {
            "format_version": index.FORMAT_VERSION,
            "recording_id": str(uuid.uuid4()),  # stable: vipc-analyze's tables key on it
            "name": args.name,
            "streams": {},
            "topics": args.topic,
            "clock": "CLOCK_MONOTONIC",
            "start": index.clock_now(),
            "stop": None,
            "status": layout.RECORDING,
        }
        for client, storage in zip(clients, storages):
            fmt, w, h = client.format, client.width, client.height
            measure = FRAME_METRICS[args.frame_metrics]
            writer = StreamWriter(cv2, args.out, str(client.stream), storage, args.segment_seconds, measure)
            recorders.append(StreamRecorder(client, storage, writer, args.frames, stop))
            manifest["streams"][str(client.stream)] = {
                "width": w,
                "height": h,
                "format": fmt,
                **storage.describe(),
                "frame_metrics": writer.measures,
                "segments": 0,
                "frames": 0,
            }
        index.write_json(layout.manifest_path(args.out), manifest)
        for r in recorders + topics:
            r.start()
        start = time.monotonic()
        total = args.frames * len(recorders) if args.frames else None
        bar = progress(total=total, desc="recording", unit="frame")
        while not stop.wait(0.05):
            now = time.monotonic()
            bar.update(sum(r.received for r in recorders) - bar.n)
            if args.duration and now - start >= args.duration:
                break
            if recorders and not any(r.receiver.is_alive() for r in recorders):
                break  # every stream has its --frames
            if args.idle_timeout and recorders and all(now - r.last_frame_s >= args.idle_timeout for r in recorders):
                break
        stop.set()
        bar.update(sum(r.received for r in recorders) - bar.n)
        bar.close()
        for r in recorders:
            r.join()
        for t in topics:
            t.join()
        for r in recorders:
            manifest["streams"][r.writer.stream].update(r.summary())
        failed = [r for r in recorders + topics if r.error]
        full = next((disk_full(r.error) for r in failed if disk_full(r.error)), None)
        manifest["stop"], manifest["status"] = index.clock_now(), layout.FAILED if failed else layout.COMPLETE
        if failed:
            manifest["error"] = printable(f"{type(failed[0].error).__name__}: {failed[0].error}")
        if full is not None:
            manifest["error"] = f"disk full: {printable(str(full))}"
            drop_partial_files(args.out)  # the dropped segments' space, for recording.json
        finish_manifest(layout.manifest_path(args.out), manifest)
        if full is not None:
            segments = sum(info["segments"] for info in manifest["streams"].values())
            log.error(
                f"the disk is full ({printable(str(full))}): stopped; {segments} complete "
                f"segment(s) kept in {printable(args.out)}, recording.json says so"
            )
            return EXIT_DISK_FULL
        for r in failed:
            log.error(f"{type(r.error).__name__}: {r.error}")
        if not args.quiet:
            for s, info in manifest["streams"].items():
                log.info(
                    f"{s}: {info['frames']} frames in {info['segments']} segment(s), "
                    f"{info['missed']} missed by the recorder, {info['gaps']} missing frame ids"
                )
            for t in topics:
                log.info(f"topic {t.topic}: {t.messages} messages")
        return 1 if failed else 0
    finally:
        stop.set()
        for c in clients:
            c.close()
        stopper.restore()


def disk_full(error: Optional[BaseException]) -> Optional[BaseException]:
    """The error in ``error``'s chain (an OSError, PyAV's or pyarrow's error; closing a
    segment after a failed write raises again) that says the disk or quota is full, or None."""
    while error is not None:
        if getattr(error, "errno", None) in DISK_FULL or any(os.strerror(e) in str(error) for e in DISK_FULL):
            return error
        error = error.__cause__ or error.__context__
    return None


def drop_partial_files(folder: str) -> None:
    """Remove the hidden ``.NNNNNN.partial.*`` files of segments that could not be completed
    (readers skip them; on a full disk their space is what recording.json needs)."""
    for root, _, names in os.walk(folder):
        for name in names:
            if layout.is_partial(name):
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass


def finish_manifest(path: str, manifest: Dict[str, Any]) -> None:
    """recording.json's last state, atomically; on a full disk (no room for the new copy)
    written over the old one in place: the stop and the reason must reach the file."""
    try:
        index.write_json(path, manifest)
    except OSError as e:
        if not disk_full(e):
            raise
        drop_partial_files(os.path.dirname(path))
        data = (json.dumps(manifest, indent=2) + "\n").encode()
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()
            os.fsync(f.fileno())


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return run_command(PROG, build_parser(), run, argv, config=True)
    except OSError as e:  # before the recorders ran (creating --out, the first recording.json)
        if not disk_full(e):
            raise
        print(f"{PROG}: error: the disk is full ({printable(str(e))})", file=sys.stderr)
        return EXIT_DISK_FULL


if __name__ == "__main__":
    sys.exit(main())
