"""The PNGs: vipc-bench's (latency and frames/s against frame size, server CPU and latency
against clients) and the msgq vs pyzmq benchmark's."""

import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from visionipc.bench.stats import fmt_size

COLORS = {"visionipc": "#1f77b4", "pyzmq": "#d62728", "shm+pipe": "#2ca02c", "futex": "#7f7f7f", "iceoryx2": "#9467bd"}


def _series(rows, key, by, **match):
    pts = sorted((r[by], r[key]) for r in rows if all(r[k] == v for k, v in match.items()) and r[key] is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def _focus_size(rows):
    """4K when the run has it, else the largest frame: the size the client-count panels show."""
    sizes = {(r["width"], r["height"]): r["bytes"] for r in rows}
    if (3840, 2160) in sizes:
        return 3840, 2160
    return max(sizes, key=sizes.get) if sizes else None


def write_png(summary: Dict[str, Any], path: str, title: str = "") -> None:
    """Write the plot; raises ImportError when matplotlib is missing (pip install 'visionipc[bench]')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paced, flat = summary["paced"], summary["flat"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    one = min([r["clients"] for r in paced + flat] or [1])

    def by_size(ax, rows, key, ylabel, heading, p99_key=None):
        """``key`` against the frame size, a line per transport; with ``p99_key``, its p99 dotted beside it."""
        for kind, c in COLORS.items():
            xs, ys = _series(rows, key, "bytes", transport=kind, clients=one)
            if xs:
                ax.plot(xs, ys, "o-", color=c, label=f"{kind} p50" if p99_key else kind)
                if p99_key:
                    ax.plot(*_series(rows, p99_key, "bytes", transport=kind, clients=one), "x:", color=c, alpha=0.6)
        ax.set(xscale="log", yscale="log", xlabel="NV12 frame bytes", ylabel=ylabel, title=heading)
        ax.legend(fontsize=8)

    by_size(axes[0][0], paced, "p50_us", "µs", f"paced: send -> numpy view, {one} client (o p50, x p99)", "p99_us")
    by_size(axes[0][1], flat, "fps", "intact frames/s at the client", f"flat out, {one} client")
    focus = _focus_size(paced + flat)
    for ax, rows, label in ((axes[1][0], None, "server CPU per frame"), (axes[1][1], paced, "paced p50 latency")):
        if focus is None:
            continue
        w, h = focus
        for kind, c in COLORS.items():
            if rows is None:
                for mode, style in (("flat", "o-"), ("paced", "s--")):
                    xs, ys = _series(summary[mode], "server_cpu_us", "clients", transport=kind, width=w, height=h)
                    if xs:
                        ax.plot(xs, ys, style, color=c, label=f"{kind} {mode}")
            else:
                xs, ys = _series(rows, "p50_us", "clients", transport=kind, width=w, height=h)
                if xs:
                    ax.plot(xs, ys, "o-", color=c, label=kind)
        ax.set(yscale="log", xlabel="clients", ylabel="µs", title=f"{label} vs clients, {w}x{h}")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_pubsub_png(
    results: List[Dict[str, Any]],
    sizes: Sequence[int],
    path: str,
    pooled_latency: Callable[..., Optional[Dict[str, Any]]],
    throughput: Callable[..., Any],
) -> bool:
    """The msgq vs pyzmq PNG (``bench_msgq.py --plot``): latency percentiles and throughput per
    size, from the suite's ``pooled_latency`` and ``throughput``; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no plot written", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.5))
    colors = {"msgq": "#1f77b4", "pyzmq": "#d62728"}
    # latency percentiles
    for ax, kind_modes, title in (
        (axes[0], [("latency", "blocking"), ("latency", "busy")], "one-way latency (µs, log)"),
        (axes[1], [("rtt", None)], "round trip, blocking (µs, log)"),
    ):
        labels: List[Tuple[float, str]] = []  # (x, tick label)
        x = 0
        for kind, mode in kind_modes:
            for size in sizes:
                for j, tr in enumerate(("msgq", "pyzmq")):
                    st = pooled_latency(results, kind, tr, size, mode)
                    if not st:
                        continue
                    for k, (pct, alpha) in enumerate((("p50", 1.0), ("p99", 0.6), ("p99.9", 0.3))):
                        ax.bar(
                            x + j * 0.4 + k * 0.13 - 0.13,
                            st[pct],
                            width=0.13,
                            color=colors[tr],
                            alpha=alpha,
                            label=f"{tr} {pct}" if not labels and size == sizes[0] else None,
                        )
                labels.append((x + 0.2, f"{mode + ' ' if mode else ''}{fmt_size(size)}"))
                x += 1
        ax.set_xticks([p for p, _ in labels], [t for _, t in labels], rotation=30, ha="right")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=7)
    ax = axes[2]
    width = 0.2
    variants = ("msgq", "msgq-recv1", "pyzmq", "msgq-lossy", "pyzmq-lossy")
    vcolors = ("#1f77b4", "#6baed6", "#d62728", "#9ecae1", "#fc9272")
    for j, (v, c) in enumerate(zip(variants, vcolors)):
        ys = [throughput(results, v, s) or 0 for s in sizes]
        ax.bar([i + (j - 2) * width * 0.8 for i in range(len(sizes))], ys, width=width * 0.8, color=c, label=v)
    ax.set_xticks(range(len(sizes)), [fmt_size(s) for s in sizes])
    ax.set_yscale("log")
    ax.set_title("throughput received (msg/s, log); msgq/pyzmq = lossless")
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return True
