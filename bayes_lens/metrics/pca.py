"""Standardized PCA in float64: explained variance, participation ratio, bootstrap and Gaussian null.

The value-manifold measurement of Paper A §4.2 (METHODS.md §1): rows are prompts, columns are the
coordinates of a final-token activation. Each column is z-scored across rows (columns with zero
variance are dropped and counted), then the singular values s_i of the standardized n × d matrix Z
give the component variances λ_i = s_i² / (n − 1) and

* explained-variance ratio EVR_i = λ_i / Σ_j λ_j (PC1, and PC1+PC2),
* participation ratio PR = (Σ λ)² / Σ λ² (an effective dimension, 1 ≤ PR ≤ rank),
* per-row coordinates Z·v_i (the principal-component scores).

The null is i.i.d. Gaussian data of the same n × d, standardized the same way and simulated
(not 1/d and not the "≈5%" of Paper A: at n = 75, d = 1024, PC1 of noise is about 2%).

Bootstrap intervals resample rows and re-standardize each resample (:func:`bootstrap_pca_stats`);
:func:`bootstrap_interval` turns the replicates into a 95% interval by one of :data:`CI_METHODS`,
which do not target the same quantity:

* ``"recentered"`` — the percentile interval shifted by (estimate − median of the replicates):
  [θ̂ + q_lo − med, θ̂ + q_hi − med]. Resampled rows are duplicated, which lowers the rank of the
  standardized matrix and inflates PC1 in every replicate; recentring removes that shift, so the
  interval describes the sampling spread *of the same-n statistic* around its own value — the
  quantity the same-n Gaussian null is compared with (model vs noise at equal n and d). It is not
  built to cover the population value: sample PC1 is biased upwards at n ≲ d.
* ``"basic"`` — [2θ̂ − q_hi, 2θ̂ − q_lo], the basic (reverse-percentile) bootstrap: it corrects the
  estimate for the bootstrap's own bias and targets the *population* value, but the correction is
  only as good as the bootstrap's imitation of that bias. In simulation (spiked correlation
  matrices, 100 data sets × 200 resamples per setting, n = 40–75, d = 100–192) it covered the
  population PC1 in 0.87–0.91 of data sets for a strong spike (eigenvalues 20, 10, 1, …) but in
  0.61–1.00 for weak ones (5, 3 or 3, 2: 0.61 at n = 75, d = 192; 0.75–0.78 at n = 50–75, d = 100),
  and PC1+PC2 in 0.78–1.00; the plain percentile interval covered PC1+PC2 in 0–0.24. Below nominal
  is the rule for a weak leading eigenvalue at n < d, so :func:`interval_label` says so there.
* ``"percentile"`` — [q_lo, q_hi], the plain percentile interval: biased upwards for PC1 (it can miss
  the estimate itself); kept for comparison.

The participation ratio is different: sample PR is biased low, E[PR̂] ≈ PR / (1 + PR/n) (the
Wishart identity E tr S² = tr Σ²(1 + 1/n) + (tr Σ)²/n; 27.2 measured vs 27.4 predicted at n = 40,
PR = 86.6), so what matters is n against the PR, not against d: a strong spike (small PR) is
estimated well at n < 10·d. Coverage of the population PR in the same simulations:

* ``"basic"``: 0.80–0.89 at n ≥ 10·PR̂ (n = 100–200, d = 64, PR ≈ 10–22; n = 700, d = 64,
  PR = 53: 0.82), 0.11–0.24 at n = 3–5·PR̂, 0 at n < d; but 0.13 at n = 700, d = 64 for a flat
  spectrum (population PR = d, the upper bound sample PR never reaches);
* ``"recentered"`` and ``"percentile"``: not centred on the population value at any n (n = 700,
  d = 64, PR = 53: 0.00 and 0.00; 0.54–0.90 and 0.11–0.75 at n ≥ 10·PR̂ for strong spikes).

:func:`pr_interval_covers_population` and :func:`interval_label` therefore claim coverage only for
the basic interval at n ≥ :data:`PR_POPULATION_MIN_RATIO`·PR̂ with PR̂ < :data:`PR_FLAT_FRACTION`·d;
every other PR interval is labelled as describing the same-n statistic only.

Example
-------
>>> import numpy as np
>>> from bayes_lens.metrics.pca import pca
>>> x = np.random.default_rng(0).normal(size=(50, 8)) @ np.diag([5, 1, 1, 1, 1, 1, 1, 1.0])
>>> fit = pca(x)
>>> round(float(fit.explained_variance_ratio.sum()), 6)
1.0
"""

