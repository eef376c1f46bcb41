"""Core statistics shared by every analysis: entropies in bits, correlations, bootstrap and permutation.

* ``entropy_bits(p)``: H(p) = -Σ p log₂ p over the last axis, with 0·log 0 = 0.
* ``pearson`` / ``spearman``: correlation coefficients (NaN when an input is constant).
* ``bootstrap_ci(stat, *arrays, n_boot=1000, seed=0, level=0.95)``: percentile bootstrap over
  the first axis of the arrays, resampled jointly (rows = prompts), as METHODS.md §0 prescribes.
* ``permutation_pvalue(x, y, stat, n_perm=1000, seed=0)``: two-sided p-value of |stat(x, y)|
  against random permutations of y, with the +1 correction (never exactly 0).

Example
-------
>>> import numpy as np
>>> from bayes_lens.metrics import bootstrap_ci, spearman
>>> x = np.arange(20.0); y = x + np.random.default_rng(0).normal(size=20)
>>> round(spearman(x, y), 2) > 0.9
True
>>> lo, hi = bootstrap_ci(spearman, x, y, seed=0)
>>> lo <= spearman(x, y) <= hi
True
"""

from __future__ import annotations

from typing import Callable, Tuple

import numpy as np
import torch

from ..errors import InvalidInputError

__all__ = ["entropy_bits", "pearson", "spearman", "bootstrap_ci", "permutation_pvalue", "as_numpy"]


def as_numpy(x) -> np.ndarray:
    """A float64 numpy array from a tensor, array or sequence."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def entropy_bits(p, axis: int = -1, *, from_logits: bool = False):
    """Shannon entropy in bits along ``axis`` (probabilities, or logits with ``from_logits=True``).

    Works on torch tensors (returns a tensor, computed in float64) and on numpy arrays.
    """
    if isinstance(p, torch.Tensor):
        x = p.double()
        if from_logits:
            logp = torch.log_softmax(x, dim=axis)
            return -(logp.exp() * logp).sum(axis) / np.log(2.0)
        logp = torch.where(x > 0, torch.log2(x.clamp_min(1e-300)), torch.zeros_like(x))
        return -(x * logp).sum(axis)
    x = np.asarray(p, dtype=np.float64)
    if from_logits:
        x = x - x.max(axis=axis, keepdims=True)
        logp = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
        return -(np.exp(logp) * logp).sum(axis) / np.log(2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.where(x > 0, np.log2(np.where(x > 0, x, 1.0)), 0.0)
    return -(x * logp).sum(axis)


def pearson(x, y) -> float:
    """Pearson correlation of two 1-D samples (NaN if either is constant)."""
    x, y = as_numpy(x).ravel(), as_numpy(y).ravel()
    if x.shape != y.shape:
        raise InvalidInputError(f"x and y must have the same length, got {x.size} and {y.size}.")
    xc, yc = x - x.mean(), y - y.mean()
    den = np.sqrt((xc * xc).sum() * (yc * yc).sum())
    return float((xc * yc).sum() / den) if den > 0 else float("nan")


def _rank(a: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(a, axis=-1)


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties; NaN if either is constant)."""
    x, y = as_numpy(x).ravel(), as_numpy(y).ravel()
    if x.shape != y.shape:
        raise InvalidInputError(f"x and y must have the same length, got {x.size} and {y.size}.")
    return pearson(_rank(x), _rank(y))


def bootstrap_ci(
    stat: Callable[..., float],
    *arrays,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Tuple[float, float]:
    """Percentile bootstrap interval of ``stat(*arrays)``, resampling rows of all arrays jointly.

    NaN replicates (e.g. a resample with a constant column) are dropped; if more than half are NaN
    the interval is (NaN, NaN).
    """
    if not arrays:
        raise InvalidInputError("bootstrap_ci needs at least one array.")
    arrs = [a if isinstance(a, np.ndarray) else as_numpy(a) for a in arrays]
    n = len(arrs[0])
    if any(len(a) != n for a in arrs):
        raise InvalidInputError("all arrays passed to bootstrap_ci must have the same number of rows.")
    if n < 2:
        return float("nan"), float("nan")
    if not 0 < level < 1:
        raise InvalidInputError(f"level must be in (0, 1), got {level}.")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    reps = np.array([stat(*[a[i] for a in arrs]) for i in idx], dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size < n_boot / 2:
        return float("nan"), float("nan")
    alpha = (1 - level) / 2
    lo, hi = np.quantile(reps, [alpha, 1 - alpha])
    return float(lo), float(hi)


def permutation_pvalue(x, y, stat: Callable[[np.ndarray, np.ndarray], float] = spearman, *,
                       n_perm: int = 1000, seed: int = 0) -> float:
    """Two-sided permutation p-value of ``stat(x, y)``: P(|stat(x, perm(y))| >= |stat(x, y)|)."""
    x, y = as_numpy(x).ravel(), as_numpy(y).ravel()
    observed = abs(stat(x, y))
    if not np.isfinite(observed):
        return float("nan")
    rng = np.random.default_rng(seed)
    count = sum(abs(stat(x, rng.permutation(y))) >= observed - 1e-12 for _ in range(n_perm))
    return float((count + 1) / (n_perm + 1))
