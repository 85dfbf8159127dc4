"""vipc-camera: the camera daemon (sources, the synthetic pattern, the stream loop).
Needs OpenCV: ``pip install 'visionipc[cv]'``."""