from __future__ import annotations

import functools
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch
from jaxtyping import Bool, Float

from .._validate import check_choice, check_count
from ..errors import InvalidInputError, NonFiniteError
from .stats import as_numpy

__all__ = [
    "small_blas",
    "PCAFit",
    "standardize",
    "pca",
    "participation_ratio",
    "bootstrap_pca_stats",
    "gaussian_null_pca_stats",
    "CI_METHODS",
    "CI_METHOD_LABELS",
    "PR_POPULATION_MIN_RATIO",
    "bootstrap_interval",
    "pca_bootstrap_cis",
    "PR_FLAT_FRACTION",
    "pr_interval_covers_population",
    "interval_label",
]

CI_METHODS = ("recentered", "basic", "percentile")
#: What each interval method is, and what it targets (for result and report labels).
CI_METHOD_LABELS = {
    "recentered": "recentred percentile bootstrap (targets the same-n statistic, as compared with the same-n null)",
    "basic": "basic bootstrap (targets the population value)",
    "percentile": "percentile bootstrap (biased upwards for PC1)",
}
#: Below n = PR_POPULATION_MIN_RATIO · PR̂ (· d when no PR̂ is given) the participation-ratio interval
#: does not cover the population PR (and only the basic interval can above it).
PR_POPULATION_MIN_RATIO = 10
#: A sample PR above this fraction of d means a nearly flat spectrum: the population PR is at its bound
#: d, which the (always smaller) sample PR cannot bracket.
PR_FLAT_FRACTION = 0.9

_REL_EPS = 1e-10


_BLAS_CONTROLLER = None


def small_blas():
    """Limit BLAS/LAPACK to one thread for these small matrices.

    Multi-threaded OpenBLAS on a busy 2-core machine took ~1 s for one 64 × 192 SVD (1 ms on one
    thread); the matrices here are far too small to gain from threads. The loaded BLAS libraries are
    scanned once per process (a scan costs ~3 ms and a geometry run enters this ~60 times).
    """
    global _BLAS_CONTROLLER
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - comes with scikit-learn
        import contextlib

        return contextlib.nullcontext()
    if _BLAS_CONTROLLER is None:
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER.limit(limits=1, user_api="blas")


def _check_matrix(x, min_rows: int = 3) -> np.ndarray:
    x = as_numpy(x)
    if x.ndim != 2:
        raise InvalidInputError(f"expected a 2-D [n_samples, n_features] array, got shape {list(x.shape)}.")
    if x.shape[0] < min_rows:
        raise InvalidInputError(
            f"PCA needs at least {min_rows} samples (prompts), got {x.shape[0]}; pass more prompts.")
    if not np.isfinite(x).all():
        rows = np.where(~np.isfinite(x).all(axis=1))[0].tolist()
        raise NonFiniteError(f"the samples contain NaN or infinity in rows {rows}; drop those prompts.")
    return x


def standardize(x: Float[np.ndarray | torch.Tensor, "n d"]
                ) -> Tuple[Float[np.ndarray, "n d_kept"], Bool[np.ndarray, "d"]]:
    """Z-score columns (ddof = 0) in float64; returns ``(z[:, kept], kept)`` dropping constant columns."""
    x = as_numpy(x)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    scale = np.abs(x).max(axis=0) + np.abs(mean)
    kept = std > _REL_EPS * np.maximum(scale, 1e-300)
    return (x[:, kept] - mean[kept]) / std[kept], kept


