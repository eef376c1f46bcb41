"""Optimal chain-of-thought length (Paper B §4, Theorem 4.5) and its constants from measurements.

Theorem 4.5 of Paper B ("LLMs are Bayesian, In Expectation, Not in Realization", arXiv 2507.11768):

    k* = √(α·n / (H_CoT·(B(0) − B_opt))) · log(1/ε) · (1 + ξ_n),   |ξ_n| ≤ C₂·√(log n / n),
    C₂ = 4·(1 + M_B/α + β/H_CoT),

valid for n ≥ 4β·log n / H_CoT and ε ∈ [max(n^(−1/4), 1/V), ½]. The paper writes log₂, but its
worked examples (n = 100, ε = 0.1, H_CoT = 3, α = 5, B(0) − B_opt = 6 → "k* ≈ 12.8"; n = 1000 → "≈ 40")
only come out with the natural log (12.1, 38.4; log₂ gives 17.5, 55.4). So ``log_base`` is a
parameter, ``"e"`` by default; it applies to every log of the theorem (log(1/ε), log n in ξ_n and
in the validity condition). Note that the paper's own example has ε = 0.1 < 100^(−1/4) ≈ 0.32, outside
the stated validity range; :func:`cot_length` computes k* anyway and reports ``valid=False`` with
the reason.

The band k*·(1 ± C₂√(log n/n)) needs M_B and β; when they are not given they are taken as 0, which
gives C₂ = 4, the narrowest band the theorem allows (said in ``notes``).

Estimating α, k₀ and B_opt. METHODS.md asks for "the paper's estimation of α, k₀, B_opt from
measured (k, B(k)) points" without fixing a functional form; this module fits the hyperbolic decay

    B(k) = B_opt + α / (k + k₀)      (α > 0, k₀ > 0),

so that α is the efficiency constant of the theorem, B(0) = B_opt + α/k₀ and the theorem's gap
B(0) − B_opt = α/k₀, by nonlinear least squares (scipy ``curve_fit``), with residual-bootstrap CIs.
This form is a documented decision of bayes_lens, not a quotation of the paper.

Example
-------
>>> import bayes_lens as bl
>>> round(bl.cot_length(100, 0.1, 3, 5, 6).k_star, 1)
12.1
>>> round(bl.cot_length(100, 0.1, 3, 5, 6, log_base=2).k_star, 1)
17.5
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

import numpy as np
import pandas as pd

from ._results import Estimate, Result, fmt, fmt_ci, plotly
from ._validate import check_int
from .errors import InvalidInputError
from .metrics.stats import percentile_interval

__all__ = ["CotLength", "cot_length", "CotFit", "estimate_cot_params"]


def _log_fn(log_base):
    if isinstance(log_base, str):
        if log_base not in ("e", "ln"):
            raise InvalidInputError(f"log_base must be 'e' or a positive number such as 2, got {log_base!r}.")
        return math.log, "e"
    if isinstance(log_base, bool) or not isinstance(log_base, numbers.Real):
        raise InvalidInputError(f"log_base must be 'e' or a positive number such as 2, got {log_base!r}.")
    b = float(log_base)
    if not (b > 0 and b != 1 and math.isfinite(b)):
        raise InvalidInputError(f"log_base must be positive and not 1, got {log_base!r}.")
    return (lambda v: math.log(v) / math.log(b)), b


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}.")
    if float(value) <= 0:
        raise InvalidInputError(f"{name} must be positive, got {value!r}.")
    return float(value)


@dataclass(frozen=True, eq=False)
class CotLength(Result):
    """k* of Theorem 4.5, the ξ_n band, and the validity checks (``checks``: True/False/None = unknown)."""

    k_star: float
    band: Tuple[float, float]
    xi_bound: float
    c2: float
    valid: bool
    checks: dict
    n: float
    eps: float
    h_cot: float
    alpha: float
    gap: float
    log_base: Union[str, float]
    notes: Tuple[str, ...] = field(default_factory=tuple)

    def _summary(self):
        title = (f"n = {fmt(self.n)}, eps = {fmt(self.eps)}, H_cot = {fmt(self.h_cot)}, alpha = {fmt(self.alpha)}, "
                 f"gap = {fmt(self.gap)} (log base {self.log_base})")
        failed = [name for name, ok in self.checks.items() if ok is False]
        unchecked = [name for name, ok in self.checks.items() if ok is None]
        why = ("failed: " + ", ".join(failed)) if failed else "every check passed"
        if unchecked:
            why += "; not checked: " + ", ".join(unchecked)
        return title, [
            ("k* (chain-of-thought length)", fmt(self.k_star), fmt_ci(self.band), "the xi_n band"),
            ("valid", str(self.valid), "", why),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame([{"n": self.n, "eps": self.eps, "h_cot": self.h_cot, "alpha": self.alpha, "gap": self.gap,
                              "log_base": str(self.log_base), "k_star": self.k_star, "band_low": self.band[0],
                              "band_high": self.band[1], "xi_bound": self.xi_bound, "valid": self.valid}])

    def plot(self):
        go = plotly()
        fig = go.Figure(go.Scatter(x=[self.k_star], y=[0], mode="markers", name="k*",
                                   error_x=dict(type="data", symmetric=False, array=[self.band[1] - self.k_star],
                                                arrayminus=[self.k_star - self.band[0]])))
        fig.update_layout(title=f"Optimal CoT length k* = {self.k_star:.2f} (log base {self.log_base})",
                          xaxis_title="k (reasoning steps)", yaxis_visible=False)
        return fig


def cot_length(n, eps, h_cot, alpha, gap, *, log_base: Union[str, float] = "e", m_b: Optional[float] = None,
               beta: Optional[float] = None, vocab_size: Optional[int] = None) -> CotLength:
    """Theorem 4.5's optimal chain-of-thought length k* for ``n`` examples and target error ``eps``.

    ``h_cot``: bits per CoT step H_CoT; ``alpha``: the efficiency constant α; ``gap``: B(0) − B_opt.
    ``m_b``, ``beta`` (the theorem's M_B and β) widen the ξ_n band and enable the n-condition;
    ``vocab_size`` enables the ε ≥ 1/V check.
    """
    log, base = _log_fn(log_base)
    n = _positive("n", n)
    if n <= 1:
        raise InvalidInputError(f"n must be > 1 (log n appears in ξ_n), got {n}.")
    eps = _positive("eps", eps)
    if eps >= 1:
        raise InvalidInputError(f"eps is a target error in (0, 1), got {eps}.")
    h_cot = _positive("h_cot", h_cot)
    alpha = _positive("alpha", alpha)
    gap = _positive("gap (B(0) - B_opt)", gap)
    notes = []
    if m_b is None or beta is None:
        notes.append("M_B and/or beta not given: taken as 0 in C2, the narrowest band the theorem allows.")
    mb = 0.0 if m_b is None else float(m_b)
    bt = 0.0 if beta is None else float(beta)
    if mb < 0 or bt < 0:
        raise InvalidInputError(f"m_b and beta must be non-negative, got {m_b!r}, {beta!r}.")
    k_star = math.sqrt(alpha * n / (h_cot * gap)) * log(1.0 / eps)
    c2 = 4.0 * (1.0 + mb / alpha + bt / h_cot)
    xi = c2 * math.sqrt(log(n) / n)
    band = (max(0.0, k_star * (1 - xi)), k_star * (1 + xi))
    lower = n ** -0.25
    if vocab_size is not None:
        vocab_size = check_int(vocab_size, "vocab_size", min=2)
        lower = max(lower, 1.0 / int(vocab_size))
    checks = {
        "eps_at_least_max(n^-1/4, 1/V)": eps >= lower,
        "eps_at_most_half": eps <= 0.5,
        "n_at_least_4beta_log_n_over_h_cot": (n >= 4 * bt * log(n) / h_cot) if beta is not None else None,
        "xi_bound_below_1": xi < 1,
    }
    for name, ok in checks.items():
        if ok is False:
            notes.append(f"validity check failed: {name}")
    if vocab_size is None:
        notes.append("vocab_size not given: the eps >= 1/V part of the range is not checked.")
    valid = all(v is not False for v in checks.values())
    return CotLength(k_star=k_star, band=band, xi_bound=xi, c2=c2, valid=valid, checks=checks, n=n, eps=eps,
                     h_cot=h_cot, alpha=alpha, gap=gap, log_base=base, notes=tuple(notes))


def _model(k, b_opt, alpha, k0):
    return b_opt + alpha / (k + k0)


@dataclass(frozen=True, eq=False)
class CotFit(Result):
    """α, k₀, B_opt of B(k) = B_opt + α/(k + k₀); ``gap`` = B(0) − B_opt = α/k₀.

    ``alpha``, ``k0``, ``b_opt`` and ``gap`` are :class:`~bayes_lens.Estimate` values with 95%
    residual-bootstrap intervals (the fit refitted on fitted values plus resampled residuals; ``n``
    is the number of points), ``(nan, nan)`` when fewer than half the refits converged or
    ``n_boot=0``.
    """

    alpha: Estimate
    k0: Estimate
    b_opt: Estimate
    b0: float
    gap: Estimate
    rmse: float
    points: pd.DataFrame

    def _summary(self):
        return f"fit of B(k) on {len(self.points)} points, RMSE {fmt(self.rmse)}", [
            ("alpha", fmt(self.alpha), fmt_ci(self.alpha), ""),
            ("k0", fmt(self.k0), fmt_ci(self.k0), ""),
            ("B_opt", fmt(self.b_opt), fmt_ci(self.b_opt), f"B0 {fmt(self.b0)}"),
            ("gap", fmt(self.gap), fmt_ci(self.gap), ""),
        ]

    def predict(self, k) -> np.ndarray:
        return _model(np.asarray(k, dtype=np.float64), self.b_opt.value, self.alpha.value, self.k0.value)

    def k_star(self, n, eps, h_cot, *, log_base: Union[str, float] = "e", **kw) -> CotLength:
        """:func:`cot_length` with the fitted α and gap."""
        return cot_length(n, eps, h_cot, self.alpha.value, self.gap.value, log_base=log_base, **kw)

    def to_dataframe(self) -> pd.DataFrame:
        rows = []
        for name in ("alpha", "k0", "b_opt", "gap"):
            e = getattr(self, name)
            rows.append({"parameter": name, "value": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high})
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        p = self.points
        grid = np.linspace(0, p.k.max(), 200)
        fig = go.Figure([go.Scatter(x=p.k, y=p.B, mode="markers", name="measured B(k)"),
                         go.Scatter(x=grid, y=self.predict(grid), name="B_opt + α/(k + k0)")])
        fig.update_layout(title="CoT constants", xaxis_title="k", yaxis_title="B(k)")
        return fig


def estimate_cot_params(k, B, *, n_boot: int = 1000, seed: int = 0) -> CotFit:
    """Fit B(k) = B_opt + α/(k + k₀) to measured points (k ≥ 0; at least 4 distinct k)."""
    from scipy.optimize import curve_fit

    k = np.asarray(k, dtype=np.float64).ravel()
    B = np.asarray(B, dtype=np.float64).ravel()
    if k.shape != B.shape:
        raise InvalidInputError(f"k and B must have the same length, got {k.size} and {B.size}.")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(B))):
        raise InvalidInputError("k and B must be finite.")
    if np.any(k < 0):
        raise InvalidInputError(f"every k (number of CoT steps) must be >= 0, got min {k.min():g}.")
    if np.unique(k).size < 4:
        raise InvalidInputError("at least 4 distinct k are needed to fit B_opt, α and k₀.")

    def fit(y):
        span = max(float(np.ptp(y)), 1e-9)
        p0 = (float(y.min()), span * (1 + k.min()), 1.0)
        popt, _ = curve_fit(_model, k, y, p0=p0, bounds=([-np.inf, 1e-12, 1e-9], [np.inf, np.inf, np.inf]),
                            maxfev=20000)
        return popt

    try:
        b_opt, alpha, k0 = fit(B)
    except RuntimeError as err:
        raise InvalidInputError(f"B(k) = B_opt + α/(k + k0) did not converge on these points: {err}") from err
    resid = B - _model(k, b_opt, alpha, k0)
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    cis = {name: (float("nan"), float("nan")) for name in ("alpha", "k0", "b_opt", "gap")}
    if n_boot:
        rng = np.random.default_rng(seed)
        fitted = _model(k, b_opt, alpha, k0)
        reps = []
        for _ in range(n_boot):
            yb = fitted + rng.choice(resid, size=resid.size, replace=True)
            try:
                bo, a, kk = fit(yb)
            except RuntimeError:
                continue
            reps.append((a, kk, bo, a / kk))
        reps = np.asarray(reps)
        if reps.shape[0] >= n_boot / 2:
            for j, name in enumerate(("alpha", "k0", "b_opt", "gap")):
                cis[name] = percentile_interval(reps[:, j], min_finite=0.0)
    method = "95% residual bootstrap (refit on fitted values + resampled residuals)" if n_boot else "no interval (n_boot=0)"

    def est(name, value):
        return Estimate(float(value), cis[name], method, n=int(k.size))

    return CotFit(alpha=est("alpha", alpha), k0=est("k0", k0), b_opt=est("b_opt", b_opt),
                  b0=float(b_opt + alpha / k0), gap=est("gap", alpha / k0), rmse=rmse, points=pd.DataFrame({"k": k, "B": B}))
