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
far ahead (the segment's packets give each frame's position).
"""

import contextlib
import ctypes
import os
import threading
from fractions import Fraction

import numpy as np

from msgq.tooling import printable
from visionipc import pixels
from visionipc.apps._cli import UsageError, need
from visionipc.formats import FORMAT_TABLE, format_info

# --codec -> (FFmpeg encoder, lossless). NVENC encoders need an NVIDIA GPU and driver.
CODECS = {
    "h264": ("libx264", False),
    "hevc": ("libx265", False),
    "av1": ("libsvtav1", False),
    "ffv1": ("ffv1", True),
    "h264_nvenc": ("h264_nvenc", False),
    "hevc_nvenc": ("hevc_nvenc", False),
    "av1_nvenc": ("av1_nvenc", False),
}
EXT = "mkv"  # Matroska holds every codec above
DEFAULT_CRF = {"h264": 23, "hevc": 28, "av1": 35, "h264_nvenc": 23, "hevc_nvenc": 28, "av1_nvenc": 35}
DEFAULT_PRESET = {"h264": "veryfast", "hevc": "veryfast", "av1": "10"}
DEFAULT_PRESET.update(dict.fromkeys(("h264_nvenc", "hevc_nvenc", "av1_nvenc"), "p4"))
GOP_SECONDS = 2  # --gop 0: a keyframe every 2 s of frames
SEEK_GAP = 32  # a wanted frame this far ahead is reached by seeking, not by decoding the frames between

# stream format -> (FFmpeg pixel format of the compact image, stored_as kind of storage.py)
LAYOUT = {f.name: (f.av_format, pixels.image_kind(f.name)) for f in FORMAT_TABLE if f.selectable}
# what an encoder gets when it cannot take the compact layout as is (first one it supports)
FALLBACK = {
    True: {"nv12": ("yuv420p",), "rgb24": ("gbrp", "bgr0"), "bgr24": ("gbrp", "bgr0")},
    False: {"gray": ("yuv420p",), "gray16le": ("yuv420p",)},
}
LOSSY_FALLBACK = ("yuv420p", "nv12")


def av():
    return need("av", "record")


def _codec(encoder: str):
    try:
        return av().codec.Codec(encoder, "w")
    except Exception as e:  # PyAV's UnknownCodecError
        raise UsageError(f"this FFmpeg build has no {encoder} encoder ({e})") from None


_REALTIME = tuple(getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name))


def _thread_ids():
    return [int(t) for t in os.listdir("/proc/self/task")]


def _set_own_scheduling(policy, param) -> None:
    """The calling thread's policy, through pthread_setschedparam: glibc keeps its own copy
    of a thread's policy once it was set that way (SVT-AV1 does), copies it into every
    thread this one creates, and libzmq re-applies that copy in its I/O threads; the bare
    system call would leave the copy saying SCHED_FIFO 99."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.pthread_self.restype = ctypes.c_ulong
        priority = ctypes.c_int(param.sched_priority)  # struct sched_param
        if libc.pthread_setschedparam(ctypes.c_ulong(libc.pthread_self()), policy, ctypes.byref(priority)) == 0:
            return
    except (OSError, AttributeError):  # no such C library calls here
        pass
    os.sched_setscheduler(0, policy, param)


