"""Excess prequential code length, the order-averaging gain and position interventions (Paper B v3).

Paper B v3 (arXiv 2507.11768v3; METHODS.md §8b) scores in-context prediction by log loss against an
exact Bayesian reference P (here :func:`~bayes_lens.martingale.dirichlet_categorical`; K = 2,
α = ½ is Krichevsky–Trofimov) with the frequentist plug-in beside it.

* :func:`excess_codelength` (arrays) and :func:`codelength` (a model or predictor): per position t and
  sequence, the excess code length e_t = log₂ P(x_t | x_{<t}) − log₂ Q(x_t | x_{<t}) and the
  predictive KL k_t = KL(P(· | x_{<t}) ‖ Q(· | x_{<t})) in bits, their sums over positions, means
  with bootstrap intervals over sequences. **What holds exactly.** Pointwise, only the one-step
  identity E_{x_t ~ P(·|x_{<t})}[e_t] = k_t holds; Σ_t e_t of a realized sequence is not Σ_t k_t
  (their difference is a sum of martingale differences under P). Summed, E_P[Σ_t e_t] = E_P[Σ_t k_t]
  = KL(P_n ‖ Q_n) (the chain rule) holds **in expectation under the reference mixture P**: exactly
  by enumeration of all K^n sequences weighted by P (``identity_exact``), and within Monte Carlo error
  for sequences drawn from P (``identity_gap``, interval should hold 0). For sequences drawn at a
  fixed θ it does not hold (the expectation is then under θ, not P).
* :func:`order_averaging`: for each multiset, the regret of its given order
  log₂ P(x) − log₂ Q(x), of the order-averaged (permutation-mixture) predictor
  log₂ P(x) − log₂ Q̄(x), Q̄(x) = mean over m random orderings π_j of Q(π_j x) (exchangeable; P is, so
  log₂ P is the same for every ordering), and the order-averaging gain = their difference, which adds up
  exactly on every sequence by construction; next to it the expected single-ordering regret (mean over
  the m orderings) and its gain over Q̄, a Jensen gap ≥ 0 on every sequence. Monte Carlo error of
  log₂ Q̄: the delta-method s.e. sd(Q_j)/(√m·mean Q_j)/ln 2. With finite m, log₂ Q̄ is biased low, so
  the gain is understated against the mixture over all orderings (−26% / −20% / −7% at m = 4 / 8 / 32
  on a synthetic predictor); ``gain_jackknife_bits`` (leave-one-ordering-out jackknife of log₂ Q̄)
  removes the O(1/m) bias. Each is given per n with its log-log slope.
* :func:`position_interventions`: move one symbol (position i) to the end or the start of the
  sequence, everything else in order, and measure the change of the final prediction (total variation
  and KL in bits); an exchangeable predictor (the exact reference) changes by exactly 0.

Example
-------
>>> import numpy as np
>>> from bayes_lens.martingale import excess_codelength, dirichlet_categorical, plugin_mle
>>> x = np.random.default_rng(0).integers(0, 2, size=(20, 10))
>>> q = plugin_mle(2, 0.05)(x)
>>> res = excess_codelength(q, x, {"kt": dirichlet_categorical(2, 0.5)(x)}, n_boot=0)
>>> bool(res.per_sequence.excess_bits.notna().all())
True
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._validate import check_count, check_float, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ..metrics.stats import bootstrap_indices, keyed_rng, percentile_interval
from ._predict import CategoricalTemplate, as_symbol_sequences, symbol_predictive
from ._references import dirichlet_categorical, dirichlet_log_marginal, plugin_mle

__all__ = ["CodeLengthResult", "excess_codelength", "codelength", "exact_identity",
           "OrderAveragingResult", "order_averaging", "PositionInterventionResult", "position_interventions"]

_LN2 = np.log(2.0)
_METHOD = "95% percentile bootstrap over sequences"


def _as_predictive(q, x: np.ndarray, name: str) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 3 or q.shape[:2] != x.shape:
        raise InvalidInputError(f"{name} must be [n_seq, n_pos, K] matching the sequences {x.shape}; got {q.shape}.")
    if not np.all(np.isfinite(q)) or q.min() < 0 or np.abs(q.sum(-1) - 1).max() > 1e-6:
        raise InvalidInputError(
            f"{name} must hold finite probability distributions over K symbols (>= 0, rows summing to 1); "
            "renormalize over the symbol tokens first, and give the model a preamble so row 0 is defined.")
    return q


def _floor(q: np.ndarray, floor: float) -> np.ndarray:
    return q if floor == 0 else (q + floor) / (1.0 + q.shape[-1] * floor)


def _picked(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.take_along_axis(q, x[..., None], axis=-1)[..., 0]


def _kl_bits(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return terms.sum(-1) / _LN2


_INFINITE = ("none: the mean is infinite (Q gave probability 0 where the reference did not), and an interval from "
             "the resamples that left those sequences out would exclude it")


def _mean(rows: np.ndarray, axis=None):
    """Mean without numpy's warning for inf − inf (a NaN mean stays NaN)."""
    with np.errstate(invalid="ignore"):
        return rows.mean(axis)


