"""Compression efficiency (Paper B §5.3): cumulative cross-entropy per symbol against H(θ).

On i.i.d. Bernoulli(θ) sequences, the per-symbol cumulative cross-entropy after n symbols is

    CE_n = (1/n) Σ_{t=1..n} −log₂ P(x_t | x_{<t})   (bits per symbol),

averaged over sequences (with a bootstrap CI), for the model, Laplace's rule (Beta(1,1)), the
Krichevsky–Trofimov estimator (Beta(½,½)) and the clipped maximum-likelihood plug-in. In expectation
CE_n ≥ H(θ) (code length ≥ entropy), so the **efficiency is H(θ)/CE_n ≤ 1**, and 0.99 means
"within 1% of the entropy limit". Paper B: GPT-3 reaches 99% within 20 examples; Laplace needs > 100.
For the Bayes mixtures the code length has a closed form: for k ones in n symbols, Laplace's
−log₂ [k!(n−k)!/(n+1)!] and KT's −log₂ [Γ(k+½)Γ(n−k+½)/(π·n!)], whose Binomial(n, θ) expectations
are reported too (``expected_ce_bits``).

The model's first symbol is scored with its predictive given only the template preamble; with
``prefix=""`` (no preamble, no BOS) that is undefined and compression raises.

Example
-------
>>> from bayes_lens.martingale import compression, laplace
>>> res = compression(laplace, thetas=(0.5,), seq_len=50, n_seqs=20, n_boot=0)
>>> bool(res.curves.query("predictor == 'laplace' and n == 50").efficiency.iloc[0] < 1)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float, Int
from scipy.special import gammaln
from scipy.stats import binom

from .._results import Result, fmt, plotly
from ..metrics.calibration import binary_entropy_bits
from ..metrics.stats import bootstrap_indices, percentile_interval
from .._validate import check_count, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._predict import BernoulliTemplate, predict_array, prob_of, clipped_mle, krichevsky_trofimov, laplace

__all__ = ["CompressionResult", "compression", "bernoulli_entropy_bits", "mixture_codelength_bits",
           "expected_ce_bits"]


def bernoulli_entropy_bits(theta: Float[np.ndarray, "*shape"] | float) -> Float[np.ndarray, "*shape"]:
    """H(θ) in bits."""
    return binary_entropy_bits(theta)


def mixture_codelength_bits(k: Int[np.ndarray, "*shape"] | int, n: Int[np.ndarray, "*shape"] | int, a: float = 1.0,
                            b: float = 1.0) -> Float[np.ndarray, "*shape"]:
    """−log₂ of the Beta(a, b)-Bernoulli marginal probability of a sequence with k ones in n symbols."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    logp = (gammaln(k + a) + gammaln(n - k + b) - gammaln(n + a + b)
            - (gammaln(a) + gammaln(b) - gammaln(a + b)))
    return -logp / np.log(2.0)


def expected_ce_bits(theta: float, n: Int[np.ndarray, "k"] | int, a: float = 1.0, b: float = 1.0) -> Float[np.ndarray, "k"]:
    """E[CE_n] in bits/symbol for the Beta(a, b) Bayes predictive on i.i.d. Bernoulli(θ) data (exact)."""
    out = []
    for m in np.atleast_1d(n).astype(int):
        k = np.arange(m + 1)
        out.append(float(np.sum(binom.pmf(k, m, theta) * mixture_codelength_bits(k, m, a, b)) / m))
    return np.asarray(out)


