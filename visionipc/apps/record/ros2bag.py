"""vipc-replay of a ROS 2 bag (an MCAP file, ROS 2's default bag format): its
``sensor_msgs/msg/Image`` and ``sensor_msgs/msg/CompressedImage`` topics become VisionIPC
streams (``--topic-map /camera/image_raw=road``; default: every image topic, named after
it). Frame ids count from 0 per stream; timestamp_sof/eof are the message's header stamp
(its log time when the stamp is 0); frames are spaced by the messages' log times.

Reads with the ``mcap`` and ``mcap-ros2-support`` packages (the ``record`` extra).
"""

import argparse
import contextlib
import io
import struct
import threading
from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple

import numpy as np

from msgq.tooling import printable
from visionipc import pixels
from visionipc.apps._cli import UsageError, need
from visionipc.apps.record import playback
from visionipc.apps.record.av_frames import Image
from visionipc.apps.record.checks import RecordingError, check_size, check_stream, reading
from visionipc.apps.record.mcap_io import open_reader
from visionipc.apps.record.vocabulary import ROS_ENCODING, ROS_ENCODING_ALIASES
from visionipc.formats import format_info

IMAGE, COMPRESSED = "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"
# sensor_msgs/Image encoding -> stream format
ENCODINGS = {**{encoding: fmt for fmt, encoding in ROS_ENCODING.items()}, **ROS_ENCODING_ALIASES}


def _decoder_factory():
    need("mcap", "record")
    need("mcap_ros2", "record")
    from mcap_ros2.decoder import DecoderFactory

    return DecoderFactory


def _stamp(data: bytes, log_time: int) -> int:
    """The header stamp (ns) of a CDR-encoded message that starts with std_msgs/Header.

    Read from the first 12 bytes instead of decoding with mcap_ros2 (issue 34, item 5
    asked why): this pass over the bag wants only the stamps, and mcap_ros2 decodes the
    whole message, image bytes included. Measured (2026-11-27, 20 messages of 1080p rgb8,
    reading included): 1,061 µs a message this way, 4,743 µs decoded (4.5x). The images
    themselves are decoded by mcap_ros2 (``Bag.images``)."""
    if len(data) < 12:
        return log_time
    order = "<" if data[1] & 1 else ">"  # the encapsulation kind: CDR_LE or CDR_BE
    sec, nsec = struct.unpack_from(order + "iI", data, 4)
    stamp = sec * 1_000_000_000 + nsec
    return stamp if stamp > 0 else log_time


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # JPEG frame headers


