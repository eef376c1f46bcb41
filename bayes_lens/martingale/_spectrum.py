"""Positional structure of the martingale gap (Paper B §5.1): per-position series, FFT, harmonic fit.

From one pass over each of N long i.i.d. Bernoulli(p) sequences, the per-position gap

    g(n) = mean over sequences of | log P(x_n | x_{1:n−1}) − log P(x_n | x_{1:n−2}) |,  n = 3 … L

is a series over positions. Its trend is removed by least squares on A/n + c; the residual's power
spectrum (``numpy.fft.rfft``) gives the dominant periods (in symbols; × tokens-per-symbol for token
periods, where positional encodings act). The harmonic model

    g(n) = A/n + c + Σ_{k=1..K} [a_k sin(2πkn/P) + b_k cos(2πkn/P)]   (= B_k sin(2πkn/P + φ_k))

is fitted with P, the dominant period found in the spectrum (never hard-coded; Paper B reports
P = 64 with harmonics 64, 32, 21.3 explaining > 60% of positional variance for GPT-3). Reported: the
fraction of the detrended variance the harmonics explain (with a bootstrap CI over sequences) and the
debiased series g(n) − Σ harmonics. Laplace's rule on the same sequences is smooth (no periods).
A resampled mean series is noisier than the original, so the bootstrap distribution of the explained
fraction sits below the point estimate (the interval is conservative on the low side); the share of
resamples whose dominant period equals P (``period_agreement``) says how stable P is.

Example
-------
>>> from bayes_lens.martingale import positional_spectrum, laplace
>>> res = positional_spectrum(laplace, length=128, n_seqs=8, seed=0, n_boot=0)
>>> res.series.shape[0]
126
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import pandas as pd

from .._results import Result, plotly
from .._validate import check_int, check_nonneg_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, DEFAULT_TEMPLATE, _predict, _prob_of, is_model, laplace

__all__ = ["SpectrumResult", "positional_spectrum", "per_position_gap", "harmonic_fit", "dominant_periods"]


def per_position_gap(p1: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|log P(x_t | x_{<t}) − log P(x_t | x_{<t−1})| for t = 3 … L (1-based); shape [N, L − 2]."""
    a = _prob_of(p1[:, 2:], x[:, 2:])
    b = _prob_of(p1[:, 1:-1], x[:, 2:])
    with np.errstate(divide="ignore"):
        return np.abs(np.log(a) - np.log(b))


def _detrend(ns: np.ndarray, g: np.ndarray) -> np.ndarray:
    X = np.stack([1.0 / ns, np.ones_like(ns)], 1)
    beta, *_ = np.linalg.lstsq(X, g, rcond=None)
    return g - X @ beta


