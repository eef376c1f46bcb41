"""Permutation averaging (Paper B §5.2): the predictive averaged over k random orderings of the prefix.

For each of ``n_seqs`` i.i.d. Bernoulli(p) prefixes x_{1:n}, ``n_perms`` random orderings are scored
in one batched call (include the predictive after the whole prefix), giving P_j = P(next = 1 | π_j(x)).

Headline: the SD across orderings at k = 1 (``sd_k1``, averaged over sequences, bootstrap CI over
sequences). An exchangeable predictor gives the same P_j for every ordering, so its SD is exactly 0:
the reference ``exchangeable_sd_k1`` is Laplace's rule ((k+1)/(n+2)) scored on the *same* orderings
(0 up to rounding), and ``sd_k1`` − reference is the order sensitivity of the model. To give it a
scale, ``sd_k1_over_posterior_sd`` divides each sequence's SD by the SD of the Beta(k+1, n−k+1)
posterior of θ (how large the ordering noise is next to the Bayesian uncertainty). Next to it,
``mean_abs_dev_from_uniform_bayes`` is |mean over orderings − Laplace|, the distance of the
ordering-averaged predictive from the **uniform-prior** Bayesian (Laplace's rule). It is not a
distance from "Bayes" in general: an exact Bayesian with another prior is not at 0 (on the default
design, n = 30, 16 sequences: Krichevsky–Trofimov 0.0021, Beta(2, 5) 0.034).
``mean_abs_dev_from_laplace`` is the same number under its earlier name (kept as an alias).

Numerical floor. A predictor that is exchangeable in exact arithmetic but computed in floating point
(a Bayesian mixture, a float32 or bfloat16 model) gives orderings that differ by rounding, so its SD
at k = 1 is tiny but not 0, and a slope of rounding noise would be reported (−0.84 and −0.51 were
seen for float64 and float32 mixtures). ``numerical_floor_sd`` estimates the SD rounding alone can
produce, the larger of (a) √n · eps · mean P, eps of the predictive's working precision (``precision=``
when the caller states it; otherwise the coarsest of the model's ``cfg.dtype`` or the dtype a
predictor returns, and the precision the values themselves show: values that are all exactly
representable in float32, float16 or bfloat16 were computed in it, as a float32 computation returned
as float64 is — a float64 computation gives a value exactly representable in float32 with
probability ≈ 2⁻²⁹, so only a predictor whose outputs are short dyadic fractions, e.g. k/32, is
mistaken for a low precision, which ``precision="float64"`` overrides; for a three-component Beta mixture updated in
sequence the measured SD was 0.11–0.15 of this in float64, float32 and float16) and (b) the spread
from re-scoring some orderings in another batch layout (reversed order, another batch size; the
RMS difference / √2). When ``sd_k1`` is at or below the floor, ``at_numerical_floor`` is True and
``slope`` (value and interval) is NaN (the fitted value stays in ``slope_raw``): there is no order
sensitivity above rounding to take a slope of.

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
``mean_abs_dev_from_uniform_bayes`` (distance of the average from the uniform-prior Bayesian) measure.

Example
-------
>>> from bayes_lens.martingale import permutation_average, laplace
>>> res = permutation_average(laplace, seq_len=20, n_seqs=4, n_perms=16, ks=(1, 2, 4, 8), n_boot=0)
>>> float(res.sd_k1), float(res.per_k.sd.max())
(0.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from .._results import Estimate, Result, fmt, fmt_ci, plotly
from ..metrics.stats import bootstrap_indices, percentile_interval
from .._validate import check_choice, check_count, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, is_model, predict_with_next, laplace

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
    """Headline ``sd_k1`` (SD across orderings; ``null``: the exchangeable reference, Laplace's rule
    on the same orderings, 0 up to rounding); ``per_k``: SD of the k-ordering average vs k; ``slope``
    (log-log, −0.5 by construction). ``sd_k1`` and ``slope`` are :class:`~bayes_lens.Estimate` values
    (95% percentile bootstrap over sequences)."""

    per_k: pd.DataFrame  # k, sd, sd_ci_low, sd_ci_high
    slope: Estimate
    theory_slope: float
    paper_b_slope: float
    predictive: np.ndarray  # [n_seqs, n_perms] P(next=1 | ordering)
    laplace_predictive: np.ndarray  # [n_seqs] (k+1)/(n+2)
    mean_abs_dev_from_uniform_bayes: float  # mean |ordering-average − Laplace| (uniform-prior Bayesian)
    n: int
    n_seqs: int
    n_perms: int
    seed: int
    sd_k1: Estimate = Estimate(float("nan"))  # mean over sequences of the SD of P(next=1) across orderings
    exchangeable_sd_k1: float = 0.0  # the same statistic for Laplace's rule on the same orderings
    sd_k1_over_posterior_sd: float = float("nan")  # mean of SD_i / SD of the Beta(k+1, n−k+1) posterior
    numerical_floor_sd: float = 0.0  # SD across orderings that rounding alone can give (module docstring)
    rescore_sd: float = 0.0  # the part of it measured by re-scoring orderings in another batch layout
    working_dtype: str = "float64"  # precision the floor's eps is taken from (stated, declared or detected)
    at_numerical_floor: bool = False  # sd_k1 <= numerical_floor_sd: slope suppressed (NaN)
    slope_raw: float = float("nan")  # the fitted slope before suppression at the floor

    @property
    def mean_abs_dev_from_laplace(self) -> float:
        """Earlier name of :attr:`mean_abs_dev_from_uniform_bayes` (distance from Laplace's rule, the
        uniform-prior Bayesian; not 0 for exact Bayesians with other priors)."""
        return self.mean_abs_dev_from_uniform_bayes

    @property
    def sd_k1_excess(self) -> float:
        """``sd_k1`` minus the exchangeable (Laplace) reference: the order sensitivity."""
        return self.sd_k1.value - self.exchangeable_sd_k1

    def _summary(self):
        title = f"n = {self.n}, {self.n_seqs} sequences x {self.n_perms} orderings"
        return title, [
            ("SD of P(next=1) across orderings", fmt(self.sd_k1), fmt_ci(self.sd_k1),
             f"Laplace {fmt(self.exchangeable_sd_k1)}; / posterior SD {fmt(self.sd_k1_over_posterior_sd)}"),
            ("log-log slope of the k-average SD", fmt(self.slope), fmt_ci(self.slope),
             f"theory {fmt(self.theory_slope)}"),
            ("mean |P - Laplace|", fmt(self.mean_abs_dev_from_laplace), "", ""),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_k.copy()

    def plot(self):
        go = plotly()
        d = self.per_k
        fig = go.Figure(go.Scatter(x=d.k, y=d.sd, mode="markers+lines", name="SD across orderings"))
        if np.isfinite(self.slope.value) and (d.sd > 0).any():
            ref = d.sd.iloc[0] * (d.k / d.k.iloc[0]) ** -0.5
            fig.add_trace(go.Scatter(x=d.k, y=ref, name="k^-1/2", line=dict(dash="dash")))
        slope = (f"at the numerical floor {self.numerical_floor_sd:.2g}: no slope" if self.at_numerical_floor
                 else f"slope {self.slope:.3f} (−0.5 by construction)")
        fig.update_layout(title=f"Permutation averaging: SD at k = 1 {self.sd_k1:.3g} (exchangeable: 0); {slope}",
                          xaxis_type="log",
                          yaxis_type="log", xaxis_title="k orderings", yaxis_title="SD of P(next=1)")
        return fig


def permutation_average(model, *, seq_len: int = 30, n_seqs: int = 16, n_perms: int = 32,
                        ks: Sequence[int] = (1, 2, 4, 8, 16), p: float = 0.5, seed: int = 0,
                        template: Optional[BernoulliTemplate] = None, n_partitions: int = 50, n_boot: int = 1000,
                        batch_size: int = 8, precision: Optional[str] = None,
                        progress: Optional[bool] = None) -> PermutationResult:
    """SD of the predictive across random orderings of a length-``seq_len`` prefix (headline: k = 1, against the
    exchangeable reference 0) and of its average over k orderings, vs k (slope −0.5 by construction).

    ``precision`` (``"float64"``, ``"float32"``, ``"float16"`` or ``"bfloat16"``): the precision the
    predictive is computed in, for the numerical floor; default None detects it (module docstring)."""
    seed = check_seed(seed)
    precision = _check_precision(precision)
    n = check_positive_int(seq_len, "seq_len")
    n_seqs = check_positive_int(n_seqs, "n_seqs")
    n_perms = check_int(n_perms, "n_perms")
    n_partitions = check_int(n_partitions, "n_partitions")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
    ks = np.asarray(sorted({int(k) for k in ks}), dtype=np.int64)
    if ks.size == 0 or ks.min() < 1:
        raise InvalidInputError(f"every k must be >= 1 (number of orderings averaged), got {ks.tolist()}.")
    if n_perms < 2 * ks.max():
        raise InvalidInputError(
            f"n_perms ({n_perms}) must be at least 2·max(ks) = {2 * ks.max()} so that every k has two "
            "disjoint groups of orderings; raise n_perms or lower ks."
        )
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
        idx = bootstrap_indices(n_seqs, n_boot, seed=brng)
        sd1_ci = percentile_interval(sd1[idx].mean(1), min_finite=0.0)
        boot = sd[idx].mean(1)  # [n_boot, n_k]
        lo, hi = percentile_interval(boot, axis=0, min_finite=0.0)
        slope_ci = percentile_interval(np.array([_slope(ks.astype(float), b) for b in boot]))
    lap = (x.sum(1) + 1.0) / (n + 2.0)
    per_k = pd.DataFrame({"k": ks, "sd": mean_sd, "sd_ci_low": lo, "sd_ci_high": hi})
    floor, rescore, dtype = _numerical_floor(model, perms, pnext, n, n_seqs, n_perms, template=template,
                                             batch_size=batch_size, precision=precision)
    sd_k1 = float(sd1.mean())
    at_floor = bool(sd_k1 <= floor)
    slope_raw = slope
    if at_floor:
        slope, slope_ci = float("nan"), (float("nan"), float("nan"))
    method = "95% percentile bootstrap over sequences"
    exchangeable = float(lap_sd1.mean())
    return PermutationResult(per_k=per_k, slope=Estimate(slope, slope_ci, method, n=n_seqs), theory_slope=-0.5, paper_b_slope=-0.48,
                             predictive=pnext, laplace_predictive=lap,
                             mean_abs_dev_from_uniform_bayes=float(np.abs(pnext.mean(1) - lap).mean()),
                             n=n, n_seqs=n_seqs, n_perms=n_perms, seed=seed,
                             sd_k1=Estimate(sd_k1, sd1_ci, method, null=exchangeable, n=n_seqs),
                             exchangeable_sd_k1=exchangeable,
                             sd_k1_over_posterior_sd=float(np.mean(sd1 / post_sd)), numerical_floor_sd=floor,
                             rescore_sd=rescore, working_dtype=dtype, at_numerical_floor=at_floor,
                             slope_raw=slope_raw)


_RESCORE_SEQS, _RESCORE_PERMS = 4, 8


def _working_dtype(model, sample: np.ndarray) -> np.dtype:
    """The precision the predictive is computed in: a model's ``cfg.dtype``, or what a predictor returns."""
    import torch

    if is_model(model):
        dt = getattr(model.cfg, "dtype", torch.float32)
        return np.dtype(str(dt).replace("torch.", "")) if dt != torch.bfloat16 else "bfloat16"
    out = model(sample)
    dt = out.dtype if hasattr(out, "dtype") else np.asarray(out).dtype
    if isinstance(dt, torch.dtype):
        return "bfloat16" if dt == torch.bfloat16 else np.dtype(str(dt).replace("torch.", ""))
    dt = np.dtype(dt)
    return dt if dt.kind == "f" else np.dtype(np.float64)


