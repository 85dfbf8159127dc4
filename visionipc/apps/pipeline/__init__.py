"""The data pipeline over recordings, on Apache Spark (``pip install 'visionipc[spark]'``).

Modules: ``session`` (a SparkSession with local defaults), ``read`` (recordings ->
index DataFrame), ``frames`` (segments decoded in executors), ``health`` (fps,
drops, latency, jitter, stalls), ``metrics`` (per-frame OpenCV metrics),
``export`` (sampled frames to JPEG/PNG + manifest), ``report`` (HTML + plots),
``cli`` (``vipc-analyze``), ``synthetic`` (fixture recordings); for clusters and
fleets: ``cluster`` (master, task slots, starvation warning), ``fs`` (locations by
URI, pyarrow I/O), ``jobs`` (the CLI's jobs as executor tasks), ``analysis`` (one
run), ``runs`` (run folders, _SUCCESS, run.json), ``submit`` (spark-submit's file). Nothing here is
imported by ``visionipc`` itself.
"""
