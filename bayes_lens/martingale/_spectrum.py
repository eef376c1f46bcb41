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

Harmonics (``harmonic_scan=True``, default). At low signal-to-noise the largest FFT peak can be the
second (or third) harmonic of the true period, e.g. P = 30 found as 15, and a scan around the peak
cannot leave that bracket. The scan is therefore also run around 2P₀ and 3P₀ (up to M/2), and the
longer period is taken when the harmonics it adds (its odd multiples, absent from the model at P₀)
pass an F test at p < 0.01 *and* explain ≥ 2% of the detrended variance; otherwise the shorter
period stays (a longer period always fits a little better, since its harmonics include P₀'s).
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
from .._validate import check_count, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, DEFAULT_TEMPLATE, predict_array, prob_of, is_model, laplace

__all__ = ["SpectrumResult", "positional_spectrum", "per_position_gap", "harmonic_fit", "dominant_periods",
           "refine_period"]


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
    xty = np.swapaxes(X, 1, 2) @ Y  # [G, p, B]
    try:
        beta = np.linalg.solve(xtx, xty)
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


def _rss_at(ns: np.ndarray, g: np.ndarray, period: float, n_harmonics: int) -> float:
    return float(_harmonic_rss(ns, g, np.array([float(period)]), n_harmonics)[0])


#: A longer candidate period (m times the current one) replaces it when the harmonics it adds have an
#: F-test p-value below HARMONIC_TEST_ALPHA *and* explain at least HARMONIC_MIN_GAIN more of the
#: detrended variance (significance alone is not enough: with many sequences the few-harmonic model's
#: own misfit makes any extra sinusoids "significant"; a planted 48 gained 0.002 at 96).
HARMONIC_TEST_ALPHA = 0.01
HARMONIC_MIN_GAIN = 0.02


def _select_period(ns: np.ndarray, g: np.ndarray, period_fft: float, n_harmonics: int, min_period: float,
                   n_grid: int):
    """Refined period among the FFT peak P₀ and its multiples 2P₀, 3P₀: (period, step, table).

    Each candidate is refined by the least-squares scan around it. At low signal-to-noise the FFT
    peak can be the second or third harmonic of the true period (whose harmonics are all in the
    model at P but only some at P/m), so starting from P₀ a longer candidate L ≈ m·S replaces the
    current choice S when the harmonics of L that S lacks matter: the
    K-harmonic model at L/m is nested in the mK-harmonic model at L; the extra harmonics must pass an
    F test (p < :data:`HARMONIC_TEST_ALPHA`) and explain at least :data:`HARMONIC_MIN_GAIN` of the
    detrended variance. A shorter period is kept when the longer one only fits noise, so a pure
    sinusoid keeps its own period (RSS alone would often pick a multiple of it).
    """
    from scipy import stats

    m_pts = ns.size
    tss = float(np.sum(_detrend(ns, g) ** 2))
    cands = [period_fft] + [c for c in (2 * period_fft, 3 * period_fft) if c <= m_pts / 2]
    refined = [(c,) + _refine_near(ns, g, c, n_harmonics, min_period, n_grid) for c in cands]
    rows, best = [], None
    for c, per, step in refined:
        row = {"candidate": float(c), "period": float(per), "rss": _rss_at(ns, g, per, n_harmonics),
               "p_value": float("nan"), "gain": float("nan"), "chosen": False}
        if best is None:
            best = row
        else:
            m = int(round(per / best["period"]))
            df_full = m_pts - 2 - 2 * m * n_harmonics
            if m >= 2 and abs(per / best["period"] - m) < 0.15 * m and df_full > 0:
                rss_small = _rss_at(ns, g, per / m, n_harmonics)
                rss_full = _rss_at(ns, g, per, m * n_harmonics)
                extra = 2 * (m - 1) * n_harmonics
                if rss_full > 0:
                    f = max(rss_small - rss_full, 0.0) / extra / (rss_full / df_full)
                    row["p_value"] = float(stats.f.sf(f, extra, df_full))
                    row["gain"] = (rss_small - rss_full) / tss if tss > 0 else float("nan")
                    if row["p_value"] < HARMONIC_TEST_ALPHA and row["gain"] >= HARMONIC_MIN_GAIN:
                        best = row
        row["step"] = step
        rows.append(row)
    best["chosen"] = True
    return best["period"], best["step"], rows


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
    period_candidates: Optional[pd.DataFrame] = None  # P₀, 2P₀, 3P₀ (≤ M/2): period, RSS, F-test p, gain, chosen
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
                        progress: Optional[bool] = None) -> SpectrumResult:
    """Per-position gap over ``n_seqs`` i.i.d. Bernoulli(``p``) sequences of ``seq_len`` symbols; FFT,
    dominant periods (≥ ``min_period`` symbols), harmonic fit with ``n_harmonics`` and the debiased series.

    ``refine=True`` (default) refines the FFT peak's period by a least-squares scan of ``n_grid``
    periods between the neighbouring FFT bins (:func:`refine_period`); ``refine=False`` keeps the FFT bin.
    ``harmonic_scan=True`` (default, with ``refine``) also refines 2P₀ and 3P₀ and moves to a
    longer one when its extra harmonics are significant (the FFT peak can be the second harmonic at
    low signal-to-noise; see the module docstring); ``period_candidates`` lists them.
    """
    seed = check_seed(seed)
    length = check_int(seq_len, "seq_len", min=16)  # a spectrum needs >= 16 symbols
    n_seqs = check_positive_int(n_seqs, "n_seqs")
    n_harmonics = check_positive_int(n_harmonics, "n_harmonics")
    top = check_positive_int(top, "top")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
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
            period, step, rows = _select_period(ns, g, period_fft, n_harmonics, min_period, n_grid)
            cands = pd.DataFrame(rows)
            centre = float(cands.candidate[cands.chosen].iloc[0])
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
