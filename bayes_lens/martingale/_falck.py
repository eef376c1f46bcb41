"""Falck et al. (ICML 2024) martingale checks by predictive resampling.

Given data x_{1:n} ~ Bernoulli(θ) (seeded), K continuation paths z_{n+1:n+N} are sampled from the
predictive itself (our own seeded loop: at each step one batched pass over the K paths, then
z ~ Bernoulli(P(next = 1 | x, z_{<j})); no ``model.generate``). For a Bayesian (exchangeable)
predictive the paths are exchangeable and their limit is the posterior, so:

* T₁ = mean over paths of [mean of g(z) over the first half − over the second half], g(z) = z: ≈ 0;
* T₂(lag) = mean over paths of [acf(lag) − acf(1)], lags 2–5: ≈ 0 (exchangeable sequences have equal
  autocorrelation at every lag);
* T₃ = IQR across paths of the per-path continuation means: the posterior spread, shrinking like
  n^(−1/2) over n (its log-log slope is reported per (θ, N/n)).

Reference bands: the same statistics for K paths drawn from the exact Bayes predictive given the data,
i.e. θ_k ~ Beta(n·p̂ + 1, n(1 − p̂) + 1), z i.i.d. Bernoulli(θ_k), over ``n_ref`` simulated replicates
(2.5% and 97.5% quantiles). Falck et al.'s settings: θ ∈ {0.3, 0.5, 0.7}, n ∈ {20, 50, 100},
N/n ∈ {0.5, 2}. Paths for the smaller N/n are prefixes of those for the largest (sampling is sequential,
so they are exactly distributed as shorter paths).

Two definitions (``definition=``):

* ``"library"`` (default) — the statistics above: T₂ is the per-path, mean-centred sample
  autocorrelation averaged over paths; every path is kept; every band comes from the posterior given
  the data. Each path's centring removes its own θ, so T₂ measures serial dependence within paths
  and is not diluted by the spread of θ across paths.
* ``"falck"`` — the definitions of Falck et al.'s public code (github.com/meta-inf/bayes_icl,
  ``plotting.py``/``agg_plot.py``), reproduced from their description: paths whose mean |z| is an
  outlier (outside [Q1 − 1.5·IQR, Q3 + 1.5·IQR] across paths) are dropped first (the reference
  paths are not filtered); T₁ = pooled mean of the first ⌊N/2⌋ symbols − pooled mean of the rest;
  T₂(lag) = ρ(lag) − ρ(1) with the pooled, uncentred ρ(k) = E[z_{t+k} z_t] / (10⁻⁵ + E[z²]), where
  E[z_{t+k} z_t] is the mean over paths of each path's lag-k product mean after dropping outlying
  paths (the same 1.5·IQR rule) and E[z²] is taken over positions k … N−k−1 of every path; the T₁
  band comes from the posterior *matched to the paths' mean* (Beta(n·z̄ + 1, n(1 − z̄) + 1), so a
  model whose paths drift in level is not penalised on T₁), and the T₂ band of every lag is the band
  of the first lag (under exchangeability the differences are identically distributed); T₃ as above.
  As in the reference code (``.astype('f')`` of the posterior completions), every ``"falck"``
  statistic is computed in **float32**, for the model's paths and the reference paths alike. The cast
  is not cosmetic: per-path lag-product means take few distinct values, many of them exactly on a
  Tukey fence, and float32 arithmetic of the fences (NumPy ≥ 2 keeps ``q1 − 1.5·iqr`` in float32)
  moves some across it. At n = 50, k = 15, N = 25, K = 48 (three seeds × 2,000 replicates) the T₂
  band is [−0.083, 0.088] in float32 against [−0.076, 0.080] in float64, about 10% wider. Under
  NumPy 1.x promotion (fences formed in float64, then compared in float32) the same code gives the
  float64 band, [−0.075, 0.080]: which band the reference code produced depends on its NumPy.

Example
-------
>>> from bayes_lens.martingale import falck_checks, laplace
>>> res = falck_checks(laplace, thetas=(0.5,), ns=(20,), ratios=(2,), n_paths=20, n_ref=200, seed=0)
>>> res.table.shape[0] >= 1
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Int

from .._progress import progress as progress_bar
from .._results import Result, fmt, fmt_pct, plotly
from .._validate import check_choice, check_count, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ..metrics.stats import keyed_rng, keyed_seed
from ._predict import BernoulliTemplate, predict_with_next

__all__ = ["FalckResult", "falck_checks", "resample_paths", "t1", "t2", "t3", "drop_outlier_paths", "falck_statistics",
           "DEFINITIONS"]

DEFINITIONS = ("library", "falck")


def _check_definition(definition: str) -> str:
    # 'library': per-path centred T2, all paths, data-posterior bands; 'falck': Falck et al.'s pooled
    # uncentred T2, outlier paths dropped.
    return check_choice(definition, "definition", DEFINITIONS)


def _iqr_keep(a: np.ndarray) -> np.ndarray:
    """Mask of values inside [Q1 − 1.5·IQR, Q3 + 1.5·IQR] (Tukey's fences)."""
    q1, q3 = np.quantile(a, [0.25, 0.75])
    iqr = q3 - q1
    return (q1 - 1.5 * iqr <= a) & (a <= q3 + 1.5 * iqr)


_FALCK_DTYPE = np.float32  # the reference code's completions are float32 (``.astype('f')``)


def drop_outlier_paths(z: Int[np.ndarray, "n_paths seq_len"]) -> Int[np.ndarray, "n_kept seq_len"]:
    """Paths [K, N] whose mean |z| lies inside Tukey's fences across paths (Falck et al.'s filter).

    Computed in float32, as the reference code does (its completions are float32); returns float32.
    """
    z = np.asarray(z, dtype=_FALCK_DTYPE)
    return z[_iqr_keep(np.abs(z).mean(1))]


def t1(z: np.ndarray, definition: str = "library") -> float:
    """Mean over paths of (first-half mean − second-half mean) of z [K, N].

    ``"library"``: halves of ⌊N/2⌋ symbols each (an odd last symbol is left out); ``"falck"``: pooled
    mean of the first ⌊N/2⌋ symbols minus pooled mean of the remaining ⌈N/2⌉.
    """
    h = z.shape[1] // 2
    if _check_definition(definition) == "falck":
        z = np.asarray(z, dtype=_FALCK_DTYPE)
        return float(z[:, :h].mean() - z[:, h:].mean())
    return float((z[:, :h].mean(1) - z[:, h: 2 * h].mean(1)).mean())


def _falck_acf(z: np.ndarray, lag: int) -> float:
    if z.shape[1] <= 2 * lag:  # no positions lag … N−lag−1 for E[z²] (the reference code gives NaN too)
        return float("nan")
    prod = (z[:, lag:] * z[:, :-lag]).mean(1)
    prod = prod[_iqr_keep(prod)]
    return float(prod.mean() / (1e-5 + (z[:, lag:-lag] ** 2).mean()))


def _acf(z: np.ndarray, lag: int) -> np.ndarray:
    c = z - z.mean(1, keepdims=True)
    den = (c * c).sum(1)
    num = (c[:, :-lag] * c[:, lag:]).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def t2(z: np.ndarray, lags: Sequence[int] = (2, 3, 4, 5), definition: str = "library") -> np.ndarray:
    """acf(lag) − acf(1), per lag.

    ``"library"``: mean over paths of the per-path, mean-centred sample autocorrelation (constant
    paths are skipped). ``"falck"``: pooled, uncentred ρ(k) = E[z_{t+k} z_t] / (10⁻⁵ + E[z²]) with
    outlying per-path lag products dropped (see the module docstring), computed in float32 as the
    reference code does.
    """
    if _check_definition(definition) == "falck":
        z = np.asarray(z, dtype=_FALCK_DTYPE)
        r1 = _falck_acf(z, 1)
        return np.asarray([_falck_acf(z, int(lag)) - r1 for lag in lags])
    a1 = _acf(z, 1)
    out = []
    for lag in lags:
        d = _acf(z, lag) - a1
        out.append(float(np.nanmean(d)) if np.isfinite(d).any() else float("nan"))
    return np.asarray(out)


def t3(z: np.ndarray) -> float:
    """IQR across paths of the per-path means."""
    m = z.mean(1)
    q75, q25 = np.quantile(m, [0.75, 0.25])
    return float(q75 - q25)


def falck_statistics(z: Int[np.ndarray, "n_paths seq_len"], lags: Sequence[int] = (2, 3, 4, 5),
                     definition: str = "library") -> dict:
    """T₁, T₂ (one value per lag) and T₃ of continuation paths ``z`` [K, N] under ``definition``.

    With ``definition="falck"`` the paths are first filtered by :func:`drop_outlier_paths`, as
    :func:`falck_checks` does, and everything is computed in float32 (the reference code's dtype);
    ``"K"`` is the number of paths used.
    """
    z = np.asarray(z, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        raise InvalidInputError(f"paths must be a [K, N] array with N >= 2, got shape {list(z.shape)}.")
    if _check_definition(definition) == "falck":
        z = drop_outlier_paths(z)
    return {"T1": t1(z, definition), "T2": t2(z, lags, definition), "T3": t3(z), "K": int(z.shape[0])}


def resample_paths(model, data: Int[np.ndarray, "n_data"], n_paths: int, seq_len: int, *, seed: int = 0,
                   template: Optional[BernoulliTemplate] = None,
                   batch_size: int = 8) -> Int[np.ndarray, "n_paths seq_len"]:
    """Sample ``n_paths`` continuations of ``seq_len`` symbols after ``data`` from the model's predictive.

    Returns int array [n_paths, seq_len]. One batched pass per step (no KV cache: cost grows as
    seq_len × (len(data) + seq_len)).
    """
    seed = check_seed(seed)
    n_paths = check_positive_int(n_paths, "n_paths")
    length = check_positive_int(seq_len, "seq_len")
    batch_size = check_count(batch_size, "batch_size")
    rng = np.random.default_rng(seed)
    data = np.asarray(data, dtype=np.int64).ravel()
    state = np.tile(data, (n_paths, 1))
    for _ in range(length):
        p1, _ = predict_with_next(model, state, template=template, batch_size=batch_size, progress=False)
        pn = p1[:, -1]
        if not np.all(np.isfinite(pn)):
            raise InvalidInputError("the predictive is NaN after the data; check the template/model.")
        z = (rng.random(n_paths) < pn).astype(np.int64)
        state = np.concatenate([state, z[:, None]], axis=1)
    return state[:, data.size:]


def _reference(n: int, k1: float, n_paths: int, length: int, lags, n_ref: int, rng: np.random.Generator,
               definition: str = "library"):
    th = rng.beta(k1 + 1, n - k1 + 1, size=(n_ref, n_paths))
    z = (rng.random((n_ref, n_paths, length)) < th[..., None]).astype(
        _FALCK_DTYPE if definition == "falck" else np.float64)
    T1 = np.array([t1(zz, definition) for zz in z])
    T2 = np.array([t2(zz, lags, definition) for zz in z])
    T3 = np.array([t3(zz) for zz in z])
    return T1, T2, T3


@dataclass(frozen=True, eq=False)
class FalckResult(Result):
    """``table``: one row per (θ, n, N/n, statistic) with the model value, the Bayes band and whether
    the value lies inside; ``t3_slopes``: log-log slope of T₃ vs n (Bayes: about −0.5)."""

    table: pd.DataFrame
    t3_slopes: pd.DataFrame
    n_paths: int
    n_ref: int
    seed: int
    definition: str = "library"

    def _summary(self):
        title = f"{len(self.table)} (setting, statistic) rows, {self.n_paths} paths, {self.n_ref} reference draws"
        rows = [("inside the Bayes band", fmt_pct(self.fraction_inside), "", f"definition {self.definition!r}")]
        if "slope" in self.t3_slopes:
            s = self.t3_slopes["slope"]
            rows.append(("T3 log-log slope vs n", fmt(s.mean()), f"[{fmt(s.min())}, {fmt(s.max())}]",
                         "range over settings; Bayes about -0.5"))
        return title, rows

    def to_dataframe(self) -> pd.DataFrame:
        return self.table.copy()

    @property
    def fraction_inside(self) -> float:
        """Fraction of (setting, statistic) rows whose model value lies inside the Bayes band."""
        v = self.table.inside.dropna()
        return float(v.mean()) if len(v) else float("nan")

    def plot(self):
        go = plotly()
        t = self.table
        labels = [f"{r.statistic} θ={r.theta} n={r.n} N/n={r.ratio}" for r in t.itertuples()]
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=t.value, y=labels, mode="markers", name="model"))
        fig.add_trace(go.Scatter(x=t.band_low, y=labels, mode="markers", marker_symbol="line-ns-open",
                                 name="Bayes band low"))
        fig.add_trace(go.Scatter(x=t.band_high, y=labels, mode="markers", marker_symbol="line-ns-open",
                                 name="Bayes band high"))
        fig.update_layout(title="Falck et al. checks vs Beta-posterior bands", xaxis_title="statistic")
        return fig


