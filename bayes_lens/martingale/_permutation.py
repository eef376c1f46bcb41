"""Permutation averaging (Paper B §5.2): the predictive averaged over k random orderings of the prefix.

For each of ``n_seqs`` i.i.d. Bernoulli(p) prefixes x_{1:n}, ``n_perms`` random orderings are scored
in one batched call (include the predictive after the whole prefix), giving P_j = P(next = 1 | π_j(x)).

Headline: the SD across orderings at k = 1 (``sd_k1``, averaged over sequences, bootstrap CI over
sequences). An exchangeable predictor gives the same P_j for every ordering, so its SD is exactly 0:
the reference ``exchangeable_sd_k1`` is Laplace's rule ((k+1)/(n+2)) scored on the *same* orderings
(0 up to rounding), and ``sd_k1`` − reference is the order sensitivity of the model. To give it a
scale, ``sd_k1_over_posterior_sd`` divides each sequence's SD by the SD of the Beta(k+1, n−k+1)
posterior of θ (how large the ordering noise is next to the Bayesian uncertainty). Next to it,
``mean_abs_dev_from_laplace`` is |mean over orderings − Laplace|: whether the ordering-averaged
predictive is Bayes ("in expectation").

What the slope can and cannot say. The SD of the mean of k orderings is also estimated for each k
(without finite-pool bias, from disjoint groups of k orderings over many random partitions of the
pool, variances averaged, then averaged over sequences), and the slope of log SD vs log k is fitted
with a bootstrap CI over sequences (Paper B: −0.48, CI [−0.52, −0.44]). Because the orderings are
drawn independently, the k-ordering mean of *any* predictor has SD = SD(k = 1)/√k, so the slope is
−0.5 by construction: an order-dependent "recency" predictor gives −0.50 just like a model with
tiny position noise, and an exchangeable predictor has no slope (SD 0). The slope therefore only
checks the design and the estimator (a slope away from −0.5 means correlated orderings or a biased
SD estimate) and tells how many orderings an average needs; it says nothing about whether the model
is exchangeable or Bayesian. That is what ``sd_k1`` (order sensitivity) and
``mean_abs_dev_from_laplace`` (distance of the average from Bayes) measure.

Example
-------
>>> from bayes_lens.martingale import permutation_average, laplace
>>> res = permutation_average(laplace, n=20, n_seqs=4, n_perms=16, ks=(1, 2, 4, 8), n_boot=0)
>>> float(res.sd_k1), float(res.per_k.sd.max())
(0.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from .._results import Result, fmt, fmt_ci, plotly
from ..metrics.stats import bootstrap_indices, percentile_interval
from .._validate import check_int, check_nonneg_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, predict_with_next, laplace

__all__ = ["PermutationResult", "permutation_average"]


def _group_sd(values: np.ndarray, k: int, n_partitions: int, rng: np.random.Generator) -> float:
    """SD of the mean of k draws, from disjoint groups of the pool ``values`` (random partitions)."""
    m = values.size // k
    if m < 2:
        return float("nan")
    var = []
    for _ in range(n_partitions):
        idx = rng.permutation(values.size)[: m * k].reshape(m, k)
        var.append(values[idx].mean(1).var(ddof=1))
    return float(np.sqrt(np.mean(var)))


def _slope(ks: np.ndarray, sd: np.ndarray) -> float:
    ok = np.isfinite(sd) & (sd > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(ks[ok]), np.log(sd[ok]), 1)[0])


@dataclass(frozen=True, eq=False)
class PermutationResult(Result):
    """Headline ``sd_k1`` (SD across orderings, exchangeable reference 0) with ``sd_k1_ci``; ``per_k``:
    SD of the k-ordering average vs k; ``slope`` (log-log, −0.5 by construction) with ``slope_ci``."""

    per_k: pd.DataFrame  # k, sd, sd_ci_low, sd_ci_high
    slope: float
    slope_ci: Tuple[float, float]
    theory_slope: float
    paper_b_slope: float
    predictive: np.ndarray  # [n_seqs, n_perms] P(next=1 | ordering)
    laplace_predictive: np.ndarray  # [n_seqs] (k+1)/(n+2)
    mean_abs_dev_from_laplace: float
    n: int
    n_seqs: int
    n_perms: int
    seed: int
    sd_k1: float = float("nan")  # mean over sequences of the SD of P(next=1) across orderings
    sd_k1_ci: Tuple[float, float] = (float("nan"), float("nan"))
    exchangeable_sd_k1: float = 0.0  # the same statistic for Laplace's rule on the same orderings
    sd_k1_over_posterior_sd: float = float("nan")  # mean of SD_i / SD of the Beta(k+1, n−k+1) posterior

    @property
    def sd_k1_excess(self) -> float:
        """``sd_k1`` minus the exchangeable (Laplace) reference: the order sensitivity."""
        return self.sd_k1 - self.exchangeable_sd_k1

    def _summary(self):
        title = f"n = {self.n}, {self.n_seqs} sequences x {self.n_perms} orderings"
        return title, [
            ("SD of P(next=1) across orderings", fmt(self.sd_k1), fmt_ci(self.sd_k1_ci),
             f"Laplace {fmt(self.exchangeable_sd_k1)}; / posterior SD {fmt(self.sd_k1_over_posterior_sd)}"),
            ("log-log slope of the k-average SD", fmt(self.slope), fmt_ci(self.slope_ci),
             f"theory {fmt(self.theory_slope)}"),
            ("mean |P - Laplace|", fmt(self.mean_abs_dev_from_laplace), "", ""),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_k.copy()

    def plot(self):
        go = plotly()
        d = self.per_k
        fig = go.Figure(go.Scatter(x=d.k, y=d.sd, mode="markers+lines", name="SD across orderings"))
        if np.isfinite(self.slope) and (d.sd > 0).any():
            ref = d.sd.iloc[0] * (d.k / d.k.iloc[0]) ** -0.5
            fig.add_trace(go.Scatter(x=d.k, y=ref, name="k^-1/2", line=dict(dash="dash")))
        fig.update_layout(title=f"Permutation averaging: SD at k = 1 {self.sd_k1:.3g} (exchangeable: 0); "
                                f"slope {self.slope:.3f} (−0.5 by construction)", xaxis_type="log",
                          yaxis_type="log", xaxis_title="k orderings", yaxis_title="SD of P(next=1)")
        return fig


def permutation_average(model, *, n: int = 30, n_seqs: int = 16, n_perms: int = 32,
                        ks: Sequence[int] = (1, 2, 4, 8, 16), p: float = 0.5, seed: int = 0,
                        template: Optional[BernoulliTemplate] = None, n_partitions: int = 50, n_boot: int = 1000,
                        batch_size: int = 8, progress: Optional[bool] = None) -> PermutationResult:
    """SD of the predictive across random orderings of a length-``n`` prefix (headline: k = 1, against the
    exchangeable reference 0) and of its average over k orderings, vs k (slope −0.5 by construction)."""
    seed = check_seed(seed)
    n = check_int(n, "n")
    n_seqs = check_int(n_seqs, "n_seqs")
    n_perms = check_int(n_perms, "n_perms")
    n_partitions = check_int(n_partitions, "n_partitions")
    n_boot = check_nonneg_int(n_boot, "n_boot")
    batch_size = check_positive_int(batch_size, "batch_size")
    if n < 1:
        raise InvalidInputError(f"n (prefix length) must be >= 1, got {n}.")
    ks = np.asarray(sorted({int(k) for k in ks}), dtype=np.int64)
    if ks.size == 0 or ks.min() < 1:
        raise InvalidInputError(f"every k must be >= 1 (number of orderings averaged), got {ks.tolist()}.")
    if n_perms < 2 * ks.max():
        raise InvalidInputError(
            f"n_perms ({n_perms}) must be at least 2·max(ks) = {2 * ks.max()} so that every k has two "
            "disjoint groups of orderings; raise n_perms or lower ks."
        )
    if n_seqs < 1:
        raise InvalidInputError(f"n_seqs must be >= 1, got {n_seqs}.")
    rng = np.random.default_rng(seed)
    x = (rng.random((n_seqs, n)) < p).astype(np.int64)
    perms = np.stack([x[i][rng.permutation(n)] for i in range(n_seqs) for _ in range(n_perms)])
    p1, _ = predict_with_next(model, perms, template=template, batch_size=batch_size, progress=progress,
                               desc="permutation average")
    pnext = p1[:, -1].reshape(n_seqs, n_perms)
    sd1 = pnext.std(axis=1, ddof=1)  # per sequence, k = 1
    lap_sd1 = predict_with_next(laplace, perms)[0][:, -1].reshape(n_seqs, n_perms).std(axis=1, ddof=1)
    ones = x.sum(1).astype(np.float64)
    a, b = ones + 1.0, n - ones + 1.0
    post_sd = np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0)))
    prng = np.random.default_rng(seed + 1)
    sd = np.array([[_group_sd(pnext[i], int(k), n_partitions, prng) for k in ks] for i in range(n_seqs)])
    mean_sd = sd.mean(0)
    slope = _slope(ks.astype(float), mean_sd)
    lo = hi = np.full(ks.size, np.nan)
    slope_ci = sd1_ci = (float("nan"), float("nan"))
    if n_boot and n_seqs >= 2:
        brng = np.random.default_rng(seed + 2)
        idx = bootstrap_indices(n_seqs, n_boot, brng)
        sd1_ci = percentile_interval(sd1[idx].mean(1), min_finite=0.0)
        boot = sd[idx].mean(1)  # [n_boot, n_k]
        lo, hi = percentile_interval(boot, axis=0, min_finite=0.0)
        slope_ci = percentile_interval(np.array([_slope(ks.astype(float), b) for b in boot]))
    lap = (x.sum(1) + 1.0) / (n + 2.0)
    per_k = pd.DataFrame({"k": ks, "sd": mean_sd, "sd_ci_low": lo, "sd_ci_high": hi})
    return PermutationResult(per_k=per_k, slope=slope, slope_ci=slope_ci, theory_slope=-0.5, paper_b_slope=-0.48,
                             predictive=pnext, laplace_predictive=lap,
                             mean_abs_dev_from_laplace=float(np.abs(pnext.mean(1) - lap).mean()),
                             n=n, n_seqs=n_seqs, n_perms=n_perms, seed=seed, sd_k1=float(sd1.mean()),
                             sd_k1_ci=sd1_ci, exchangeable_sd_k1=float(lap_sd1.mean()),
                             sd_k1_over_posterior_sd=float(np.mean(sd1 / post_sd)))