def compressed_size(data: bytes) -> Tuple[int, int]:
    """(width, height) from a PNG's or JPEG's header, read before anything is decoded (a
    small compressed image can describe a huge one); ValueError for any other data."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 <= len(data):
            if data[i] != 0xFF:
                break
            marker = data[i + 1]
            if marker in _SOF:
                height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                return width, height
            if marker == 0xFF or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # fill byte, no length
                i += 1 if marker == 0xFF else 2
                continue
            i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
        raise ValueError("a JPEG without a frame header")
    raise ValueError("a CompressedImage that is neither PNG nor JPEG")


def to_image(schema_name: str, msg: Any) -> Tuple[str, Image]:
    """A decoded message -> (stream format, compact image); sizes are checked (1..16384 a
    side, checks.check_size) before any pixel is decoded or copied."""
    if schema_name == COMPRESSED:
        cv2 = need("cv2", "record")
        check_size(*compressed_size(bytes(msg.data[: 1 << 16])), "the CompressedImage")
        image = cv2.imdecode(np.frombuffer(msg.data, np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise ValueError(f"cannot decode a {printable(repr(msg.format))[:40]} CompressedImage")
        if image.ndim == 3 and image.shape[2] == 4:
            image = image[..., :3]
        fmt = "bgr8" if image.ndim == 3 else ("raw16" if image.dtype == np.uint16 else "gray8")
        return fmt, np.ascontiguousarray(image)
    if msg.encoding not in ENCODINGS:
        raise ValueError(f"image encoding {printable(repr(msg.encoding))[:40]} is not one of {', '.join(ENCODINGS)}")
    check_size(msg.width, msg.height, "the Image")
    fmt = ENCODINGS[msg.encoding]
    info = format_info(fmt)
    channels, order = info.channels, ">" if msg.is_bigendian and info.sample_bytes > 1 else "<"
    dtype = np.dtype(f"{order}u{info.sample_bytes}")
    rows = msg.height * 3 // 2 if info.yuv420 else msg.height
    row_items = msg.step // dtype.itemsize
    data = np.frombuffer(msg.data, dtype, count=len(msg.data) // dtype.itemsize)
    if msg.step < msg.width * channels * dtype.itemsize or data.size < rows * row_items:
        raise ValueError(f"a {msg.width}x{msg.height} {msg.encoding} image with step {msg.step} has too few bytes")
    image = data[: rows * row_items].reshape(rows, row_items)[:, : msg.width * channels]
    shape = pixels.compact_shape(fmt, msg.width, msg.height)
    return fmt, np.ascontiguousarray(image.reshape(shape), dtype=pixels.compact_dtype(fmt))


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


class Bag:
    """The image topics of one bag: ``streams`` (stream -> topic), ``geometry`` (stream ->
    width, height, format from its first message) and the replay ``events``. The bag is
    untrusted input: everything read from it goes through checks.reading (one
    RecordingError naming the bag and the message)."""

    def __init__(self, path: str, topic_map: Sequence[str], only: Optional[Sequence[str]]) -> None:
        self.path, self.factory = path, _decoder_factory()
        wanted: Dict[str, str] = {}  # topic -> stream
        for item in topic_map:
            topic, sep, stream = item.partition("=")
            if not sep or not topic or not stream:
                raise UsageError(f"--topic-map wants TOPIC=STREAM, got {item!r}")
            wanted[topic] = stream
        try:
            with open(path, "rb") as f:
                summary = open_reader(f).get_summary()
        except Exception as e:  # mcap raises its own errors for files that are not MCAP
            raise RecordingError(
                f"{printable(path)} is not a readable MCAP file ({type(e).__name__}: {printable(str(e))[:200]})"
            ) from None
        if summary is None:
            raise RecordingError(f"{printable(path)} has no MCAP summary (was the bag closed properly?)")
        with reading(path, "its summary"):
            images = {
                c.topic: summary.schemas[c.schema_id].name
                for c in summary.channels.values()
                if c.schema_id in summary.schemas and summary.schemas[c.schema_id].name in (IMAGE, COMPRESSED)
            }
        missing = [t for t in wanted if t not in images]
        if missing:
            raise UsageError(f"the bag has no image topic {', '.join(missing)} (it has: {', '.join(sorted(images))})")
        self.streams = {wanted.get(t, t.strip("/").replace("/", "_")): t for t in (wanted or images)}
        for stream in self.streams:  # named after the bag's topics: VisionIPC's name rule
            check_stream(stream, path)
        if only:
            unknown = [s for s in only if s not in self.streams]
            if unknown:
                raise UsageError(f"the bag has no stream {', '.join(unknown)} (it has: {', '.join(self.streams)})")
            self.streams = {s: self.streams[s] for s in only}
        if not self.streams:
            raise UsageError(f"{path!r} has no sensor_msgs/msg/Image or CompressedImage topic")
        self.schema = images
        self.geometry: Dict[str, Dict[str, Any]] = {}  # stream -> width, height, format
        self.events: List[playback.Event] = []
        by_topic = {t: s for s, t in self.streams.items()}
        seq = dict.fromkeys(self.streams, 0)
        with open(path, "rb") as f, reading(path) as place:
            messages = open_reader(f).iter_messages(topics=list(by_topic), log_time_order=True)
            for i, (_, channel, message) in enumerate(messages):
                place.at = f"message {i} (log time {message.log_time})"
                stream = by_topic[channel.topic]
                stamp = _stamp(message.data, message.log_time)
                self.events.append((message.log_time, 0, stream, seq[stream], (stamp, stamp)))
                seq[stream] += 1
        for stream, topic in self.streams.items():
            # the first message parses the topic's message definitions: mcap-ros2-support's
            # parser prints what it cannot parse (raw bytes of the file) before raising, here
            # in the main thread: its output is dropped, the error is the line that counts
            with contextlib.closing(self.images(topic)) as decoded, _quiet():
                first = next(decoded, None)
            if first is None:
                raise UsageError(f"topic {topic} has no messages")
            fmt, image = first
            shape = image.shape
            height = shape[0] * 2 // 3 if format_info(fmt).yuv420 else shape[0]
            self.geometry[stream] = {"width": shape[1], "height": height, "format": fmt}

    def images(self, topic: str) -> Generator[Tuple[str, Image], None, None]:
        """(format, compact image) of every message of ``topic``, in log-time order."""
        with open(self.path, "rb") as f, reading(self.path) as place:
            reader = open_reader(f, [self.factory()])
            messages = reader.iter_decoded_messages(topics=[topic], log_time_order=True)
            for i, (schema, _, message, msg) in enumerate(messages):
                place.at = f"message {i} of {printable(topic)} (log time {message.log_time})"
                yield to_image(schema.name, msg)


class BagDecoder(playback.Decoder):
    """One stream's images from the bag, ahead of the publisher."""

    def __init__(self, bag: Bag, stream: str, stop: threading.Event) -> None:
        super().__init__(None, bag.path, stream, [], None, stop)
        self.bag = bag

    def images(self) -> Generator[Image, None, None]:
        want, topic = self.bag.geometry[self.stream], self.bag.streams[self.stream]
        with contextlib.closing(self.bag.images(topic)) as images:
            for fmt, image in images:
                if fmt != want["format"] or image.shape != pixels.compact_shape(fmt, want["width"], want["height"]):
                    raise RecordingError(f"{printable(self.bag.path)}: topic {topic} changes size or encoding mid-bag")
                yield image


class _Compact:
    """Storage.restore for the bag's images, already in the stream's compact layout."""

    @staticmethod
    def restore(image: Image, buf: Any) -> None:
        pixels.unpack(image, buf)


def replay(args: argparse.Namespace, rate: Optional[float], stop: threading.Event) -> int:
    bag = Bag(args.dir, args.topic_map, args.stream)
    storages = dict.fromkeys(bag.streams, _Compact())

    def decoders(stop: threading.Event) -> Dict[str, playback.Decoder]:
        return {s: BagDecoder(bag, s, stop) for s in bag.streams}

    return playback.serve(args, rate, bag.geometry, storages, bag.events, [], decoders, stop)
