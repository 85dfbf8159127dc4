"""vipc-replay: publish a recording back into a VisionIPC server it creates, with the
original frame ids and timing (intervals scaled by --rate), in a deterministic order."""

import argparse
import contextlib
import logging
import os
import queue
import sys
import threading
import time

from msgq.cli import progress
from msgq.tooling import printable
from visionipc.apps._cli import Stopper, UsageError, add_wait_clients, add_wake, need, run_command
from visionipc.apps.record import codecs, index
from visionipc.apps.record.checks import RecordingError, check_size
from visionipc.apps.record.reader import iter_segment_frames, open_video
from visionipc.apps.record.storage import Storage

PROG = "vipc-replay"
log = logging.getLogger(PROG)
DECODE_AHEAD = 16  # decoded frames kept ready per stream

EPILOG = """\
examples:
  vipc-replay rec1 --name camd                     # as recorded
  vipc-replay rec1 --name camd --rate 2.0 --loop   # twice as fast, forever
  vipc-replay rec1 --name camd --rate max --stream road --wait-clients 1
  vipc-replay bag.mcap --name camd --topic-map /camera/image_raw=road   # a ROS 2 bag

Every frame is published with its recorded frame id, in the order it was first
published (publish_time, then stream name, then frame id; the same order on every run),
spaced like the recording (divided by --rate; max: as fast as frames decode).
timestamp_sof/eof keep their recorded spacing, moved so the first frame is published
now (--original-timestamps: exactly as recorded). Recorded msgq topics are published
at their recorded times too (--no-topics: not). --loop starts over at the end, with the
same frame ids. SIGINT/SIGTERM stop cleanly (exit 0).

A ROS 2 bag (MCAP) replays its sensor_msgs/msg/Image (mono8, mono16, rgb8, bgr8, nv12)
and sensor_msgs/msg/CompressedImage (JPEG, PNG) topics: frame ids count from 0 per
stream, timestamp_sof/eof are the header stamps, spacing is the messages' log times.
"""


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Replay a vipc-record recording into a VisionIPC server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", help="recording folder, or a ROS 2 bag (.mcap file)")
    p.add_argument("--name", required=True, help="name of the VisionIPC server to create")
    p.add_argument("--rate", default="1.0", help="speed factor (1.0 as recorded, 2.0 twice as fast) or max")
    p.add_argument("--loop", action="store_true", help="start over at the end, until stopped")
    p.add_argument("--stream", action="append", help="replay only these streams (repeatable; default: all)")
    p.add_argument("--no-topics", action="store_true", help="do not publish the recorded msgq topics")
    add_wait_clients(p)
    add_wake(p)
    p.add_argument("--original-timestamps", action="store_true", help="publish timestamps exactly as recorded")
    p.add_argument("--buffers", type=int, default=8, help="buffers per stream (default 8)")
    p.add_argument(
        "--topic-map",
        action="append",
        default=[],
        metavar="TOPIC=STREAM",
        help="ROS 2 bag: publish image TOPIC as STREAM (repeatable; default: every image topic, named after it)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    return p


def _rate(text):
    if text == "max":
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not 0 < rate <= 1000:
        raise UsageError(f"--rate must be a number in (0, 1000] or 'max', got {text!r}")
    return rate


class Decoder(threading.Thread):
    """Decodes one stream's segments in index order, one frame per index row, ahead
    of the publisher (a bounded queue: the only data shared with it)."""

    def __init__(self, cv2, folder, stream, rows, storage, stop):
        super().__init__(daemon=True)
        self.cv2, self.folder, self.stream, self.rows, self.storage, self.stop = (
            cv2,
            folder,
            stream,
            rows,
            storage,
            stop,
        )
        self.frames = queue.Queue(DECODE_AHEAD)
        self.error = None

    def images(self):
        """The stream's images in publishing order (a ROS 2 bag's decoder overrides this)."""
        return iter_segment_frames(self.cv2, self.folder, self.rows, self.storage)

    def run(self):
        try:
            with contextlib.closing(self.images()) as images:  # the decoder freed here, not by the GC
                for image in images:
                    if not self._put(image):
                        return
        except BaseException as e:
            self.error = e
            self._put(None)

    def _put(self, item):
        while not self.stop.is_set():
            try:
                self.frames.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def next(self):
        while True:
            try:
                image = self.frames.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():
                    return None
                continue
            if image is None:
                kind = RecordingError if isinstance(self.error, RecordingError) else RuntimeError
                raise kind(f"stream {self.stream}: {self.error}")
            return image


def _timeline(folder, manifest, streams, topics):
    """Every event of the recording in replay order: (time_ns, kind, name, seq, row)."""
    events = []
    tables = {}
    for s in streams:
        table = index.read_index(folder, s)
        if table.num_rows == 0:
            raise UsageError(f"stream {s!r} has no complete segment in {folder!r}")
        tables[s] = table
        cols = table.to_pydict()
        for i in range(table.num_rows):
            events.append(
                (
                    cols["publish_time"][i],
                    0,
                    s,
                    cols["frame_id"][i],
                    (cols["timestamp_sof"][i], cols["timestamp_eof"][i]),
                )
            )
    for t in topics:
        cols = index.read_topic(folder, t).to_pydict()
        for i in range(len(cols["seq"])):
            events.append((cols["receive_time"][i], 1, t, cols["seq"][i], cols["data"][i]))
    events.sort(key=lambda e: e[:4])
    return events, tables


def _memory_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (no limit known: a very large number)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def check_pool(geometry: dict, buffers: int) -> None:
    """RecordingError unless every stream's size is one a recording may hold (checks.MAX_SIDE)
    and ``buffers`` buffers of each fit in half the available memory: the same limits for a
    recording folder and a ROS 2 bag, checked before anything is reserved."""
    from visionipc.formats import layout

    for s, info in geometry.items():
        check_size(info["width"], info["height"], f"stream {s}")
    pool_bytes = sum(buffers * layout(i["format"], i["width"], i["height"]).size for i in geometry.values())
    available = _memory_available()
    if pool_bytes > available // 2:
        raise RecordingError(
            f"replaying {', '.join(geometry)} needs {pool_bytes >> 20} MiB of buffers, more than half the "
            f"{available >> 20} MiB available: use fewer --buffers or --stream"
        )


def _storages(cv2, folder, recorded, streams, tables) -> dict:
    """Each stream's Storage, once its first video is checked to have the size recording.json
    says (before anything is reserved)."""
    storages = {}
    for s in streams:
        try:
            storages[s] = Storage.from_manifest(cv2, recorded[s])
        except ValueError as e:
            raise RecordingError(f"{folder}/recording.json: stream {s!r}: {e}") from None
        first = tables[s].column("segment_file")[0].as_py()
        if storages[s].uses_av:  # its first frame decodes to the size recording.json gives
            with contextlib.closing(codecs.iter_decoded(folder, [(first, 0)], storages[s])) as frames:
                next(frames)
        else:
            cap, fd = open_video(cv2, folder, first, storages[s])
            cap.release()
            os.close(fd)
    return storages


def run(args) -> int:
    """SIGINT/SIGTERM set the stop flag from the first moment on (a KeyboardInterrupt raised
    at a random point of the start-up could be swallowed by a library and lost)."""
    stopper = Stopper()
    try:
        return _run(args, stopper.event)
    finally:
        stopper.restore()


def _run(args, stop) -> int:
    rate = _rate(args.rate)
    if os.path.isfile(args.dir):  # a ROS 2 bag (MCAP)
        from visionipc.apps.record import ros2bag

        return ros2bag.replay(args, rate, stop)
    if args.topic_map:
        raise UsageError("--topic-map is for ROS 2 bags (an .mcap file), not a recording folder")
    cv2 = need("cv2", "record")
    index.pa()
    manifest = index.read_manifest(args.dir)
    recorded = manifest.get("streams", {})
    streams = args.stream or sorted(recorded)
    unknown = [s for s in streams if s not in recorded]
    if unknown:
        raise UsageError(
            f"the recording has no stream {', '.join(map(repr, unknown))} (it has: {', '.join(sorted(recorded))})"
        )
    topics = [] if args.no_topics else list(manifest.get("topics", []))
    events, tables = _timeline(args.dir, manifest, streams, topics)
    storages = _storages(cv2, args.dir, recorded, streams, tables)

    def decoders(stop):
        return {
            s: Decoder(
                cv2,
                args.dir,
                s,
                list(zip(tables[s].column("segment_file").to_pylist(), tables[s].column("position").to_pylist())),
                storages[s],
                stop,
            )
            for s in streams
        }

    return serve(args, rate, {s: recorded[s] for s in streams}, storages, events, topics, decoders, stop)


def serve(args, rate, geometry, storages, events, topics, make_decoders, stop) -> int:
    """Create the server (``geometry``: stream -> dict of width, height, format), then publish
    ``events`` (see _timeline) with ``make_decoders(stop)``'s images, once or --loop, until
    ``stop`` (a threading.Event) is set."""
    from visionipc import VisionIpcServer
    from visionipc.formats import MAX_BUFFERS

    streams = list(geometry)
    if not 1 <= args.buffers <= MAX_BUFFERS:
        raise UsageError(f"--buffers must be in 1..{MAX_BUFFERS}")
    check_pool(geometry, args.buffers)
    server, pubs, decoders = None, {}, {}
    try:
        try:
            server = VisionIpcServer(args.name, wake=args.wake)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for s, info in geometry.items():
            server.create_buffers(s, args.buffers, info["width"], info["height"], info["format"])
        server.start_listener()
        import msgq

        pubs = {t: msgq.pub_sock(t) for t in topics}
        if args.wait_clients:
            while not stop.is_set() and not all(server.num_clients(s) >= args.wait_clients for s in streams):
                stop.wait(0.01)
            stop.wait(0.1)  # the last client finishes subscribing
        passes = sent = 0
        while not stop.is_set():
            decoders = make_decoders(stop)
            for d in decoders.values():
                d.start()
            with progress(total=len(events), desc=f"replaying (pass {passes + 1})", unit="msg") as bar:
                sent += _play(events, server, storages, decoders, pubs, rate, args.original_timestamps, stop, bar)
            passes += 1
            for d in decoders.values():
                d.join()
            if not args.loop:
                break
        if not args.quiet:
            log.info(f"{sent} frames of {', '.join(streams)} published in {passes} pass(es)")
        return 0
    finally:
        stop.set()
        for d in decoders.values():
            d.join()
        for p in pubs.values():
            p.close()
        if server is not None:
            server.close()


def _play(events, server, storages, decoders, pubs, rate, original, stop, bar) -> int:
    first = events[0][0]
    start = time.monotonic_ns()
    shift = 0 if original else start - first
    scale = 1.0 if (rate is None or original) else 1.0 / rate
    sent = 0
    for when, kind, name, seq, payload in events:
        if rate is not None:
            due = start + int((when - first) / rate)
            wait = due - time.monotonic_ns()
            if wait > 0 and stop.wait(wait / 1e9):
                break
        if stop.is_set():
            break
        bar.update()
        if kind == 1:
            pubs[name].send(payload)
            continue
        image = decoders[name].next()
        if image is None:
            break
        buf = server.get_buffer(name)
        storages[name].restore(image, buf)
        sof, eof = (first + shift + round((t - first) * scale) for t in payload)  # exact for epoch-ns stamps
        server.send(buf, frame_id=seq, timestamp_sof=max(0, sof), timestamp_eof=max(0, eof))
        sent += 1
    return sent


def main(argv=None) -> int:
    try:
        return run_command(PROG, build_parser(), run, argv, config=True)
    except (RuntimeError, OSError) as e:  # a failure, not bad input: one line, exit 1
        print(f"{PROG}: error: {printable(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before run() took SIGINT over (Python's start-up, imports)
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
