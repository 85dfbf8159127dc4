"""The data pipeline over recordings, on Apache Spark (``pip install 'visionipc[spark]'``).

Modules: ``session`` (a SparkSession with local defaults), ``read`` (recordings ->
index DataFrame), ``frames`` (segments decoded in executors), ``health`` (fps,
drops, latency, jitter, stalls), ``metrics`` (per-frame OpenCV metrics),
``export`` (sampled frames to JPEG/PNG + manifest), ``report`` (HTML + plots),
``cli`` (``vipc-analyze``), ``synthetic`` (fixture recordings). Nothing here is
imported by ``visionipc`` itself.
"""
