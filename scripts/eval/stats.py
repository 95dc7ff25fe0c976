"""Paired bootstrap over items for the difference of two images' scores on the same items.

Efron & Tibshirani, "An Introduction to the Bootstrap" (1993), ch. 13 (percentile interval);
paired, as in Koehn, "Statistical Significance Tests for Machine Translation Evaluation" (2004):
one resample of item indices is applied to both images, so item difficulty cancels.
"""
from __future__ import annotations

import numpy as np


def paired_bootstrap(base: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray],
                     resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
    """Difference other − base of a ratio metric Σnum/Σden, both [n] over the same items in the
    same order, with its percentile confidence interval at `level`.

    Returns {'base', 'other', 'delta', 'lo', 'hi'} as fractions (not percent). Raises
    ValueError when the item counts differ or are zero."""
    bn, bd = base
    on, od = other
    n = len(bn)
    if n == 0 or len(on) != n or len(bd) != n or len(od) != n:
        raise ValueError(f"paired bootstrap needs the same non-zero item count, got {len(bn)} and {len(on)}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    b = bn[idx].sum(1) / np.maximum(bd[idx].sum(1), 1e-12)
    o = on[idx].sum(1) / np.maximum(od[idx].sum(1), 1e-12)
    d = o - b
    alpha = (1 - level) / 2
    base_v = bn.sum() / bd.sum()
    other_v = on.sum() / od.sum()
    return {"base": float(base_v), "other": float(other_v), "delta": float(other_v - base_v),
            "lo": float(np.quantile(d, alpha)), "hi": float(np.quantile(d, 1 - alpha))}
