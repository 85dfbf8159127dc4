"""What vipc-replay does once it knows what to play, for a recording folder (replay.py) and a
ROS 2 bag (ros2bag.py) alike: decoder threads that stay ahead of the publisher
(:class:`Decoder`), the memory check (:func:`check_pool`), and :func:`serve`: the server
created, the events published in time, once or in a loop."""

import argparse
import contextlib
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, List, Mapping, Optional, Protocol, Sequence, Tuple

from msgq.cli import progress
from visionipc.apps._cli import UsageError
from visionipc.apps.record.checks import RecordingError, check_size
from visionipc.apps.record.reader import iter_segment_frames

if TYPE_CHECKING:
    from visionipc.apps.record.av_frames import Image
    from visionipc.frame import VisionBuf

log = logging.getLogger("vipc-replay")
DECODE_AHEAD = 16  # decoded frames kept ready per stream
# (time ns, 0: a frame / 1: a message, stream or topic, frame id or seq, (sof, eof) or the message)
Event = Tuple[int, int, str, int, Any]


class Restores(Protocol):
    """A stream's storage as the publisher uses it: a decoded image back into a pool buffer."""

    def restore(self, image: "Image", buf: "VisionBuf") -> None: ...


class Decoder(threading.Thread):
    """Decodes one stream's segments in index order, one frame per index row, ahead
    of the publisher (a bounded queue: the only data shared with it)."""

    def __init__(
        self, cv2: Any, folder: str, stream: str, rows: List[Tuple[str, int]], storage: Any, stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.cv2, self.folder, self.stream, self.rows, self.storage, self.stop = (
            cv2,
            folder,
            stream,
            rows,
            storage,
            stop,
        )
        self.frames: "queue.Queue[Optional[Image]]" = queue.Queue(DECODE_AHEAD)
        self.error: Optional[BaseException] = None

    def images(self) -> Generator["Image", None, None]:
        """The stream's images in publishing order (a ROS 2 bag's decoder overrides this)."""
        return iter_segment_frames(self.cv2, self.folder, self.rows, self.storage)

    def run(self) -> None:
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

    def next(self) -> Optional["Image"]:
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


def check_pool(geometry: Dict[str, Dict[str, Any]], buffers: int) -> None:
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


def serve(
    args: argparse.Namespace,
    rate: Optional[float],
    geometry: Dict[str, Dict[str, Any]],
    storages: Mapping[str, Restores],
    events: List[Event],
    topics: Sequence[str],
    make_decoders: Callable[[threading.Event], Dict[str, Decoder]],
    stop: threading.Event,
) -> int:
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
