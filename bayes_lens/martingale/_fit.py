"""Weighted least-squares fits of the martingale gap curve Δ̂_n (Paper B §5.1, eq. 27–28).

Two shapes are fitted to the per-n means Δ̂_n with weights w_n ∝ N_n / Δ̂_n² (relative errors):

    "log":  Δ = A · log(n)/n + B      (Paper B's Θ(log n / n) prediction)
    "inv":  Δ = A / n + B             (what an exact Bayes predictive gives: Laplace's Δ̂_n ≈ 1/n)

For each: A, B, their standard errors (σ̂²(XᵀWX)⁻¹, σ̂² = RSS_w/(N−2)), weighted R² and adjusted
R² (1 − (1 − R²)(N − 1)/(N − 2)), and AIC under Gaussian errors with the given relative weights.
The comparison of the two non-nested shapes reports the likelihood ratio N·log(RSS_inv/RSS_log)
(positive favours log n/n; equal parameter counts, so it equals AIC_inv − AIC_log) and, for a proper
test, each shape against the encompassing model A·log(n)/n + C/n + B with a χ²(1) p-value.
Bootstrap CIs resample sequences within each n (METHODS.md §0: over prompts).

Example
-------
>>> import numpy as np
>>> from bayes_lens.martingale import fit_gap
>>> ns = np.arange(10, 200, 2); d = 0.18 * np.log(ns) / ns - 0.004
>>> round(fit_gap(ns, d, shape="log").A, 3)
0.18
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from .._validate import check_nonneg_int, check_seed
from ..errors import InvalidInputError

__all__ = ["GapFit", "fit_gap", "compare_fits", "SHAPES"]

SHAPES = {
    "log": lambda n: np.log(n) / n,
    "inv": lambda n: 1.0 / n,
}
_FORMULAS = {"log": "A*log(n)/n + B", "inv": "A/n + B"}


@dataclass(frozen=True)
class GapFit:
    """One weighted least-squares fit of Δ̂_n; ``A_ci``/``B_ci`` are bootstrap CIs when available."""

    shape: str
    formula: str
    A: float
    B: float
    A_se: float
    B_se: float
    r2: float
    adj_r2: float
    rss_weighted: float
    aic: float
    n_points: int
    A_ci: Tuple[float, float] = (float("nan"), float("nan"))
    B_ci: Tuple[float, float] = (float("nan"), float("nan"))

    @property
    def adjusted_r2(self) -> float:
        """Alias of ``adj_r2``."""
        return self.adj_r2

    def predict(self, n) -> np.ndarray:
        """The fitted curve at ``n``."""
        return self.A * SHAPES[self.shape](np.asarray(n, dtype=np.float64)) + self.B


def _weights(gaps: np.ndarray, counts: np.ndarray) -> np.ndarray:
    g2 = gaps ** 2
    positive = g2[g2 > 0]
    floor = (1e-3 * np.median(positive)) if positive.size else 1.0
    return counts / np.maximum(g2, floor)


def _check(ns, gaps, counts) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    ns = np.asarray(ns, dtype=np.float64).ravel()
    gaps = np.asarray(gaps, dtype=np.float64).ravel()
    if ns.shape != gaps.shape:
        raise InvalidInputError(f"ns and gaps must have the same length, got {ns.size} and {gaps.size}.")
    counts = np.ones_like(ns) if counts is None else np.asarray(counts, dtype=np.float64).ravel()
    if counts.shape != ns.shape:
        raise InvalidInputError("counts must have one entry per n.")
    if ns.size < 3:
        raise InvalidInputError(f"a gap fit needs at least 3 values of n, got {ns.size}.")
    if np.any(ns < 3):
        raise InvalidInputError(f"every n must be >= 3 (Δ̂_n compares prefixes n-1 and n-2), got min {ns.min():g}.")
    if not np.all(np.isfinite(gaps)):
        raise InvalidInputError("gaps contain NaN or infinity; drop those n before fitting.")
    return ns, gaps, counts


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Batched WLS: X [m, p], y [..., m], w [..., m] -> beta [..., p], rss [...], xtwx_inv [..., p, p]."""
    xtwx = np.einsum("...m,mi,mj->...ij", w, X, X)
    xtwy = np.einsum("...m,mi,...m->...i", w, X, y)
    beta = np.linalg.solve(xtwx, xtwy[..., None])[..., 0]
    resid = y - np.einsum("mi,...i->...m", X, beta)
    rss = np.einsum("...m,...m->...", w, resid ** 2)
    return beta, rss, np.linalg.inv(xtwx)