def dominant_periods(ns: np.ndarray, g: np.ndarray, *, top: int = 3, min_period: float = 2.0
                     ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Periods (in positions) of the ``top`` largest local maxima of the detrended series' power.

    Returns (periods, powers, (freqs, power) full spectrum stacked as [2, n_freq]).
    """
    r = _detrend(ns, g)
    r = r - r.mean()
    power = np.abs(np.fft.rfft(r)) ** 2
    freqs = np.fft.rfftfreq(r.size, d=1.0)
    ok = (freqs > 0) & (1.0 / np.where(freqs > 0, freqs, 1.0) >= min_period) & (freqs >= 2.0 / r.size)
    cand = []
    for i in np.nonzero(ok)[0]:
        left = power[i - 1] if i > 0 else -np.inf
        right = power[i + 1] if i + 1 < power.size else -np.inf
        if power[i] >= left and power[i] >= right:
            cand.append(i)
    cand = sorted(cand, key=lambda i: -power[i])[:top]
    return 1.0 / freqs[cand], power[cand], np.stack([freqs, power])


def harmonic_fit(ns: np.ndarray, g: np.ndarray, period: float, n_harmonics: int = 3) -> dict:
    """Least-squares fit of A/n + c + Σ_k (a_k sin + b_k cos)(2πkn/P); variance explained by harmonics."""
    if not np.isfinite(period) or period <= 0:
        raise InvalidInputError(f"period must be positive, got {period}.")
    base = [1.0 / ns, np.ones_like(ns)]
    harm = []
    for k in range(1, n_harmonics + 1):
        w = 2 * np.pi * k * ns / period
        harm += [np.sin(w), np.cos(w)]
    X = np.stack(base + harm, 1)
    beta, *_ = np.linalg.lstsq(X, g, rcond=None)
    harmonic = np.stack(harm, 1) @ beta[2:]
    detrended = _detrend(ns, g)
    resid = g - X @ beta
    var = float(np.var(detrended))
    explained = 1.0 - float(np.var(resid)) / var if var > 0 else float("nan")
    amps, phases = [], []
    for k in range(n_harmonics):
        a, b = beta[2 + 2 * k], beta[3 + 2 * k]
        amps.append(float(np.hypot(a, b)))
        phases.append(float(np.arctan2(b, a)))
    return {"A": float(beta[0]), "c": float(beta[1]), "amplitudes": amps, "phases": phases,
            "harmonic_periods": [period / k for k in range(1, n_harmonics + 1)],
            "explained_fraction": explained, "harmonic": harmonic}


@dataclass(frozen=True)
class SpectrumResult(Result):
    """Per-position gap series (``series``), spectrum, dominant periods and the harmonic fit."""

    series: pd.DataFrame  # position_n, gap_nats, laplace_gap_nats, harmonic_nats, debiased_gap_nats
    spectrum: pd.DataFrame  # frequency_per_symbol, period_symbols, power
    dominant_periods_symbols: Tuple[float, ...]
    period_symbols: float
    tokens_per_symbol: float
    period_tokens: float
    harmonic_periods_symbols: Tuple[float, ...]
    amplitudes_nats: Tuple[float, ...]
    phases_rad: Tuple[float, ...]
    A: float
    explained_fraction: float
    explained_fraction_ci: Tuple[float, float]
    period_agreement: float  # fraction of bootstrap resamples whose dominant period equals P
    n_seqs: int
    length: int
    seed: int

    def to_dataframe(self) -> pd.DataFrame:
        return self.series.melt(id_vars=["position_n"], var_name="series", value_name="value_nats")

    def plot(self):
        go = plotly()
        s = self.series
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=s.position_n, y=s.gap_nats, name="model gap"))
        fig.add_trace(go.Scatter(x=s.position_n, y=s.debiased_gap_nats, name="debiased"))
        fig.add_trace(go.Scatter(x=s.position_n, y=s.laplace_gap_nats, name="Laplace", line=dict(dash="dash")))
        fig.update_layout(title=f"Per-position martingale gap (dominant period {self.period_symbols:.1f} symbols)",
                          xaxis_title="position n (symbols)", yaxis_title="gap (nats)")
        return fig


def _tokens_per_symbol(model, template: BernoulliTemplate) -> float:
    if not is_model(model):
        return float("nan")
    from ._predict import _layout

    _, positions, _ = _layout(model.tokenizer, template, [0, 1, 0, 1, 1, 0])
    steps = np.diff(positions)
    return float(steps[0]) if np.all(steps == steps[0]) else float(np.mean(steps))


def positional_spectrum(model, *, length: int = 256, n_seqs: int = 32, p: float = 0.5, seed: int = 0,
                        n_harmonics: int = 3, min_period: float = 4.0, top: int = 3,
                        template: Optional[BernoulliTemplate] = None, n_boot: int = 1000, batch_size: int = 8,
                        progress: Optional[bool] = None) -> SpectrumResult:
    """Per-position gap over ``n_seqs`` i.i.d. Bernoulli(``p``) sequences of ``length`` symbols; FFT,
    dominant periods (≥ ``min_period`` symbols), harmonic fit with ``n_harmonics`` and the debiased series.
    """
    seed = check_seed(seed)
    length = check_int(length, "length")
    n_seqs = check_int(n_seqs, "n_seqs")
    n_harmonics = check_int(n_harmonics, "n_harmonics")
    top = check_positive_int(top, "top")
    n_boot = check_nonneg_int(n_boot, "n_boot")
    batch_size = check_positive_int(batch_size, "batch_size")
    if length < 16:
        raise InvalidInputError(f"length must be >= 16 symbols for a spectrum, got {length}.")
    if n_seqs < 1:
        raise InvalidInputError(f"n_seqs must be >= 1, got {n_seqs}.")
    if not 0 < p < 1:
        raise InvalidInputError(f"p must be in (0, 1), got {p}.")
    if n_harmonics < 1:
        raise InvalidInputError(f"n_harmonics must be >= 1, got {n_harmonics}.")
    rng = np.random.default_rng(seed)
    x = (rng.random((n_seqs, length)) < p).astype(np.int64)
    p1, _ = _predict(model, x, template=template, batch_size=batch_size, progress=progress,
                     desc="positional spectrum")
    d = per_position_gap(p1, x)
    if not np.all(np.isfinite(d)):
        raise InvalidInputError("the predictive is 0 or NaN for an observed symbol; cannot take logs.")
    ns = np.arange(3, length + 1, dtype=np.float64)
    g = d.mean(0)
    periods, _, spec = dominant_periods(ns, g, top=top, min_period=min_period)
    period = float(periods[0]) if periods.size else float("nan")
    if np.isfinite(period):
        hf = harmonic_fit(ns, g, period, n_harmonics)
    else:
        hf = {"A": float("nan"), "amplitudes": [], "phases": [], "harmonic_periods": [],
              "explained_fraction": float("nan"), "harmonic": np.zeros_like(g)}
    ci, agree = (float("nan"), float("nan")), float("nan")
    if n_boot and n_seqs >= 2 and np.isfinite(period):
        brng = np.random.default_rng(seed + 1)
        fr, same = [], []
        for _ in range(n_boot):
            gb = d[brng.integers(0, n_seqs, n_seqs)].mean(0)
            fr.append(harmonic_fit(ns, gb, period, n_harmonics)["explained_fraction"])
            pb, _, _ = dominant_periods(ns, gb, top=1, min_period=min_period)
            same.append(bool(pb.size) and abs(pb[0] - period) < 1e-9)
        fr = np.asarray(fr)
        fr = fr[np.isfinite(fr)]
        if fr.size:
            ci = (float(np.quantile(fr, 0.025)), float(np.quantile(fr, 0.975)))
        agree = float(np.mean(same))
    lap = per_position_gap(laplace(x), x).mean(0)
    series = pd.DataFrame({"position_n": ns.astype(int), "gap_nats": g, "laplace_gap_nats": lap,
                           "harmonic_nats": hf["harmonic"], "debiased_gap_nats": g - hf["harmonic"]})
    freqs, power = spec
    with np.errstate(divide="ignore"):
        spectrum = pd.DataFrame({"frequency_per_symbol": freqs, "period_symbols": np.where(freqs > 0, 1 / np.where(freqs > 0, freqs, 1), np.inf),
                                 "power": power})
    tps = _tokens_per_symbol(model, template or DEFAULT_TEMPLATE)
    return SpectrumResult(series=series, spectrum=spectrum, dominant_periods_symbols=tuple(float(v) for v in periods),
                          period_symbols=period, tokens_per_symbol=tps, period_tokens=period * tps,
                          harmonic_periods_symbols=tuple(hf["harmonic_periods"]),
                          amplitudes_nats=tuple(hf["amplitudes"]), phases_rad=tuple(hf["phases"]), A=hf["A"],
                          explained_fraction=hf["explained_fraction"], explained_fraction_ci=ci,
                          period_agreement=agree, n_seqs=n_seqs, length=length, seed=seed)
