"""MCAP segments (``vipc-record --format mcap``): each segment of a stream is one MCAP file
that Foxglove / Lichtblick open directly, beside the usual Parquet index (so vipc-replay
and vipc-analyze read it like the Matroska segments).

In the file: one channel ``/<stream>`` of ``foxglove.CompressedVideo`` (lossy codecs: H.264
as ``h264``, HEVC as ``h265``, AV1 as ``av1``; one access unit per message, no B-frames, a
keyframe with its parameter sets every --gop frames) or ``foxglove.RawImage`` (lossless:
``mono8``, ``mono16``, ``rgb8``, ``bgr8``, ``nv12``; I420 is stored as NV12, exactly),
protobuf-encoded with Foxglove's own schemas (the ``foxglove-sdk`` package). Each message's
log time is the frame's receive time, its publish time the server's publish time, its
``timestamp`` field the frame's timestamp_eof, and the frame id its sequence number; a
``visionipc.stream`` metadata record names the stream, its format, size and codec.
msgq topics get MCAP segments of their own (``topics/<topic>/NNNNNN.mcap``, channel
``/<topic>``, beside their Parquet files; ``write_topic``).
"""

import os
import time
from fractions import Fraction
from typing import IO, TYPE_CHECKING, Any, Dict, Generator, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from msgq.tooling import printable
from visionipc import pixels
from visionipc.apps._cli import UsageError, need
from visionipc.apps.record.av_frames import Image, encoder_frame, ordinary_scheduling, tag_colour, to_image
from visionipc.apps.record.index import Columns, FrameMeta, Rows
from visionipc.apps.record.vocabulary import CODECS, IN_MCAP, ROS_ENCODING, X264, X265, either
from visionipc.formats import format_info

if TYPE_CHECKING:
    from msgq.schemas import Schema

AvStorage = Any  # codecs.AvStorage (above this module: codecs opens an McapWriter)

RAW_ENCODING = {**ROS_ENCODING, "i420": ROS_ENCODING["nv12"]}  # I420 travels as NV12 (_i420_to_nv12), exactly
METADATA = "visionipc.stream"


def epoch_offset_ns() -> int:
    """What to add to a CLOCK_MONOTONIC time (frames' timestamps, the index's times) to
    get nanoseconds since the Unix epoch, now: MCAP, Foxglove and ROS 2 expect epoch
    times, so a recording opened in Foxglove lands at the wall-clock time it was made."""
    return time.time_ns() - time.monotonic_ns()


def wall_ns(monotonic_ns: int) -> int:
    """A CLOCK_MONOTONIC time in nanoseconds since the Unix epoch."""
    return monotonic_ns + epoch_offset_ns()


def _messages() -> Any:
    need("foxglove", "record")
    import foxglove.messages as messages

    return messages


def check(codec: str, lossless: bool) -> None:
    """UsageError when ``codec`` cannot be written as MCAP (or its packages are missing)."""
    if not lossless and codec not in IN_MCAP:
        raise UsageError(f"--format mcap stores {either(IN_MCAP)} video (Foxglove plays these), not {codec}")
    _messages()
    need("mcap", "record")


