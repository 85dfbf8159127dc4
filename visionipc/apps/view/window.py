"""``vipc-view --window``: the streams in OpenCV windows, beside the browser view.

All HighGUI calls happen in the main thread (OpenCV's Qt and Cocoa backends want
that); the HTTP side then runs its event loop in another thread. The windows show
each feed's newest converted frame (``StreamFeed.latest_bgr``); q or Esc in a
window stops vipc-view.
"""

import asyncio
import logging
import os
import queue
import signal
import threading
from typing import Any, Callable, Coroutine, Dict, List, Set, Tuple

log = logging.getLogger("vipc-view")

WAIT_MS = 30  # cv2.waitKey per round: the windows' refresh period


class WindowError(RuntimeError):
    """No display, or an OpenCV build without a GUI."""


def check_window_support() -> None:
    """Raise WindowError with what to do if OpenCV windows cannot open here."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise WindowError(
            "--window needs a display, and neither DISPLAY nor WAYLAND_DISPLAY is set; "
            "use the browser view (--http) instead"
        )
    import cv2

    for line in cv2.getBuildInformation().splitlines():
        if line.strip().startswith("GUI:") and line.split(":", 1)[1].strip().upper() == "NONE":
            raise WindowError(
                "--window needs OpenCV with GUI support, but this OpenCV has none "
                "(opencv-python-headless); install opencv-python instead, "
                "or use the browser view (--http)"
            )


def run_with_windows(serve: Callable[..., Coroutine[Any, Any, int]], settings: Dict[str, Any]) -> int:
    """Run ``serve(**settings)`` (the HTTP side) in a thread and the OpenCV windows in
    this, the main thread (Qt and Cocoa want their GUI there). SIGINT/SIGTERM, q or Esc
    in a window, or the HTTP side ending (port taken) stop both."""
    import cv2

    started: "queue.Queue[Tuple[Any, ...]]" = queue.Queue()  # (loop, stop event, ViewServer)
    result: List[int] = []
    http = threading.Thread(
        target=lambda: result.append(
            asyncio.run(serve(**settings, keep_bgr=True, on_started=lambda *hooks: started.put(hooks)))
        ),
        name="vipc-view:http",
    )
    quit_requested = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: quit_requested.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    http.start()
    shown: Set[str] = set()
    try:
        while started.empty() and http.is_alive():
            http.join(0.05)
        if started.empty():
            return result[0] if result else 1
        loop, stop, view = started.get()
        try:
            while not quit_requested.is_set() and http.is_alive():
                for stream, feed in list(view.feeds.items()):
                    bgr = feed.latest_bgr
                    if bgr is not None:
                        cv2.imshow(f"vipc-view {feed.server}/{stream}", bgr)
                        shown.add(stream)
                if cv2.waitKey(WAIT_MS) & 0xFF in (ord("q"), 27):
                    break
        except cv2.error as exc:
            log.error(f"the OpenCV window failed: {exc}")
        loop.call_soon_threadsafe(stop.set)
        http.join()
        return result[0] if result else 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if shown:
            cv2.destroyAllWindows()
