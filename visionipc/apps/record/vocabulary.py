"""What other programs call what the recorder stores, each name written once: the codecs
(FFmpeg's encoders, their defaults, their names in Foxglove's MCAP messages and the decoders
that read those back) and the ROS / Foxglove encodings of the stream formats. Every
recorder module (codecs.py, mcap_io.py, ros2bag.py) and vipc-foxglove read them from here;
FFmpeg's pixel formats of the compact images are the format table's (``av_format``, used
through av_frames.py)."""

from typing import Dict, List, NamedTuple, Optional


class Codec(NamedTuple):
    """One ``--codec`` of vipc-record (the PyAV ones; mp4v is codecs.LEGACY)."""

    encoder: str  # FFmpeg's encoder (NVENC's need an NVIDIA GPU and driver)
    lossless: bool
    crf: Optional[int] = None  # the default --crf (lossy codecs)
    preset: Optional[str] = None  # the default --preset (lossy codecs)
    foxglove: Optional[str] = None  # its name in foxglove.CompressedVideo (--format mcap); None: not in MCAP
    mcap_decoder: Optional[str] = None  # FFmpeg's decoder of those MCAP messages


DEFAULT_CODEC = "h264"
LOSSLESS_CODEC = "ffv1"
HARDWARE_SUFFIX = "_nvenc"  # --hwaccel: CODEC + this, where the table has it
X264, X265 = "libx264", "libx265"  # the encoders given options of their own (codecs.py, mcap_io.py)

CODECS: Dict[str, Codec] = {
    DEFAULT_CODEC: Codec(X264, False, 23, "veryfast", "h264", "h264"),
    "hevc": Codec(X265, False, 28, "veryfast", "h265", "hevc"),
    "av1": Codec("libsvtav1", False, 35, "10", "av1", "libdav1d"),
    LOSSLESS_CODEC: Codec("ffv1", True),
    "h264_nvenc": Codec("h264_nvenc", False, 23, "p4"),
    "hevc_nvenc": Codec("hevc_nvenc", False, 28, "p4"),
    "av1_nvenc": Codec("av1_nvenc", False, 35, "p4"),
}

HARDWARE = [codec.removesuffix(HARDWARE_SUFFIX) for codec in CODECS if codec.endswith(HARDWARE_SUFFIX)]
IN_MCAP = [codec for codec, spec in CODECS.items() if spec.foxglove]  # the lossy codecs Foxglove plays


def either(names: List[str]) -> str:
    """``a, b or c``: the names in a message."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


# stream format -> its sensor_msgs/Image encoding, the name Foxglove's RawImage takes too.
# i420 has none: MCAP stores it as NV12 (mcap_io.py), exactly.
ROS_ENCODING = {"gray8": "mono8", "raw16": "mono16", "rgb8": "rgb8", "bgr8": "bgr8", "nv12": "nv12"}
# other encodings ROS gives the same layouts (OpenCV's type names), read from bags
ROS_ENCODING_ALIASES = {"8UC1": "gray8", "16UC1": "raw16"}