def _i420_to_nv12(image: Image, width: int, height: int) -> Image:
    y, rest = image[:height], image[height:].reshape(-1)
    u, v = rest[: rest.size // 2], rest[rest.size // 2 :]
    return np.vstack([y, np.stack([u, v], axis=1).reshape(height // 2, width)])


def _nv12_to_i420(image: Image, width: int, height: int) -> Image:
    y, uv = image[:height], image[height:].reshape(-1, 2)
    return np.vstack([y, np.concatenate([uv[:, 0], uv[:, 1]]).reshape(height // 2, width)])


def open_video_encoder(storage: AvStorage, fps: float, live: bool = False) -> Any:
    """An FFmpeg encoder for Foxglove's CompressedVideo: no B-frames (one access unit out per
    frame in, in order), parameter sets on every keyframe, a keyframe every --gop frames;
    ``live``: no lookahead either (each frame's packet comes out at once)."""
    mod = need("av", "record")
    rate = Fraction(max(1, int(fps)), 1)
    ctx = mod.codec.CodecContext.create(storage.encoder, "w")
    ctx.width, ctx.height, ctx.pix_fmt = storage.width, storage.height, storage.pix_fmt
    ctx.time_base, ctx.framerate = 1 / rate, rate
    ctx.gop_size = storage.gop or max(1, 2 * int(fps))
    ctx.max_b_frames = 0
    ctx.thread_count = storage.threads
    options = storage.options()
    if storage.encoder == X265:
        options["x265-params"] += ":bframes=0:repeat-headers=1"
    elif storage.encoder == X264:
        options["x264-params"] = "repeat-headers=1"
        if live:
            options["tune"] = "zerolatency"
    ctx.options = options
    tag_colour(ctx, storage.src_format, storage.pix_fmt)
    with ordinary_scheduling():
        ctx.open()
    return ctx


def video_frame(storage: AvStorage, image: Image) -> Any:
    """A compact image -> an FFmpeg frame in the pixel format the encoder takes."""
    return encoder_frame(storage, image)


class McapWriter:
    """One segment's MCAP file: ``write(compact_image, meta)`` per frame, ``release()``
    at the end (the interface writer.StreamWriter uses; ``wants_meta``: with the frame's
    index row)."""

    wants_meta = True

    def __init__(self, path: str, storage: AvStorage, fps: float, stream: str) -> None:
        from mcap.writer import Writer

        self.messages, self.storage, self.stream = _messages(), storage, stream
        lossless = storage.lossless
        schema_type = self.messages.RawImage if lossless else self.messages.CompressedVideo
        schema = schema_type.get_schema()
        self.file = open(path, "wb")
        self.writer = Writer(self.file)
        self.writer.start(profile="", library="visionipc")
        schema_id = self.writer.register_schema(schema.name, schema.encoding, schema.data)
        self.channel = self.writer.register_channel(f"/{stream}", "protobuf", schema_id)
        info = {"stream": stream, "format": storage.fmt, "width": str(storage.width), "height": str(storage.height)}
        info["codec"] = storage.codec
        # Message times are epoch nanoseconds; the index (and this offset) keep CLOCK_MONOTONIC.
        self.offset = epoch_offset_ns()
        info["clock"], info["monotonic_to_epoch_ns"] = "unix epoch", str(self.offset)
        self.writer.add_metadata(METADATA, info)
        self.ctx: Any = None  # the video encoder (lossy codecs)
        self.metas: Dict[int, FrameMeta] = {}  # pts -> the frame's row, until its packet comes
        self.seq = 0
        if not lossless:
            self.ctx = open_video_encoder(storage, fps)

    def write(self, image: Image, meta: FrameMeta) -> None:
        if self.ctx is None:
            self._log(self._raw(image, meta), meta)
            return
        frame = video_frame(self.storage, image)
        frame.pts = self.seq
        self.metas[self.seq] = meta
        self.seq += 1
        self._packets(self.ctx.encode(frame))

    def _packets(self, packets: Iterable[Any]) -> None:
        for packet in packets:
            meta = self.metas.pop(packet.pts)
            msg = self.messages.CompressedVideo(
                timestamp=self._stamp(meta), frame_id=self.stream, data=bytes(packet),
                format=CODECS[self.storage.codec].foxglove,
            )  # fmt: skip
            self._log(msg, meta)

    def _stamp(self, meta: FrameMeta) -> Any:
        t = meta["timestamp_eof"] + self.offset
        return self.messages.Timestamp(sec=t // 10**9, nsec=t % 10**9)

    def _raw(self, image: Image, meta: FrameMeta) -> Any:
        s = self.storage
        if format_info(s.fmt).planes == 3:  # ROS has NV12's two planes only
            image = _i420_to_nv12(image, s.width, s.height)
        data = np.ascontiguousarray(image, dtype=image.dtype.newbyteorder("<")).tobytes()
        step = s.width * format_info(s.fmt).bytes_per_pixel
        return self.messages.RawImage(
            timestamp=self._stamp(meta), frame_id=self.stream, width=s.width, height=s.height,
            encoding=RAW_ENCODING[s.fmt], step=step, data=data,
        )  # fmt: skip

    def _log(self, msg: Any, meta: FrameMeta) -> None:
        self.writer.add_message(
            self.channel, log_time=meta["receive_time"] + self.offset, data=msg.encode(),
            publish_time=meta["publish_time"] + self.offset, sequence=meta["frame_id"] & 0xFFFFFFFF,
        )  # fmt: skip

    def release(self) -> None:
        try:
            if self.ctx is not None:
                self._packets(self.ctx.encode(None))
            self.writer.finish()
        finally:
            self.file.close()


def write_topic(rows: Columns, path: str, schema: "Optional[Schema]" = None) -> None:
    """One topic segment's messages (recorder's TopicRecorder rows) as an MCAP file: channel
    ``/<topic>`` of the msgq bytes, logged at their receive time (epoch ns); with the
    topic's declared schema (``msgq.Schema``: its encoding, name and bytes, the channel's
    message encoding from it), else message encoding ``msgq`` and no schema."""
    from mcap.writer import Writer

    from visionipc.apps.record.layout import partial_path

    tmp = partial_path(path)
    with open(tmp, "wb") as f:
        writer = Writer(f)
        writer.start(profile="", library="visionipc")
        if schema is None:
            channel = writer.register_channel(f"/{rows['topic'][0]}", "msgq", 0)
        else:
            schema_id = writer.register_schema(schema.name, schema.encoding, schema.data)
            channel = writer.register_channel(f"/{rows['topic'][0]}", schema.message_encoding, schema_id)
        offset = epoch_offset_ns()
        writer.add_metadata("visionipc.topic", {"clock": "unix epoch", "monotonic_to_epoch_ns": str(offset)})
        for seq, when, data in zip(rows["seq"], (t + offset for t in rows["receive_time"]), rows["data"]):
            writer.add_message(channel, log_time=when, data=data, publish_time=when, sequence=seq & 0xFFFFFFFF)
        writer.finish()
    os.replace(tmp, path)


def open_reader(f: IO[bytes], decoder_factories: Sequence[Any] = ()) -> Any:
    """An MCAP reader of the open file ``f`` that loads no record longer than the file itself
    (mcap's own limit is 4 GiB: one flipped length byte would have it allocate that much)."""
    from mcap.reader import SeekingReader

    return SeekingReader(f, decoder_factories=decoder_factories, record_size_limit=os.fstat(f.fileno()).st_size)


class SegmentReader:
    """One MCAP segment of a recording open for reading (``with`` it, or ``close()``): its file
    and video decoder are opened here and freed by ``close`` in the caller's thread, never by a
    garbage-collected generator. ``frames()`` yields its compact images in order; every
    message is checked against recording.json's stream, and whatever else fails in the file
    is a RecordingError naming it and the message (checks.reading).

    Packets are handed to FFmpeg in buffers FFmpeg owns: a packet made from Python bytes is
    freed through a callback that takes the GIL, and FFmpeg's decoding threads free packets;
    freeing the decoder (which waits for those threads) with the GIL held then deadlocked."""

    def __init__(self, folder: str, segment_file: str, storage: Any) -> None:
        """``storage``: the stream's codecs.AvStorage (or its CodedPlanes)."""
        from visionipc.apps.record.checks import Place, open_file

        self.storage = storage
        self.ctx: Any = None  # the video decoder, opened by the first video message
        self.place = Place(os.path.join(folder, segment_file))
        self.file = os.fdopen(open_file(folder, segment_file), "rb")

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.ctx = None  # the decoder freed now, in this thread
        self.file.close()

    def frames(self) -> Generator[Image, None, None]:
        from visionipc.apps.record.checks import reading

        need("mcap_protobuf", "record")
        from mcap_protobuf.decoder import DecoderFactory

        with reading(self.place.path) as self.place:
            self.place.at = "its header"
            reader = open_reader(self.file, [DecoderFactory()])
            for i, (_, _, message, msg) in enumerate(reader.iter_decoded_messages(log_time_order=False)):
                self.place.at = f"message {i} (log time {message.log_time})"
                if self.storage.lossless:
                    yield self._raw(msg)
                else:
                    yield from self._decode(msg)
            if self.ctx is not None:
                self.place.at = "the end of its video"
                yield from self._images(self.ctx.decode(None))

    def _raw(self, msg: Any) -> Image:
        s = self.storage
        shape, dtype = pixels.compact_shape(s.fmt, s.width, s.height), pixels.compact_dtype(s.fmt)
        want = (s.width, s.height, RAW_ENCODING[s.fmt], int(np.prod(shape)) * dtype.itemsize)
        got = (msg.width, msg.height, msg.encoding, len(msg.data))
        if got != want:
            raise self.place.error(
                f"a {got[0]}x{got[1]} {printable(got[2])[:20]} image of {got[3]} bytes, recording.json says "
                f"{want[0]}x{want[1]} {want[2]} ({want[3]} bytes)"
            )
        image = np.frombuffer(msg.data, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        return _nv12_to_i420(image, s.width, s.height) if format_info(s.fmt).planes == 3 else image

    def _decode(self, msg: Any) -> Iterator[Image]:
        av = need("av", "record")
        codec = CODECS[self.storage.codec]
        want = codec.foxglove
        if msg.format != want:
            raise self.place.error(f"a {printable(repr(msg.format))[:40]} video message in a {want} stream")
        if self.ctx is None:
            self.ctx = av.codec.CodecContext.create(codec.mcap_decoder, "r")
            self.ctx.thread_type, self.ctx.thread_count = "AUTO", self.storage.decode_threads
        if msg.data:  # an empty packet would end the stream
            packet = av.Packet(len(msg.data))
            packet.update(msg.data)
            yield from self._images(self.ctx.decode(packet))

    def _images(self, frames: Iterable[Any]) -> Iterator[Image]:
        for frame in frames:
            yield to_image(frame, self.storage.src_format)


def iter_decoded(folder: str, rows: Rows, storage: Any) -> Iterator[Tuple[str, Image]]:
    """(segment_file, decoded compact image) for ``rows`` ((segment_file, position) pairs, in
    index order); each segment opened through checks.open_file and closed before the next."""
    from visionipc.apps.record.checks import RecordingError

    segment: Optional[SegmentReader] = None
    frames: Optional[Generator[Image, None, None]] = None
    current: Optional[str] = None
    position = 0
    try:
        for segment_file, want in rows:
            if segment_file != current or want < position:
                if segment is not None and frames is not None:
                    frames.close()
                    segment.close()
                    segment = None
                segment = SegmentReader(folder, segment_file, storage)
                frames, current, position = segment.frames(), segment_file, 0
            assert segment is not None and frames is not None  # opened above for the first row
            for image in frames:
                position += 1
                if position - 1 == want:
                    yield segment_file, image
                    break
            else:
                raise RecordingError(f"{printable(segment.place.path)} ends before frame position {want}")
    finally:
        if segment is not None and frames is not None:
            frames.close()
            segment.close()
