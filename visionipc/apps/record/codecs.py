"""Recording codecs through PyAV (FFmpeg): H.264, HEVC, AV1 (lossy) and FFV1 (lossless),
and NVENC's hardware H.264/HEVC/AV1 where a GPU offers them.

The encoder is fed the stream's own compact image (``pixels.pack``: NV12/I420 planes,
GRAY8, RGB8/BGR8, RAW16) as an FFmpeg frame of the same layout; FFmpeg converts only
where the encoder cannot take that layout (NV12 -> I420 planes for FFV1, RGB -> planar
GBR for FFV1, RGB -> YUV 4:2:0 for the lossy codecs): never a BGR round trip.
Decoding gives the same compact image back (exactly, for FFV1), so ``restore`` is
``pixels.unpack``.

``AvStorage`` is the PyAV counterpart of ``storage.Storage`` (same attributes and
methods); ``AvEncoder`` writes one segment; ``iter_decoded`` reads frames back by
(segment_file, position), decoding from the keyframe before a wanted frame when it is
far ahead (the segment's packets give each frame's position). The frames both ways (compact
image <-> FFmpeg frame) are av_frames.py's, shared with the MCAP container (mcap_io.py); which
storage a stream gets is storage.py's.
"""

import argparse
import os
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Dict, Generator, Optional, Protocol, Tuple, Union

from msgq.tooling import printable
from visionipc import pixels
from visionipc.apps._cli import UsageError
from visionipc.apps.record.av_frames import (
    BGR,
    GRAY,
    GRAY16,
    I420,
    NV12,
    RGB,
    Image,
    av,
    encoder_frame,
    ordinary_scheduling,
    reformat,
    tag_colour,
    to_image,
)
from visionipc.apps.record.index import Rows
from visionipc.apps.record.layout import MATROSKA, MCAP, MP4
from visionipc.apps.record.vocabulary import (
    CODECS,
    DEFAULT_CODEC,
    HARDWARE,
    HARDWARE_SUFFIX,
    LOSSLESS_CODEC,
    X265,
    either,
)
from visionipc.formats import FORMAT_TABLE, format_info

if TYPE_CHECKING:
    from visionipc.apps.record.mcap_io import McapWriter
    from visionipc.frame import VisionBuf


class Stored(Protocol):
    """What the decoders and the mp4v encoder read of a stream's storage: an AvStorage, a
    storage.Storage (the OpenCV format's, in storage.py above this module) or CodedPlanes."""

    fmt: str
    width: int
    height: int
    ext: str
    lossless: bool
    uses_av: bool
    kind: str


EXT = MATROSKA  # Matroska holds every codec (vocabulary.CODECS)
GOP_SECONDS = 2  # --gop 0: a keyframe every 2 s of frames
SEEK_GAP = 32  # a wanted frame this far ahead is reached by seeking, not by decoding the frames between

# stream format -> (FFmpeg pixel format of the compact image, stored_as kind of storage.py)
LAYOUT = {f.name: (f.av_format, pixels.image_kind(f.name)) for f in FORMAT_TABLE if f.selectable}
# what an encoder gets when it cannot take the compact layout as is (first one it supports)
_PLANAR_RGB = ("gbrp", "bgr0")
FALLBACK: Dict[bool, Dict[str, Tuple[str, ...]]] = {
    True: {NV12: (I420,), RGB: _PLANAR_RGB, BGR: _PLANAR_RGB},
    False: {GRAY: (I420,), GRAY16: (I420,)},
}
LOSSY_FALLBACK = (I420, NV12)


def _codec(encoder: str) -> Any:
    try:
        return av().codec.Codec(encoder, "w")
    except Exception as e:  # PyAV's UnknownCodecError
        raise UsageError(f"this FFmpeg build has no {encoder} encoder ({e})") from None


