"""PyAV frames both ways, for every container that holds PyAV's codecs (codecs.py's
Matroska, mcap_io.py's MCAP): the encoder's frame made from a compact image
(``encoder_frame``, ``tag_colour``), the compact image back from a decoded frame
(``to_image``), and ``ordinary_scheduling``, inside which an encoder is opened."""

import contextlib
import ctypes
import os
import threading
from typing import Any, Iterator, List, Protocol, Set

import numpy as np
import numpy.typing as npt

from visionipc.apps._cli import need
from visionipc.formats import format_info

Image = npt.NDArray[Any]  # a compact image (pixels.pack), or what a segment decodes to

# FFmpeg's names of the compact images' layouts (the format table's av_format), as the
# encoders and the conversions here and in codecs.py name them
I420, NV12, GRAY, GRAY16, RGB, BGR = (
    format_info(name).av_format for name in ("i420", "nv12", "gray8", "raw16", "rgb8", "bgr8")
)


class Encodes(Protocol):
    """What ``encoder_frame`` reads of an encoder's storage (codecs.AvStorage, codecs.Mp4vEncoder)."""

    src_format: str  # FFmpeg's pixel format of the compact image
    pix_fmt: str  # the one the encoder takes


def av() -> Any:
    return need("av", "record")


_REALTIME = tuple(getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name))


def _thread_ids() -> List[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _set_own_scheduling(policy: int, param: os.sched_param) -> None:
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
def ordinary_scheduling() -> Iterator[None]:
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


def _restore_scheduling(policy: int, param: os.sched_param, before: Set[int]) -> None:
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


# RGB/BGR -> the encoder's YUV 4:2:0 (BT.601, video range), by OpenCV: FFmpeg's default
# swscale conversion from bgr24 truncates (Y one level low for half the grays) and its
# conversion back to RGB/BGR is 1-2 levels dark (docs/pipeline.md, "Luma").
_TO_I420 = {RGB: "COLOR_RGB2YUV_I420", BGR: "COLOR_BGR2YUV_I420"}
_FROM_I420 = {RGB: "COLOR_YUV2RGB_I420", BGR: "COLOR_YUV2BGR_I420"}


def reformat(frame: Any, pix_fmt: str) -> Any:
    """``frame`` converted to ``pix_fmt`` by swscale on the calling thread: PyAV's default (0:
    automatic) starts and joins a pool of slice threads for every frame, and a replay
    interrupted by SIGINT hung in that join (sws_freeContext, with the GIL held)."""
    return frame.reformat(format=pix_fmt, threads=1)


def tag_colour(ctx: Any, src_format: str, pix_fmt: str) -> None:
    """Tag an encoder's YUV with what it holds, so ffprobe and players read it right: BT.601
    (SMPTE 170M) video range, or full range for gray8 stored as the Y plane as it is."""
    if pix_fmt == GRAY:
        ctx.color_range = 2  # AVCOL_RANGE_JPEG
    elif pix_fmt in (I420, NV12):
        ctx.colorspace = 6  # AVCOL_SPC_SMPTE170M (BT.601)
        ctx.color_range = 2 if src_format == GRAY else 1  # AVCOL_RANGE_JPEG / AVCOL_RANGE_MPEG


def encoder_frame(storage: Encodes, image: Image) -> Any:
    """A compact image -> the FFmpeg frame ``storage``'s encoder takes (``storage.pix_fmt``):
    YUV planes as they are (NV12 <-> I420 only reorders chroma), gray as the Y plane with flat
    chroma (its values as they are), RGB/BGR converted exactly to video-range BT.601 YUV."""
    src, dst = storage.src_format, storage.pix_fmt
    if dst in (I420, NV12):
        if src == GRAY:  # FFmpeg's conversion would rescale the range
            image, src = np.vstack([image, np.full((image.shape[0] // 2, image.shape[1]), 128, np.uint8)]), I420
        elif src in _TO_I420:
            cv2 = need("cv2", "record")
            image, src = cv2.cvtColor(np.ascontiguousarray(image), getattr(cv2, _TO_I420[src])), I420
    frame = av().VideoFrame.from_ndarray(image, format=src)
    return frame if frame.format.name == dst else reformat(frame, dst)


def to_image(frame: Any, src_format: str) -> Image:
    """A decoded FFmpeg frame -> the compact image of FFmpeg format ``src_format`` (the way
    back of ``encoder_frame``)."""
    if src_format == GRAY and frame.format.name in (I420, "yuvj420p", NV12):
        return frame.to_ndarray()[: frame.height].copy()  # the Y plane as stored (no range conversion)
    if src_format in _FROM_I420 and frame.format.name in (I420, NV12):  # encoder_frame's way back
        cv2 = need("cv2", "record")
        if frame.format.name != I420:
            frame = reformat(frame, I420)
        return cv2.cvtColor(frame.to_ndarray(), getattr(cv2, _FROM_I420[src_format]))
    if frame.format.name != src_format:
        frame = reformat(frame, src_format)
    return frame.to_ndarray(format=src_format)
