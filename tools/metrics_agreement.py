"""Do lossless and lossy recordings of the same frames give the same metrics? (issue 18 item 4)

The lossy recordings are measured decoded (``frame_metrics=False``): what the codec itself
changes. vipc-record's default keeps the metrics of the frames as captured in the index,
which makes every difference 0 (``--as-captured`` shows it).

    .venv/bin/python tools/metrics_agreement.py                # 64x48, 8 frames, 3 per segment
    .venv/bin/python tools/metrics_agreement.py --size 1280x720 --codecs h264,h264:12,mp4v
    .venv/bin/python tools/metrics_agreement.py --stages       # where the old mp4v chain lost levels

The table writes the synthetic test pattern (vipc-record's writer, ``synthetic.write_recording``)
once losslessly and once per ``codec[:crf]`` x format, runs the pipeline's metrics on both and
prints the relative difference (mean and worst frame). ``--stages`` follows one picture through
the conversions an OpenCV mp4v recording went through (NV12 -> BGR -> swscale YUV -> mpeg4 ->
swscale BGR -> gray) and prints each stage's effect on the metrics (docs/pipeline.md, "Luma").
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from visionipc.apps.pipeline import metrics, synthetic  # noqa: E402

NAMES = ("brightness", "contrast", "sharpness")


def _rel(a, b) -> str:
    return " ".join(f"{n[:5]} {x:+.2%}" for n, x in zip(NAMES, (np.asarray(b) - a) / a))


def agreement(width, height, frames, segment, codecs, formats, captured=False):
    with tempfile.TemporaryDirectory(dir=".") as d:
        for fmt in formats:
            spec = dict(frames=frames, width=width, height=height, segment_frames=segment, format=fmt)
            a = metrics.metrics_pandas([synthetic.write_recording(f"{d}/{fmt}", {"s": spec})])
            a = a.sort_values("frame_id", ignore_index=True)
            for item in codecs:
                codec, _, crf = item.partition(":")
                lossy = dict(spec, codec=codec, crf=int(crf) if crf else None, frame_metrics=captured)
                rec = synthetic.write_recording(f"{d}/{fmt}-{codec}{crf}", {"s": lossy})
                b = metrics.metrics_pandas([rec]).sort_values("frame_id", ignore_index=True)
                cells = []
                for name in NAMES:
                    r = ((b[name] - a[name]) / a[name]).to_numpy()
                    cells.append(f"{name} {r.mean():+.2%} (worst {r[np.argmax(np.abs(r))]:+.2%})")
                print(f"{width}x{height} {fmt:5} {item:8} " + " | ".join(cells), flush=True)


def stages(width, height, frame=1):
    """One frame through OpenCV's mp4v chain (the pre-fix recorder and reader), stage by stage."""
    import av
    import cv2

    def video_luma(y):  # the lossless path: video-range Y stretched to full range
        return np.clip((y.astype(np.float32) - 16) * 255 / 219, 0, 255)

    def bgr_luma(bgr):
        return cv2.cvtColor(bgr.astype(np.float32), cv2.COLOR_BGR2GRAY)

    def m(luma):
        return np.array(metrics.frame_metrics(luma)[:3])

    pictures = [synthetic.pattern(i, width, height) for i in range(frame + 1)]
    nv12 = [np.vstack([y, np.full((height // 2, width), 128, np.uint8)]) for y in pictures]
    ref = m(video_luma(pictures[frame]))
    bgr = [cv2.cvtColor(p, cv2.COLOR_YUV2BGR_NV12) for p in nv12]
    print(f"1 OpenCV NV12->BGR (recorder's to_bgr):      {_rel(ref, m(bgr_luma(bgr[frame])))}")
    y_in = av.VideoFrame.from_ndarray(bgr[frame], format="bgr24").reformat(format="yuv420p").to_ndarray()[:height]
    print(f"2 swscale bgr24->yuv420p (VideoWriter input): {_rel(ref, m(video_luma(y_in)))}"
          f"  Y {np.mean(y_in.astype(int) - pictures[frame]):+.2f} levels")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=".") as d:
        path = os.path.join(d, "s.mp4")
        video = cv2.VideoWriter(path, cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"mp4v"), 30, (width, height))
        for b in bgr:
            video.write(b)
        video.release()
        with av.open(path) as c:
            y_out = [f.to_ndarray()[:height] for f in c.decode(video=0)][frame]
        print(f"3 mpeg4 (coded Y as decoded):                {_rel(ref, m(video_luma(y_out)))}"
              f"  (codec alone: {_rel(m(video_luma(y_in)), m(video_luma(y_out)))})")  # fmt: skip
        cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG)
        decoded = [cap.read()[1] for _ in range(frame + 1)][frame]
        cap.release()
    print(f"4 swscale yuv420p->bgr24 + BGR2GRAY (reader): {_rel(ref, m(bgr_luma(decoded)))}"
          f"  luma {np.mean(bgr_luma(decoded) - video_luma(y_out)):+.2f} levels")  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64x48")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--segment-frames", type=int, default=3)
    p.add_argument("--codecs", default="mp4v,h264,h264:0,hevc,av1", help="codec[:crf], comma-separated")
    p.add_argument("--formats", default="nv12,gray8,rgb8")
    p.add_argument("--stages", action="store_true", help="the old OpenCV mp4v chain, stage by stage")
    p.add_argument(
        "--as-captured",
        action="store_true",
        help="lossy recordings with the recorder's own metrics (its default): then every difference is 0",
    )
    args = p.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    os.environ.setdefault("SVT_LOG", "1")
    if args.stages:
        stages(width, height)
    else:
        codecs, formats = args.codecs.split(","), args.formats.split(",")
        agreement(width, height, args.frames, args.segment_frames, codecs, formats, args.as_captured)


if __name__ == "__main__":
    main()