def check_encoder(encoder: str) -> None:
    """Open ``encoder`` once on a small picture: UsageError when this machine cannot encode
    with it (NVENC without an NVIDIA GPU, a codec missing from this FFmpeg build)."""
    os.environ.setdefault("SVT_LOG", "2")  # SVT-AV1: warnings and errors only, not its banner
    ctx = av().codec.CodecContext.create(_codec(encoder))
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = 256, 256, I420, Fraction(1, 30)
    try:
        with ordinary_scheduling():
            ctx.open()
    except Exception as e:
        hint = " (NVENC needs an NVIDIA GPU with its driver)" if "nvenc" in encoder else ""
        raise UsageError(f"encoder {encoder} cannot be used here{hint}: {e}") from None


def encoder_pix_fmt(encoder: str, src: str, lossless: bool) -> str:
    """The pixel format ``encoder`` is fed for compact images of FFmpeg format ``src``."""
    supported = {f.name for f in (_codec(encoder).video_formats or ())}
    if not supported or src in supported:
        return src
    for candidate in FALLBACK[lossless].get(src, ()) + (() if lossless else LOSSY_FALLBACK):
        if candidate in supported:
            return candidate
    raise UsageError(f"encoder {encoder} cannot store {src} pixels{' losslessly' if lossless else ''}")


class AvStorage:
    """How one stream is stored with a PyAV codec (see the module doc)."""

    uses_av = True

    def __init__(
        self,
        fmt: str,
        width: int,
        height: int,
        codec: str = DEFAULT_CODEC,
        crf: Optional[int] = None,
        preset: Optional[str] = None,
        gop: int = 0,
        threads: int = 1,
        pix_fmt: Optional[str] = None,
        container: str = EXT,
    ) -> None:
        av()  # imported now, not in the first decoder or encoder call (a replay's clock runs by then)
        if codec not in CODECS:
            raise UsageError(f"unknown codec {codec!r} (choose from {', '.join(CODECS)})")
        if format_info(fmt).sample_bytes > 1:
            codec = LOSSLESS_CODEC  # 16-bit samples: always lossless, as in the OpenCV format
        self.fmt, self.width, self.height = fmt, width, height
        self.codec = codec
        spec = CODECS[codec]
        self.encoder, self.lossless = spec.encoder, spec.lossless
        self.src_format, self.kind = LAYOUT[fmt]
        self.crf = None if self.lossless else (spec.crf if crf is None else crf)
        self.preset = None if self.lossless else (preset or spec.preset)
        self.gop, self.threads = gop, threads
        if container not in (EXT, MCAP):
            raise ValueError(f"container {container!r} is not {EXT} or {MCAP}")
        self.ext = container  # mkv, or mcap (mcap_io.py)
        self.pix_fmt = pix_fmt or encoder_pix_fmt(self.encoder, self.src_format, self.lossless)
        shape = pixels.compact_shape(fmt, width, height)
        self.image_size = (shape[1], shape[0])
        self.is_color = len(shape) == 3
        self.decode_threads = 0  # FFmpeg's choice; the Spark pipeline decodes on one thread per task

    def describe(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "codec": self.codec,
            "encoder": self.encoder,
            "lossless": self.lossless,
            "stored_as": self.kind,
        }
        out["pix_fmt"], out["container"] = self.pix_fmt, self.ext
        if not self.lossless:
            out.update(crf=self.crf, preset=self.preset)
        return out

    def options(self) -> Dict[str, str]:
        if self.lossless:
            return {"level": "3", "slicecrc": "1"}
        if "nvenc" in self.encoder:
            return {"preset": str(self.preset), "rc": "vbr", "cq": str(self.crf)}
        opts = {"crf": str(self.crf), "preset": str(self.preset)}
        if self.encoder == X265:
            opts["x265-params"] = "log-level=error"
        return opts

    def open_writer(self, path: str, fps: float) -> "Union[McapWriter, AvEncoder]":
        if self.ext == MCAP:
            from visionipc.apps.record.mcap_io import McapWriter

            return McapWriter(path, self, fps, os.path.basename(os.path.dirname(path)))  # frames/<stream>/
        return AvEncoder(path, self, fps)

    def capture(self, frame: "VisionBuf") -> Image:
        return pixels.pack(frame)

    def restore(self, image: Image, buf: "VisionBuf") -> None:
        pixels.unpack(image, buf)

    @classmethod
    def from_manifest(cls, info: Dict[str, Any]) -> "AvStorage":
        """The stream's storage as recording.json describes it (checked by storage.Storage.from_manifest)."""
        return cls(
            info["format"], info["width"], info["height"], info["codec"],
            pix_fmt=info.get("pix_fmt"), container=info.get("container", EXT),
        )  # fmt: skip


