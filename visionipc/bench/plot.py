"""The PNG: latency and frames/s against frame size, server CPU and latency against clients."""

import os

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


def write_png(summary, path, title=""):
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