#: Precisions a floor can be taken in, finest first, with their machine epsilon.
_EPS = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps),
        "float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0 ** -7}


def _check_precision(precision) -> Optional[str]:
    if precision is None:
        return None
    name = str(precision).replace("torch.", "")
    return check_choice(name, "precision", list(_EPS))  # or None to detect it


def _value_precision(values: np.ndarray) -> str:
    """The coarsest of bfloat16, float16, float32 in which every finite value is exactly representable
    ("float64" when none): a computation in a lower precision returned as float64 keeps that precision's
    values. bfloat16 is float32 with its 16 low mantissa bits zero."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "float64"
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = v.astype(np.float32)
        if not np.array_equal(f32.astype(np.float64), v):
            return "float64"
        fits16 = np.array_equal(v.astype(np.float16).astype(np.float64), v)
    fits_bf16 = not np.any(f32.view(np.uint32) & np.uint32(0xFFFF))
    if fits_bf16:
        return "bfloat16"
    return "float16" if fits16 else "float32"


def _numerical_floor(model, perms: np.ndarray, pnext: np.ndarray, n: int, n_seqs: int, n_perms: int, *,
                     template, batch_size: int, precision: Optional[str] = None):
    """(floor, rescore part, dtype name): the SD across orderings rounding alone can give."""
    rows = np.concatenate([np.arange(i * n_perms, i * n_perms + min(n_perms, _RESCORE_PERMS))
                           for i in range(min(n_seqs, _RESCORE_SEQS))])[::-1]  # another order ...
    p_again, _ = predict_with_next(model, perms[rows], template=template,
                                   batch_size=max(1, batch_size - 1) if batch_size > 1 else 2,  # ... and batches
                                   progress=False)
    diff = p_again[:, -1] - pnext.reshape(-1)[rows]
    rescore = float(np.sqrt(np.mean(diff ** 2) / 2.0)) if np.all(np.isfinite(diff)) else 0.0
    if precision is None:  # the coarser of the declared dtype and the precision the values show
        declared = str(_working_dtype(model, np.concatenate([perms[:1], np.zeros((1, 1), dtype=np.int64)], axis=1)))
        declared = declared if declared in _EPS else "float64"
        precision = max((declared, _value_precision(pnext)), key=lambda d: _EPS[d])
    from_eps = float(np.sqrt(n) * _EPS[precision] * np.nanmean(pnext))
    return max(from_eps, rescore), rescore, precision
