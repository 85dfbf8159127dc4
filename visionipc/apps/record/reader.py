"""Reading a recording's frames back (vipc-replay, tests, your own analysis):

    from visionipc.apps.record.reader import iter_frames
    for row, image in iter_frames("rec1", "road"):
        ...   # row: the index row (dict); image: the stored image (see storage.py)

For lossless recordings the image is the frame's compact image: NV12/I420 the
``(h*3/2, w)`` plane image, GRAY8/RGB8/BGR8 as is, RAW16 uint16; so for the lossy
PyAV codecs (H.264, HEVC, AV1: decoded pixels of the same layout). Lossy OpenCV (mp4v)
recordings give a BGR image (GRAY8: gray).
"""

import os

from visionipc.apps._cli import need
from visionipc.apps.record import codecs, index
from visionipc.apps.record.storage import Storage


def iter_segment_frames(cv2, folder, rows, storage):
    """Decoded stored images for ``rows`` ((segment_file, position) pairs, in index order)."""
    if storage.uses_av:
        yield from codecs.iter_decoded(folder, rows, storage)
        return
    cap, current, position = None, None, 0
    try:
        for segment_file, want in rows:
            if segment_file != current:
                if cap is not None:
                    cap.release()
                path = os.path.join(folder, segment_file)
                cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, storage.reader_params())
                if not cap.isOpened():
                    raise RuntimeError(f"cannot open {path}")
                current, position = segment_file, 0
            while True:
                ok, image = cap.read()
                if not ok:
                    raise RuntimeError(f"{segment_file} ends before frame position {want}")
                position += 1
                if position - 1 == want:
                    break
            if not storage.is_color and image.ndim == 3:  # FFmpeg hands 8-bit gray back as BGR
                image = image[..., 0].copy()
            yield image
    finally:
        if cap is not None:
            cap.release()


def iter_frames(folder: str, stream: str):
    """``(row, image)`` for every frame of ``stream`` in the recording, in order."""
    cv2 = need("cv2", "record")
    manifest = index.read_manifest(folder)
    storage = Storage.from_manifest(cv2, manifest["streams"][stream])
    rows = index.read_index(folder, stream).to_pylist()
    images = iter_segment_frames(cv2, folder, [(r["segment_file"], r["position"]) for r in rows], storage)
    yield from zip(rows, images)