def _estimate(rows: np.ndarray, idx: Optional[np.ndarray], *, null=None) -> Estimate:
    """Mean over sequences (axis 0) with a percentile bootstrap interval from resample indices; an infinite
    mean gets no interval (the finite resamples are those that left its infinite sequences out)."""
    rows = np.asarray(rows, dtype=np.float64)
    value = float(_mean(rows))
    if not np.isfinite(value):
        how = _INFINITE if np.isinf(value) else "none: undefined (an infinite excess minus an infinite KL)"
        return Estimate(value, (float("nan"), float("nan")), how, null=null, n=int(rows.size))
    ci = (float("nan"), float("nan"))
    if idx is not None and rows.size >= 2:
        ci = percentile_interval(rows[idx].mean(1), min_finite=0.0)
    return Estimate(value, ci, _METHOD, null=null, n=int(rows.size))


def _curve(rows: np.ndarray, idx: Optional[np.ndarray]):
    """Per-column mean and interval of ``rows [n_seq, L]`` (no interval where the mean is infinite)."""
    mean = _mean(rows, 0)
    if idx is None or rows.shape[0] < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    with np.errstate(invalid="ignore"):
        lo, hi = percentile_interval(rows[idx].mean(1), axis=0, min_finite=0.0)
    bad = ~np.isfinite(mean)
    return mean, np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)


def _fmt(est: Estimate) -> str:
    """``fmt`` of an estimate, but ``+inf`` for an infinite one (``fmt`` writes every non-finite number as nan)."""
    return "+inf" if est.value == np.inf else fmt(est)


# ----------------------------------------------------------------------------- excess code length

@dataclass(frozen=True, eq=False)
class CodeLengthResult(Result):
    """Excess code length of a predictor Q against exact references, in bits (module docstring).

    ``headline``: one row per reference with the cumulative excess code length Σ_t e_t, the cumulative
    KL Σ_t k_t, their difference (the identity gap; 0 in expectation under that reference's mixture),
    and the one-step KL at the last position, each with a bootstrap interval over sequences (the one-step
    KL's 95% percentile interval covers the true mean about 91% of the time, not 95%: the per-sequence KL
    is skewed and the sequences few; METHODS.md §8b).
    ``per_position``: mean e_t and k_t (and cumulative means) per reference and position, with
    intervals; ``per_sequence``: Σ_t e_t and Σ_t k_t per sequence and reference.
    ``identity_exact``: E_P[Σ e] and E_P[Σ k] by enumeration of every sequence of length
    ``identity_exact['n']`` (weights P, the Bayesian reference), where it was computed.
    """

    headline: pd.DataFrame
    per_position: pd.DataFrame
    per_sequence: pd.DataFrame
    excess: Dict[str, Estimate]
    cum_kl: Dict[str, Estimate]
    identity_gap: Dict[str, Estimate]
    one_step_kl: Dict[str, Estimate]
    n_seqs: int
    n_pos: int
    n_symbols: int
    identity_exact: Dict[str, float] = field(default_factory=dict)
    design: Dict[str, object] = field(default_factory=dict)
    #: how many sequences have a symbol that occurred with probability 0 under Q (their excess code length,
    #: and so the mean, is +inf; score with ``floor`` > 0 to bound it)
    zero_probability: int = 0

    @property
    def identity_line(self) -> str:
        """The identity, stated with what holds exactly and what was measured."""
        parts = []
        ex = self.identity_exact
        if ex:
            parts.append(f"exact (all {self.n_symbols}^{ex['n']} sequences weighted by the reference): "
                         f"E[excess] {ex['expected_excess_bits']:.6g} bits = E[cum KL] {ex['expected_cum_kl_bits']:.6g}"
                         f" bits, |difference| {ex['abs_difference_bits']:.1e}")
        for ref, est in self.identity_gap.items():
            parts.append(f"{ref}: mean(excess − cum KL) over sequences {fmt(est)} {fmt_ci(est)} (0 in expectation "
                         "only when the sequences are drawn from this reference's mixture)")
        return "excess code length = cumulative KL in expectation under the reference, not per sequence; " + \
            "; ".join(parts)

    def _summary(self):
        title = f"{self.n_seqs} sequences, {self.n_pos} positions, K = {self.n_symbols}"
        rows = []
        for ref in self.excess:
            rows.append((f"excess code length vs {ref} (bits)", _fmt(self.excess[ref]), fmt_ci(self.excess[ref]),
                         f"cum KL {_fmt(self.cum_kl[ref])}"))
            rows.append((f"one-step KL vs {ref} (bits)", _fmt(self.one_step_kl[ref]), fmt_ci(self.one_step_kl[ref]),
                         ""))
        if self.zero_probability:
            rows.insert(0, ("infinite: Q gave probability 0 to a symbol that occurred", "+inf", "no interval",
                            f"{self.zero_probability} of {self.n_seqs} sequences; score with floor=1e-6 to bound it"))
        ex = self.identity_exact
        if ex:
            rows.append(("identity E[excess] − E[cum KL] (exact)", f"{ex['difference_bits']:.1e}", "",
                         f"n = {ex['n']}, by enumeration"))
        return title, rows[:8]

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_position.copy()

    def plot(self):
        go = plotly()
        fig = go.Figure()
        for ref, g in self.per_position.groupby("reference", sort=False):
            fig.add_trace(go.Scatter(x=g.position, y=g.cum_excess_bits, name=f"cum excess vs {ref}"))
            fig.add_trace(go.Scatter(x=g.position, y=g.cum_kl_bits, name=f"cum KL vs {ref}", line=dict(dash="dot")))
        fig.update_layout(title="Excess prequential code length (bits)", xaxis_title="position t",
                          yaxis_title="bits")
        return fig


