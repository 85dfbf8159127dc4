"""Statistics and formatting shared by the benchmarks (nanoseconds in, µs out)."""

import math
import statistics
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import TypeGuard


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0-100) of a sequence (numpy's ``inverted_cdf``)."""
    if len(sorted_values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(sorted_values), p, method="inverted_cdf"))


def latency_stats(samples_ns: Iterable[float]) -> Dict[str, float]:
    """Percentiles of latency samples given in ns, reported in µs (nearest rank, numpy)."""
    s = np.asarray(samples_ns, dtype=np.float64)
    if s.size == 0:
        return {"n": 0}
    us = 1e-3
    p50, p90, p99, p999 = np.percentile(s, [50, 90, 99, 99.9], method="inverted_cdf") * us
    return {
        "n": int(s.size),
        "min": float(s.min()) * us,
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "p99.9": float(p999),
        "max": float(s.max()) * us,
        "mean": float(s.mean()) * us,
    }


def is_number(x: object) -> "TypeGuard[float]":
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def median(values: Iterable[Any]) -> float:
    """The median of the values that are numbers (statistics.median), NaN if none."""
    v = [x for x in values if is_number(x)]
    return statistics.median(v) if v else float("nan")


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """a / b, or None when either is missing or b is zero."""
    if not is_number(a) or not is_number(b) or not b:
        return None
    return a / b


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], aligns: Optional[str] = None) -> str:
    """Plain-text table (tabulate's "simple"); ``aligns`` is a string of 'l'/'r' per column."""
    from tabulate import tabulate

    aligns = aligns or ("l" + "r" * (len(headers) - 1))
    colalign = ["left" if a == "l" else "right" for a in aligns]
    return tabulate(rows, headers=headers, tablefmt="simple", colalign=colalign, disable_numparse=True, missingval="")


def fmt_rate(per_s: Optional[float]) -> str:
    if not is_number(per_s):
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


def fmt(v: Optional[float], spec: str = "{:.1f}") -> str:
    return spec.format(v) if is_number(v) else "-"


def fmt_size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def parse_size(text: str) -> int:
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("mib", 1 << 20), ("m", 1 << 20), ("kib", 1 << 10), ("k", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)
