"""``vipc-view --window``: the streams in OpenCV windows, beside the browser view.

All HighGUI calls happen in one thread (OpenCV's GUI backends want that). It
shows each feed's newest converted frame (``StreamFeed.latest_bgr``); q or Esc
in a window stops vipc-view.
"""

import os
import threading


class WindowError(RuntimeError):
    """No display, or an OpenCV build without a GUI."""


def check_window_support():
    """Raise WindowError with what to do if OpenCV windows cannot open here."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise WindowError("--window needs a display, and neither DISPLAY nor WAYLAND_DISPLAY is set; "
                          "use the browser view (--http) instead")
    import cv2

    for line in cv2.getBuildInformation().splitlines():
        if line.strip().startswith("GUI:") and line.split(":", 1)[1].strip().upper() == "NONE":
            raise WindowError("--window needs OpenCV with GUI support, but this OpenCV has none "
                              "(opencv-python-headless); install opencv-python instead, "
                              "or use the browser view (--http)")


class WindowLoop:
    def __init__(self, feeds, on_quit, interval_ms=30):
        self._feeds = feeds          # dict stream -> StreamFeed, read (never changed) here
        self._on_quit = on_quit      # called from this thread when the user quits
        self._interval_ms = interval_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vipc-view:window", daemon=True)
        self._thread.start()

    def _run(self):
        import cv2

        shown = set()
        try:
            while not self._stop.is_set():
                for stream, feed in list(self._feeds.items()):
                    bgr = feed.latest_bgr
                    if bgr is not None:
                        cv2.imshow(f"vipc-view {feed.server}/{stream}", bgr)
                        shown.add(stream)
                key = cv2.waitKey(self._interval_ms) & 0xFF
                if key in (ord("q"), 27):
                    self._on_quit()
                    return
        except cv2.error as exc:
            print(f"vipc-view: the OpenCV window failed: {exc}", flush=True)
            self._on_quit()
        finally:
            if shown:
                cv2.destroyAllWindows()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
