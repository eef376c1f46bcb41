"""Positional structure of the martingale gap (Paper B §5.1): per-position series, FFT, harmonic fit.

From one pass over each of N long i.i.d. Bernoulli(p) sequences, the per-position gap

    g(n) = mean over sequences of | log P(x_n | x_{1:n−1}) − log P(x_n | x_{1:n−2}) |,  n = 3 … L

is a series over positions. Its trend is removed by least squares on A/n + c; the residual's power
spectrum (``numpy.fft.rfft``) gives the dominant periods (in symbols; × tokens-per-symbol for token
periods, where positional encodings act). The harmonic model

    g(n) = A/n + c + Σ_{k=1..K} [a_k sin(2πkn/P) + b_k cos(2πkn/P)]   (= B_k sin(2πkn/P + φ_k))

is fitted with P found from the data (never hard-coded; Paper B reports P = 64 with harmonics 64,
32, 21.3 explaining > 60% of positional variance for GPT-3).

Finding P. The FFT of a series of M points only has periods M/j, so its peak alone is coarse (a true
48 on M = 254 lands on 50.8, and the harmonics fitted at 50.8 explain 0.61 of a variance that 0.93
is explained at 48). P is therefore refined (``refine=True``, default) by a least-squares scan: the
harmonic model is fitted at every period of a fine grid between the FFT bins either side of the peak,
M/(j+1) … M/(j−1), and P is the period with the smallest residual sum of squares (a parabola through
the three grid points around the minimum places it between grid points). The grid step is reported
as ``period_resolution_symbols`` (the FFT's own spacing at the peak as ``period_fft_spacing_symbols``),
the raw FFT peak as ``period_fft_symbols``, and a bootstrap interval of the refined period over
sequences as ``period_symbols.ci``. ``refine=False`` gives the FFT-bin period as before.

Harmonics (``harmonic_scan=True``, default; :func:`select_period`). At low signal-to-noise the
largest FFT peak can be the second (or third) harmonic of the true period, e.g. P = 30 found as 15, and
a scan around the peak cannot leave that bracket. Rule: S = the refined period near the FFT peak P₀;
for m = 2, 3 (while m·P₀ ≤ M/2) the harmonics 1 … m−1 of L = m·S — the periods longer than S, absent
from the K-harmonic model at S — are tested in that model plus them (exactly nested: L is m·S, not a
period refined apart; q = 2(m−1) columns), each candidate at ``harmonic_level`` / (candidates
tested), Bonferroni, so a series of period S moves with probability at most ``harmonic_level``
(default 1%). The test is Hotelling's T² of the q coefficients over the i.i.d. sequences, F(q, N − q):
the gap's noise varies with the position (a periodic envelope makes it heteroscedastic with the same
period) and the mean series' F test, which assumes white noise, was liberal (7.1% moves for a pure
period-15 envelope at a nominal 1%; 0.8% now). A candidate with q ≥ N sequences is not tested. A
significant candidate must also explain ≥ 0.5% of the detrended variance (a floor against the
few-harmonic model's deterministic misfit); the smallest p-value wins and its period is refined near
m·P₀. Measured (METHODS.md §8): 1.0% false moves on 5,000 white-noise pure P = 15 series, power 76.7%
at SNR 0.3 for P = 30 (old rule 64.2%; an oracle that knows 15 and 30, 83.5%).
``period_candidates`` lists each candidate with its RSS, p-value and gain. ``period_wide`` flags a
bootstrap interval of P wider than min(5% of P, half the FFT bin spacing): the refined period is then
no better resolved than the FFT bin and should not be quoted to a decimal.

Reported: the fraction of the detrended variance the harmonics explain (with a bootstrap CI over
sequences) and the debiased series g(n) − Σ harmonics. Laplace's rule on the same sequences is smooth
(no periods). A resampled mean series is noisier than the original, so the bootstrap distribution of
the explained fraction sits below the point estimate (the interval is conservative on the low side);
the share of resamples whose FFT peak is the same bin as the original's (``period_agreement``) says
how stable the peak is.

Example
-------
>>> from bayes_lens.martingale import positional_spectrum, laplace
>>> res = positional_spectrum(laplace, seq_len=128, n_seqs=8, seed=0, n_boot=0)
>>> res.series.shape[0]
126
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import pandas as pd
from jaxtyping import Float

from .._results import Estimate, Result, fmt, fmt_ci, fmt_pct, plotly
from .._validate import check_count, check_float, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, DEFAULT_TEMPLATE, predict_array, prob_of, is_model, laplace

__all__ = ["SpectrumResult", "positional_spectrum", "per_position_gap", "harmonic_fit", "dominant_periods",
           "refine_period", "select_period", "AutocorrelatedNoiseWarning", "residual_autocorrelation"]


def per_position_gap(p1: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|log P(x_t | x_{<t}) − log P(x_t | x_{<t−1})| for t = 3 … L (1-based); shape [N, L − 2]."""
    a = prob_of(p1[:, 2:], x[:, 2:])
    b = prob_of(p1[:, 1:-1], x[:, 2:])
    with np.errstate(divide="ignore"):
        return np.abs(np.log(a) - np.log(b))


