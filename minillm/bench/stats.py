"""Small statistics used by every benchmark: per-repeat figures, percentiles, ratios."""
from __future__ import annotations

import numpy as np

from minillm.roofline.roofs import Measurement

PERCENTILES = (50, 90, 99)


def figure(unit: str, values: list[float], **params) -> Measurement:
    """Every repeat and their median: the JSON keeps both so noise stays visible."""
    return Measurement.of(unit, [float(v) for v in values], **params)


def percentiles(values: list[float], ps: tuple[int, ...] = PERCENTILES) -> dict[str, float]:
    """{"p50": .., "p90": .., "p99": ..} with linear interpolation; NaN when empty."""
    if not values:
        return {f"p{p}": float("nan") for p in ps}
    arr = np.asarray(values, dtype=np.float64)
    return {f"p{p}": float(np.percentile(arr, p)) for p in ps}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or a != a or b != b:
        return None
    return a / b


def paired_ratio(a: list[float], b: list[float]) -> float | None:
    """Median of a[i] / b[i]: for measurements taken in interleaved pairs."""
    pairs = [x / y for x, y in zip(a, b) if y]
    return float(np.median(pairs)) if pairs else None
