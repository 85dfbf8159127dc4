"""Helpers for the vipc-view tests: a real producer with a known test pattern,
vipc-view as a child process, and a small MJPEG reader.

The pattern (BGR, converted to the stream's format): the left half LEFT, the
right half RIGHT, and in the bottom quarter a white bar that moves 8 px per frame,
so consecutive pictures differ while the top three quarters stay known colours.
"""

import contextlib
import http.client
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import cv2
import numpy as np

LEFT = (40, 40, 220)  # BGR: red
RIGHT = (220, 90, 30)  # BGR: blue
BAR = (255, 255, 255)
TOLERANCE = 40  # per channel, after NV12 + JPEG round trips of flat areas
VIEW = os.path.join(os.path.dirname(sys.executable), "vipc-view")


def pattern(width, height, frame_id, texture=False):
    """The test picture; ``texture`` fills the bottom quarter's background with noise
    (large JPEGs, as a camera gives, so a slow viewer's socket fills quickly)."""
    img = np.empty((height, width, 3), np.uint8)
    img[:, : width // 2] = LEFT
    img[:, width // 2 :] = RIGHT
    if texture:
        rows = height - height * 3 // 4
        img[height * 3 // 4 :] = np.random.default_rng(frame_id).integers(0, 160, (rows, width, 3), np.uint8)
    x = (frame_id * 8) % width
    img[height * 3 // 4 :, x : x + 16] = BAR
    return img


def fill(buf, bgr):
    """Write a BGR picture into a VisionBuf of any 8-bit format."""
    h, w = bgr.shape[:2]
    if buf.format == "nv12":
        i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
        buf.y[:] = i420[:h]
        chroma = i420[h:].reshape(2, h // 2, w // 2)
        buf.uv[..., 0], buf.uv[..., 1] = chroma[0], chroma[1]
    elif buf.format == "bgr8":
        buf.array[:] = bgr
    elif buf.format == "gray8":
        buf.array[:] = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    else:
        raise ValueError(f"the test producer does not write {buf.format}")


def region_colour(img, x0, x1, y0, y1):
    return img[y0:y1, x0:x1].reshape(-1, 3).mean(axis=0)


def assert_shows_pattern(img):
    """The top three quarters of ``img`` (BGR, the producer's size) are LEFT | RIGHT."""
    h, w = img.shape[:2]
    left = region_colour(img, w // 16, w * 7 // 16, h // 10, h * 6 // 10)
    right = region_colour(img, w * 9 // 16, w * 15 // 16, h // 10, h * 6 // 10)
    assert np.abs(left - LEFT).max() < TOLERANCE, f"left half is {left}, expected {LEFT}"
    assert np.abs(right - RIGHT).max() < TOLERANCE, f"right half is {right}, expected {RIGHT}"


class Producer:
    """A VisionIpcServer in a thread sending the pattern on ``streams`` at ``fps``."""

    def __init__(self, name, streams=("road",), width=320, height=240, fps=30, fmt="nv12", texture=False, count=4):
        from visionipc import VisionIpcServer

        self.server = VisionIpcServer(name)
        self.streams, self.width, self.height, self.fps = list(streams), width, height, fps
        for stream in self.streams:
            self.server.create_buffers(stream, count, width, height, fmt)
        self.server.start_listener()
        self.texture = texture
        self.sent = 0
        self.elapsed = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        start = time.monotonic()
        next_at = start
        while not self._stop.is_set():
            frame_id = self.sent + 1
            picture = pattern(self.width, self.height, frame_id, self.texture)
            for stream in self.streams:
                buf = self.server.get_buffer(stream)
                fill(buf, picture)
                now = time.monotonic_ns()
                self.server.send(buf, frame_id, now, now)
            self.sent = frame_id
            next_at += 1 / self.fps
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        self.elapsed = time.monotonic() - start

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        self.server.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Output:
    """Collects a child's stdout lines in a thread; ``wait_for`` a line matching a pattern."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"{self.proc.args[0]} ended before printing {pattern!r}:\n{self.text()}"
            match = re.search(pattern, line)
            if match:
                return match

    def text(self):
        return "".join(self.output)


SERVING = r"serving (http://[^/\s]+)/(?:\?token=(\S+))? "  # vipc-view's first line: URL and token


class ViewProcess:
    """``vipc-view --name NAME ... --http 127.0.0.1:0`` as a child; ``url`` is where it serves
    (no trailing slash), ``token`` the per-run secret it printed (None with --no-auth) and
    ``page_url`` the URL it printed (the page, with the token)."""

    def __init__(self, *args, start_timeout=30, preexec_fn=None, stderr=subprocess.STDOUT):
        self.proc = subprocess.Popen(
            [VIEW, *args, "--http", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=preexec_fn,
        )
        self.out = Output(self.proc)
        match = self.out.wait_for(SERVING, start_timeout)
        self.url, self.token = match.group(1), match.group(2)
        self.page_url = f"{self.url}/" + (f"?token={self.token}" if self.token else "")

    def auth(self):
        """The header that shows the token (none with --no-auth)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path, timeout=10, headers=None, token=True):
        """(status, headers, body) of GET url+path (with the token unless ``token=False``);
        HTTP errors are answers too."""
        request = urllib.request.Request(self.url + path, headers={**(self.auth() if token else {}), **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def stats(self):
        status, _, body = self.get("/stats")
        assert status == 200, body
        return json.loads(body)

    def wait_for(self, predicate, timeout=20, what="condition"):
        """Poll /stats until ``predicate(stats)`` is true; return those stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; /stats: {json.dumps(stats, indent=1)}")
            time.sleep(0.1)

    def stop(self, sig=signal.SIGINT, timeout=15):
        """Signal it and return its exit code (it must exit on its own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class _SmallWindowConnection(http.client.HTTPConnection):
    """An HTTP connection with a small receive buffer: a slow reader's window fills fast."""

    def connect(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        self.sock.settimeout(self.timeout)
        self.sock.connect((self.host, self.port))


class MjpegReader:
    """Reads parts of ``/stream/<s>.mjpg`` in a thread; ``delay`` s between parts makes it
    slow (and gives it a small receive window); ``token``: vipc-view's (ViewProcess.token)."""

    def __init__(self, url, stream, delay=0.0, token=None):
        host, port = url.split("//", 1)[1].split(":")
        connection = _SmallWindowConnection if delay else http.client.HTTPConnection
        self.conn = connection(host, int(port), timeout=10)
        self.conn.request(
            "GET", f"/stream/{stream}.mjpg", headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        self.sock = self.conn.sock  # kept: getresponse() may hand it over to the response
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.content_type = self.response.getheader("Content-Type")
        self.frame_ids = []
        self.last_jpeg = None
        self.delay = delay
        self._stop = threading.Event()
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self.status == 200:
            self._thread.start()

    def _read_part(self):
        r = self.response
        line = r.readline()
        while line in (b"\r\n", b"\n"):
            line = r.readline()
        if not line:
            raise EOFError("the MJPEG stream ended")
        assert line.strip() == b"--vipcframe", line
        headers = {}
        while line := r.readline().strip():
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        jpeg = r.read(int(headers["content-length"]))
        return int(headers["x-frame-id"]), jpeg

    def _run(self):
        try:
            while not self._stop.is_set():
                frame_id, self.last_jpeg = self._read_part()
                self.frame_ids.append(frame_id)
                if self.delay:
                    self._stop.wait(self.delay)
        except Exception as exc:  # reported by close()
            if not self._stop.is_set():
                self.error = exc

    def close(self):
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in the thread
        self._thread.join(5)
        self.conn.close()
