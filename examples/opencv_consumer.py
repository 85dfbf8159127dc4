"""A VisionIPC consumer doing real OpenCV work on every frame, without copying it.

For each frame of one stream it runs Canny edge detection straight on the Y
plane (a numpy view into the shared-memory pool: no copy of the frame) and
measures motion against the previous frame (mean absolute difference of a
quarter-size copy of Y). Once a second it prints its rate, the latency from the
camera's end of exposure (timestamp_eof) to the end of our work, the handoff
latency (server publish -> our receive), the edge density, the motion and the
frames it missed (frame id gaps).

    python examples/opencv_consumer.py --name camerad --stream road [--seconds 10]

Ctrl-C or SIGTERM stops it. Needs OpenCV: pip install 'visionipc[cv]'.
"""

import argparse
import signal
import statistics
import sys
import time

import cv2
import numpy as np

from visionipc import VisionIpcClient


def luma(frame):
    """The frame's brightness plane as a 2-D uint8 array: a view for YUV and gray
    frames (zero-copy), a conversion for RGB/BGR ones."""
    if frame.format in ("nv12", "i420"):
        return frame.y
    if frame.format == "gray8":
        return frame.array
    if frame.format in ("bgr8", "rgb8"):
        code = cv2.COLOR_BGR2GRAY if frame.format == "bgr8" else cv2.COLOR_RGB2GRAY
        return cv2.cvtColor(frame.array, code)
    raise SystemExit(f"opencv_consumer: {frame.format} frames are not supported")


class Work:
    """Edges and motion, into buffers allocated once per frame size."""

    def __init__(self, width, height):
        self.size = (width, height)
        self.edges = np.empty((height, width), np.uint8)
        self.small = np.empty((height // 4, width // 4), np.uint8)
        self.previous = None
        self.diff = np.empty_like(self.small)

    def run(self, y):
        cv2.Canny(y, 80, 160, edges=self.edges)
        edge_share = cv2.countNonZero(self.edges) / self.edges.size
        cv2.resize(y, self.small.shape[::-1], dst=self.small, interpolation=cv2.INTER_AREA)
        motion = 0.0
        if self.previous is not None:
            cv2.absdiff(self.small, self.previous, dst=self.diff)
            motion = float(cv2.mean(self.diff)[0])
            self.previous, self.small = self.small, self.previous  # reuse the two buffers
        else:
            self.previous, self.small = self.small, np.empty_like(self.small)
        return edge_share, motion


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="VisionIPC server name")
    p.add_argument("--stream", default="road", help="stream to process (default road)")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long (default: run until Ctrl-C)")
    args = p.parse_args(argv)

    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))

    # conflate=False: every frame, in order; a consumer that falls a whole ring
    # behind skips ahead and we count the gap as drops.
    client = VisionIpcClient(args.name, args.stream, conflate=False)
    print(f"consumer: waiting for {args.name}/{args.stream}", flush=True)
    work, last_id, processed, drops, overwritten = None, None, 0, 0, 0
    latencies, handoffs, edge_share, motion = [], [], 0.0, 0.0
    start = report_at = time.monotonic()
    while not stopping and not (args.seconds and time.monotonic() - start >= args.seconds):
        frame = client.recv(100)  # short timeout: we look at the stop flag often
        if frame is None:
            continue
        with frame:  # lease: the server does not reuse this buffer while we work on it
            if work is None or work.size != (frame.width, frame.height):
                work = Work(frame.width, frame.height)
            edge_share, motion = work.run(luma(frame))
            intact = frame.valid
        done = time.monotonic_ns()
        if last_id is not None and frame.frame_id > last_id + 1:
            drops += frame.frame_id - last_id - 1
        last_id = frame.frame_id
        if not intact:
            overwritten += 1  # the producer lapped us mid-frame: the result is discarded
            continue
        processed += 1
        if 0 < frame.timestamp_eof <= done:
            latencies.append((done - frame.timestamp_eof) / 1e6)
        handoffs.append((frame.timestamp_recv - frame.timestamp_publish) / 1e6)
        now = time.monotonic()
        if now - report_at >= 1.0:
            latency = f"{statistics.median(latencies):6.2f} ms" if latencies else "     -   "
            print(
                f"consumer: {len(handoffs) / (now - report_at):5.1f} fps  frame {frame.frame_id:6d}  "
                f"eof->done {latency}  handoff {statistics.median(handoffs):6.3f} ms  "
                f"{frame.width}x{frame.height}  edges {edge_share * 100:4.1f}%  motion {motion:5.2f}  "
                f"drops {drops}",
                flush=True,
            )
            latencies, handoffs, report_at = [], [], now
    client.close()
    print(
        f"consumer: processed {processed} frames ({drops} dropped, {overwritten} overwritten while in use)", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