def participation_ratio(eigenvalues: Float[np.ndarray | torch.Tensor, "k"]) -> float:
    """(Σλ)² / Σλ² of non-negative component variances."""
    lam = np.clip(as_numpy(eigenvalues), 0.0, None)
    den = float((lam ** 2).sum())
    return float(lam.sum() ** 2 / den) if den > 0 else float("nan")


@dataclass(frozen=True, eq=False)
class PCAFit:
    """Result of :func:`pca` (all float64)."""

    explained_variance: Float[np.ndarray, "n_eig"]  # λ_i, descending, length min(n, d_kept)
    explained_variance_ratio: Float[np.ndarray, "n_eig"]
    components: Float[np.ndarray, "k d_kept"]  # unit vectors in standardized coordinates
    coords: Float[np.ndarray, "n k"]  # principal-component scores
    kept: Bool[np.ndarray, "d"]  # columns with non-zero variance
    mean: Float[np.ndarray, "d"]
    scale: Float[np.ndarray, "d"]  # standard deviations (ddof=0)

    @property
    def participation_ratio(self) -> float:
        return participation_ratio(self.explained_variance)

    @property
    def n_constant(self) -> int:
        return int((~self.kept).sum())


def pca(x: Float[np.ndarray | torch.Tensor, "n d"], n_components: int | None = None, *,
        standardized: bool = True) -> PCAFit:
    """PCA by SVD in float64 of the (z-scored, unless ``standardized=False``) centred data.

    Signs are fixed so that each component's largest-magnitude loading is positive.
    """
    x = _check_matrix(x)
    n = x.shape[0]
    mean, scale = x.mean(axis=0), x.std(axis=0)
    if standardized:
        z, kept = standardize(x)
    else:
        kept = np.ones(x.shape[1], dtype=bool)
        z = x - mean
    if z.shape[1] == 0:
        raise InvalidInputError("every coordinate is constant across the samples; PCA is undefined.")
    with small_blas():
        u, s, vt = np.linalg.svd(z, full_matrices=False)
    lam = s ** 2 / (n - 1)
    total = lam.sum()
    if not total > 0:
        raise InvalidInputError("the samples have zero variance; PCA is undefined.")
    k = len(s) if n_components is None else max(1, min(int(n_components), len(s)))
    vt = vt[:k]
    flip = np.sign(vt[np.arange(k), np.abs(vt).argmax(axis=1)])
    flip[flip == 0] = 1.0
    vt = vt * flip[:, None]
    coords = z @ vt.T
    return PCAFit(explained_variance=lam, explained_variance_ratio=lam / total, components=vt, coords=coords,
                  kept=kept, mean=mean, scale=scale)


def _batched_evr_stats(xb: np.ndarray, floor) -> np.ndarray:
    """[B, n, d] raw batches (modified in place) → [B, 3] (PC1, PC1+PC2, PR) after z-scoring each.

    Columns whose variance within a batch is not above ``floor`` (scalar or [d]) are dropped (set to
    0). Only the eigenvalues of the n × n (or d × d) Gram matrix are needed.
    """
    n = xb.shape[1]
    xb -= xb.mean(axis=1, keepdims=True)
    var = np.einsum("bnd,bnd->bd", xb, xb) / n
    ok = var > floor
    xb *= np.where(ok, 1.0 / np.sqrt(np.where(ok, var, 1.0)), 0.0)[:, None, :]
    return _evr_from_rows(xb)


def _evr_from_rows(zb: np.ndarray) -> np.ndarray:
    """[B, m, d] standardized rows (any row scaling already applied) → [B, 3] (PC1, PC1+PC2, PR) from
    the eigenvalues of the smaller Gram matrix."""
    m, d = zb.shape[1], zb.shape[2]
    with small_blas():
        gram = zb @ np.swapaxes(zb, 1, 2) if m <= d else np.swapaxes(zb, 1, 2) @ zb
    return _eigen_stats(gram)


def _eigen_stats(gram: np.ndarray) -> np.ndarray:
    """[B, k, k] Gram matrices → [B, 3] (PC1, PC1+PC2, PR) of their eigenvalues."""
    with small_blas():
        lam = np.clip(np.linalg.eigvalsh(gram)[:, ::-1], 0.0, None)
    total = lam.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pc1 = lam[:, 0] / total
        pc12 = lam[:, :2].sum(axis=1) / total
        pr = total ** 2 / (lam ** 2).sum(axis=1)
    return np.stack([pc1, pc12, pr], axis=1)