def excess_codelength(q, sequences, references: Mapping[str, np.ndarray], *, floor: float = 0.0,
                      n_boot: int = 1000, seed: int = 0, identity_exact: Optional[dict] = None,
                      design: Optional[dict] = None) -> CodeLengthResult:
    """Excess code length of the predictive ``q`` ``[n_seq, n_pos, K]`` against each reference array.

    ``sequences`` ``[n_seq, n_pos]`` are the symbols that occurred (q[i, t] predicts sequences[i, t]);
    ``references`` maps a name to its exact predictive, the same shape as ``q``. ``floor`` mixes
    ``q`` with a floor (q + ε)/(1 + Kε) before scoring (0: none). A symbol that occurred with probability 0
    under ``q`` has an infinite code length: the estimates are then +inf with no interval, the result's
    ``zero_probability`` counts those sequences and its summary says so (a ``floor`` > 0 bounds it).
    """
    seed = check_seed(seed)
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    eps = check_float(floor, "floor", min=0.0)
    q0 = np.asarray(q, dtype=np.float64)
    if q0.ndim != 3:
        raise InvalidInputError(f"q must be [n_seq, n_pos, K], got shape {q0.shape}.")
    x = as_symbol_sequences(sequences, q0.shape[-1])
    q = _floor(_as_predictive(q0, x, "q"), eps)
    if not references:
        raise InvalidInputError("references is empty; pass e.g. {'bayes': dirichlet_categorical(K, 0.5)(x)}.")
    n, L, k = q.shape
    idx = bootstrap_indices(n, n_boot, seed=keyed_rng(seed, 1)) if n_boot and n >= 2 else None
    with np.errstate(divide="ignore"):  # a probability 0 is an infinite code length, reported as such
        logq = np.log2(_picked(q, x))
    head, pos_rows, seq_rows = [], [], []
    excess, cum_kl, gap, one = {}, {}, {}, {}
    zero = int(np.isinf(logq).any(1).sum())  # sequences whose code length under Q is infinite
    for ref, p in references.items():
        p = _as_predictive(p, x, f"references[{ref!r}]")
        if p.shape[-1] != k:
            raise InvalidInputError(f"references[{ref!r}] is over {p.shape[-1]} symbols but q over {k}: build the "
                                    f"reference for the same K, e.g. dirichlet_categorical({k}, 0.5)(sequences).")
        with np.errstate(divide="ignore"):
            logp = np.log2(_picked(p, x))
        with np.errstate(invalid="ignore"):
            e = logp - logq  # [n, L]
        kl = _kl_bits(p, q)
        E, K_ = e.sum(1), kl.sum(1)
        excess[ref], cum_kl[ref] = _estimate(E, idx), _estimate(K_, idx)
        with np.errstate(invalid="ignore"):  # inf − inf: no identity gap for an infinite sequence (NaN)
            diff = E - K_
        gap[ref], one[ref] = _estimate(diff, idx, null=0.0), _estimate(kl[:, -1], idx)
        head.append({"reference": ref, **{f"excess_bits_{k2}": v for k2, v in excess[ref].to_dict().items()},
                     **{f"cum_kl_bits_{k2}": v for k2, v in cum_kl[ref].to_dict().items()},
                     "identity_gap_bits": gap[ref].value, "identity_gap_ci_low": gap[ref].ci_low,
                     "identity_gap_ci_high": gap[ref].ci_high, "one_step_kl_bits": one[ref].value,
                     "one_step_kl_ci_low": one[ref].ci_low, "one_step_kl_ci_high": one[ref].ci_high})
        m_e, lo_e, hi_e = _curve(e, idx)
        m_k, lo_k, hi_k = _curve(kl, idx)
        m_ce, lo_ce, hi_ce = _curve(np.cumsum(e, 1), idx)
        m_ck, lo_ck, hi_ck = _curve(np.cumsum(kl, 1), idx)
        for t in range(L):
            pos_rows.append({"reference": ref, "position": t + 1, "excess_bits": m_e[t], "excess_ci_low": lo_e[t],
                             "excess_ci_high": hi_e[t], "kl_bits": m_k[t], "kl_ci_low": lo_k[t], "kl_ci_high": hi_k[t],
                             "cum_excess_bits": m_ce[t], "cum_excess_ci_low": lo_ce[t],
                             "cum_excess_ci_high": hi_ce[t], "cum_kl_bits": m_ck[t], "cum_kl_ci_low": lo_ck[t],
                             "cum_kl_ci_high": hi_ck[t]})
        seq_rows.append(pd.DataFrame({"reference": ref, "sequence": np.arange(n), "excess_bits": E,
                                      "cum_kl_bits": K_}))
    return CodeLengthResult(headline=pd.DataFrame(head), per_position=pd.DataFrame(pos_rows),
                            per_sequence=pd.concat(seq_rows, ignore_index=True), excess=excess, cum_kl=cum_kl,
                            identity_gap=gap, one_step_kl=one, n_seqs=n, n_pos=L, n_symbols=k,
                            identity_exact=dict(identity_exact or {}), design=dict(design or {}),
                            zero_probability=zero)


