"""Weighted least-squares fits of the martingale gap curve Δ̂_n (Paper B §5.1, eq. 27–28).

Two shapes are fitted to the per-n means Δ̂_n:

    "log":  Δ = A · log(n)/n + B      (Paper B's Θ(log n / n) prediction)
    "inv":  Δ = A / n + B             (what an exact Bayes predictive gives: Laplace's Δ̂_n ≈ 1/n)

Weights (``weights=``). The per-sequence gaps have a spread proportional to their mean, so the
variance of Δ̂_n is ∝ Δ_n² / N_n and the efficient weights are N_n / Δ_n². The default
``weights="fitted"`` estimates them by iteratively reweighted least squares (IRLS): fit, set
w_n = N_n / Δ̃_n² from the *fitted* curve Δ̃_n, refit, until A and B stop changing (the quasi-likelihood
estimate of a variance ∝ mean² model). ``weights="observed"`` is the single fit with w_n = N_n / Δ̂_n²
from the noisy means themselves, as Paper B writes it: a Δ̂_n that is low by chance gets a large
weight, so A is biased low (≈ −2% at Paper B's settings) and, because every bootstrap replicate
repeats the bias, its bootstrap interval covered the true A in only about a quarter of simulated
data sets; IRLS is unbiased and its intervals cover at the nominal rate (tests/test_martingale.py).
Squared fitted values are floored at 10⁻³·median(Δ̂²) so a curve crossing zero cannot get an
infinite weight.

For each fit: A, B, their standard errors (σ̂²(XᵀWX)⁻¹, σ̂² = RSS_w/(N−2), final weights), weighted
R² and adjusted R² (1 − (1 − R²)(N − 1)/(N − 2)), and AIC under Gaussian errors with the given
relative weights. The comparison of the two non-nested shapes (:func:`compare_fits`) uses one set
of weights for all models (IRLS on the encompassing model A·log(n)/n + C/n + B, or the observed
weights), reports the likelihood ratio N·log(RSS_inv/RSS_log) (positive favours log n/n) and, for a
proper test, each shape against the encompassing model with a χ²(1) p-value. Bootstrap CIs resample
sequences within each n (METHODS.md §0: over prompts) and refit with the same weighting (IRLS
in every replicate, vectorized over replicates).

Example
-------
>>> import numpy as np
>>> from bayes_lens.martingale import fit_gap
>>> ns = np.arange(10, 200, 2); d = 0.18 * np.log(ns) / ns - 0.004
>>> round(fit_gap(ns, d, shape="log").A.value, 3)
0.18
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
from jaxtyping import Float, Int

from .._results import Estimate
from ..metrics.stats import percentile_interval
from .._validate import check_choice, check_count, check_seed
from ..errors import InvalidInputError

__all__ = ["GapFit", "fit_gap", "compare_fits", "SHAPES", "WEIGHTS", "check_weights"]

SHAPES = {
    "log": lambda n: np.log(n) / n,
    "inv": lambda n: 1.0 / n,
}
_FORMULAS = {"log": "A*log(n)/n + B", "inv": "A/n + B"}
WEIGHTS = ("fitted", "observed")  # IRLS with N/fitted² (default) or one fit with N/Δ̂² (Paper B as written)
_MAX_ITER = 100
_TOL = 1e-10


@dataclass(frozen=True, eq=False)
class GapFit:
    """One weighted least-squares fit of Δ̂_n; ``A`` and ``B`` (nats) are :class:`~bayes_lens.Estimate`
    values whose ``ci`` is the percentile bootstrap interval (sequences resampled within each n,
    each replicate refitted) when per-sequence gaps were given, else ``(nan, nan)``; ``A_se`` /
    ``B_se`` are the WLS standard errors.

    ``weights`` says how the fit was weighted ("fitted": IRLS with N/fitted², "observed": N/Δ̂²);
    ``n_iter`` is the number of IRLS iterations (1 for "observed").
    """

    shape: str
    formula: str
    A: Estimate
    B: Estimate
    A_se: float
    B_se: float
    r2: float
    adj_r2: float
    rss_weighted: float
    aic: float
    n_points: int
    weights: str = "fitted"
    n_iter: int = 1

    def predict(self, n) -> np.ndarray:
        """The fitted curve at ``n``."""
        return self.A.value * SHAPES[self.shape](np.asarray(n, dtype=np.float64)) + self.B.value


def _floor(gaps: np.ndarray) -> np.ndarray:
    """Lower bound for squared means in the weights: 10⁻³·median of the positive Δ̂² (per data set)."""
    g2 = np.where(gaps ** 2 > 0, gaps ** 2, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-zero data set: floor 1
        med = np.nanmedian(g2, axis=-1, keepdims=True)
    return np.where(np.isfinite(med), 1e-3 * med, 1.0)


def _observed_weights(gaps: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return counts / np.maximum(gaps ** 2, _floor(gaps))


def _wls(X: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Batched WLS: X [m, p], y [..., m], w [..., m] -> beta [..., p], rss [...], xtwx_inv [..., p, p]."""
    xtwx = np.einsum("...m,mi,mj->...ij", w, X, X)
    xtwy = np.einsum("...m,mi,...m->...i", w, X, y)
    beta = np.linalg.solve(xtwx, xtwy[..., None])[..., 0]
    resid = y - np.einsum("mi,...i->...m", X, beta)
    rss = np.einsum("...m,...m->...", w, resid ** 2)
    return beta, rss, np.linalg.inv(xtwx)


