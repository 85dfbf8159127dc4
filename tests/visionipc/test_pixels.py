"""visionipc.pixels driven by the format table's descriptors (issue 35): every format's compact
image goes into a pool buffer and back exactly, and converts to BGR as OpenCV's own code for
that layout does; the table's OpenCV and FFmpeg names exist in those libraries."""

import numpy as np
import pytest

from msgq.errors import InvalidArgumentError
from msgq.testing import unique_name
from visionipc import FORMATS, VisionIpcServer, pixels
from visionipc.formats import FORMAT_TABLE, format_info

cv2 = pytest.importorskip("cv2")
W, H = 64, 32
# the conversion to BGR of each format's compact image, written out for the test
REFERENCE = {
    "nv12": lambda img: cv2.cvtColor(img, cv2.COLOR_YUV2BGR_NV12),
    "i420": lambda img: cv2.cvtColor(img, cv2.COLOR_YUV2BGR_I420),
    "gray8": lambda img: cv2.cvtColor(img, cv2.COLOR_GRAY2BGR),
    "rgb8": lambda img: img[..., ::-1],
    "bgr8": lambda img: img,
    "raw16": lambda img: cv2.cvtColor((img >> 8).astype(np.uint8), cv2.COLOR_GRAY2BGR),
}


@pytest.fixture
def buffer():
    servers = []

    def make(fmt):
        server = VisionIpcServer(unique_name("px"))
        server.create_buffers("s", 1, W, H, fmt)
        servers.append(server)
        return server.get_buffer("s")

    yield make
    for server in servers:
        server.close()


def _compact(fmt):
    rng = np.random.default_rng(7)
    dtype = pixels.compact_dtype(fmt)
    return rng.integers(0, np.iinfo(dtype).max, pixels.compact_shape(fmt, W, H), dtype=dtype, endpoint=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_compact_image_round_trips_and_converts_like_opencv(buffer, fmt):
    assert sorted(REFERENCE) == sorted(FORMATS)
    buf, image = buffer(fmt), _compact(fmt)
    pixels.unpack(image, buf)
    np.testing.assert_array_equal(pixels.pack(buf), image)
    want = REFERENCE[fmt](image)
    np.testing.assert_array_equal(pixels.to_bgr(image, fmt), want)
    got = buf.to_bgr()
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.uint8 and got.shape == (H, W, 3)
    if format_info(fmt).planes == 3:
        np.testing.assert_array_equal(buf.u.ravel(), image.ravel()[W * H : W * H * 5 // 4])
    elif format_info(fmt).planes == 2:
        np.testing.assert_array_equal(buf.uv.reshape(H // 2, W), image[H:])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_bgr_picture_written_into_any_format_reads_back_close(buffer, fmt):
    y, x = np.mgrid[0:H, 0:W]
    gray = ((x * 4 + y * 2) % 256).astype(np.uint8)
    bgr = np.dstack([gray, gray, gray])  # gray: exact through YUV too (up to rounding)
    buf = buffer(fmt)
    pixels.BgrWriter(fmt, W, H).write(bgr, buf)
    assert np.abs(buf.to_bgr().astype(int) - bgr).max() <= 2


def test_the_tables_converter_names_exist():
    av = pytest.importorskip("av")
    for f in FORMAT_TABLE:
        for code in (f.cv_to_bgr, f.cv_from_bgr):
            assert code == "" or hasattr(cv2, f"COLOR_{code}"), (f.name, code)
        assert av.VideoFormat(f.av_format).name == f.av_format
        assert (f.planes > 1) == f.yuv420 and f.planes <= 3


def test_a_compact_image_of_the_wrong_shape_is_refused(buffer):
    with pytest.raises(InvalidArgumentError, match="does not fit a 64x32 i420 frame"):
        pixels.unpack(np.zeros((H, W), np.uint8), buffer("i420"))