def exact_identity(model, n_symbols: int = 2, length: int = 4, *, alpha: float = 0.5,
                   template: Optional[CategoricalTemplate] = None, batch_size: int = 8,
                   progress: Optional[bool] = None) -> Dict[str, float]:
    """E_P[Σ_t e_t] and E_P[Σ_t k_t] for the model, exactly: every one of the K^length sequences is
    scored and weighted by its probability under the Dirichlet(α) reference P. Equal up to rounding."""
    k = check_int(n_symbols, "n_symbols", min=2)
    n = check_positive_int(length, "length")
    if k ** n > 4096:
        raise InvalidInputError(f"K^length = {k}^{n} sequences is too many to enumerate; use K^length <= 4096.")
    x = np.array(list(itertools.product(range(k), repeat=n)), dtype=np.int64)
    q, _ = symbol_predictive(model, x, n_symbols=k, template=template, batch_size=batch_size,
                             progress=progress, desc="identity (enumeration)")
    q = _as_predictive(q, x, "the model's predictive")
    p = dirichlet_categorical(k, alpha)(x)
    w = np.exp(dirichlet_log_marginal(x, k, alpha))
    e = (np.log2(_picked(p, x)) - np.log2(_picked(q, x))).sum(1)
    kl = _kl_bits(p, q).sum(1)
    ee, ek = float(w @ e), float(w @ kl)
    return {"n": n, "expected_excess_bits": ee, "expected_cum_kl_bits": ek, "difference_bits": ee - ek,
            "abs_difference_bits": abs(ee - ek), "total_weight": float(w.sum())}


def _draw(rng: np.random.Generator, n_seqs: int, length: int, k: int, alpha: float, theta) -> np.ndarray:
    """Sequences from the Dirichlet(α) mixture (θ drawn per sequence) or, with ``theta``, i.i.d. from θ."""
    if theta is None:
        th = rng.dirichlet(np.full(k, alpha), size=n_seqs)
    else:
        th = np.broadcast_to(np.asarray(theta, dtype=np.float64), (n_seqs, k))
    u = rng.random((n_seqs, length, 1))
    return np.minimum((u > np.cumsum(th, axis=1)[:, None, :]).sum(-1), k - 1).astype(np.int64)