@dataclass(frozen=True, eq=False)
class CompressionResult(Result):
    """``curves``: one row per (θ, predictor, n) with ``ce_bits`` (+ CI), ``entropy_bits``,
    ``efficiency`` = H(θ)/CE (≤ 1 in expectation) and, for Laplace/KT, the exact ``expected_ce_bits``;
    ``n_to_99``: the first n from which the mean efficiency stays >= 0.99 up to ``length`` (NaN if
    never; "reaches" alone would be n = 1 at θ = ½, where any predictor starting at ½ scores 1 bit)."""

    curves: pd.DataFrame
    n_to_99: pd.DataFrame
    length: int
    n_seqs: int
    clip: float
    seed: int

    def _summary(self):
        import numpy as np

        title = f"{self.n_seqs} sequences of {self.length} symbols, clip {fmt(self.clip)}"
        last = self.curves[self.curves["n"] == self.curves["n"].max()]
        rows = []
        for (th, who), g in last.groupby(["theta", "predictor"]):
            hit = self.n_to_99[(self.n_to_99["theta"] == th) & (self.n_to_99["predictor"] == who)]["n_to_99"]
            n99 = hit.iloc[0] if len(hit) else np.nan
            rows.append((f"{who}, theta {fmt(th, 3)}", f"efficiency {fmt(g['efficiency'].mean(), 3)} at n = {self.length}",
                         "", f"n to 0.99: {'never' if not np.isfinite(n99) else int(n99)}"))
        return title, rows[:8]

    def to_dataframe(self) -> pd.DataFrame:
        return self.curves.copy()

    def n_to(self, level: float = 0.99) -> pd.DataFrame:
        """Per (θ, predictor): the first n from which the mean efficiency stays >= ``level`` up to ``length``.

        ``n_to(0.99)`` is :attr:`n_to_99`. NaN means not within ``length`` symbols: at quick lengths (30-100)
        no predictor stays at 99% — Laplace's rule needs hundreds of symbols for that (its expected excess
        is about log₂(n)/(2n) bits per symbol) — so a lower ``level`` (0.9, 0.95) is the informative one there.
        """
        level = float(level)
        if not 0 < level <= 1:
            raise InvalidInputError(f"level must be in (0, 1], got {level!r}.")
        rows = []
        for (th, who), g in self.curves.groupby(["theta", "predictor"], sort=False):
            g = g.sort_values("n")
            eff = g["efficiency"].to_numpy(float)
            stays = np.minimum.accumulate(eff[::-1])[::-1] >= level
            reach = np.nonzero(stays)[0]
            rows.append({"theta": th, "predictor": who,
                         "n_to_level": int(g["n"].to_numpy()[reach[0]]) if reach.size else np.nan,
                         "efficiency_at_end": float(eff[-1]), "level": level})
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        fig = go.Figure()
        for (th, who), g in self.curves.groupby(["theta", "predictor"]):
            fig.add_trace(go.Scatter(x=g.n, y=g.efficiency, name=f"{who} θ={th}"))
        fig.add_hline(y=0.99, line_dash="dot")
        fig.update_layout(title="Compression efficiency H(θ)/CE_n", xaxis_title="n", yaxis_title="H(θ)/CE_n")
        return fig


def compression(model, *, thetas: Sequence[float] = (0.3, 0.5, 0.7), seq_len: int = 100, n_seqs: int = 50,
                seed: int = 0, clip: float = 0.01, template: Optional[BernoulliTemplate] = None,
                n_boot: int = 1000, batch_size: int = 8, progress: Optional[bool] = None) -> CompressionResult:
    """Cumulative cross-entropy per symbol vs H(θ) for the model and the three reference predictors."""
    seed = check_seed(seed)
    length = check_positive_int(seq_len, "seq_len")
    n_seqs = check_positive_int(n_seqs, "n_seqs")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
    thetas = [float(t) for t in thetas]
    if not thetas or any(not 0 < t < 1 for t in thetas):
        raise InvalidInputError(f"thetas must be non-empty and in (0, 1), got {thetas}.")
    rng = np.random.default_rng(seed)
    predictors = {"model": model, "laplace": laplace, "kt": krichevsky_trofimov, "clipped_mle": clipped_mle(clip)}
    ns = np.arange(1, length + 1)
    rows, firsts = [], []
    for th in thetas:
        x = (rng.random((n_seqs, length)) < th).astype(np.int64)
        h = float(bernoulli_entropy_bits(th))
        exact = {"laplace": expected_ce_bits(th, ns, 1, 1), "kt": expected_ce_bits(th, ns, 0.5, 0.5)}
        for who, pred in predictors.items():
            p1, _ = predict_array(pred, x, template=template, batch_size=batch_size, progress=progress,
                             desc=f"compression θ={th}")
            q = prob_of(p1, x)
            if np.isnan(q[:, 0]).any():
                raise InvalidInputError(
                    "the predictive for the first symbol is undefined (template prefix is empty and the model "
                    "prepends no BOS); give the template a preamble, e.g. BernoulliTemplate(prefix='Sequence: ')."
                )
            with np.errstate(divide="ignore"):
                bits = -np.log2(q)
            ce = np.cumsum(bits, axis=1) / ns  # [n_seqs, length]
            mean = ce.mean(0)
            if n_boot and n_seqs >= 2:
                brng = np.random.default_rng(seed + 11)
                boot = ce[bootstrap_indices(n_seqs, n_boot, seed=brng)].mean(1)
                lo, hi = percentile_interval(boot, axis=0, min_finite=0.0)
            else:
                lo = hi = np.full(length, np.nan)
            eff = h / mean
            stays = np.minimum.accumulate(eff[::-1])[::-1] >= 0.99  # efficiency >= 0.99 from n onwards
            reach = np.nonzero(stays)[0]
            firsts.append({"theta": th, "predictor": who, "n_to_99": int(ns[reach[0]]) if reach.size else np.nan,
                           "efficiency_at_end": float(eff[-1])})
            ex = exact.get(who, np.full(length, np.nan))
            for j, n in enumerate(ns):
                rows.append({"theta": th, "predictor": who, "n": int(n), "ce_bits": float(mean[j]),
                             "ce_ci_low_bits": float(lo[j]), "ce_ci_high_bits": float(hi[j]), "entropy_bits": h,
                             "efficiency": float(eff[j]), "expected_ce_bits": float(ex[j])})
    return CompressionResult(curves=pd.DataFrame(rows), n_to_99=pd.DataFrame(firsts), length=length,
                             n_seqs=n_seqs, clip=clip, seed=seed)
