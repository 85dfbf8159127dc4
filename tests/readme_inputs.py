"""Inputs some README blocks read, written into the current folder before the
block runs (tests/system/test_readme.py; the block's ``setup=`` says which):

    camera      clip.mp4 (a short video) and cams.toml (two synthetic streams)
    recordings  rec1, rec2 and fleet/<site>/2026-11-0N recordings (synthetic, lossless)
"""

import sys

STREAMS = [
    dict(name="road", source="synthetic", width=640, height=480, fps=20),
    dict(name="driver", source="synthetic", width=320, height=240, fps=10, format="gray"),
]


def _toml(streams):
    lines = ['name = "camd"']
    for stream in streams:
        lines.append("[[stream]]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in stream.items()]
    return "\n".join(lines) + "\n"


def camera():
    import cv2
    import numpy as np

    out = cv2.VideoWriter("clip.mp4", cv2.VideoWriter_fourcc(*"mp4v"), 30, (320, 240))
    for i in range(30):
        frame = np.full((240, 320, 3), (i * 8) % 256, np.uint8)
        cv2.putText(frame, str(i), (20, 120), cv2.FONT_HERSHEY_SIMPLEX, 2, (255, 255, 255), 3)
        out.write(frame)
    out.release()
    with open("cams.toml", "w") as f:
        f.write(_toml(STREAMS))


def recordings():
    from visionipc.apps.pipeline.synthetic import write_recording

    spec = {
        "road": dict(frames=60, width=160, height=120, drop=[17, 40], blur=0),
        "driver": dict(frames=30, width=96, height=64, format="gray8", fps=15),
    }
    write_recording("rec1", spec, name="rec1")
    write_recording("rec2", {"road": dict(frames=40, width=160, height=120, black=[5, 6])}, name="rec2")
    for site in ("site-a", "site-b"):
        for day in (1, 2):
            write_recording(
                f"fleet/{site}/2026-11-0{day}", {"road": dict(frames=30, width=128, height=96)}, name=f"{site}-{day}"
            )


if __name__ == "__main__":
    for what in sys.argv[1:]:
        {"camera": camera, "recordings": recordings}[what]()
