"""vipc-replay: publish a recording back into a VisionIPC server it creates, with the
original frame ids and timing (intervals scaled by --rate), in a deterministic order."""

import argparse
import contextlib
import os
import sys
from typing import Any, Dict, Optional, Sequence

from msgq.tooling import printable
from visionipc.apps._cli import Stopper, UsageError, add_wait_clients, add_wake, need, run_command
from visionipc.apps.record import codecs, index, layout
from visionipc.apps.record.checks import RecordingError
from visionipc.apps.record.playback import Decoder, serve
from visionipc.apps.record.reader import open_video
from visionipc.apps.record.storage import Storage

PROG = "vipc-replay"

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


def build_parser() -> argparse.ArgumentParser:
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


def _storages(cv2, folder, recorded, streams, tables) -> dict:
    """Each stream's Storage, once its first video is checked to have the size recording.json
    says (before anything is reserved)."""
    storages: Dict[str, Any] = {}  # stream -> its Storage or AvStorage
    for s in streams:
        try:
            storages[s] = Storage.from_manifest(cv2, recorded[s])
        except ValueError as e:
            raise RecordingError(f"{folder}/{layout.MANIFEST}: stream {s!r}: {e}") from None
        first = tables[s].column("segment_file")[0].as_py()
        if storages[s].uses_av:  # its first frame decodes to the size recording.json gives
            with contextlib.closing(codecs.iter_decoded(folder, [(first, 0)], storages[s])) as frames:
                next(frames)
        else:
            cap, fd = open_video(cv2, folder, first, storages[s])
            cap.release()
            os.close(fd)
    return storages


def run(args: argparse.Namespace) -> int:
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


def main(argv: Optional[Sequence[str]] = None) -> int:
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