@contextlib.contextmanager
def ordinary_scheduling():
    """Open an encoder inside this block so that it cannot leave the process real-time.

    SVT-AV1 (libsvtav1), opened by root, moves the thread that opens it and every thread it
    starts to SCHED_FIFO priority 99. A real-time recorder thread can starve its whole CPU,
    and every thread and process started from it later inherits the policy. Threads that
    became real-time inside the block go back to the caller's policy; a caller that was
    real-time already (``chrt``) is left as it chose."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        before = {t for t in _thread_ids() if os.sched_getscheduler(t) in _REALTIME}
    except (AttributeError, OSError):  # no Linux scheduling calls, no /proc
        policy = None
    try:
        yield
    finally:
        if policy is not None and policy not in _REALTIME:
            _restore_scheduling(policy, param, before)


def _restore_scheduling(policy, param, before) -> None:
    """``ordinary_scheduling``'s way back; it never raises (the block's own error matters)."""
    me = threading.get_native_id()
    try:
        if os.sched_getscheduler(0) in _REALTIME:
            _set_own_scheduling(policy, param)
        tids = _thread_ids()
    except OSError:
        return
    for tid in tids:
        try:
            if tid != me and tid not in before and os.sched_getscheduler(tid) in _REALTIME:
                os.sched_setscheduler(tid, policy, param)
        except OSError:  # the thread ended meanwhile
            pass


def check_encoder(encoder: str):
    """Open ``encoder`` once on a small picture: UsageError when this machine cannot encode
    with it (NVENC without an NVIDIA GPU, a codec missing from this FFmpeg build)."""
    os.environ.setdefault("SVT_LOG", "2")  # SVT-AV1: warnings and errors only, not its banner
    ctx = av().codec.CodecContext.create(_codec(encoder))
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = 256, 256, "yuv420p", Fraction(1, 30)
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
        self, fmt, width, height, codec="h264", crf=None, preset=None, gop=0, threads=1, pix_fmt=None, container=EXT
    ):
        av()  # imported now, not in the first decoder or encoder call (a replay's clock runs by then)
        if codec not in CODECS:
            raise UsageError(f"unknown codec {codec!r} (choose from {', '.join(CODECS)})")
        if format_info(fmt).sample_bytes > 1:
            codec = "ffv1"  # 16-bit samples: always lossless, as in the OpenCV format
        self.fmt, self.width, self.height = fmt, width, height
        self.codec = codec
        self.encoder, self.lossless = CODECS[codec]
        self.src_format, self.kind = LAYOUT[fmt]
        self.crf = None if self.lossless else (DEFAULT_CRF[codec] if crf is None else crf)
        self.preset = None if self.lossless else (preset or DEFAULT_PRESET.get(codec))
        self.gop, self.threads = gop, threads
        if container not in (EXT, "mcap"):
            raise ValueError(f"container {container!r} is not {EXT} or mcap")
        self.ext = container  # mkv, or mcap (mcap_io.py)
        self.pix_fmt = pix_fmt or encoder_pix_fmt(self.encoder, self.src_format, self.lossless)
        shape = pixels.compact_shape(fmt, width, height)
        self.image_size = (shape[1], shape[0])
        self.is_color = len(shape) == 3
        self.decode_threads = 0  # FFmpeg's choice; the Spark pipeline decodes on one thread per task

    def describe(self) -> dict:
        out = {"codec": self.codec, "encoder": self.encoder, "lossless": self.lossless, "stored_as": self.kind}
        out["pix_fmt"], out["container"] = self.pix_fmt, self.ext
        if not self.lossless:
            out.update(crf=self.crf, preset=self.preset)
        return out

    def options(self) -> dict:
        if self.lossless:
            return {"level": "3", "slicecrc": "1"}
        if "nvenc" in self.encoder:
            return {"preset": str(self.preset), "rc": "vbr", "cq": str(self.crf)}
        opts = {"crf": str(self.crf), "preset": str(self.preset)}
        if self.encoder == "libx265":
            opts["x265-params"] = "log-level=error"
        return opts

    def open_writer(self, path: str, fps: float):
        if self.ext == "mcap":
            from visionipc.apps.record.mcap_io import McapWriter

            return McapWriter(path, self, fps, os.path.basename(os.path.dirname(path)))  # frames/<stream>/
        return AvEncoder(path, self, fps)

    def capture(self, frame):
        return pixels.pack(frame)

    def restore(self, image, buf):
        pixels.unpack(image, buf)

    @classmethod
    def from_manifest(cls, info: dict):
        storage = cls(
            info["format"], info["width"], info["height"], info["codec"],
            pix_fmt=info.get("pix_fmt"), container=info.get("container", EXT),
        )  # fmt: skip
        if storage.kind != info.get("stored_as", storage.kind):
            raise ValueError(f"stored_as {info.get('stored_as')!r} does not match format {info['format']}")
        return storage


# RGB/BGR -> the encoder's YUV 4:2:0 (BT.601, video range), by OpenCV: FFmpeg's default
# swscale conversion from bgr24 truncates (Y one level low for half the grays) and its
# conversion back to RGB/BGR is 1-2 levels dark (docs/pipeline.md, "Luma").
_TO_I420 = {"rgb24": "COLOR_RGB2YUV_I420", "bgr24": "COLOR_BGR2YUV_I420"}
_FROM_I420 = {"rgb24": "COLOR_YUV2RGB_I420", "bgr24": "COLOR_YUV2BGR_I420"}


def reformat(frame, pix_fmt: str):
    """``frame`` converted to ``pix_fmt`` by swscale on the calling thread: PyAV's default (0:
    automatic) starts and joins a pool of slice threads for every frame, and a replay
    interrupted by SIGINT hung in that join (sws_freeContext, with the GIL held)."""
    return frame.reformat(format=pix_fmt, threads=1)


def tag_colour(ctx, src_format: str, pix_fmt: str):
    """Tag an encoder's YUV with what it holds, so ffprobe and players read it right: BT.601
    (SMPTE 170M) video range, or full range for gray8 stored as the Y plane as it is."""
    if pix_fmt == "gray":
        ctx.color_range = 2  # AVCOL_RANGE_JPEG
    elif pix_fmt in ("yuv420p", "nv12"):
        ctx.colorspace = 6  # AVCOL_SPC_SMPTE170M (BT.601)
        ctx.color_range = 2 if src_format == "gray" else 1  # AVCOL_RANGE_JPEG / AVCOL_RANGE_MPEG


def encoder_frame(storage, image):
    """A compact image -> the FFmpeg frame ``storage``'s encoder takes (``storage.pix_fmt``):
    YUV planes as they are (NV12 <-> I420 only reorders chroma), gray as the Y plane with flat
    chroma (its values as they are), RGB/BGR converted exactly to video-range BT.601 YUV."""
    src, dst = storage.src_format, storage.pix_fmt
    if dst in ("yuv420p", "nv12"):
        if src == "gray":  # FFmpeg's conversion would rescale the range
            image, src = np.vstack([image, np.full((image.shape[0] // 2, image.shape[1]), 128, np.uint8)]), "yuv420p"
        elif src in _TO_I420:
            cv2 = need("cv2", "record")
            image, src = cv2.cvtColor(np.ascontiguousarray(image), getattr(cv2, _TO_I420[src])), "yuv420p"
    frame = av().VideoFrame.from_ndarray(image, format=src)
    return frame if frame.format.name == dst else reformat(frame, dst)


class AvEncoder:
    """One segment's video file: ``write(compact_image)`` per frame, ``release()`` at the end
    (the interface of cv2.VideoWriter that writer.StreamWriter uses)."""

    def __init__(self, path: str, storage: AvStorage, fps: float):
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

    def write(self, image):
        frame = encoder_frame(self.storage, image)
        frame.pts = self.pts
        self.pts += 1
        if frame.pts == 0:  # the first frame opens the encoder
            with ordinary_scheduling():
                packets = self.stream.encode(frame)
        else:
            packets = self.stream.encode(frame)
        self.container.mux(packets)

    def release(self):
        try:
            self.container.mux(self.stream.encode(None))
        finally:
            self.container.close()


class Mp4vEncoder:
    """One segment of the OpenCV format's lossy storage (``storage.Storage``, --codec mp4v):
    MPEG-4 Part 2 in .mp4 with OpenCV's VideoWriter settings (1.5 bits per pixel, qmin 3,
    an intra frame every 12), fed the compact image as YUV 4:2:0 (``encoder_frame``; gray8
    rescaled to video range, as OpenCV's writer did), not through OpenCV's BGR input, whose
    swscale conversion wrote Y half a level low. The interface of ``AvEncoder``."""

    def __init__(self, path: str, storage, fps: float):
        mod = av()
        self.src_format, self.pix_fmt = LAYOUT[storage.fmt][0], "yuv420p"
        self.container = mod.open(path, mode="w", format="mp4")
        try:
            rate = Fraction(int(fps), 1)
            stream = self.container.add_stream("mpeg4", rate=rate)
            stream.width, stream.height, stream.pix_fmt = storage.width, storage.height, self.pix_fmt
            stream.codec_context.time_base = 1 / rate
            stream.codec_context.gop_size = 12
            stream.thread_count = 1  # one encoding thread per stream, as vipc-record's --encoder-threads default
            stream.codec_tag = "mp4v"
            stream.options = {"b": str(int(1.5 * int(fps) * storage.width * storage.height)), "qmin": "3"}
            tag_colour(stream.codec_context, "yuv420p", self.pix_fmt)  # gray8 too is rescaled to video range
        except BaseException:
            self.container.close()
            raise
        self.stream, self.pts = stream, 0

    def write(self, image):
        if self.src_format == "gray":
            frame = reformat(av().VideoFrame.from_ndarray(image, format="gray"), "yuv420p")
        else:
            frame = encoder_frame(self, image)
        frame.pts = self.pts
        self.pts += 1
        self.container.mux(self.stream.encode(frame))

    def release(self):
        try:
            self.container.mux(self.stream.encode(None))
        finally:
            self.container.close()


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


def _to_image(frame, src_format):
    if src_format == "gray" and frame.format.name in ("yuv420p", "yuvj420p", "nv12"):
        return frame.to_ndarray()[: frame.height].copy()  # the Y plane as stored (no range conversion)
    if src_format in _FROM_I420 and frame.format.name in ("yuv420p", "nv12"):  # encoder_frame's way back
        cv2 = need("cv2", "record")
        if frame.format.name != "yuv420p":
            frame = reformat(frame, "yuv420p")
        return cv2.cvtColor(frame.to_ndarray(), getattr(cv2, _FROM_I420[src_format]))
    if frame.format.name != src_format:
        frame = reformat(frame, src_format)
    return frame.to_ndarray(format=src_format)


class CodedPlanes:
    """A lossy stream's storage seen as coded: decoding gives the YUV 4:2:0 planes the encoder
    compressed (an I420 compact image, ``kind`` planes, video-range BT.601), with no
    conversion to RGB/BGR. Every lossy format is coded so (OpenCV's mp4v too: its BGR or
    gray input becomes video-range YUV), except gray8 in the PyAV codecs, whose Y plane holds
    the gray values as they are (``coded_planes`` gives None for it)."""

    uses_av = True
    lossless = False
    kind = "planes"
    fmt = "i420"
    src_format = "yuv420p"

    def __init__(self, storage):
        self.width, self.height, self.ext = storage.width, storage.height, storage.ext
        self.decode_threads = getattr(storage, "decode_threads", 0)


def coded_planes(storage):
    """``CodedPlanes`` of a lossy ``storage`` (PyAV's or OpenCV's), or None where the stored
    image is what was coded (lossless storage, PyAV's gray8)."""
    if storage.lossless or (storage.uses_av and storage.kind == "gray"):
        return None
    return CodedPlanes(storage)


def iter_decoded(folder: str, rows, storage):
    """Decoded compact images for ``rows`` ((segment_file, position) pairs, in index order).
    Every segment is opened through checks.open_file (a regular file inside ``folder``), and
    every image must have the size recording.json gives, or RecordingError."""
    from visionipc.apps.record import checks

    want_shape = pixels.compact_shape(storage.fmt, storage.width, storage.height)
    if storage.ext == "mcap":
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
                image = _to_image(segment.frame(want), storage.src_format)
            yield segment_file, image
    finally:
        if segment is not None:
            segment.close()
        if fd is not None:
            os.close(fd)


LEGACY = "mp4v"  # the OpenCV format of format_version 1 (storage.Storage)


def add_codec_args(p):
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
        choices=("folder", "mcap"),
        default="folder",
        help="segment files: Matroska (folder, default) or MCAP (Foxglove's CompressedVideo/RawImage messages)",
    )
    p.add_argument("--hwaccel", action="store_true", help="encode on the GPU (NVENC); an error where there is none")
    p.add_argument(
        "--encoder-threads", type=int, default=1, help="FFmpeg threads per stream's encoder (default 1; 0: auto)"
    )


def chosen_codec(args) -> str:
    """The codec the options ask for (UsageError on a contradiction)."""
    codec = args.codec or ("ffv1" if args.lossless else "h264")
    if args.lossless and codec != "ffv1":
        raise UsageError(f"--lossless stores with ffv1, not --codec {codec}")
    if args.hwaccel:
        if codec not in ("h264", "hevc", "av1"):
            raise UsageError(f"--hwaccel: no hardware encoder for {codec} (h264, hevc or av1 have one)")
        codec += "_nvenc"
    if args.crf is not None and not 0 <= args.crf <= 63:
        raise UsageError(f"--crf must be in 0..63, got {args.crf}")
    if args.gop < 0 or args.encoder_threads < 0:
        raise UsageError("--gop and --encoder-threads must be >= 0")
    return codec


def check_args(args) -> str:
    """The codec the options ask for, its encoder opened once (UsageError when it cannot be
    used here). Before connecting: a connected recorder must keep up with its stream at once."""
    codec = chosen_codec(args)
    if codec != LEGACY:
        check_encoder(CODECS[codec][0])
    if args.format == "mcap":
        if codec == LEGACY:
            raise UsageError("--format mcap stores PyAV codecs, not mp4v")
        from visionipc.apps.record import mcap_io

        mcap_io.check(codec, CODECS[codec][1])
    return codec


def storage_for(args, cv2, fmt, width, height):
    """The storage of one stream as the options ask."""
    codec = chosen_codec(args)
    if codec == LEGACY:
        from visionipc.apps.record.storage import Storage

        return Storage(cv2, fmt, width, height, False)
    container = "mcap" if args.format == "mcap" else EXT
    return AvStorage(fmt, width, height, codec, args.crf, args.preset, args.gop, args.encoder_threads, None, container)