def _check_theta(theta, k: int):
    if theta is None:
        return None
    th = np.asarray(theta, dtype=np.float64).ravel()
    if th.size == 1 and k == 2:
        th = np.array([1.0 - th[0], th[0]])
    if th.size != k or np.any(th < 0) or not np.isclose(th.sum(), 1.0):
        raise InvalidInputError(f"theta must be {k} probabilities summing to 1 (or P(1) for K = 2), got {theta!r}.")
    return th


def codelength(model, *, n_symbols: int = 2, alpha: float = 0.5, seq_len: int = 32, n_seqs: int = 64,
               theta=None, plugin_floor: float = 0.01, floor: float = 0.0,
               template: Optional[CategoricalTemplate] = None, identity_len: Optional[int] = None,
               seed: int = 0, n_boot: int = 1000, batch_size: int = 8,
               progress: Optional[bool] = None) -> CodeLengthResult:
    """Excess code length of a model (or sequence predictor) against the Dirichlet(α) Bayesian reference
    (``"bayes"``; KT for K = 2, α = ½) and the plug-in baseline (``"plugin"``), on ``n_seqs`` sequences
    of ``seq_len`` symbols drawn from the reference mixture (``theta=None``) or i.i.d. from ``theta``.

    ``identity_len`` (default: the largest n with K^n <= 256; 0 skips): the exact identity check by
    enumeration (:func:`exact_identity`) on the model's own predictions.
    """
    seed = check_seed(seed)
    k = check_int(n_symbols, "n_symbols", min=2, max=10)
    a = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    L = check_positive_int(seq_len, "seq_len")
    n = check_positive_int(n_seqs, "n_seqs")
    th = _check_theta(theta, k)
    template = template or CategoricalTemplate.digits(k)
    if template.n_symbols != k:
        raise InvalidInputError(f"the template has {template.n_symbols} symbols but n_symbols = {k}.")
    x = _draw(keyed_rng(seed, 0), n, L, k, a, th)
    q, mass = symbol_predictive(model, x, n_symbols=k, template=template, batch_size=batch_size,
                                progress=progress, desc="code length")
    refs = {"bayes": dirichlet_categorical(k, a)(x), "plugin": plugin_mle(k, plugin_floor)(x)}
    if identity_len is None:
        identity_len = int(np.floor(np.log(256) / np.log(k) + 1e-9))
    identity_len = check_int(identity_len, "identity_len", min=0)
    exact = exact_identity(model, k, identity_len, alpha=a, template=template, batch_size=batch_size,
                           progress=progress) if identity_len else {}
    design = {"alpha": a, "theta": None if th is None else th.tolist(), "plugin_floor": plugin_floor,
              "floor": floor, "seed": seed, "symbols": list(template.symbols),
              "symbol_mass_mean": float(np.nanmean(mass)) if np.isfinite(mass).any() else float("nan")}
    return excess_codelength(q, x, refs, floor=floor, n_boot=n_boot, seed=seed, identity_exact=exact, design=design)


# ----------------------------------------------------------------------------- order averaging

def _log2_joint(model, x: np.ndarray, k: int, template, batch_size: int, progress, desc: str) -> np.ndarray:
    q, _ = symbol_predictive(model, x, n_symbols=k, template=template, batch_size=batch_size,
                             progress=progress, desc=desc)
    q = _as_predictive(q, x, "the model's predictive")
    return np.log2(_picked(q, x)).sum(1)


def _log2_mean_exp2(v: np.ndarray, axis: int = -1) -> np.ndarray:
    m = v.max(axis=axis, keepdims=True)
    return (m + np.log2(np.mean(np.exp2(v - m), axis=axis, keepdims=True))).squeeze(axis)


