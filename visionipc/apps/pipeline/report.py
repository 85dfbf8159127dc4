"""The human report: one HTML page with tables and matplotlib plots (PNG files beside it).

Everything here works on small pandas frames the jobs have already reduced
(health rows, drops, per-second frame counts, histograms, a sample of metrics).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Frame = Any  # a pandas DataFrame (pandas has no types)
Part = Dict[str, Any]  # one block of the page (``kind`` names it; report.html.j2 draws it)

MAX_LINES = 12  # streams drawn in the per-stream plots; the tables list all of them


def latency_histogram(index_df: DataFrame, max_ms: float, bins: int = 60) -> Frame:
    """Spark: counts of ``receive_time - timestamp_eof`` per stream name in ``bins`` equal bins
    over [0, max_ms) plus one overflow bin (``bin == bins``); returns pandas. (SQL text, no
    ``pyspark.sql.functions``: the same on a classic and a Spark Connect session.)"""
    width = max_ms / bins
    lat_ms = "(receive_time - timestamp_eof) / 1e6"
    b = f"CAST(LEAST(GREATEST(FLOOR({lat_ms} / {width!r}), 0), {int(bins)}) AS INT) AS bin"
    out: Frame = index_df.selectExpr("stream", b).groupBy("stream", "bin").count().toPandas()
    out["lo_ms"] = out["bin"] * width
    return out.sort_values(["stream", "bin"], ignore_index=True)


def _plot_timeline(plt, timeline, health, drops, path):
    fig, ax = plt.subplots(figsize=(10, 4))
    keys = health[["recording_id", "stream"]].drop_duplicates().head(MAX_LINES)
    for rid, stream in keys.itertuples(index=False):
        t = timeline[(timeline.recording_id == rid) & (timeline.stream == stream)].sort_values("second")
        whole = int(health[(health.recording_id == rid) & (health.stream == stream)]["duration_s"].iloc[0])
        if "fps_lowest" in t.columns:  # 1 / the longest frame interval in each second: one lost frame shows
            ax.plot(t["second"], t["fps_lowest"], marker=".", label=f"{rid}/{stream}")
            continue
        t = t[t["second"] < max(1, whole)]  # the last, partial second would look like a drop
        ax.plot(t["second"], t["frames"], marker=".", label=f"{rid}/{stream}")
    ax.set_xlabel("seconds since the stream's first frame")
    lowest = "fps_lowest" in timeline.columns
    ax.set_ylabel("lowest frame rate in that second (fps)" if lowest else "frames in that second")
    ax.set_title("Frame rate over time" + (" (1 / longest frame interval per second)" if lowest else ""))
    if lowest:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def latency_figure(plt: Any, hist: Frame) -> Any:
    """The report's latency histogram (a matplotlib figure): counts per bin from 0 ms up,
    log-scaled counts; per recording x stream, bins log-spaced, so the axis is symlog (linear
    to 0.1 ms) starting at 0 ms, never below (a latency is not negative)."""
    fig, ax = plt.subplots(figsize=(10, 4))
    keys = ["recording_id", "stream"] if "recording_id" in hist.columns else ["stream"]
    for i, (key, h) in enumerate(hist.groupby(keys, sort=True)):
        if i == MAX_LINES:
            break
        h = h.sort_values("lo_ms")
        label = "/".join(key) if isinstance(key, tuple) else str(key)
        ax.step(h["lo_ms"], h["count"], where="post", label=label)
    ax.set_yscale("log")
    if "recording_id" in hist.columns:
        ax.set_xscale("symlog", linthresh=0.1)
    # from 0 ms (autoscale's margin went below it: negative ticks on a latency axis; one
    # bin at 0 drew -0.055 .. 0.055) past the last bin's start (a bin is drawn from its start)
    ax.set_xlim(0, max(float(hist["lo_ms"].max()) * 1.5, 1.0))
    ax.set_xlabel("latency receive - eof (ms; the last bin holds everything above)")
    ax.set_ylabel("frames")
    ax.set_title("Latency histogram")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _plot_latency(plt, hist, path):
    fig = latency_figure(plt, hist)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_drops(plt, health, drops, path):
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.35 * max(3, min(len(health), 40))))
    keys = [f"{r}/{s}" for r, s in health[["recording_id", "stream"]].itertuples(index=False)][:40]
    for y, key in enumerate(keys):
        rid, _, stream = key.rpartition("/")
        h = health[(health.recording_id == rid) & (health.stream == stream)].iloc[0]
        ax.hlines(y, 0, h["duration_s"], color="0.8", lw=6)
        d = drops[(drops.recording_id == rid) & (drops.stream == stream)]
        ax.scatter(d["t_s"], [y] * len(d), s=20 + 10 * np.minimum(d["missing"], 20), color="crimson", zorder=3)
    ax.set_yticks(range(len(keys)), keys, fontsize=7)
    ax.set_xlabel("seconds since the stream's first frame (red: a gap in frame_id, bigger = more frames)")
    ax.set_title("Drop timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_metrics(plt, sample, path):
    names = ["brightness", "contrast", "sharpness", "motion"]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3))
    for ax, name in zip(axes, names):
        for stream, s in sample.groupby("stream"):
            values = s[name].dropna()
            if len(values):  # a near-constant metric gets one bin (numpy cannot split a range of ~1e-13)
                spread = float(values.max() - values.min())
                bins = 40 if spread > 1e-6 * max(1.0, float(values.abs().max())) else 1
                ax.hist(values, bins=bins, histtype="step", label=stream)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


MAX_THUMBNAILS = 48


def fleet_summary(health: Frame) -> Frame:
    """One row per stream, worst first: the share of frames dropped, then the longest stall,
    then the p99 latency; ``status`` BAD (>1 % dropped or a stall over 1 s), WARN (any drop or
    a stall over 3 frame intervals), OK."""
    h = health.copy()
    expected = h["frames"] + h["dropped"]
    h["dropped_pct"] = 100.0 * h["dropped"] / expected.where(expected > 0, 1)
    interval = (1000.0 / h["fps"]).where(h["fps"] > 0)
    bad = (h["dropped_pct"] > 1.0) | (h["longest_stall_ms"] > 1000.0)
    warn = (h["dropped"] > 0) | (h["longest_stall_ms"] > 3 * interval.fillna(np.inf))
    h["status"] = np.where(bad, "BAD", np.where(warn, "WARN", "OK"))
    h["_rank"] = np.where(bad, 0, np.where(warn, 1, 2))
    h = h.sort_values(
        ["_rank", "dropped_pct", "longest_stall_ms", "latency_p99_ms"], ascending=[True, False, False, False]
    )
    cols = ["status", "recording_id", "stream", "frames", "fps", "fps_min", "dropped", "dropped_pct"]
    cols += ["longest_stall_ms", "latency_p50_ms", "latency_p99_ms", "jitter_ms"]
    return h[[c for c in cols if c in h.columns]].reset_index(drop=True)


# The page: report.html.j2 beside this file, a Jinja2 template with autoescaping (every
# name, path and value that comes from a recording is escaped by the template engine).
TEMPLATE = "report.html.j2"


def _text(v) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list) else str(v)


def _thumbnails(manifest) -> dict:
    figures = [
        {
            "path": str(r.path),
            "alt": f"{r.recording_id}/{r.stream} frame {r.frame_id}",
            "caption": f"{r.recording_id}/{r.stream} #{r.frame_id} ({r.reason})",
        }
        for r in manifest.head(MAX_THUMBNAILS).itertuples(index=False)
    ]
    return {"kind": "thumbnails", "figures": figures, "more": max(0, len(manifest) - MAX_THUMBNAILS)}


def _table(df, max_rows: int = 200) -> dict:
    """A DataFrame as the template's table: formatted cells, the status row classes."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if np.isfinite(v) else "-"
        if isinstance(v, (list, np.ndarray)):
            v = list(v)
            return ", ".join(map(str, v[:10])) + (f" ... ({len(v)})" if len(v) > 10 else "")
        return str(v)

    status = list(df.columns).index("status") if "status" in df.columns else None
    rows = [
        {
            "cls": {"BAD": "bad", "WARN": "warn"}.get(row[status], "") if status is not None else "",
            "cells": [fmt(v) for v in row],
        }
        for row in df.head(max_rows).itertuples(index=False)
    ]
    return {"columns": [str(c) for c in df.columns], "rows": rows, "more": max(0, len(df) - max_rows)}