def _weighted_fit(X: np.ndarray, y: np.ndarray, counts: np.ndarray, weights: str):
    """Batched fit with the chosen weighting: (beta, rss, xtwx_inv, w, n_iter); y [..., m]."""
    w = _observed_weights(y, counts)
    beta, rss, inv = _wls(X, y, w)
    if weights == "observed":
        return beta, rss, inv, w, 1
    floor = _floor(y)
    for it in range(2, _MAX_ITER + 1):
        fitted = np.einsum("mi,...i->...m", X, beta)
        w = counts / np.maximum(fitted ** 2, floor)
        new, rss, inv = _wls(X, y, w)
        scale = np.maximum(np.abs(new), 1e-12 + 1e-6 * np.abs(new).max(axis=-1, keepdims=True))
        done = np.all(np.abs(new - beta) <= _TOL * scale)
        beta = new
        if done:
            return beta, rss, inv, w, it
    return beta, rss, inv, w, _MAX_ITER


def check_weights(weights: str) -> str:
    """Validate a ``weights=`` argument (one of :data:`WEIGHTS`); returns it."""
    return check_choice(weights, "weights", WEIGHTS)  # 'fitted': IRLS, unbiased; 'observed': Paper B, biased low


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


def fit_gap(ns: Float[np.ndarray, "n_lengths"], gaps: Float[np.ndarray, "n_lengths"],
            counts: Optional[Int[np.ndarray, "n_lengths"]] = None, *, shape: str = "log",
            per_seq: Optional[Sequence[Float[np.ndarray, "n_seqs"]]] = None,
            n_boot: int = 0, seed=0, level: float = 0.95, weights: str = "fitted") -> GapFit:
    """Fit ``Δ = A·f(n) + B`` (f = log(n)/n for ``shape="log"``, 1/n for ``"inv"``) by weighted least squares.

    ``counts`` are the numbers of sequences N_n. ``weights="fitted"`` (default) iterates
    w_n = N_n / Δ̃_n² with Δ̃ the fitted curve (IRLS, unbiased); ``weights="observed"`` is one fit with
    w_n = N_n / Δ̂_n² (Paper B as written; biased low, see the module docstring). With ``per_seq``
    (one array of per-sequence gaps per n) and ``n_boot > 0``, A and B get percentile bootstrap CIs
    from resampling sequences within each n (each replicate refitted the same way). ``seed`` is an
    int, a :class:`numpy.random.SeedSequence` or a Generator.
    """
    if not isinstance(seed, (np.random.SeedSequence, np.random.Generator)):  # a child stream passes as is
        seed = check_seed(seed)
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    check_choice(shape, "shape", sorted(SHAPES))
    check_weights(weights)
    ns, gaps, counts = _check(ns, gaps, counts)
    X = np.stack([SHAPES[shape](ns), np.ones_like(ns)], axis=1)
    beta, rss, inv, w, n_iter = _weighted_fit(X, gaps, counts, weights)
    rss = float(rss)
    m = ns.size
    ybar = np.sum(w * gaps) / np.sum(w)
    tss = float(np.sum(w * (gaps - ybar) ** 2))
    r2 = 1.0 - rss / tss if tss > 0 else float("nan")
    adj = 1.0 - (1.0 - r2) * (m - 1) / (m - 2) if m > 2 else float("nan")
    sigma2 = rss / (m - 2) if m > 2 else float("nan")
    se = np.sqrt(np.maximum(np.diag(inv) * sigma2, 0.0))
    aic = m * np.log(max(rss, 1e-300) / m) + 2 * 3  # A, B and the error scale
    a_ci = b_ci = (float("nan"), float("nan"))
    method, n_seqs = "no interval (needs per_seq and n_boot > 0)", None
    if per_seq is not None and n_boot > 0:
        a_ci, b_ci = _bootstrap(ns, per_seq, X, n_boot=n_boot, seed=seed, level=level, weights=weights)
        method = f"{level:.0%} percentile bootstrap over sequences (resampled within each n, refitted)"
        n_seqs = int(sum(len(v) for v in per_seq))
    return GapFit(shape=shape, formula=_FORMULAS[shape], A=Estimate(float(beta[0]), a_ci, method, n=n_seqs),
                  B=Estimate(float(beta[1]), b_ci, method, n=n_seqs),
                  A_se=float(se[0]), B_se=float(se[1]), r2=float(r2), adj_r2=float(adj),
                  rss_weighted=rss, aic=float(aic), n_points=int(m),
                  weights=weights, n_iter=int(n_iter))