def _detrend(ns: np.ndarray, g: np.ndarray) -> np.ndarray:
    X = np.stack([1.0 / ns, np.ones_like(ns)], 1)
    beta, *_ = np.linalg.lstsq(X, g, rcond=None)
    return g - X @ beta


def dominant_periods(ns: Float[np.ndarray, "n"], g: Float[np.ndarray, "n"], *, top: int = 3,
                     min_period: float = 2.0) -> Tuple[Float[np.ndarray, "top"], Float[np.ndarray, "top"],
                                                       Float[np.ndarray, "top"]]:
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


def harmonic_fit(ns: Float[np.ndarray, "n"], g: Float[np.ndarray, "n"], period: float, n_harmonics: int = 3) -> dict:
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


def _design(ns: np.ndarray, periods: np.ndarray, n_harmonics: int) -> np.ndarray:
    """[G, M, 2 + 2K] designs of the harmonic model, one per period."""
    cols = [np.broadcast_to(1.0 / ns, (periods.size, ns.size)), np.ones((periods.size, ns.size))]
    for k in range(1, n_harmonics + 1):
        w = 2 * np.pi * k * ns[None, :] / periods[:, None]
        cols += [np.sin(w), np.cos(w)]
    return np.stack(cols, axis=-1)


def _harmonic_rss(ns: np.ndarray, y: np.ndarray, periods: np.ndarray, n_harmonics: int) -> np.ndarray:
    """Residual sum of squares of the harmonic model at each period: y [M] or [M, B] -> [G] or [G, B]."""
    X = _design(ns, periods, n_harmonics)
    Y = y if y.ndim == 2 else y[:, None]
    Y = Y - Y.mean(axis=0, keepdims=True)  # the constant column absorbs it; avoids cancellation below
    xtx = np.swapaxes(X, 1, 2) @ X  # [G, p, p]
    g_, m_, p_ = X.shape
    xty = (np.ascontiguousarray(np.swapaxes(X, 1, 2)).reshape(g_ * p_, m_) @ Y).reshape(g_, p_, -1)  # [G, p, B]: one GEMM
    try:
        beta = np.linalg.inv(xtx) @ xty  # small p x p inverses, then one batched product (faster than solve)
    except np.linalg.LinAlgError:  # a period so long that sin/cos are collinear with the trend
        beta = np.stack([np.linalg.lstsq(a, Y, rcond=None)[0] for a in X])
    rss = (Y ** 2).sum(0)[None, :] - (beta * xty).sum(1)
    return rss if y.ndim == 2 else rss[:, 0]


def _fft_bracket(m: int, period_fft: float, min_period: float) -> Tuple[float, float]:
    j = m / period_fft
    lo = max(m / (j + 1), min_period)
    hi = m / (j - 1) if j > 1.5 else float(m)
    return lo, hi


