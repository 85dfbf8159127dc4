"""vipc-view: live preview of VisionIPC streams in a browser (aiohttp, MJPEG) and OpenCV windows.

``python -m visionipc.apps.view`` or the ``vipc-view`` command; see ``vipc-view --help``.
Parts: cli.py (the command), web.py (HTTP routes), feed.py (one receiving and
encoding worker per stream), stats.py (fps, latency, drops), window.py, page.html.
Needs the ``view`` extra: ``pip install 'visionipc[view]'``.
"""

from visionipc.apps.view.cli import main

__all__ = ["main"]
