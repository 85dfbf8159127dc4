"""Statistics and formatting shared by the benchmarks (nanoseconds in, µs out)."""

import math


def percentile(sorted_values, p):
    """Nearest-rank percentile ``p`` (0-100) of an already sorted sequence."""
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    k = max(0, min(n - 1, int(math.ceil(p / 100.0 * n)) - 1))
    return sorted_values[k]


def latency_stats(samples_ns):
    """Percentiles of latency samples given in ns, reported in µs."""
    s = sorted(samples_ns)
    n = len(s)
    if n == 0:
        return {"n": 0}
    us = 1e-3
    return {
        "n": n,
        "min": s[0] * us,
        "p50": percentile(s, 50) * us,
        "p90": percentile(s, 90) * us,
        "p99": percentile(s, 99) * us,
        "p99.9": percentile(s, 99.9) * us,
        "max": s[-1] * us,
        "mean": sum(s) / n * us,
    }


def is_number(x):
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def median(values):
    v = sorted(x for x in values if is_number(x))
    if not v:
        return float("nan")
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def ratio(a, b):
    """a / b, or None when either is missing or b is zero."""
    if not is_number(a) or not is_number(b) or not b:
        return None
    return a / b


def format_table(headers, rows, aligns=None):
    """Plain-text table; ``aligns`` is a string of 'l'/'r' per column."""
    cols = len(headers)
    aligns = aligns or ("l" + "r" * (cols - 1))
    cells = [[str(c) for c in headers]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(cols)]

    def line(r):
        return "  ".join(
            c.ljust(widths[i]) if aligns[i] == "l" else c.rjust(widths[i]) for i, c in enumerate(r)
        ).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def fmt_rate(per_s):
    if not is_number(per_s):
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


def fmt(v, spec="{:.1f}"):
    return spec.format(v) if is_number(v) else "-"


def fmt_size(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def parse_size(text):
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("mib", 1 << 20), ("m", 1 << 20), ("kib", 1 << 10), ("k", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)