def _parabolic_min(x: np.ndarray, rss: np.ndarray) -> np.ndarray:
    """Minimum of the parabola through the grid minimum and its neighbours (per column of rss [G, B])."""
    i = np.clip(np.argmin(rss, axis=0), 1, x.size - 2)
    cols = np.arange(rss.shape[1])
    y0, y1, y2 = rss[i - 1, cols], rss[i, cols], rss[i + 1, cols]
    den = y0 - 2 * y1 + y2
    step = x[1] - x[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        shift = np.where(den > 0, 0.5 * (y0 - y2) / den, 0.0)
    best = np.argmin(rss, axis=0)
    interior = (best >= 1) & (best <= x.size - 2)
    return np.where(interior, x[i] + np.clip(shift, -1, 1) * step, x[best])


def _refine_near(ns: np.ndarray, g: np.ndarray, centre: float, n_harmonics: int, min_period: float,
                 n_grid: int):
    """Least-squares period in the bracket M/(j+1) … M/(j−1), j = M/centre (j need not be an integer):
    (period or periods [B], grid step)."""
    lo, hi = _fft_bracket(ns.size, centre, min_period)
    grid = np.linspace(lo, hi, n_grid)
    rss = _harmonic_rss(ns, g if g.ndim == 2 else g[:, None], grid, n_harmonics)
    best = _parabolic_min(grid, rss)
    return (float(best[0]) if g.ndim == 1 else best), float(grid[1] - grid[0])


#: Family-wise level of the harmonic-period test: the candidates 2P and 3P are tested together, each at
#: HARMONIC_TEST_LEVEL / (number of candidates tested) (Bonferroni), so a series whose period really is
#: P moves to a multiple with probability at most this level.
HARMONIC_TEST_LEVEL = 0.01
#: A significant longer period must also explain at least this share of the detrended variance: the
#: few-harmonic model's deterministic misfit leaks a little into the longer period's harmonics, and
#: with enough sequences even 0.1–0.5% of the variance is "significant" (pure period-15 envelopes,
#: 1,000 series: 1.1–1.6% moves without the floor, 0.2–0.5% with it). It only makes moves rarer.
HARMONIC_MIN_GAIN = 0.005
#: The multiples m of the FFT-peak period P₀ that are candidates (each only while m·P₀ ≤ M/2).
HARMONIC_MULTIPLES = (2, 3)


def _fft_peak(ns: np.ndarray, G: np.ndarray, min_period: float) -> np.ndarray:
    """Period of the largest spectral local maximum of each column of G [M, B] (NaN if none): the
    peak ``dominant_periods(ns, G[:, b], top=1)`` finds, for all columns at once."""
    X = np.stack([1.0 / ns, np.ones_like(ns)], 1)
    beta, *_ = np.linalg.lstsq(X, G, rcond=None)
    r = G - X @ beta
    r = r - r.mean(0, keepdims=True)
    power = np.abs(np.fft.rfft(r, axis=0)) ** 2
    freqs = np.fft.rfftfreq(r.shape[0], d=1.0)
    ok = (freqs > 0) & (1.0 / np.where(freqs > 0, freqs, 1.0) >= min_period) & (freqs >= 2.0 / r.shape[0])
    pad = np.full((1, power.shape[1]), -np.inf)
    left = np.concatenate([pad, power[:-1]], 0)
    right = np.concatenate([power[1:], pad], 0)
    eligible = ok[:, None] & (power >= left) & (power >= right)
    i = np.argmax(np.where(eligible, power, -np.inf), axis=0)
    found = eligible.any(axis=0)
    return np.where(found, 1.0 / np.where(found, freqs[i], 1.0), np.nan)


def _harmonic_columns(ns: np.ndarray, periods: np.ndarray, ks) -> np.ndarray:
    """[B, M, 2·len(ks)]: sin and cos of 2πkn/P for each k, one block per period."""
    cols = []
    for k in ks:
        w = 2 * np.pi * k * ns[None, :] / periods[:, None]
        cols += [np.sin(w), np.cos(w)]
    return np.stack(cols, -1)


def _null_design(ns: np.ndarray, periods: np.ndarray, n_harmonics: int) -> np.ndarray:
    """[B, M, 2 + 2K]: the trend A/n + c and K harmonics of each period."""
    base = np.stack([np.broadcast_to(1.0 / ns, (periods.size, ns.size)), np.ones((periods.size, ns.size))], -1)
    return np.concatenate([base, _harmonic_columns(ns, periods, range(1, n_harmonics + 1))], -1)


def _ols(X: np.ndarray, Y: np.ndarray):
    """Per-series least squares: X [B, M, p], Y [M, B] -> ((X'X)⁻¹X' [B, p, M], RSS [B])."""
    xt = np.swapaxes(X, 1, 2)
    try:
        hat = np.linalg.inv(xt @ X) @ xt
    except np.linalg.LinAlgError:  # a period so long that sin/cos are collinear with the trend
        hat = np.linalg.pinv(X)
    y = Y.T[:, :, None]
    resid = y - X @ (hat @ y)
    return hat, (resid[..., 0] ** 2).sum(1)


def _subharmonic_test(ns: np.ndarray, G: np.ndarray, D: Optional[np.ndarray], short: np.ndarray, m: int,
                      n_harmonics: int) -> dict:
    """Test that L = m·S adds nothing to the K-harmonic model at S: its harmonics 1 … m−1 (the periods
    longer than S; q = 2(m−1) columns) are zero. Exactly nested: L is m·S, not a period fitted apart.

    With per-sequence series D [N, M, B] and N > q: Hotelling's T² of the q coefficients over the
    i.i.d. sequences, F(q, N − q), valid however the noise varies along the positions (its variance
    with the position, its correlation across positions). With D but N ≤ q: not tested. Without D:
    the F test on the mean series G [M, B] (white noise assumed), F(q, M − p).
    Returns p-values and gains (the share of the detrended variance the q columns explain) [B].
    """
    from scipy import stats

    X0 = _null_design(ns, short, n_harmonics)
    Z = _harmonic_columns(ns, m * short, range(1, m))
    X1 = np.concatenate([X0, Z], -1)
    q, p1 = Z.shape[-1], X1.shape[-1]
    Gc = G - G.mean(0, keepdims=True)  # the constant column absorbs it; avoids cancellation
    _, rss0 = _ols(X0, Gc)
    hat1, rss1 = _ols(X1, Gc)
    tss = np.sum(_detrend(ns, G) ** 2, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        gain = np.where(tss > 0, (rss0 - rss1) / tss, np.nan)
    if D is not None and D.shape[0] > q:
        n = D.shape[0]
        coef = np.einsum("bqm,nmb->bnq", hat1[:, p1 - q:, :], D)  # each sequence's q coefficients
        mean = coef.mean(1)
        dev = coef - mean[:, None, :]
        cov = np.einsum("bnq,bnr->bqr", dev, dev) / (n - 1)
        t2 = n * np.einsum("bq,bq->b", mean, (np.linalg.pinv(cov) @ mean[..., None])[..., 0])
        f = t2 * (n - q) / (q * (n - 1))
        return {"p_value": stats.f.sf(f, q, n - q), "gain": gain, "df_den": n - q, "test": "sequences"}
    if D is not None:
        return {"p_value": np.full(G.shape[1], np.nan), "gain": gain, "df_den": float(D.shape[0] - q),
                "test": "untested"}
    df = ns.size - p1
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.maximum(rss0 - rss1, 0.0) / q / (rss1 / df)
        p = np.where(rss1 > 0, stats.f.sf(f, q, df), np.nan)
    return {"p_value": p, "gain": gain, "df_den": df, "test": "series"}


def _refine_many(ns: np.ndarray, G: np.ndarray, centres: np.ndarray, n_harmonics: int, min_period: float,
                 n_grid: int):
    """:func:`_refine_near` for each column of G [M, B] around its own centre (columns sharing a centre,
    e.g. one FFT bin, are scanned together): (periods [B], grid steps [B]); NaN where the centre is."""
    per = np.full(centres.size, np.nan)
    step = np.full(centres.size, np.nan)
    for c in np.unique(centres[np.isfinite(centres)]):
        idx = centres == c
        per[idx], step[idx] = _refine_near(ns, G[:, idx], float(c), n_harmonics, min_period, n_grid)
    return per, step


def _rss_many(ns: np.ndarray, G: np.ndarray, periods: np.ndarray, n_harmonics: int) -> np.ndarray:
    """RSS of the K-harmonic model of column b at periods[b]."""
    out = np.full(periods.size, np.nan)
    ok = np.isfinite(periods)
    if ok.any():
        out[ok] = _ols(_null_design(ns, periods[ok], n_harmonics), G[:, ok] - G[:, ok].mean(0))[1]
    return out


#: Level of the Ljung–Box check on a lone series' residuals (:func:`residual_autocorrelation`).
AUTOCORRELATION_LEVEL = 0.01


class AutocorrelatedNoiseWarning(UserWarning):
    """:func:`select_period` on a lone series (no ``sequences=``) whose residuals are autocorrelated: its F
    test assumes white noise, and under AR(1) noise (φ = 0.5–0.8) it moved a true period P to 2P or 3P in
    33–87% of series at a nominal 1%."""


def residual_autocorrelation(ns: Float[np.ndarray, "n"], g, period, n_harmonics: int = 3, *, lags: Optional[int] = None):
    """Ljung–Box test of the residuals of A/n + c + K harmonics of ``period``, per series:
    ``(p_values [B], lag-1 autocorrelations [B])`` for ``g`` [M] or [M, B] and ``period`` a number or [B].

    Q = M(M + 2) Σ_{k=1..h} r_k² / (M − k) with h = ``lags`` (default min(10, M // 5)), against χ²(h):
    white residuals give p ~ uniform (a little conservative, as regression residuals are), AR(1) noise a
    small p. :func:`select_period` warns (:class:`AutocorrelatedNoiseWarning`) below 1% on its lone-series
    path."""
    from scipy import stats

    ns = np.asarray(ns, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    G = g if g.ndim == 2 else g[:, None]
    M, B = G.shape
    per = np.broadcast_to(np.asarray(period, dtype=np.float64), (B,)).copy()
    h = check_int(lags if lags is not None else min(10, M // 5), "lags", min=1, max=M - 2)
    p, r1 = np.full(B, np.nan), np.full(B, np.nan)
    ok = np.isfinite(per)
    if ok.any():
        X = _null_design(ns, per[ok], n_harmonics)
        Y = G[:, ok] - G[:, ok].mean(0)
        hat, _ = _ols(X, Y)
        e = Y.T - (X @ (hat @ Y.T[:, :, None]))[..., 0]  # [b, M]
        e = e - e.mean(1, keepdims=True)
        den = (e ** 2).sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.stack([(e[:, k:] * e[:, :-k]).sum(1) / den for k in range(1, h + 1)], 1)
            q = M * (M + 2) * ((r ** 2) / (M - np.arange(1, h + 1))).sum(1)
        p[ok], r1[ok] = stats.chi2.sf(q, h), r[:, 0]
    return p, r1


def _warn_if_autocorrelated(ns: np.ndarray, G: np.ndarray, short: np.ndarray, n_harmonics: int) -> None:
    import warnings

    p, r1 = residual_autocorrelation(ns, G, short, n_harmonics)
    bad = np.isfinite(p) & (p < AUTOCORRELATION_LEVEL)
    if not bad.any():
        return
    which = (f"{int(bad.sum())} of {bad.size} series have" if bad.size > 1 else "the series has")
    warnings.warn(
        f"select_period: {which} autocorrelated residuals (Ljung-Box p = {float(np.nanmin(p[bad])):.1g}, lag-1 "
        f"autocorrelation {float(np.nanmax(r1[bad])):+.2f}), but the test of 2P/3P on a lone series assumes white "
        "noise: under AR(1) noise it moves a true period P to 2P or 3P far more often than its nominal level "
        "(33-87% of series at 1% for phi = 0.5-0.8), and red noise can make the FFT peak itself a long period. Pass the per-sequence series (sequences=, as "
        "positional_spectrum does), whose test allows correlated noise, or treat a move to a longer period "
        "as unreliable.", AutocorrelatedNoiseWarning, stacklevel=3)


def select_period(ns: Float[np.ndarray, "n"], g, n_harmonics: int = 3, *, sequences=None, period_fft=None,
                  level: float = HARMONIC_TEST_LEVEL, min_gain: float = HARMONIC_MIN_GAIN,
                  min_period: float = 2.0, n_grid: int = 400) -> pd.DataFrame:
    """The period of the harmonic model: the FFT peak P₀ refined, or 2P₀ / 3P₀ when a level-controlled
    test finds the longer period's own harmonics.

    At low signal-to-noise the largest FFT peak can be the second (or third) harmonic of the true
    period (P = 30 found as 15). Rule: S = the least-squares period near P₀ (:func:`refine_period`);
    for each m in (2, 3) with m·P₀ ≤ M/2, the harmonics 1 … m−1 of L = m·S (the periods longer than S,
    which the model at S lacks) are tested in A/n + c + K harmonics of S + them — exactly nested,
    q = 2(m−1) columns — each candidate at ``level`` / (number tested), so that a series whose period
    is S moves with probability at most ``level``. With ``sequences`` (the per-sequence series, [N, M]
    or [N, M, B], whose mean over sequences is ``g``) the test is Hotelling's T² of the q coefficients
    over the i.i.d. sequences, F(q, N − q), valid however the noise varies with the position (a
    candidate with q ≥ N is not tested); without, the F test on ``g``, F(q, M − p), which assumes white
    noise: on that path the residuals at S are checked (Ljung–Box at 1%, :func:`residual_autocorrelation`)
    and :class:`AutocorrelatedNoiseWarning` is raised when they are autocorrelated (AR(1) noise moved P
    to 2P/3P in 33–87% of series at a nominal 1%). A significant candidate must also explain ≥ ``min_gain`` of the detrended variance; the
    smallest p-value wins and the period is refined near m·P₀. Measured rates: METHODS.md §8.

    ``g``: [M] or [M, B] (B series at once; ``None`` with ``sequences``: their mean). ``period_fft``:
    P₀, a number or [B] (default: each series' largest FFT peak of period ≥ ``min_period``).
    Returns one row per series and candidate: ``series``, ``multiple`` (m; 1 for P₀), ``candidate``
    (m·P₀), ``period`` (refined near it), ``rss`` (of the K-harmonic model there), ``p_value``,
    ``level`` (the candidate's, after Bonferroni), ``gain``, ``test`` (``"sequences"``, ``"series"``,
    ``"untested"``; ``"reference"`` for P₀), ``df_num``, ``df_den``, ``step`` (the scan's grid step)
    and ``chosen``.

    >>> ns = np.arange(3, 257.0)
    >>> g = 0.3 / ns + np.sin(2 * np.pi * ns / 15) + np.random.default_rng(0).standard_normal(ns.size)
    >>> t = bl.martingale.select_period(ns, g)
    >>> round(float(t.period[t.chosen].iloc[0]))
    15
    """
    ns = np.asarray(ns, dtype=np.float64)
    n_harmonics = check_positive_int(n_harmonics, "n_harmonics")
    level = check_float(level, "level", min=0.0, max=1.0, min_inclusive=False)
    min_gain = check_float(min_gain, "min_gain", min=0.0, max=1.0)
    n_grid = check_int(n_grid, "n_grid", min=3)
    D = None if sequences is None else np.asarray(sequences, dtype=np.float64)
    if g is None:
        if D is None:
            raise InvalidInputError("select_period needs the series g or the per-sequence series sequences=; "
                                    "got neither.")
        g = D.mean(0)
    g = np.asarray(g, dtype=np.float64)
    if g.ndim not in (1, 2) or g.shape[0] != ns.size:
        raise InvalidInputError(f"g must be [M] or [M, B] with M = len(ns) = {ns.size}, got shape {g.shape}.")
    G = g if g.ndim == 2 else g[:, None]
    if D is not None:
        D = D if D.ndim == 3 else D[..., None]
        if D.shape[1:] != G.shape or not np.allclose(D.mean(0), G, rtol=1e-9, atol=1e-12):
            raise InvalidInputError(f"sequences must be per-sequence series [N, M] (or [N, M, B]) whose mean over "
                                    f"sequences is g (shape {g.shape}); got shape {np.shape(sequences)}. "
                                    "Pass g=None to use their mean.")
    B = G.shape[1]
    if period_fft is None:
        p0 = _fft_peak(ns, G, min_period)
    else:
        p0 = np.broadcast_to(np.asarray(period_fft, dtype=np.float64), (B,)).copy()
        if np.any(np.isfinite(p0) & (p0 <= 0)):
            raise InvalidInputError(f"period_fft must be positive, got {period_fft}.")
    short, step1 = _refine_many(ns, G, p0, n_harmonics, min_period, n_grid)
    tested = {m: np.isfinite(p0) & (m * p0 <= ns.size / 2) for m in HARMONIC_MULTIPLES}
    results = {}
    for m in HARMONIC_MULTIPLES:
        res = {"p_value": np.full(B, np.nan), "gain": np.full(B, np.nan), "df_den": np.nan, "test": "untested"}
        ok = tested[m]
        if ok.any():
            r = _subharmonic_test(ns, G[:, ok], None if D is None else D[..., ok], short[ok], m, n_harmonics)
            res["p_value"][ok], res["gain"][ok] = r["p_value"], r["gain"]
            res.update(df_den=r["df_den"], test=r["test"])
        results[m] = res
    if D is None and np.isfinite(short).any():
        _warn_if_autocorrelated(ns, G, short, n_harmonics)
    n_tests = sum(np.isfinite(results[m]["p_value"]).astype(int) for m in HARMONIC_MULTIPLES)
    per_level = level / np.maximum(n_tests, 1)
    best_m, best_p = np.ones(B, dtype=int), np.full(B, np.inf)
    for m in HARMONIC_MULTIPLES:
        p, gn = results[m]["p_value"], results[m]["gain"]
        with np.errstate(invalid="ignore"):
            take = np.isfinite(p) & (p < per_level) & (gn >= min_gain) & (p < best_p)
        best_m, best_p = np.where(take, m, best_m), np.where(take, p, best_p)
    blocks = [(1, np.isfinite(p0), short, step1)]
    for m in HARMONIC_MULTIPLES:
        blocks.append((m, tested[m], *_refine_many(ns, G, np.where(tested[m], m * p0, np.nan), n_harmonics,
                                                   min_period, n_grid)))
    parts = []
    for m, keep, per, stp in blocks:
        idx = np.nonzero(keep)[0]
        res = results.get(m, {"p_value": np.full(B, np.nan), "gain": np.full(B, np.nan), "df_den": np.nan,
                              "test": "reference"})
        parts.append(pd.DataFrame({
            "series": idx, "multiple": m, "candidate": m * p0[idx], "period": per[idx],
            "rss": _rss_many(ns, G[:, idx], per[idx], n_harmonics), "p_value": res["p_value"][idx],
            "level": per_level[idx] if m > 1 else np.nan, "gain": res["gain"][idx], "test": res["test"],
            "df_num": float(2 * (m - 1)) if m > 1 else np.nan, "df_den": float(res["df_den"]),
            "step": stp[idx], "chosen": best_m[idx] == m}))
    table = pd.concat(parts, ignore_index=True)
    return table.sort_values(["series", "multiple"], kind="stable").reset_index(drop=True)


def refine_period(ns: Float[np.ndarray, "n"], g: Float[np.ndarray, "n"], period_fft: float, n_harmonics: int = 3, *,
                  min_period: float = 2.0, n_grid: int = 400) -> Tuple[float, float]:
    """Least-squares period of the harmonic model near an FFT peak: (period, grid step).

    Scans ``n_grid`` periods between the FFT bins either side of ``period_fft`` (M/(j+1) … M/(j−1)
    for a series of M points whose peak is bin j), keeps the one with the smallest residual sum of
    squares of A/n + c + Σ_k (a_k sin + b_k cos)(2πkn/P), and refines it with a parabola through the
    neighbouring grid points. ``g`` may be [M] or [M, B] (B series at once; returns an array of periods).
    """
    ns = np.asarray(ns, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    if not np.isfinite(period_fft) or period_fft <= 0:
        raise InvalidInputError(f"period_fft must be positive, got {period_fft}.")
    n_grid = check_int(n_grid, "n_grid", min=3)
    return _refine_near(ns, g, period_fft, n_harmonics, min_period, n_grid)


@dataclass(frozen=True, eq=False)
class SpectrumResult(Result):
    """Per-position gap series (``series``), spectrum, dominant periods and the harmonic fit.

    ``period_symbols`` and ``explained_fraction`` are :class:`~bayes_lens.Estimate` values: 2.5–97.5%
    quantiles over bootstrap resamples of the sequences (the period re-refined near the chosen one
    in each resample; the explained fraction refitted at the chosen period).
    """

    series: pd.DataFrame  # position_n, gap_nats, laplace_gap_nats, harmonic_nats, debiased_gap_nats
    spectrum: pd.DataFrame  # frequency_per_symbol, period_symbols, power
    dominant_periods_symbols: Tuple[float, ...]  # FFT-bin periods of the largest spectral peaks
    period_symbols: Estimate  # P used by the harmonic fit (refined by the least-squares scan unless refine=False)
    tokens_per_symbol: float
    period_tokens: float
    harmonic_periods_symbols: Tuple[float, ...]
    amplitudes_nats: Tuple[float, ...]
    phases_rad: Tuple[float, ...]
    A: float
    explained_fraction: Estimate
    period_agreement: float  # fraction of bootstrap resamples whose FFT peak is the same bin as the original's
    n_seqs: int
    length: int
    seed: int
    period_fft_symbols: float = float("nan")  # the FFT peak's period M/j
    period_fft_spacing_symbols: float = float("nan")  # distance to the next FFT bin, M/j − M/(j+1)
    period_resolution_symbols: float = float("nan")  # grid step of the least-squares scan (0 if refine=False)
    explained_fraction_fft: float = float("nan")  # explained fraction at the FFT-bin period, for comparison
    refined: bool = True
    period_candidates: Optional[pd.DataFrame] = None  # P₀, 2P₀, 3P₀ (≤ M/2): select_period's table
    period_wide: bool = False  # the bootstrap interval of P is wider than min(5% of P, half the FFT bin spacing)

    def _summary(self):
        title = f"{self.n_seqs} sequences of {self.length} symbols ({fmt(self.tokens_per_symbol)} tokens/symbol)"
        return title, [
            ("period (symbols)", fmt(self.period_symbols), fmt_ci(self.period_symbols),
             f"FFT peak {fmt(self.period_fft_symbols)}; agreement {fmt_pct(self.period_agreement)}"),
            ("explained fraction", fmt_pct(self.explained_fraction), fmt_ci(self.explained_fraction, pct=True),
             f"amplitude A {fmt(self.A)} nats"),
        ]

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
    from ._predict import symbol_layout

    _, positions, _ = symbol_layout(model.tokenizer, template, [0, 1, 0, 1, 1, 0])
    steps = np.diff(positions)
    return float(steps[0]) if np.all(steps == steps[0]) else float(np.mean(steps))


def positional_spectrum(model, *, seq_len: int = 256, n_seqs: int = 32, p: float = 0.5, seed: int = 0,
                        n_harmonics: int = 3, min_period: float = 4.0, top: int = 3,
                        template: Optional[BernoulliTemplate] = None, n_boot: int = 1000, batch_size: int = 8,
                        refine: bool = True, n_grid: int = 400, harmonic_scan: bool = True,
                        harmonic_level: float = HARMONIC_TEST_LEVEL,
                        progress: Optional[bool] = None) -> SpectrumResult:
    """Per-position gap over ``n_seqs`` i.i.d. Bernoulli(``p``) sequences of ``seq_len`` symbols; FFT,
    dominant periods (≥ ``min_period`` symbols), harmonic fit with ``n_harmonics`` and the debiased series.

    ``refine=True`` (default) refines the FFT peak's period by a least-squares scan of ``n_grid``
    periods between the neighbouring FFT bins (:func:`refine_period`); ``refine=False`` keeps the FFT bin.
    ``harmonic_scan=True`` (default, with ``refine``) also considers 2P₀ and 3P₀ and moves to a
    longer one when Hotelling's test over the sequences finds its harmonics longer than P₀ at family-wise
    level ``harmonic_level`` (the FFT peak can be the second harmonic at low signal-to-noise;
    :func:`select_period`, the module docstring); ``period_candidates`` lists them.
    """
    seed = check_seed(seed)
    length = check_int(seq_len, "seq_len", min=16)  # a spectrum needs >= 16 symbols
    n_seqs = check_positive_int(n_seqs, "n_seqs")
    n_harmonics = check_positive_int(n_harmonics, "n_harmonics")
    top = check_positive_int(top, "top")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
    harmonic_level = check_float(harmonic_level, "harmonic_level", min=0.0, max=1.0, min_inclusive=False)
    if not 0 < p < 1:
        raise InvalidInputError(f"p must be in (0, 1), got {p}.")
    rng = np.random.default_rng(seed)
    x = (rng.random((n_seqs, length)) < p).astype(np.int64)
    p1, _ = predict_array(model, x, template=template, batch_size=batch_size, progress=progress,
                     desc="positional spectrum")
    d = per_position_gap(p1, x)
    if not np.all(np.isfinite(d)):
        raise InvalidInputError("the predictive is 0 or NaN for an observed symbol; cannot take logs.")
    ns = np.arange(3, length + 1, dtype=np.float64)
    g = d.mean(0)
    periods, _, spec = dominant_periods(ns, g, top=top, min_period=min_period)
    period_fft = float(periods[0]) if periods.size else float("nan")
    period, step, spacing, fr_fft, cands = period_fft, 0.0, float("nan"), float("nan"), None
    centre = period_fft  # the bracket the bootstrap refines in: the FFT peak's, or the chosen relative's
    if np.isfinite(period_fft):
        fr_fft = harmonic_fit(ns, g, period_fft, n_harmonics)["explained_fraction"]
        if refine and harmonic_scan:
            cands = select_period(ns, g, n_harmonics, sequences=d, period_fft=period_fft, level=harmonic_level,
                                  min_period=min_period, n_grid=n_grid).drop(columns="series")
            chosen = cands[cands.chosen].iloc[0]
            period, step, centre = float(chosen.period), float(chosen.step), float(chosen.candidate)
        elif refine:
            period, step = refine_period(ns, g, period_fft, n_harmonics, min_period=min_period, n_grid=n_grid)
        j = ns.size / centre
        spacing = centre - ns.size / (j + 1)
    if np.isfinite(period):
        hf = harmonic_fit(ns, g, period, n_harmonics)
    else:
        hf = {"A": float("nan"), "amplitudes": [], "phases": [], "harmonic_periods": [],
              "explained_fraction": float("nan"), "harmonic": np.zeros_like(g)}
    ci, agree, pci = (float("nan"), float("nan")), float("nan"), (float("nan"), float("nan"))
    if n_boot and n_seqs >= 2 and np.isfinite(period):
        brng = np.random.default_rng(seed + 1)
        gbs = np.stack([d[brng.integers(0, n_seqs, n_seqs)].mean(0) for _ in range(n_boot)], axis=1)  # [M, B]
        fr, same = [], []
        for b in range(n_boot):
            fr.append(harmonic_fit(ns, gbs[:, b], period, n_harmonics)["explained_fraction"])
            pb, _, _ = dominant_periods(ns, gbs[:, b], top=1, min_period=min_period)
            same.append(bool(pb.size) and abs(pb[0] - period_fft) < 1e-9)
        fr = np.asarray(fr)
        fr = fr[np.isfinite(fr)]
        if fr.size:
            ci = (float(np.quantile(fr, 0.025)), float(np.quantile(fr, 0.975)))
        agree = float(np.mean(same))
        if refine:
            pb = np.concatenate([_refine_near(ns, gbs[:, i:i + 100], centre, n_harmonics, min_period, n_grid)[0]
                                 for i in range(0, n_boot, 100)])
            pci = (float(np.quantile(pb, 0.025)), float(np.quantile(pb, 0.975)))
    wide = bool(np.isfinite(pci[0]) and (pci[1] - pci[0]) > min(0.05 * period, spacing / 2))
    lap = per_position_gap(laplace(x), x).mean(0)
    series = pd.DataFrame({"position_n": ns.astype(int), "gap_nats": g, "laplace_gap_nats": lap,
                           "harmonic_nats": hf["harmonic"], "debiased_gap_nats": g - hf["harmonic"]})
    freqs, power = spec
    with np.errstate(divide="ignore"):
        spectrum = pd.DataFrame({"frequency_per_symbol": freqs, "period_symbols": np.where(freqs > 0, 1 / np.where(freqs > 0, freqs, 1), np.inf),
                                 "power": power})
    tps = _tokens_per_symbol(model, template or DEFAULT_TEMPLATE)
    method_f = "95% percentile bootstrap over sequences (harmonic fit at the chosen period)"
    method_p = ("95% percentile bootstrap over sequences (period re-refined near the chosen one)" if refine
                else "no interval (refine=False: the FFT-bin period)")
    return SpectrumResult(series=series, spectrum=spectrum, dominant_periods_symbols=tuple(float(v) for v in periods),
                          period_symbols=Estimate(float(period), pci, method_p, n=n_seqs),
                          tokens_per_symbol=tps, period_tokens=period * tps,
                          harmonic_periods_symbols=tuple(hf["harmonic_periods"]),
                          amplitudes_nats=tuple(hf["amplitudes"]), phases_rad=tuple(hf["phases"]), A=hf["A"],
                          explained_fraction=Estimate(float(hf["explained_fraction"]), ci, method_f, n=n_seqs),
                          period_agreement=agree, n_seqs=n_seqs, length=length, seed=seed,
                          period_fft_symbols=period_fft, period_fft_spacing_symbols=float(spacing),
                          period_resolution_symbols=float(step),
                          explained_fraction_fft=float(fr_fft), refined=bool(refine), period_candidates=cands,
                          period_wide=wide)
