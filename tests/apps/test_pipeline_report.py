"""vipc-analyze's report.html comes from a Jinja2 template with autoescaping (issue 34,
item 5: it was f-strings with html.escape by hand): names from recordings are escaped,
the sections and tables are there."""

import numpy as np
import pandas as pd

from visionipc.apps.pipeline.report import write_report

HOSTILE = "<script>alert(1)</script>&'\""


def test_the_report_escapes_what_recordings_name_and_lays_out_its_sections(tmp_path):
    health = pd.DataFrame(
        {
            "recording_id": [HOSTILE, "car1"],
            "stream": ["road", "wide"],
            "frames": [100, 50],
            "fps": [20.0, float("nan")],
            "dropped": [3, 0],
            "dropped_frame_ids": [np.array([4, 5, 6]), np.array([], dtype=int)],
            "longest_stall_ms": [40.0, 50.0],
            "latency_p99_ms": [5.0, 6.0],
        }
    )
    manifest = pd.DataFrame(
        {"path": ["a/b.jpg"], "recording_id": [HOSTILE], "stream": ["road"], "frame_id": [4], "reason": ["drop"]}
    )
    path = write_report(
        str(tmp_path), health=health, manifest=manifest, header={"inputs": [HOSTILE, "x"]}, title="T<1>"
    )
    page = open(path).read()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;" in page
    assert "<title>T&lt;1&gt;</title>" in page and "<h1>T&lt;1&gt;</h1>" in page
    assert "Fleet summary (2 recording x stream, worst first)" in page
    assert "<tr class='bad'>" in page and "<details><summary>Stream health, every column (2 rows)" in page
    assert "<td>4, 5, 6</td>" in page and "<td>-</td>" in page  # lists and a NaN as the table shows them
    assert "<img src='export/a/b.jpg' width='160' loading='lazy'" in page and "Export (1 frames)" in page