def _bootstrap(ns, per_seq, X, *, n_boot: int, seed, level: float, weights: str):
    if len(per_seq) != ns.size:
        raise InvalidInputError("per_seq must hold one array of per-sequence gaps per n.")
    rng = np.random.default_rng(seed)
    means = np.empty((n_boot, ns.size))
    counts = np.array([len(v) for v in per_seq], dtype=np.float64)
    for j, vals in enumerate(per_seq):
        vals = np.asarray(vals, dtype=np.float64)
        idx = rng.integers(0, vals.size, size=(n_boot, vals.size))
        means[:, j] = vals[idx].mean(axis=1)
    beta = _weighted_fit(X, means, counts, weights)[0]
    return percentile_interval(beta[:, 0], level, min_finite=0.0), percentile_interval(beta[:, 1], level, min_finite=0.0)


def compare_fits(ns: Float[np.ndarray, "n_lengths"], gaps: Float[np.ndarray, "n_lengths"],
                 counts: Optional[Int[np.ndarray, "n_lengths"]] = None, *, weights: str = "fitted") -> dict:
    """Likelihood-ratio comparison of the log(n)/n and 1/n shapes (one set of weights for every model).

    The weights are N_n / Δ̃_n² from IRLS on the encompassing model A·log(n)/n + C/n + B
    (``weights="fitted"``; with 3 values of n, from the log(n)/n fit) or N_n / Δ̂_n²
    (``"observed"``). Returns ``lr_log_vs_inv`` = N·log(RSS_inv/RSS_log) (> 0 favours log n/n),
    ``preferred``, and nested tests of each shape against the encompassing model: ``lr_log`` /
    ``p_log`` (does it improve on log n/n?) and ``lr_inv`` / ``p_inv`` (on 1/n), χ²(1) p-values.
    """
    from scipy.stats import chi2

    check_weights(weights)
    ns, gaps, counts = _check(ns, gaps, counts)
    m = ns.size
    full = np.stack([np.log(ns) / ns, 1.0 / ns, np.ones_like(ns)], 1)
    if weights == "observed":
        w = _observed_weights(gaps, counts)
    else:
        design = full if m > 3 else np.stack([np.log(ns) / ns, np.ones_like(ns)], 1)
        w = _weighted_fit(design, gaps, counts, "fitted")[3]
    rss = {}
    for shape, f in SHAPES.items():
        rss[shape] = float(_wls(np.stack([f(ns), np.ones_like(ns)], 1), gaps, w)[1])
    out = {"lr_log_vs_inv": m * np.log(rss["inv"] / rss["log"]) if rss["log"] > 0 else float("nan"),
           "preferred": "log" if rss["log"] < rss["inv"] else "inv"}
    if m > 3:
        rss_full = float(_wls(full, gaps, w)[1])
        for shape in SHAPES:
            lr = m * np.log(rss[shape] / rss_full) if rss_full > 0 else float("nan")
            out[f"lr_{shape}"] = float(lr)
            out[f"p_{shape}"] = float(chi2.sf(lr, 1)) if np.isfinite(lr) else float("nan")
    out = {k: (float(v) if not isinstance(v, str) else v) for k, v in out.items()}
    out["weights"] = weights
    return out
