"""Reading a recording's frames back (vipc-replay, tests, your own analysis):

    from visionipc.apps.record.reader import iter_frames
    for row, image in iter_frames("rec1", "road"):
        ...   # row: the index row (dict); image: the stored image (see storage.py)

For lossless recordings the image is the frame's compact image: NV12/I420 the
``(h*3/2, w)`` plane image, GRAY8/RGB8/BGR8 as is, RAW16 uint16; so for the lossy
PyAV codecs (H.264, HEVC, AV1: decoded pixels of the same layout). Lossy OpenCV (mp4v)
recordings give a BGR image (GRAY8: gray), converted from the decoded YUV planes by OpenCV.
"""

import os
from typing import Any, Dict, Generator, Iterator, Optional, Tuple

import numpy as np

from msgq.tooling import printable
from visionipc import pixels
from visionipc.apps._cli import need
from visionipc.apps.record import codecs, index
from visionipc.apps.record.av_frames import Image
from visionipc.apps.record.checks import RecordingError, check_stream, open_file, proc_path, reading
from visionipc.apps.record.index import Rows
from visionipc.apps.record.storage import Storage, quiet_opencv


def open_video(cv2: Any, folder: str, segment_file: str, storage: Storage) -> Tuple[Any, int]:
    """An opened cv2.VideoCapture of ``segment_file`` (checks.open_file: a regular file
    inside ``folder``; FFmpeg reads it through the checked descriptor), and that descriptor."""
    fd = open_file(folder, segment_file)
    quiet_opencv(cv2)
    try:
        cap = cv2.VideoCapture(proc_path(fd), cv2.CAP_FFMPEG, storage.reader_params())
        if not cap.isOpened():
            raise RecordingError(
                f"cannot open {printable(os.path.join(folder, segment_file))}: not a video OpenCV reads"
            )
        size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
        if size != tuple(storage.image_size):
            cap.release()
            raise RecordingError(
                f"{printable(os.path.join(folder, segment_file))}: the video is {size[0]}x{size[1]}, "
                f"recording.json says {storage.image_size[0]}x{storage.image_size[1]}"
            )
        return cap, fd
    except BaseException:
        os.close(fd)
        raise


# video-range Y -> full-range gray, rounded (BT.601: (Y - 16) * 255 / 219)
_FULL_RANGE = np.clip(np.round((np.arange(256) - 16) * 255 / 219), 0, 255).astype(np.uint8)


def _iter_lossy(cv2: Any, folder: str, rows: Rows, storage: Storage) -> Iterator[Image]:
    """OpenCV-format lossy (mp4v) segments: decoded by PyAV to their coded planes and converted
    by OpenCV as lossless planes are (gray8: Y back to full range); OpenCV's own reader goes
    through FFmpeg's YUV -> BGR conversion, 1-2 levels dark on most grays."""
    for planes in codecs.iter_decoded(folder, rows, codecs.CodedPlanes(storage)):
        if storage.kind == pixels.GRAY:
            yield _FULL_RANGE[planes[: storage.height]]
        else:
            yield cv2.cvtColor(planes, cv2.COLOR_YUV2BGR_I420)


def iter_segment_frames(cv2: Any, folder: str, rows: Rows, storage: Any) -> Generator[Image, None, None]:
    """Decoded stored images for ``rows`` ((segment_file, position) pairs, in index order);
    ``storage``: a storage.Storage, a codecs.AvStorage or CodedPlanes (or a proxy of one)."""
    if storage.uses_av:
        yield from codecs.iter_decoded(folder, rows, storage)
        return
    if not storage.lossless:
        yield from _iter_lossy(cv2, folder, rows, storage)
        return
    cap: Any = None  # the segment's cv2.VideoCapture
    fd: Optional[int] = None
    current: Optional[str] = None
    position = 0
    try:
        for segment_file, want in rows:
            with reading(os.path.join(folder, segment_file), f"frame position {want}") as place:
                if segment_file != current:
                    if cap is not None and fd is not None:
                        cap.release()
                        os.close(fd)
                        cap = None
                    cap, fd = open_video(cv2, folder, segment_file, storage)
                    current, position = segment_file, 0
                while True:
                    ok, image = cap.read()
                    if not ok:
                        raise place.error("the segment ends before it")
                    position += 1
                    if position - 1 == want:
                        break
                if (image.shape[1], image.shape[0]) != tuple(storage.image_size):
                    raise place.error(
                        f"the frame is {image.shape[1]}x{image.shape[0]}, "
                        f"recording.json says {storage.image_size[0]}x{storage.image_size[1]}"
                    )
            if not storage.is_color and image.ndim == 3:  # FFmpeg hands 8-bit gray back as BGR
                image = image[..., 0].copy()
            yield image
    finally:
        if cap is not None and fd is not None:
            cap.release()
            os.close(fd)


def iter_frames(folder: str, stream: str) -> Iterator[Tuple[Dict[str, Any], Image]]:
    """``(row, image)`` for every frame of ``stream`` in the recording, in order."""
    cv2 = need("cv2", "record")
    manifest = index.read_manifest(folder)
    if check_stream(stream, folder) not in manifest.get("streams", {}):
        raise RecordingError(f"{printable(folder)}: no stream {stream!r} in recording.json")
    storage = Storage.from_manifest(cv2, manifest["streams"][stream])
    rows = index.read_index(folder, stream).to_pylist()
    images = iter_segment_frames(cv2, folder, [(r["segment_file"], r["position"]) for r in rows], storage)
    yield from zip(rows, images)