class _SegmentFile:
    """A segment's video file being written: a PyAV container with one video stream."""

    container: Any
    stream: Any

    def release(self) -> None:
        try:
            self.container.mux(self.stream.encode(None))
        finally:
            self.container.close()


class AvEncoder(_SegmentFile):
    """One segment's video file: ``write(compact_image)`` per frame, ``release()`` at the end
    (the interface of cv2.VideoWriter that writer.StreamWriter uses)."""

    def __init__(self, path: str, storage: AvStorage, fps: float) -> None:
        mod = av()
        os.environ.setdefault("SVT_LOG", "2")  # SVT-AV1: warnings and errors only, not its banner
        self.storage = storage
        self.container = mod.open(path, mode="w", format="matroska")
        try:
            rate = Fraction(int(fps), 1)
            stream = self.container.add_stream(storage.encoder, rate=rate)
            stream.width, stream.height = storage.width, storage.height
            stream.pix_fmt = storage.pix_fmt
            stream.codec_context.time_base = 1 / rate
            stream.codec_context.gop_size = storage.gop or max(1, GOP_SECONDS * int(fps))
            stream.thread_count = storage.threads
            stream.options = storage.options()
            tag_colour(stream.codec_context, storage.src_format, storage.pix_fmt)
        except BaseException:
            self.container.close()
            raise
        self.stream, self.pts = stream, 0

    def write(self, image: Image) -> None:
        frame = encoder_frame(self.storage, image)
        frame.pts = self.pts
        self.pts += 1
        if frame.pts == 0:  # the first frame opens the encoder
            with ordinary_scheduling():
                packets = self.stream.encode(frame)
        else:
            packets = self.stream.encode(frame)
        self.container.mux(packets)


class Mp4vEncoder(_SegmentFile):
    """One segment of the OpenCV format's lossy storage (``storage.Storage``, --codec mp4v):
    MPEG-4 Part 2 in .mp4 with OpenCV's VideoWriter settings (1.5 bits per pixel, qmin 3,
    an intra frame every 12), fed the compact image as YUV 4:2:0 (``encoder_frame``; gray8
    rescaled to video range, as OpenCV's writer did), not through OpenCV's BGR input, whose
    swscale conversion wrote Y half a level low. The interface of ``AvEncoder``."""

    def __init__(self, path: str, storage: Stored, fps: float) -> None:
        mod = av()
        self.src_format, self.pix_fmt = LAYOUT[storage.fmt][0], I420
        self.container = mod.open(path, mode="w", format=MP4)
        try:
            rate = Fraction(int(fps), 1)
            stream = self.container.add_stream("mpeg4", rate=rate)
            stream.width, stream.height, stream.pix_fmt = storage.width, storage.height, self.pix_fmt
            stream.codec_context.time_base = 1 / rate
            stream.codec_context.gop_size = 12
            stream.thread_count = 1  # one encoding thread per stream, as vipc-record's --encoder-threads default
            stream.codec_tag = LEGACY
            stream.options = {"b": str(int(1.5 * int(fps) * storage.width * storage.height)), "qmin": "3"}
            tag_colour(stream.codec_context, I420, self.pix_fmt)  # gray8 too is rescaled to video range
        except BaseException:
            self.container.close()
            raise
        self.stream, self.pts = stream, 0

    def write(self, image: Image) -> None:
        if self.src_format == GRAY:
            frame = reformat(av().VideoFrame.from_ndarray(image, format=GRAY), I420)
        else:
            frame = encoder_frame(self, image)
        frame.pts = self.pts
        self.pts += 1
        self.container.mux(self.stream.encode(frame))