def falck_checks(model, *, thetas: Sequence[float] = (0.3, 0.5, 0.7), ns: Sequence[int] = (20, 50, 100),
                 ratios: Sequence[float] = (0.5, 2.0), n_paths: int = 50, lags: Sequence[int] = (2, 3, 4, 5),
                 n_ref: int = 1000, seed: int = 0, template: Optional[BernoulliTemplate] = None,
                 batch_size: int = 8, definition: str = "library", progress: Optional[bool] = None) -> FalckResult:
    """T₁, T₂, T₃ by predictive resampling for every (θ, n, N/n), each against its Beta-posterior band.

    ``definition="library"`` (default) or ``"falck"`` (Falck et al.'s reference definitions: outlier
    paths dropped, pooled uncentred T₂, T₁ band matched to the paths' mean); see the module docstring.
    The table's ``n_paths_used`` column is K after any outlier dropping, ``band_source`` says which
    posterior each band came from.
    """
    _check_definition(definition)
    seed = check_seed(seed)
    n_paths = check_int(n_paths, "n_paths", min=2)  # K >= 2 for a spread
    n_ref = check_int(n_ref, "n_ref")
    batch_size = check_positive_int(batch_size, "batch_size")
    thetas, ns, ratios = list(thetas), [int(n) for n in ns], sorted(float(r) for r in ratios)
    lags = [int(l) for l in lags]
    if not thetas or not ns or not ratios:
        raise InvalidInputError("thetas, ns and ratios must be non-empty.")
    if any(not 0 < t < 1 for t in thetas):
        raise InvalidInputError(f"every θ must be in (0, 1), got {thetas}.")
    if min(ns) < 3:
        raise InvalidInputError(f"every n must be >= 3, got {min(ns)}.")
    if min(ratios) <= 0:
        raise InvalidInputError(f"every N/n ratio must be positive, got {ratios}.")
    if not lags or min(lags) < 2:
        raise InvalidInputError(f"lags must be >= 2 (they are compared with lag 1), got {lags}.")
    for n in ns:
        if int(round(min(ratios) * n)) < max(lags) + 2:
            raise InvalidInputError(
                f"the shortest path (N = {min(ratios)}·{n}) must exceed the largest lag + 1 ({max(lags) + 1}); "
                "raise n or the ratio, or use smaller lags."
            )
    rng = np.random.default_rng(seed)
    rows = []
    settings = [(th, n) for th in thetas for n in ns]
    for i, (th, n) in enumerate(progress_bar(settings, desc="Falck checks", enabled=progress, unit="setting")):
        data = (rng.random(n) < th).astype(np.int64)
        k1 = int(data.sum())
        n_max = int(round(max(ratios) * n))
        paths = resample_paths(model, data, n_paths, n_max, seed=keyed_seed(seed, 1000, i), template=template,
                               batch_size=batch_size).astype(np.float64)
        for r in ratios:
            N = int(round(r * n))
            z = paths[:, :N]
            if definition == "library":
                ref1, ref2, ref3 = _reference(n, k1, n_paths, N, lags, n_ref, keyed_rng(seed, 7, i, N))
                v2 = t2(z, lags)
                vals = [("T1", float("nan"), t1(z), ref1, "data"), ("T3", float("nan"), t3(z), ref3, "data")]
                vals += [("T2", lag, v2[j], ref2[:, j], "data") for j, lag in enumerate(lags)]
            else:
                z = drop_outlier_paths(z)
                k_used = z.shape[0]
                ss = [np.random.SeedSequence([seed, i, N, j]) for j in (0, 1)]
                _, ref2, ref3 = _reference(n, k1, k_used, N, lags, n_ref, np.random.default_rng(ss[0]), "falck")
                ref1 = _reference(n, n * float(z.mean()), k_used, N, lags, n_ref, np.random.default_rng(ss[1]),
                                  "falck")[0]
                v2 = t2(z, lags, "falck")
                vals = [("T1", float("nan"), t1(z, "falck"), ref1, "paths' mean"),
                        ("T3", float("nan"), t3(z), ref3, "data")]
                vals += [("T2", lag, v2[j], ref2[:, 0], f"data, lag {lags[0]}") for j, lag in enumerate(lags)]
            for stat, lag, v, ref, source in vals:
                ref = ref[np.isfinite(ref)]
                lo, hi = (np.quantile(ref, [0.025, 0.975]) if ref.size else (np.nan, np.nan))
                p_two = (float(min(1.0, 2 * min(np.mean(ref <= v), np.mean(ref >= v)) + 1.0 / (ref.size + 1)))
                         if ref.size and np.isfinite(v) else float("nan"))
                rows.append({"theta": th, "n": n, "ratio": r, "N": N, "p_hat": k1 / n, "statistic": stat, "lag": lag,
                             "value": v, "band_low": float(lo), "band_high": float(hi),
                             "reference_mean": float(ref.mean()) if ref.size else float("nan"),
                             "inside": bool(lo <= v <= hi) if np.isfinite(v) and np.isfinite(lo) else np.nan,
                             "p_value": p_two, "n_paths_used": int(z.shape[0]), "band_source": source,
                             "definition": definition})
    table = pd.DataFrame(rows)
    slopes = []
    t3rows = table[table.statistic == "T3"]
    for (th, r), grp in t3rows.groupby(["theta", "ratio"]):
        grp = grp.sort_values("n")
        ok = (grp.value > 0) & (grp.reference_mean > 0)
        if ok.sum() >= 2:
            sm = float(np.polyfit(np.log(grp.n[ok]), np.log(grp.value[ok]), 1)[0])
            sr = float(np.polyfit(np.log(grp.n[ok]), np.log(grp.reference_mean[ok]), 1)[0])
        else:
            sm = sr = float("nan")
        slopes.append({"theta": th, "ratio": r, "t3_slope_model": sm, "t3_slope_bayes": sr, "theory": -0.5})
    return FalckResult(table=table, t3_slopes=pd.DataFrame(slopes), n_paths=n_paths, n_ref=n_ref, seed=seed,
                       definition=definition)