def fit_gap(ns, gaps, counts=None, *, shape: str = "log", per_seq: Optional[Sequence[np.ndarray]] = None,
            n_boot: int = 0, seed: int = 0, level: float = 0.95) -> GapFit:
    """Fit ``Δ = A·f(n) + B`` (f = log(n)/n for ``shape="log"``, 1/n for ``"inv"``) by WLS.

    ``counts`` are the numbers of sequences N_n (weights N_n/Δ̂_n²). With ``per_seq`` (one array of
    per-sequence gaps per n) and ``n_boot > 0``, A and B get percentile bootstrap CIs from resampling
    sequences within each n (weights recomputed in every replicate).
    """
    seed = check_seed(seed)
    n_boot = check_nonneg_int(n_boot, "n_boot")
    if shape not in SHAPES:
        raise InvalidInputError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}.")
    ns, gaps, counts = _check(ns, gaps, counts)
    X = np.stack([SHAPES[shape](ns), np.ones_like(ns)], axis=1)
    w = _weights(gaps, counts)
    beta, rss, inv = _wls(X, gaps, w)
    m = ns.size
    ybar = np.sum(w * gaps) / np.sum(w)
    tss = float(np.sum(w * (gaps - ybar) ** 2))
    r2 = 1.0 - rss / tss if tss > 0 else float("nan")
    adj = 1.0 - (1.0 - r2) * (m - 1) / (m - 2) if m > 2 else float("nan")
    sigma2 = rss / (m - 2) if m > 2 else float("nan")
    se = np.sqrt(np.maximum(np.diag(inv) * sigma2, 0.0))
    aic = m * np.log(max(rss, 1e-300) / m) + 2 * 3  # A, B and the error scale
    a_ci = b_ci = (float("nan"), float("nan"))
    if per_seq is not None and n_boot > 0:
        a_ci, b_ci = _bootstrap(ns, per_seq, X, n_boot=n_boot, seed=seed, level=level)
    return GapFit(shape=shape, formula=_FORMULAS[shape], A=float(beta[0]), B=float(beta[1]),
                  A_se=float(se[0]), B_se=float(se[1]), r2=float(r2), adj_r2=float(adj),
                  rss_weighted=float(rss), aic=float(aic), n_points=int(m), A_ci=a_ci, B_ci=b_ci)


def _bootstrap(ns, per_seq, X, *, n_boot: int, seed: int, level: float):
    if len(per_seq) != ns.size:
        raise InvalidInputError("per_seq must hold one array of per-sequence gaps per n.")
    rng = np.random.default_rng(seed)
    means = np.empty((n_boot, ns.size))
    counts = np.array([len(v) for v in per_seq], dtype=np.float64)
    for j, vals in enumerate(per_seq):
        vals = np.asarray(vals, dtype=np.float64)
        idx = rng.integers(0, vals.size, size=(n_boot, vals.size))
        means[:, j] = vals[idx].mean(axis=1)
    g2 = means ** 2
    floor = 1e-3 * np.median(g2[g2 > 0]) if np.any(g2 > 0) else 1.0
    w = counts / np.maximum(g2, floor)
    beta, _, _ = _wls(X, means, w)
    alpha = (1 - level) / 2
    qa = np.quantile(beta[:, 0], [alpha, 1 - alpha])
    qb = np.quantile(beta[:, 1], [alpha, 1 - alpha])
    return (float(qa[0]), float(qa[1])), (float(qb[0]), float(qb[1]))


def compare_fits(ns, gaps, counts=None) -> dict:
    """Likelihood-ratio comparison of the log(n)/n and 1/n shapes (same weights for both).

    Returns ``lr_log_vs_inv`` = N·log(RSS_inv/RSS_log) (> 0 favours log n/n; equals AIC_inv − AIC_log),
    and nested tests of each shape against A·log(n)/n + C/n + B: ``lr_log`` / ``p_log`` (does the
    encompassing model improve on log n/n?) and ``lr_inv`` / ``p_inv`` (on 1/n), χ²(1) p-values.
    """
    from scipy.stats import chi2

    ns, gaps, counts = _check(ns, gaps, counts)
    w = _weights(gaps, counts)
    m = ns.size
    rss = {}
    for shape, f in SHAPES.items():
        rss[shape] = float(_wls(np.stack([f(ns), np.ones_like(ns)], 1), gaps, w)[1])
    out = {"lr_log_vs_inv": m * np.log(rss["inv"] / rss["log"]) if rss["log"] > 0 else float("nan"),
           "preferred": "log" if rss["log"] < rss["inv"] else "inv"}
    if m > 3:
        full = np.stack([np.log(ns) / ns, 1.0 / ns, np.ones_like(ns)], 1)
        rss_full = float(_wls(full, gaps, w)[1])
        for shape in SHAPES:
            lr = m * np.log(rss[shape] / rss_full) if rss_full > 0 else float("nan")
            out[f"lr_{shape}"] = float(lr)
            out[f"p_{shape}"] = float(chi2.sf(lr, 1)) if np.isfinite(lr) else float("nan")
    return {k: (float(v) if not isinstance(v, str) else v) for k, v in out.items()}