def heading_part(level: int, text: str) -> Part:
    return {"kind": "heading", "level": level, "text": text}


def table_part(df: Frame, max_rows: int = 200) -> Part:
    return {"kind": "table", "table": _table(df, max_rows)}


def details_part(summary: str, df: Frame, max_rows: int = 200) -> Part:
    return {"kind": "details", "summary": summary, "table": _table(df, max_rows)}


def render(title: str, header: Optional[Mapping[str, Any]], parts: List[Part], refresh: int | None = None) -> str:
    """The page of ``parts`` (the ``*_part`` dicts); ``refresh``: reload every N seconds."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.dirname(os.path.abspath(__file__))),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return environment.get_template(TEMPLATE).render(
        title=title, header=[(str(k), _text(v)) for k, v in (header or {}).items()], parts=parts, refresh=refresh
    )


HEALTH_SHOWN = [
    "recording_id",
    "stream",
    "frames",
    "duration_s",
    "fps",
    "fps_min",
    "dropped",
    "dropped_frame_ids",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "jitter_ms",
    "longest_stall_ms",
    "stall_before_frame_id",
]


def write_report(
    out_dir: str,
    *,
    health: Optional[Frame] = None,
    drops: Optional[Frame] = None,
    timeline: Optional[Frame] = None,
    latency_hist: Optional[Frame] = None,
    metrics_summary: Optional[Frame] = None,
    metrics_sample: Optional[Frame] = None,
    manifest: Optional[Frame] = None,
    events: Optional[Frame] = None,
    header: Optional[Mapping[str, Any]] = None,
    title: str = "vipc-analyze report",
) -> str:
    """Write ``out_dir/report.html`` (+ ``out_dir/plots/*.png``) and return its path.

    Laid out for a fleet: a run header (``header``: name -> value), the fleet summary
    (worst streams first), stall/delay events and drops, then the details (full tables,
    per-recording latency) in collapsible sections, thumbnails of exported frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = os.path.join(out_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    parts: list = []

    def heading(level, text):
        parts.append(heading_part(level, text))

    def table(df, max_rows=200):
        parts.append(table_part(df, max_rows))

    def details(summary, df, max_rows=200):
        parts.append(details_part(summary, df, max_rows))

    def figure(name, caption, draw, *args):
        draw(plt, *args, os.path.join(plots, name))
        parts.append({"kind": "figure", "name": name, "caption": caption})

    if health is not None:
        heading(2, f"Fleet summary ({len(health)} recording x stream, worst first)")
        table(fleet_summary(health))
        if events is not None:
            heading(3, f"Stall and delay events ({len(events)})")
            table(events.sort_values("value_ms", ascending=False), 100)
        details(
            f"Stream health, every column ({len(health)} rows)",
            health[[c for c in HEALTH_SHOWN if c in health.columns]],
        )
        if timeline is not None and len(timeline):
            figure(
                "fps_over_time.png", "frames per second over time, per stream", _plot_timeline, timeline, health, drops
            )
        if latency_hist is not None and len(latency_hist):
            figure("latency_histogram.png", "latency (receive - eof) histogram", _plot_latency, latency_hist)
        if drops is not None and len(health):
            figure("drop_timeline.png", "where frames were dropped", _plot_drops, health, drops)
            details(f"Drops ({len(drops)} gaps)", drops)
    if metrics_summary is not None:
        heading(2, "Image metrics")
        table(metrics_summary)
        if metrics_sample is not None and len(metrics_sample):
            figure("metric_distributions.png", "distributions of the per-frame metrics", _plot_metrics, metrics_sample)
    if manifest is not None:
        heading(2, f"Export ({len(manifest)} frames)")
        parts.append(_thumbnails(manifest))
        details("Export manifest", manifest, 200)
    page = render(title, header, parts)
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(page)
    return path