class _Segment:
    """One Matroska segment open for decoding (``close()`` frees its container and decoder,
    in the caller's thread; no generator holds them). A first pass over its packets (no
    decoding) gives each frame's position (the rank of its pts) and the keyframes; a frame
    far ahead or behind is reached by decoding from the last keyframe at or before it
    (Matroska seeking by time is not exact enough without cues). ``path`` is what FFmpeg
    opens (the checked descriptor's /proc path), ``place`` names the file in errors."""

    def __init__(self, mod, path, place, threads):
        self.mod, self.path, self.place, self.threads = mod, path, place, threads
        self.container = self.packets = None
        self.pending = []  # frames decoded from the last packet, not yet handed out
        self.place.at = "its packets"
        container, stream = self._open()
        try:
            packets = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.size]
        finally:
            container.close()
        ranks = sorted(range(len(packets)), key=lambda i: (packets[i][0] is None, packets[i][0]))
        self.position = {packets[i][0]: rank for rank, i in enumerate(ranks)}
        self.keys = [(self.position[pts], i) for i, (pts, key) in enumerate(packets) if key]
        self.count = len(packets)
        self.next = 0  # position of the next frame decoded

    def _open(self):
        container = self.mod.open(self.path)
        if not container.streams.video:
            container.close()
            raise self.place.error("no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.thread_count = self.threads
        return container, stream

    def _decode_from(self, start):
        """Decode from the packet ``start`` (in decode order, a keyframe) on."""
        self.close()
        self.container, stream = self._open()
        self.packets, self.index, self.start = self.container.demux(stream), -1, start

    def _next_frame(self):
        while not self.pending:
            packet = next(self.packets, None)
            if packet is None:
                return None
            if packet.size:
                self.index += 1
                if self.index < self.start:
                    continue
            self.pending = list(packet.decode())
        return self.pending.pop(0)

    def frame(self, want):
        self.place.at = f"frame position {want}"
        if not 0 <= want < self.count:
            raise self.place.error(f"the segment ends before frame position {want} ({self.count} frames)")
        key_position, key_index = max(((p, i) for p, i in self.keys if p <= want), default=(0, 0))
        if self.packets is None or want < self.next or (want - self.next >= SEEK_GAP and key_position > self.next):
            self._decode_from(key_index)
        while (frame := self._next_frame()) is not None:
            position = self.position.get(frame.pts)
            if position is None:
                raise self.place.error("a decoded frame is not among its packets")
            self.next = position + 1
            if position == want:
                return frame
            if position > want:
                break
        raise self.place.error(f"frame position {want} does not decode")

    def close(self):
        self.pending = []
        if self.packets is not None:
            self.packets.close()
            self.packets = None
        if self.container is not None:
            self.container.close()
            self.container = None


class CodedPlanes:
    """A lossy stream's storage seen as coded: decoding gives the YUV 4:2:0 planes the encoder
    compressed (an I420 compact image, ``kind`` planes, video-range BT.601), with no
    conversion to RGB/BGR. Every lossy format is coded so (OpenCV's mp4v too: its BGR or
    gray input becomes video-range YUV), except gray8 in the PyAV codecs, whose Y plane holds
    the gray values as they are (``coded_planes`` gives None for it)."""

    uses_av = True
    lossless = False
    kind = pixels.PLANES
    fmt = "i420"
    src_format = I420

    def __init__(self, storage: Stored) -> None:
        self.width, self.height, self.ext = storage.width, storage.height, storage.ext
        self.decode_threads = getattr(storage, "decode_threads", 0)


def coded_planes(storage: Stored) -> Optional[CodedPlanes]:
    """``CodedPlanes`` of a lossy ``storage`` (PyAV's or OpenCV's), or None where the stored
    image is what was coded (lossless storage, PyAV's gray8)."""
    if storage.lossless or (storage.uses_av and storage.kind == pixels.GRAY):
        return None
    return CodedPlanes(storage)


def iter_decoded(folder: str, rows: Rows, storage: Stored) -> Generator[Image, None, None]:
    """Decoded compact images for ``rows`` ((segment_file, position) pairs, in index order).
    Every segment is opened through checks.open_file (a regular file inside ``folder``), and
    every image must have the size recording.json gives, or RecordingError."""
    from visionipc.apps.record import checks

    want_shape = pixels.compact_shape(storage.fmt, storage.width, storage.height)
    if storage.ext == MCAP:
        from visionipc.apps.record import mcap_io

        images = mcap_io.iter_decoded(folder, rows, storage)
    else:
        images = _iter_av(folder, rows, storage)
    for segment_file, image in images:
        if image.shape != want_shape:
            raise checks.RecordingError(
                f"{printable(os.path.join(folder, segment_file))}: a frame of shape {image.shape}, "
                f"recording.json gives {storage.width}x{storage.height} {storage.fmt} {want_shape}"
            )
        yield image


def _iter_av(folder, rows, storage):
    from visionipc.apps.record.checks import open_file, proc_path, reading

    mod = av()
    segment, current, fd = None, None, None
    try:
        for segment_file, want in rows:
            if segment_file != current:
                if segment is not None:
                    segment.close()
                    os.close(fd)
                    segment = fd = None
                fd, current = open_file(folder, segment_file), segment_file
                with reading(os.path.join(folder, segment_file), alias=proc_path(fd)) as place:
                    segment = _Segment(mod, place.alias, place, storage.decode_threads)
            with reading(segment.place.path, alias=segment.path) as segment.place:
                image = to_image(segment.frame(want), storage.src_format)
            yield segment_file, image
    finally:
        if segment is not None:
            segment.close()
        if fd is not None:
            os.close(fd)


LEGACY = "mp4v"  # the OpenCV format of format_version 1 (storage.Storage)


def add_codec_args(p: argparse.ArgumentParser) -> None:
    """vipc-record's codec options."""
    p.add_argument(
        "--codec",
        choices=list(CODECS) + [LEGACY],
        help="h264 (default), hevc, av1 (lossy) or ffv1 (lossless, as --lossless); *_nvenc: NVIDIA's hardware "
        "encoders; mp4v: the OpenCV MPEG-4 format of older recordings",
    )
    p.add_argument("--crf", type=int, help="lossy quality, lower is better (default h264 23, hevc 28, av1 35)")
    p.add_argument("--preset", help="encoder speed preset (default h264/hevc veryfast, av1 10, nvenc p4)")
    p.add_argument("--gop", type=int, default=0, help="frames between keyframes (default: 2 s of frames)")
    p.add_argument(
        "--format",
        choices=("folder", MCAP),
        default="folder",
        help="segment files: Matroska (folder, default) or MCAP (Foxglove's CompressedVideo/RawImage messages)",
    )
    p.add_argument("--hwaccel", action="store_true", help="encode on the GPU (NVENC); an error where there is none")
    p.add_argument(
        "--encoder-threads", type=int, default=1, help="FFmpeg threads per stream's encoder (default 1; 0: auto)"
    )


def chosen_codec(args: argparse.Namespace) -> str:
    """The codec the options ask for (UsageError on a contradiction)."""
    codec = args.codec or (LOSSLESS_CODEC if args.lossless else DEFAULT_CODEC)
    if args.lossless and codec != LOSSLESS_CODEC:
        raise UsageError(f"--lossless stores with {LOSSLESS_CODEC}, not --codec {codec}")
    if args.hwaccel:
        if codec not in HARDWARE:
            raise UsageError(f"--hwaccel: no hardware encoder for {codec} ({either(HARDWARE)} have one)")
        codec += HARDWARE_SUFFIX
    if args.crf is not None and not 0 <= args.crf <= 63:
        raise UsageError(f"--crf must be in 0..63, got {args.crf}")
    if args.gop < 0 or args.encoder_threads < 0:
        raise UsageError("--gop and --encoder-threads must be >= 0")
    return codec


def check_args(args: argparse.Namespace) -> str:
    """The codec the options ask for, its encoder opened once (UsageError when it cannot be
    used here). Before connecting: a connected recorder must keep up with its stream at once."""
    codec = chosen_codec(args)
    if codec != LEGACY:
        check_encoder(CODECS[codec].encoder)
    if args.format == MCAP:
        if codec == LEGACY:
            raise UsageError("--format mcap stores PyAV codecs, not mp4v")
        from visionipc.apps.record import mcap_io

        mcap_io.check(codec, CODECS[codec].lossless)
    return codec