def _slope(ns: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(y) & (y > 0)
    return float(np.polyfit(np.log(ns[ok]), np.log(y[ok]), 1)[0]) if ok.sum() >= 2 else float("nan")


_OA_COLUMNS = ("regret_given_bits", "regret_averaged_bits", "gain_bits", "regret_expected_bits", "jensen_gain_bits",
               "regret_averaged_jackknife_bits", "gain_jackknife_bits")


def _jackknife_log2_mean(lq: np.ndarray) -> np.ndarray:
    """Leave-one-ordering-out jackknife of log₂ mean_j 2^lq_j over the last axis (m ≥ 2 orderings):
    m·θ̂ − (m − 1)·mean_j θ̂_(−j). θ̂ = log₂ of an m-sample mean is biased low (Jensen) by about
    Var(Q_j)/(2·m·mean²·ln 2); the jackknife removes that O(1/m) term."""
    m = lq.shape[-1]
    full = _log2_mean_exp2(lq)
    loo = np.stack([_log2_mean_exp2(np.delete(lq, j, axis=-1)) for j in range(m)], -1)
    return m * full - (m - 1) * loo.mean(-1)


@dataclass(frozen=True, eq=False)
class OrderAveragingResult(Result):
    """Regret of the given order = regret of the order-averaged predictor + order-averaging gain, per n.

    ``per_sequence``: one row per (n, sequence): ``regret_given_bits``, ``regret_averaged_bits``,
    ``gain_bits`` (their difference, exact), ``regret_expected_bits`` (mean over the m orderings),
    ``jensen_gain_bits`` (expected − averaged, ≥ 0), ``mc_se_bits`` (Monte Carlo s.e. of the averaged
    predictor's log₂ probability) and ``regret_averaged_jackknife_bits`` / ``gain_jackknife_bits`` (the
    same two with log₂ Q̄ jackknifed over the orderings). **Bias.** log₂ of a mean over m orderings is
    biased low (Jensen), so with finite m ``regret_averaged_bits`` is biased up and ``gain_bits`` down,
    against the mixture over all orderings (an audit's synthetic predictor with an exact answer: −26% at
    m = 4, −20% at m = 8, −7% at m = 32; the test's recency predictor at n = 10: −30% / −22% / −3%).
    The leave-one-ordering-out jackknife removes the O(1/m) term (there −6% / −7% / +3%;
    tests/test_martingale_v3.py::test_order_averaging_gain_bias_and_its_jackknife). given = averaged + gain holds by
    construction (the gain is defined as the difference), for both pairs. ``per_n``: their means with bootstrap intervals over sequences;
    ``slopes``: log-log slope of each mean against n."""

    per_sequence: pd.DataFrame
    per_n: pd.DataFrame
    slopes: Dict[str, float]
    n_perms: int
    n_seqs: int
    max_decomposition_error: float
    design: Dict[str, object] = field(default_factory=dict)

    def _summary(self):
        last = self.per_n.iloc[-1]
        title = f"{self.n_seqs} sequences per n, {self.n_perms} orderings; decomposition error {self.max_decomposition_error:.1e}"
        rows = []
        for col in ("regret_given_bits", "regret_averaged_bits", "gain_bits", "jensen_gain_bits"):
            rows.append((f"{col[:-5].replace('_', ' ')} at n = {int(last.n)}", fmt(last[col]),
                         fmt_ci((last[col + '_ci_low'], last[col + '_ci_high'])), f"slope in n {fmt(self.slopes[col])}"))
        rows.append(("gain, jackknifed over orderings at n = " + str(int(last.n)), fmt(last.gain_jackknife_bits),
                     fmt_ci((last.gain_jackknife_bits_ci_low, last.gain_jackknife_bits_ci_high)),
                     f"plain gain is biased low with {self.n_perms} orderings"))
        rows.append(("Monte Carlo s.e. of averaged (bits)", fmt(last.mc_se_bits), "", ""))
        return title, rows

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_n.copy()

    def plot(self):
        go = plotly()
        fig = go.Figure()
        for col in ("regret_given_bits", "regret_averaged_bits", "gain_bits", "jensen_gain_bits"):
            fig.add_trace(go.Scatter(x=self.per_n.n, y=self.per_n[col], name=col, mode="lines+markers"))
        fig.update_layout(title="Order-averaging decomposition (bits)", xaxis_title="n", yaxis_title="bits")
        return fig


def order_averaging(model, *, n_symbols: int = 2, alpha: float = 0.5, ns: Sequence[int] = (8, 16, 32),
                    n_seqs: int = 32, n_perms: int = 16, theta=None, template: Optional[CategoricalTemplate] = None,
                    seed: int = 0, n_boot: int = 1000, batch_size: int = 8,
                    progress: Optional[bool] = None) -> OrderAveragingResult:
    """Per sequence: regret of its order, of the permutation mixture over ``n_perms`` random orderings,
    and the order-averaging gain (module docstring), at each length in ``ns``; regret is against the
    Dirichlet(α) reference, whose log₂ P(x) is the same for every ordering."""
    seed = check_seed(seed)
    k = check_int(n_symbols, "n_symbols", min=2, max=10)
    a = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    n_seqs = check_positive_int(n_seqs, "n_seqs")
    m = check_int(n_perms, "n_perms", min=2)
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    th = _check_theta(theta, k)
    lengths = sorted({check_positive_int(v, "ns") for v in ns})
    if not lengths:
        raise InvalidInputError("ns is empty; pass the sequence lengths, e.g. ns=(8, 16, 32).")
    template = template or CategoricalTemplate.digits(k)
    rows = []
    for L in lengths:
        rng = keyed_rng(seed, 2, L)
        x = _draw(rng, n_seqs, L, k, a, th)
        perms = np.stack([[x[i][rng.permutation(L)] for _ in range(m)] for i in range(n_seqs)])  # [n, m, L]
        allx = np.concatenate([x, perms.reshape(-1, L)])
        lq = _log2_joint(model, allx, k, template, batch_size, progress, f"order averaging n={L}")
        given, lq_perm = lq[:n_seqs], lq[n_seqs:].reshape(n_seqs, m)
        lp = dirichlet_log_marginal(x, k, a) / _LN2
        avg = _log2_mean_exp2(lq_perm)
        r = np.exp2(lq_perm - lq_perm.max(1, keepdims=True))
        r = r / r.mean(1, keepdims=True)
        mc_se = r.std(1, ddof=1) / np.sqrt(m) / _LN2
        reg_given, reg_avg = lp - given, lp - avg
        reg_exp = (lp[:, None] - lq_perm).mean(1)
        reg_jk = lp - _jackknife_log2_mean(lq_perm)
        for i in range(n_seqs):
            rows.append({"n": L, "sequence": i, "regret_given_bits": reg_given[i], "regret_averaged_bits": reg_avg[i],
                         "gain_bits": reg_given[i] - reg_avg[i], "regret_expected_bits": reg_exp[i],
                         "jensen_gain_bits": reg_exp[i] - reg_avg[i], "mc_se_bits": mc_se[i],
                         "regret_averaged_jackknife_bits": reg_jk[i], "gain_jackknife_bits": reg_given[i] - reg_jk[i]})
    per_seq = pd.DataFrame(rows)
    err = float(np.max(np.abs(per_seq.regret_given_bits - (per_seq.regret_averaged_bits + per_seq.gain_bits))))
    summary = []
    for L, g in per_seq.groupby("n"):
        idx = bootstrap_indices(len(g), n_boot, seed=keyed_rng(seed, 3, int(L))) if n_boot and len(g) >= 2 else None
        row = {"n": int(L)}
        for col in _OA_COLUMNS:
            est = _estimate(g[col].to_numpy(), idx)
            row.update({col: est.value, col + "_ci_low": est.ci_low, col + "_ci_high": est.ci_high})
        row["mc_se_bits"] = float(g.mc_se_bits.mean())
        summary.append(row)
    per_n = pd.DataFrame(summary)
    slopes = {col: _slope(per_n.n.to_numpy(float), per_n[col].to_numpy(float)) for col in _OA_COLUMNS}
    return OrderAveragingResult(per_sequence=per_seq, per_n=per_n, slopes=slopes, n_perms=m, n_seqs=n_seqs,
                                max_decomposition_error=err,
                                design={"alpha": a, "theta": None if th is None else th.tolist(), "seed": seed,
                                        "ns": lengths, "symbols": list(template.symbols)})


# ----------------------------------------------------------------------------- position interventions

def _move(x: np.ndarray, i: int, j: int) -> np.ndarray:
    """``x`` with the symbol at position i taken out and put back at position j (others keep their order)."""
    rest = np.delete(x, i, axis=-1)
    return np.insert(rest, j, x[..., i], axis=-1)


@dataclass(frozen=True, eq=False)
class PositionInterventionResult(Result):
    """Change of the final prediction when one symbol moves to the end or the start of the sequence.

    ``per_move``: one row per (direction, source position) with the mean total variation and KL (bits)
    between the final predictive before and after the move, with intervals over sequences (moves that
    leave the sequence unchanged excluded). ``effect_tv``: the headline mean TV over all moves;
    ``reference_tv``: the same for the exact Bayesian reference (0); ``shuffle_tv``: TV after a random
    reordering of the whole sequence (a scale for the effect)."""

    per_move: pd.DataFrame
    effect_tv: Estimate
    effect_kl_bits: Estimate
    reference_tv: float
    shuffle_tv: Estimate
    n: int
    n_seqs: int
    design: Dict[str, object] = field(default_factory=dict)

    def _summary(self):
        return f"n = {self.n}, {self.n_seqs} sequences", [
            ("TV of final prediction after a move", fmt(self.effect_tv), fmt_ci(self.effect_tv),
             f"exact reference {fmt(self.reference_tv)}"),
            ("KL (bits) after a move", fmt(self.effect_kl_bits), fmt_ci(self.effect_kl_bits), ""),
            ("TV after a random reordering", fmt(self.shuffle_tv), fmt_ci(self.shuffle_tv), ""),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_move.copy()

    def plot(self):
        go = plotly()
        fig = go.Figure()
        for d, g in self.per_move.groupby("direction"):
            fig.add_trace(go.Scatter(x=g.source + 1, y=g.tv, name=f"move to {d}", mode="lines+markers"))
        fig.update_layout(title="Position interventions: TV of the final prediction", xaxis_title="source position",
                          yaxis_title="total variation")
        return fig


def position_interventions(model, *, n_symbols: int = 2, alpha: float = 0.5, seq_len: int = 16, n_seqs: int = 32,
                           theta=None, template: Optional[CategoricalTemplate] = None, seed: int = 0,
                           n_boot: int = 1000, batch_size: int = 8,
                           progress: Optional[bool] = None) -> PositionInterventionResult:
    """Move each symbol to the end and to the start of its sequence and measure the change of the model's
    prediction after the whole sequence (total variation, KL in bits), against the exact reference's 0."""
    seed = check_seed(seed)
    k = check_int(n_symbols, "n_symbols", min=2, max=10)
    a = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    L = check_int(seq_len, "seq_len", min=2)
    n = check_positive_int(n_seqs, "n_seqs")
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    th = _check_theta(theta, k)
    template = template or CategoricalTemplate.digits(k)
    rng = keyed_rng(seed, 4)
    x = _draw(rng, n, L, k, a, th)
    moves = [("end", i, L - 1) for i in range(L - 1)] + [("start", i, 0) for i in range(1, L)]
    moved = np.stack([_move(x, i, j) for _, i, j in moves], axis=1)  # [n, M, L]
    shuffled = np.stack([row[rng.permutation(L)] for row in x])
    allx = np.concatenate([x, moved.reshape(-1, L), shuffled])
    q, _ = symbol_predictive(model, allx, n_symbols=k, template=template, include_next=True,
                             batch_size=batch_size, progress=progress, desc="position interventions")
    fin = q[:, -1]
    if not np.all(np.isfinite(fin)):
        raise InvalidInputError("the final prediction is undefined for some sequences.")
    base, after, shuf = fin[:n], fin[n:n + n * len(moves)].reshape(n, len(moves), k), fin[n + n * len(moves):]
    tv = 0.5 * np.abs(after - base[:, None]).sum(-1)
    kl = _kl_bits(base[:, None], after)
    same = np.all(moved == x[:, None], axis=-1)
    idx = bootstrap_indices(n, n_boot, seed=keyed_rng(seed, 5)) if n_boot and n >= 2 else None
    rows = []
    for c, (d, i, j) in enumerate(moves):
        keep = ~same[:, c]
        if not keep.any():
            continue
        ii = None if idx is None or keep.sum() < 2 else bootstrap_indices(int(keep.sum()), n_boot,
                                                                          seed=keyed_rng(seed, 6, c))
        e_tv, e_kl = _estimate(tv[keep, c], ii), _estimate(kl[keep, c], ii)
        rows.append({"direction": d, "source": i, "target": j, "n_moved": int(keep.sum()), "tv": e_tv.value,
                     "tv_ci_low": e_tv.ci_low, "tv_ci_high": e_tv.ci_high, "kl_bits": e_kl.value,
                     "kl_ci_low": e_kl.ci_low, "kl_ci_high": e_kl.ci_high})
    moved_any = (~same).sum(1)  # a constant sequence has no move that changes it
    per_seq_tv = np.where(same, 0.0, tv).sum(1) / np.maximum(moved_any, 1)
    per_seq_kl = np.where(same, 0.0, kl).sum(1) / np.maximum(moved_any, 1)
    per_seq_tv[moved_any == 0] = np.nan
    ok = np.isfinite(per_seq_tv)
    idx_ok = None if idx is None or ok.sum() < 2 else bootstrap_indices(int(ok.sum()), n_boot, seed=keyed_rng(seed, 7))
    ref = dirichlet_categorical(k, a)
    ref_fin = ref(np.concatenate([allx, np.zeros((allx.shape[0], 1), dtype=np.int64)], axis=1))[:, -1]
    ref_tv = float(np.max(0.5 * np.abs(ref_fin[n:n + n * len(moves)].reshape(n, len(moves), k)
                                       - ref_fin[:n, None]).sum(-1)))
    shuf_tv = 0.5 * np.abs(shuf - base).sum(-1)
    return PositionInterventionResult(
        per_move=pd.DataFrame(rows), effect_tv=_estimate(per_seq_tv[ok], idx_ok, null=0.0),
        effect_kl_bits=_estimate(per_seq_kl[ok], idx_ok, null=0.0), reference_tv=ref_tv,
        shuffle_tv=_estimate(shuf_tv, idx), n=L, n_seqs=n,
        design={"alpha": a, "theta": None if th is None else th.tolist(), "seed": seed,
                "symbols": list(template.symbols)})