def _map_chunks(fn, items, n_items: int) -> np.ndarray:
    """``np.concatenate([fn(i) for i in items])``, two chunks at a time on two threads.

    Each chunk is single-threaded LAPACK (:func:`small_blas`), which releases the GIL, so two cores
    nearly halve the wall time. ``items`` is consumed in order; a generator at most two ahead (random
    draws stay one stream and never hold more than two chunks), a list all at once. The results are
    concatenated in order, so the output does not depend on the thread count.
    """
    sized = isinstance(items, list)
    items = iter(items)
    workers = min(2, os.cpu_count() or 1, n_items)
    out = []
    with small_blas():
        if workers < 2:
            out = [fn(i) for i in items]
        else:
            with ThreadPoolExecutor(workers) as pool:
                if sized:  # a list is already in memory: no window, so neither thread waits for the other
                    out = list(pool.map(fn, items))
                while not sized:
                    window = list(itertools.islice(items, workers))
                    if not window:
                        break
                    out.extend(pool.map(fn, window))
    return np.concatenate(out, axis=0)


def bootstrap_pca_stats(x: Float[np.ndarray | torch.Tensor, "n d"], *, n_boot: int = 1000, seed: int = 0,
                        chunk: int = 50) -> Float[np.ndarray, "n_boot 3"]:
    """[n_boot, 3] of (PC1, PC1+PC2, PR) on row-resamples of ``x``, each re-standardized.

    Columns constant in ``x`` are dropped first (as in :func:`pca`); a column that happens to be
    constant within a resample is dropped from that resample.
    """
    x = _check_matrix(x)
    n_boot = check_count(n_boot, "n_boot")
    _, kept = standardize(x)
    x = x[:, kept]
    floor = 1e-20 * x.var(axis=0)
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    idx = rng.integers(0, n, size=(n_boot, n))
    # A resample of n rows holds only ~63% distinct rows, and its standardized Gram matrix Z Zᵀ has the
    # same non-zero eigenvalues as (C^½ Z_u)(C^½ Z_u)ᵀ over its m distinct rows Z_u with their counts C.
    # So each resample is reduced to its distinct rows and resamples with equal m are batched: the
    # eigenvalue problems shrink from n × n to m × m (half the time at n = 64). The resample means and
    # variances come from two products with the count matrix (of x standardized once, which changes no
    # statistic: every resample is re-standardized), and the centring is a rank-one correction of the
    # Gram matrix, so no [n_boot, n, d] copy is centred and scaled element by element. A resample in
    # which some column is (nearly) constant, where that algebra would lose digits, takes the direct
    # route, and so does one with more distinct rows than columns (its d × d Gram matrix gains nothing).
    # Same resamples, same statistics (to ~1e-13).
    counts = np.bincount((idx + n * np.arange(n_boot)[:, None]).ravel(), minlength=n_boot * n).reshape(n_boot, n)
    xs = (x - x.mean(axis=0)) / x.std(axis=0)
    weights = counts.astype(np.float64)
    with small_blas():
        mu = weights @ xs / n                               # [n_boot, d] resample means
        var = weights @ (xs * xs) / n - mu * mu             # [n_boot, d] resample variances
    distinct = (counts > 0).sum(axis=1)
    distinct[(var < 1e-6).any(axis=1) | (distinct > x.shape[1])] = 0  # 0: the direct route
    jobs = []
    for m in np.unique(distinct):
        which = np.flatnonzero(distinct == m)
        jobs.extend((int(m), which[i:i + chunk]) for i in range(0, len(which), chunk))

    def run(job):
        m, w = job
        if m == 0:
            return _batched_evr_stats(x[idx[w]], floor)
        return _weighted_evr_stats(xs, counts[w], m, mu[w], var[w])

    out = np.empty((n_boot, 3))
    out[np.concatenate([w for _, w in jobs])] = _map_chunks(run, jobs, len(jobs))
    return out


