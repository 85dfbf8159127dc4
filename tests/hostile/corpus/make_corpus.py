"""Writes the committed corpus of hostile files (issue 31, item 4): MCAP segments and
Matroska segments of a recording, and ROS 2 bags, each a few KiB, each damaged the way
an attacker or a broken disk would. tests/hostile/test_files_hostile.py replays every one
and wants one line and exit status 2 naming the file.

    .venv/bin/python tests/hostile/corpus/make_corpus.py     # rewrites tests/hostile/corpus/

Segment files replace ``frames/road/000000.<ext>`` of a recording made from ``BASES``
(same stream, size and codec); ``<base>--<case>.<ext>`` names the base.
"""

import os
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STREAM = "road"
# base recordings: one stream "road" of 4 frames, 32x24
BASES = {
    "mcap-raw": dict(frames=4, width=32, height=24, format="nv12", codec="ffv1", container="mcap"),
    "mcap-h264": dict(frames=4, width=32, height=24, format="nv12", codec="h264", container="mcap"),
    "mkv-h264": dict(frames=4, width=32, height=24, format="nv12", codec="h264"),
    "mkv-ffv1": dict(frames=4, width=32, height=24, format="gray8", codec="ffv1"),
    "mkv-opencv": dict(frames=4, width=32, height=24, format="gray8"),  # format_version 1: FFV1 by OpenCV
    "mp4-mp4v": dict(frames=4, width=32, height=24, format="nv12", codec="mp4v"),  # --codec mp4v
}
SEGMENT = f"frames/{STREAM}/000000"


def base_recording(folder, base: str) -> str:
    """A good recording of ``BASES[base]`` in ``folder`` (vipc-record's own writer)."""
    from visionipc.apps.pipeline import synthetic

    return synthetic.write_recording(folder, {STREAM: BASES[base]})


def extension(base: str) -> str:
    return base.split("-")[0]


def segment_path(recording: str, base: str) -> str:
    return os.path.join(recording, f"{SEGMENT}.{extension(base)}")


