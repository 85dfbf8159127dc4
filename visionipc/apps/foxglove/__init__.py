"""vipc-foxglove: a VisionIPC server's streams (and msgq topics) served live over the
Foxglove WebSocket protocol (``bridge.py``)."""
