"""The on-disk layout of a recording (docs/recording-format.md), written once: the names
of the files vipc-record writes, and the one rule for which of them are complete segments
(every reader lists segments with ``complete_segments``)::

    DIR/recording.json                    MANIFEST
    DIR/frames/<stream>/<NNNNNN>.<ext>    media_file(stream, n, ext): the video (mkv, mcap...)
    DIR/index/<stream>/<NNNNNN>.parquet   index_file(stream, n): one row per frame
    DIR/topics/<topic>/<NNNNNN>.parquet   topic_file(topic, n) (and .mcap with --format mcap)

A segment file is written under a hidden ``.NNNNNN.partial.<ext>`` name in its folder and
renamed once complete (``partial_path``), so a half-written one never has a segment's name:
a segment is a file named exactly as ``segment_name`` names it, in a folder that is not
hidden. Paths inside a recording (``media_file``...) use ``/`` whatever the system.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

MANIFEST = "recording.json"
FRAMES = "frames"
INDEX = "index"
TOPICS = "topics"
TABLE_EXT = "parquet"
# media files' extensions (media_file): Matroska, MCAP (--format mcap; topics' too), and the
# OpenCV format's lossy MP4 (storage.py)
MATROSKA, MCAP, MP4 = "mkv", "mcap", "mp4"
# MANIFEST's "status": while vipc-record writes, then how the recording ended
RECORDING, COMPLETE, FAILED = "recording", "complete", "failed"


def segment_name(segment: int, ext: str) -> str:
    return f"{segment:06d}.{ext}"


def segment_number(name: str, ext: str = TABLE_EXT) -> Optional[int]:
    """The segment number of a complete segment's file name, else None (a hidden or
    half-written file, another extension, a name ``segment_name`` would not give)."""
    stem, dot, got = name.partition(".")
    if not (dot and got == ext and stem.isascii() and stem.isdigit()):
        return None
    number = int(stem)
    return number if segment_name(number, ext) == name else None


def complete_segments(listing: Iterable[str], ext: str = TABLE_EXT) -> list:
    """The complete segments among ``listing`` (paths relative to a recording's ``index/``
    or ``topics/`` folder, ``<stream>/<file>``, as a recursive listing gives them), sorted:
    ``[(stream, segment, relative path)]``. Anything else is skipped."""
    out = []
    for rel in listing:
        parts = rel.split("/")
        if len(parts) != 2 or not parts[0] or parts[0].startswith("."):
            continue
        number = segment_number(parts[1], ext)
        if number is not None:
            out.append((parts[0], number, rel))
    return sorted(out)


def folder_segments(folder: str, kind: str, name: str, ext: str = TABLE_EXT) -> list:
    """Local paths of the complete segments of ``folder/kind/name`` (kind: INDEX or
    TOPICS), in segment order; [] when there is no such folder."""
    where = os.path.join(folder, kind, name)
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return []
    return [
        os.path.join(folder, kind, *rel.split("/"))
        for _, _, rel in complete_segments((f"{name}/{n}" for n in names), ext)
    ]


def partial_path(path: str) -> str:
    """``dir/000003.mkv`` -> ``dir/.000003.partial.mkv``: hidden, and still ending in
    the container's extension (FFmpeg picks the muxer by it)."""
    folder, name = os.path.split(path)
    stem, ext = name.split(".", 1)
    return os.path.join(folder, f".{stem}.partial.{ext}")


def is_partial(name: str) -> bool:
    """A file ``partial_path`` named: a segment that is not (or never will be) complete."""
    return name.startswith(".") and ".partial." in name


def media_file(stream: str, segment: int, ext: str) -> str:
    return f"{FRAMES}/{stream}/{segment_name(segment, ext)}"


def index_file(stream: str, segment: int) -> str:
    return f"{INDEX}/{stream}/{segment_name(segment, TABLE_EXT)}"


def topic_file(topic: str, segment: int, ext: str = TABLE_EXT) -> str:
    return f"{TOPICS}/{topic}/{segment_name(segment, ext)}"


def manifest_path(folder: str | os.PathLike[str]) -> str:
    return os.path.join(folder, MANIFEST)