def _rewrite_mcap(src: str, edit) -> bytes:
    """The MCAP file ``src`` written again with each decoded message passed through ``edit``
    (msg, i) -> protobuf message or raw bytes."""
    import io

    from mcap.reader import make_reader
    from mcap.writer import Writer
    from mcap_protobuf.decoder import DecoderFactory

    out = io.BytesIO()
    with open(src, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        writer = Writer(out)
        writer.start(profile="", library="visionipc-hostile")
        ids = {}
        for i, (schema, channel, message, msg) in enumerate(reader.iter_decoded_messages()):
            if channel.id not in ids:
                sid = writer.register_schema(schema.name, schema.encoding, schema.data)
                ids[channel.id] = writer.register_channel(channel.topic, channel.message_encoding, sid)
            data = edit(msg, i)
            data = data if isinstance(data, bytes) else data.SerializeToString()
            writer.add_message(ids[channel.id], log_time=message.log_time, data=data, publish_time=message.publish_time)
        writer.finish()
    return out.getvalue()


def _flip(data: bytes, at: int, mask: int = 0xFF) -> bytes:
    b = bytearray(data)
    b[at] ^= mask
    return bytes(b)


def _length_field(data: bytes, opcode: int) -> int:
    """Offset of the u64 length of the first record with ``opcode`` after the magic."""
    i = 8
    while i + 9 <= len(data):
        op, length = data[i], struct.unpack_from("<Q", data, i + 1)[0]
        if op == opcode:
            return i + 1
        i += 9 + length
    raise ValueError(f"no record {opcode:#x}")


def segments(tmp: Path) -> dict:
    """{file name: bytes} of the hostile segment files."""
    out = {}
    for base in BASES:
        rec = base_recording(tmp / base, base)
        good = Path(segment_path(rec, base)).read_bytes()
        ext = extension(base)
        out[f"{base}--truncated.{ext}"] = good[: len(good) // 2]
        out[f"{base}--garbage.{ext}"] = bytes(np.random.default_rng(31).integers(0, 256, len(good), np.uint8))
        out[f"{base}--empty.{ext}"] = b""
        if ext != "mcap":
            out[f"{base}--zeroed-middle.{ext}"] = good[:200] + bytes(len(good) - 400) + good[-200:]
            continue
        seg = segment_path(rec, base)
        # a Chunk (opcode 6) 4 GiB longer, and no summary: read record by record, as a cut file is
        out[f"{base}--chunk-length-4GiB.{ext}"] = _flip(good, _length_field(good, 0x06) + 4, 0x01)[:-40]
        out[f"{base}--garbage-protobuf.{ext}"] = _rewrite_mcap(seg, lambda m, i: b"\xff\xfe\x1b[2J not protobuf")
        if base == "mcap-raw":
            out[f"{base}--short-image.{ext}"] = _rewrite_mcap(seg, lambda m, i: _set(m, data=m.data[:100]))
            out[f"{base}--oversized-image.{ext}"] = _rewrite_mcap(seg, lambda m, i: _set(m, width=20000, step=20000))
            out[f"{base}--odd-encoding.{ext}"] = _rewrite_mcap(seg, lambda m, i: _set(m, encoding="mono8\x1b[31m"))
        else:
            out[f"{base}--unknown-codec.{ext}"] = _rewrite_mcap(seg, lambda m, i: _set(m, format="h26\x1b]0;x\x074"))
            out[f"{base}--garbage-video.{ext}"] = _rewrite_mcap(seg, lambda m, i: _set(m, data=b"\x00\x00\x01" * 50))
    return out


def _set(msg, **fields):
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


# ---- ROS 2 bags ---------------------------------------------------------------------

HEADER = (
    "=" * 80 + "\nMSG: std_msgs/Header\nbuiltin_interfaces/Time stamp\nstring frame_id\n" + "=" * 80 + "\n"
    "MSG: builtin_interfaces/Time\nint32 sec\nuint32 nanosec"
)
IMAGE = (
    "std_msgs/Header header\nuint32 height\nuint32 width\nstring encoding\nuint8 is_bigendian\nuint32 step\n"
    "uint8[] data\n" + HEADER
)
COMPRESSED = "std_msgs/Header header\nstring format\nuint8[] data\n" + HEADER


def _bag(messages, compression="zstd") -> bytes:
    """A bag of ``messages``: (topic, "raw" or "png", dict) in order."""
    import io

    from mcap.writer import CompressionType
    from mcap_ros2.writer import Writer

    out = io.BytesIO()
    kind = {"zstd": CompressionType.ZSTD, "none": CompressionType.NONE}[compression]
    writer = Writer(output=out, compression=kind)
    schemas = {
        "raw": writer.register_msgdef("sensor_msgs/msg/Image", IMAGE),
        "png": writer.register_msgdef("sensor_msgs/msg/CompressedImage", COMPRESSED),
    }
    for i, (topic, kind_, msg) in enumerate(messages):
        t = 1_700_000_000_000_000_000 + i * 50_000_000
        header = {"stamp": {"sec": t // 10**9, "nanosec": t % 10**9}, "frame_id": "cam"}
        writer.write_message(topic, schemas[kind_], {"header": header, **msg}, log_time=t, publish_time=t)
    writer.finish()
    return out.getvalue()


def _raw(width, height, encoding="mono8", data=None, step=None):
    data = bytes(width * height) if data is None else data
    return ("/cam/image_raw", "raw", dict(height=height, width=width, encoding=encoding, is_bigendian=0,
                                          step=width if step is None else step, data=data))  # fmt: skip


def _png(width, height) -> bytes:
    """A PNG header claiming ``width`` x ``height`` (a real 8x8 PNG with its IHDR rewritten)."""
    import zlib

    import cv2

    png = bytearray(cv2.imencode(".png", np.zeros((8, 8), np.uint8))[1].tobytes())
    png[16:24] = struct.pack(">II", width, height)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    return bytes(png)


def good_bag() -> bytes:
    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 256, (24, 32), np.uint8).tobytes() for _ in range(3)]
    return _bag([_raw(32, 24, data=f) for f in frames])


def bags() -> dict:
    good = good_bag()
    return {
        "bag--too-wide-32768.mcap": _bag([_raw(32768, 1)]),  # zstd-compressed: a few hundred bytes
        "bag--too-tall-16385.mcap": _bag([_raw(1, 16385)]),
        "bag--png-bomb-header.mcap": _bag([("/cam/png", "png", dict(format="png", data=_png(30000, 30000)))]),
        "bag--not-png-or-jpeg.mcap": _bag([("/cam/png", "png", dict(format="bmp\x1b[2J", data=b"BM" + bytes(60)))]),
        "bag--short-image.mcap": _bag([_raw(32, 24, data=bytes(100))]),
        "bag--odd-encoding.mcap": _bag([_raw(32, 24, encoding="rgb8\x1b]0;x\x07")]),
        "bag--step-overflow.mcap": _bag([_raw(32, 24, step=2**32 - 1)]),
        "bag--truncated.mcap": good[: len(good) * 2 // 3],
        "bag--flipped-chunk.mcap": _flip(good, _length_field(good, 0x06) + 40),
    }


def main(out: Path = HERE) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        files = {**segments(Path(tmp)), **bags()}
    for old in out.glob("*--*"):
        old.unlink()
    for name, data in sorted(files.items()):
        (out / name).write_bytes(data)
        print(f"{len(data):7d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