def _weighted_evr_stats(xs: np.ndarray, counts: np.ndarray, m: int, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """[B, 3] (PC1, PC1+PC2, PR) of the resamples whose row counts are ``counts`` [B, n], each with exactly
    ``m`` ≤ d distinct rows of ``xs`` and with column means ``mu`` and variances ``var`` [B, d] (none near 0)."""
    rows = np.sort(np.argsort(counts == 0, axis=1, kind="stable")[:, :m], axis=1)   # [B, m] distinct rows
    root_c = np.sqrt(np.take_along_axis(counts, rows, axis=1).astype(np.float64))  # [B, m]
    scale = 1.0 / np.sqrt(var)                                                       # [B, d]
    y = xs[rows]                                                                     # [B, m, d]
    y *= scale[:, None, :]
    a = mu * scale                                                                   # the scaled means [B, d]
    with small_blas():
        gram = y @ np.swapaxes(y, 1, 2)                                              # [B, m, m]
        ya = (y @ a[:, :, None])[:, :, 0]                                            # [B, m]
    gram -= ya[:, :, None]
    gram -= ya[:, None, :]
    gram += np.einsum("bd,bd->b", a, a)[:, None, None]
    gram *= root_c[:, :, None] * root_c[:, None, :]
    return _eigen_stats(gram)


def gaussian_null_pca_stats(n: int, d: int, *, n_sims: int = 200, seed: int = 0,
                            chunk: int = 50) -> Float[np.ndarray, "n_sims 3"]:
    """[n_sims, 3] of (PC1, PC1+PC2, PR) for standardized i.i.d. Gaussian data of shape n × d.

    The draws depend on nothing but (n, d, n_sims, seed), so the result is remembered for the rest of
    the process (the 64 most recent) and a second analysis of as many prompts does not redraw it;
    each call returns its own copy.
    """
    if n < 3 or d < 1:
        raise InvalidInputError(f"the Gaussian null needs n >= 3 and d >= 1, got n={n}, d={d}.")
    if n_sims < 1:
        raise InvalidInputError(f"n_sims must be positive, got {n_sims}.")
    return _gaussian_null(int(n), int(d), int(n_sims), int(seed), int(chunk)).copy()


@functools.lru_cache(maxsize=64)
def _gaussian_null(n: int, d: int, n_sims: int, seed: int, chunk: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    starts = range(0, n_sims, chunk)
    draws = (rng.standard_normal((min(chunk, n_sims - i), n, d)) for i in starts)  # one stream, drawn in order
    out = _map_chunks(lambda xb: _batched_evr_stats(xb, 0.0), draws, len(starts))
    out.flags.writeable = False
    return out


def _check_ci_method(method: str) -> str:
    # 'recentered': the same-n statistic, 'basic': the population value, 'percentile': plain
    return check_choice(method, "ci_method", CI_METHODS)


def bootstrap_interval(replicates: Float[np.ndarray, "n_boot"], estimate: float, method: str = "recentered", level: float = 0.95
                       ) -> Tuple[float, float]:
    """Interval at ``level`` from bootstrap ``replicates`` of a statistic whose estimate is ``estimate``.

    ``"recentered"``: [θ̂ + q_lo − med, θ̂ + q_hi − med] (the same-n statistic); ``"basic"``:
    [2θ̂ − q_hi, 2θ̂ − q_lo] (the population value); ``"percentile"``: [q_lo, q_hi]. Non-finite
    replicates are dropped; none left gives (NaN, NaN).
    """
    _check_ci_method(method)
    if not 0 < level < 1:
        raise InvalidInputError(f"level must be in (0, 1), got {level}.")
    r = np.asarray(replicates, dtype=np.float64).ravel()
    r = r[np.isfinite(r)]
    if r.size == 0 or not np.isfinite(estimate):
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, med, hi = np.quantile(r, [a, 0.5, 1 - a])
    if method == "percentile":
        return float(lo), float(hi)
    if method == "basic":
        return float(2 * estimate - hi), float(2 * estimate - lo)
    return float(estimate + lo - med), float(estimate + hi - med)


def pca_bootstrap_cis(boot, estimates, method: str = "recentered", level: float = 0.95):
    """Intervals of (PC1, PC1+PC2, PR) from :func:`bootstrap_pca_stats` replicates ``boot`` [B, 3].

    Returns ``(cis, bias)``: a list of three (low, high) pairs by ``method`` (see
    :func:`bootstrap_interval`) and the bootstrap bias median(replicates) − estimate of each.
    """
    boot = np.asarray(boot, dtype=np.float64)
    if boot.ndim != 2 or boot.shape[1] != len(estimates):
        raise InvalidInputError(f"boot must be [n_boot, {len(estimates)}], got shape {list(boot.shape)}.")
    cis, bias = [], []
    for j, est in enumerate(estimates):
        col = boot[:, j][np.isfinite(boot[:, j])]
        cis.append(bootstrap_interval(col, float(est), method, level))
        bias.append(float(np.median(col)) - float(est) if col.size else float("nan"))
    return cis, tuple(bias)


def pr_interval_covers_population(n: int, d: int, method: str = "basic", participation_ratio=None) -> bool:
    """Whether a bootstrap interval of the participation ratio by ``method`` can be read as covering the
    population PR: only the ``"basic"`` interval, and only at n ≥ :data:`PR_POPULATION_MIN_RATIO`·PR̂
    (``participation_ratio``, the sample PR; d when not given, which is conservative since PR̂ ≤ d)
    with PR̂ < :data:`PR_FLAT_FRACTION`·d. Measured coverage: module docstring."""
    _check_ci_method(method)
    if method != "basic":
        return False
    pr = None if participation_ratio is None else float(participation_ratio)
    if pr is None or not np.isfinite(pr):
        return int(n) >= PR_POPULATION_MIN_RATIO * int(d)
    if pr >= PR_FLAT_FRACTION * int(d):
        return False
    return int(n) >= PR_POPULATION_MIN_RATIO * min(pr, int(d))


def interval_label(statistic: str, method: str, n: int, d: int, participation_ratio=None) -> str:
    """Label of a PCA interval naming the method used and what it targets.

    ``statistic`` is ``"pc1"``, ``"pc12"`` or ``"participation_ratio"``. A participation-ratio label says
    whether the interval covers the population PR, from the method, n and the spectrum (the sample PR
    ``participation_ratio``; :func:`pr_interval_covers_population`). A basic PC1 interval at n < d
    carries the measured caveat that a weak leading eigenvalue is covered below nominal.
    """
    _check_ci_method(method)
    check_choice(statistic, "statistic", ("pc1", "pc12", "participation_ratio"))
    label = "95% " + CI_METHOD_LABELS[method]
    n, d = int(n), int(d)
    if statistic == "pc1" and method == "basic" and n < d:
        label += ("; at n < d a weak leading eigenvalue is covered below nominal (0.61-0.78 in simulation "
                  "for eigenvalues 3-5 at n = 50-75)")
    if statistic != "participation_ratio":
        return label
    pr = None if participation_ratio is None else float(participation_ratio)
    scale = (f"{PR_POPULATION_MIN_RATIO}·PR = {PR_POPULATION_MIN_RATIO * pr:.0f}, sample PR {pr:.1f}"
             if pr is not None and np.isfinite(pr) else f"{PR_POPULATION_MIN_RATIO}·d, d = {d}")
    if pr_interval_covers_population(n, d, method, pr):
        return label + f"; approximately covers the population PR (n = {n} ≥ {scale}; 0.8-0.9 in simulation)"
    if method != "basic":
        why = f"the {method} interval is not centred on the population value at any n"
    elif pr is not None and np.isfinite(pr) and pr >= PR_FLAT_FRACTION * d:
        why = f"nearly flat spectrum: sample PR {pr:.1f} ≥ {PR_FLAT_FRACTION}·d, d = {d}"
    else:
        why = f"n = {n} < {scale}"
    return label + f"; describes the same-n statistic only, does not cover the population PR ({why})"
