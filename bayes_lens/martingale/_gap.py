"""The martingale gap Δ̂_n of Paper B (eq. 27), next to the same statistic for the exact Bayes predictive.

    Δ̂_n = mean over sequences of | log P(x_n | x_{1:n−1}) − log P(x_n | x_{1:n−2}) |   (nats)

on balanced sequences (⌊n/2⌋ ones, uniformly shuffled, seeded), N sequences per n (Paper B:
n ∈ {10, 12, …, 198}, N = 100). Both terms come from one forward pass per sequence: the predictive
read before x_{n−1} (prefix x_{1:n−2}) is evaluated at the *value of x_n*.

A Bayesian predictor has a nonzero Δ̂_n too, so the statistic is reported next to Laplace's rule
(the Bayes predictive under a uniform prior) on the same sequences, and next to its closed-form
expectation over uniformly shuffled balanced sequences: with m = n/2 ones (n even), Laplace gives
P(x_n | x_{1:n−1}) = m/(n+1) always, and P(x_n | x_{1:n−2}) = (m − 1)/n when x_{n−1} = x_n
(probability (m − 1)/(n − 1)) or ½ otherwise, so E Δ̂_n = ((m−1)/(n−1))·log(n²/(2(n+1)(m−1)))
+ (m/(n−1))·log((n+1)/n) ≈ 1/n: the 1/n shape with A ≈ 1.

Fits (see ``_fit``): A·log(n)/n + B and A/n + B by weighted least squares (IRLS with
w = N/fitted² by default, ``weights="observed"`` for Paper B's N/Δ̂²) with adjusted R²,
likelihood-ratio comparison, bootstrap CIs. Paper B (GPT-3 text-davinci-002): A = 0.182 ± 0.021,
B = −0.0043 ± 0.0018, adjusted R² 0.759; the 1/n model R² < 0.3.

Random streams: ``seed`` seeds a :class:`numpy.random.SeedSequence` whose three children drive,
independently, the balanced sequences, the per-n bootstrap CIs and the bootstrap of the fits
(the log n/n and 1/n fits share their resamples, a paired comparison). Same seed, same numbers.

Example
-------
>>> from bayes_lens.martingale import gap, laplace
>>> res = gap(laplace, range(10, 40, 2), n_seqs=20, seed=0, n_boot=0)
>>> bool((res.per_n.gap_nats - res.per_n.laplace_gap_nats).abs().max() == 0)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from jaxtyping import Float, Int

from .._progress import progress as progress_bar
from .._results import Result, fmt, fmt_ci, plotly
from ..metrics.stats import bootstrap_ci
from .._validate import check_count, check_int, check_positive_int, check_seed
from ..errors import InvalidInputError
from ._fit import GapFit, check_weights, compare_fits, fit_gap
from ._predict import DEFAULT_TEMPLATE, BernoulliTemplate, laplace, predict_array, prob_of

__all__ = ["GapResult", "gap", "balanced_sequences", "laplace_expected_gap", "martingale_gap", "gap_sequences",
           "GAP_SEQUENCES_VERSION"]

#: Bumped whenever the same arguments would give different sequences (exported in a file's card).
GAP_SEQUENCES_VERSION = "martingale-gap-1"

PAPER_B = {"A": 0.182, "A_se": 0.021, "B": -0.0043, "B_se": 0.0018, "adj_r2": 0.759, "model": "GPT-3 text-davinci-002"}


def balanced_sequences(n: int, n_seqs: int, rng: np.random.Generator) -> Int[np.ndarray, "n_seqs n"]:
    """``n_seqs`` uniformly shuffled sequences of length n with ⌊n/2⌋ ones."""
    base = np.zeros(n, dtype=np.int64)
    base[: n // 2] = 1
    return np.stack([rng.permutation(base) for _ in range(n_seqs)])


def martingale_gap(p1: Float[np.ndarray, "n_seqs n"], x: Int[np.ndarray, "n_seqs n"]) -> Float[np.ndarray, "n_seqs"]:
    """Per-sequence |log P(x_n | x_{1:n−1}) − log P(x_n | x_{1:n−2})| from predictives ``p1`` [N, n]."""
    xn = x[:, -1]
    a = prob_of(p1[:, -1], xn)
    b = prob_of(p1[:, -2], xn)
    with np.errstate(divide="ignore"):
        return np.abs(np.log(a) - np.log(b))


def laplace_expected_gap(n: Int[np.ndarray, "*shape"] | int) -> Float[np.ndarray, "*shape"]:
    """E Δ̂_n of Laplace's rule over uniformly shuffled balanced sequences (exact; n ≥ 3)."""
    n = np.asarray(n, dtype=np.float64)
    m = np.floor(n / 2)  # ones
    z = n - m  # zeros
    # the last two symbols: (1,1), (0,0), (0,1), (1,0)
    pr11 = m * (m - 1) / (n * (n - 1))
    pr00 = z * (z - 1) / (n * (n - 1))

    def term(count_sym_before_last, count_sym_before_two):
        return np.abs(np.log((count_sym_before_last + 1) / (n + 1)) - np.log((count_sym_before_two + 1) / n))

    out = np.zeros_like(n)
    # x_n = 1, x_{n-1} = 1: ones among first n-1 = m-1, among first n-2 = m-2
    out += np.where(pr11 > 0, pr11 * term(m - 1, m - 2), 0.0)
    out += np.where(pr00 > 0, pr00 * term(z - 1, z - 2), 0.0)
    # x_n differs from x_{n-1}: half of those have x_n = 1 (counts m-1, m-1), half x_n = 0 (z-1, z-1)
    diff_1 = m * z / (n * (n - 1))  # P(x_{n-1}=0, x_n=1)
    diff_0 = z * m / (n * (n - 1))
    out += diff_1 * term(m - 1, m - 1) + diff_0 * term(z - 1, z - 1)
    return out


@dataclass(frozen=True, eq=False)
class GapResult(Result):
    """Δ̂_n per n (``per_n``), the fits for the model (``fit`` = A·log n/n + B, ``fit_inv`` = A/n + B),
    their comparison, and the same fits for Laplace's rule on the same sequences."""

    per_n: pd.DataFrame
    fit: GapFit
    fit_inv: GapFit
    comparison: dict
    laplace_fit: GapFit
    laplace_fit_inv: GapFit
    mean_symbol_mass: float
    n_seqs: int
    seed: int
    template: Optional[BernoulliTemplate]
    paper_b: dict = field(default_factory=lambda: dict(PAPER_B))
    per_seq: list = field(default_factory=list, repr=False)  # per-sequence gaps, one array per n

    def _summary(self):
        ns = self.per_n["n"]
        title = f"n = {int(ns.min())}..{int(ns.max())} ({len(ns)} values), {self.n_seqs} sequences per n"
        f, fi, lf = self.fit, self.fit_inv, self.laplace_fit
        return title, [
            ("A (log n / n fit)", fmt(f.A), fmt_ci(f.A), f"B {fmt(f.B)} {fmt_ci(f.B)}, adj R2 {fmt(f.adj_r2, 3)}"),
            ("A (1/n fit)", fmt(fi.A), fmt_ci(fi.A), f"adj R2 {fmt(fi.adj_r2, 3)}"),
            ("preferred shape", str(self.comparison.get("preferred")), "",
             f"LR log vs 1/n {fmt(self.comparison.get('lr_log_vs_inv'), 3)}"),
            ("Laplace's rule A (log n / n)", fmt(lf.A), fmt_ci(lf.A), f"Paper B A = {self.paper_b.get('A', '')}"),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: one row per (n, predictor) with ``gap_nats`` and its CI."""
        rows = []
        for r in self.per_n.itertuples():
            rows.append({"n": r.n, "predictor": "model", "gap_nats": r.gap_nats, "gap_ci_low_nats": r.gap_ci_low_nats,
                         "gap_ci_high_nats": r.gap_ci_high_nats, "n_seqs": r.n_seqs})
            rows.append({"n": r.n, "predictor": "laplace", "gap_nats": r.laplace_gap_nats,
                         "gap_ci_low_nats": np.nan, "gap_ci_high_nats": np.nan, "n_seqs": r.n_seqs})
            rows.append({"n": r.n, "predictor": "laplace_expected", "gap_nats": r.laplace_expected_gap_nats,
                         "gap_ci_low_nats": np.nan, "gap_ci_high_nats": np.nan, "n_seqs": np.nan})
        return pd.DataFrame(rows)

    def fits_table(self) -> pd.DataFrame:
        """The four fits (model/Laplace × log n/n, 1/n) side by side, with Paper B's GPT-3 row."""
        rows = []
        for who, f in (("model", self.fit), ("model", self.fit_inv), ("laplace", self.laplace_fit),
                       ("laplace", self.laplace_fit_inv)):
            rows.append({"predictor": who, "formula": f.formula, "A": f.A.value, "A_se": f.A_se,
                         "A_ci_low": f.A.ci_low, "A_ci_high": f.A.ci_high, "B": f.B.value, "B_se": f.B_se,
                         "B_ci_low": f.B.ci_low, "B_ci_high": f.B.ci_high, "adj_r2": f.adj_r2, "weights": f.weights})
        rows.append({"predictor": f"paper B ({PAPER_B['model']})", "formula": "A*log(n)/n + B", "A": PAPER_B["A"],
                     "A_se": PAPER_B["A_se"], "B": PAPER_B["B"], "B_se": PAPER_B["B_se"], "adj_r2": PAPER_B["adj_r2"]})
        return pd.DataFrame(rows)

    def plot(self):
        go = plotly()
        d = self.per_n
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=d.n, y=d.gap_nats, mode="markers", name="model Δ̂_n",
                                 error_y=dict(type="data", symmetric=False,
                                              array=d.gap_ci_high_nats - d.gap_nats,
                                              arrayminus=d.gap_nats - d.gap_ci_low_nats)))
        grid = np.linspace(d.n.min(), d.n.max(), 200)
        fig.add_trace(go.Scatter(x=grid, y=self.fit.predict(grid), name=f"fit {self.fit.formula}"))
        fig.add_trace(go.Scatter(x=grid, y=self.fit_inv.predict(grid), name=f"fit {self.fit_inv.formula}",
                                 line=dict(dash="dot")))
        fig.add_trace(go.Scatter(x=d.n, y=d.laplace_expected_gap_nats, name="Laplace (exact expectation)",
                                 line=dict(dash="dash")))
        fig.update_layout(title="Martingale gap Δ̂_n (Paper B eq. 27)", xaxis_title="n",
                          yaxis_title="Δ̂_n (nats)")
        return fig


def _check_ns(ns) -> list:
    try:
        ns = [int(n) for n in ns]
    except TypeError as err:
        raise InvalidInputError(f"ns must be an iterable of integers, got {ns!r}.") from err
    if not ns:
        raise InvalidInputError("ns is empty; pass sequence lengths such as range(10, 200, 2).")
    if min(ns) < 3:
        raise InvalidInputError(
            f"every n must be >= 3 (Δ̂_n compares the predictives after n-1 and n-2 symbols), got {min(ns)}."
        )
    if len(set(ns)) != len(ns):
        raise InvalidInputError("ns contains duplicates.")
    return ns


def gap(model, ns: Sequence[int] = range(10, 42, 4), *, n_seqs: int = 100, seed: int = 0,
        template: Optional[BernoulliTemplate] = None, n_boot: int = 1000, batch_size: int = 8,
        weights: str = "fitted", progress: Optional[bool] = None) -> GapResult:
    """Paper B's Δ̂_n over balanced sequences for every n in ``ns``, with Laplace's rule alongside.

    Sizes and cost: the default ``ns`` = 10, 14, …, 38 (8 lengths) is sized for a first look; a
    sequence of n symbols is about 2n + 3 tokens, one forward pass each. On SmolLM2-135M on 2 CPU
    cores ``gap(model)`` (100 sequences per n) takes about 2-3 min and ``gap(model, n_seqs=20)``
    about 30 s; Paper B's full sizes, ``ns=range(10, 200, 2), n_seqs=100``, take about 2 h.

    ``model`` is a TransformerLens model or a predictor callable. ``n_boot`` bootstrap resamples of
    sequences give the per-n CIs and the CIs of A and B (0 skips them). ``weights``: ``"fitted"``
    (IRLS, w = N/fitted², default) or ``"observed"`` (w = N/Δ̂², Paper B as written, biased low);
    see :func:`fit_gap`. ``seed`` is split into independent child streams for the sequences, the
    per-n CIs and the fit bootstrap (``numpy.random.SeedSequence(seed).spawn``).

    Inside ``with bl.shard.sharded(...)`` the forward passes run in shards (one collection per n,
    which keeps the two symbol tokens' logits and the log-sum-exp at the last positions of every
    sequence); a predictor callable always runs in this process. Batch-aligned shards give the
    one-process numbers.
    """
    seed = check_seed(seed)
    n_seqs = check_int(n_seqs, "n_seqs", min=2)  # a spread needs two
    n_boot = check_count(n_boot, "n_boot", allow_zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
    ns = _check_ns(ns)
    if len(ns) < 3:
        raise InvalidInputError(f"gap() needs at least 3 values of n to fit the curve, got {len(ns)}.")
    check_weights(weights)
    data_ss, ci_ss, fit_ss = np.random.SeedSequence(seed).spawn(3)
    rng = np.random.default_rng(data_ss)
    ci_seeds = [int(v) for v in ci_ss.generate_state(len(ns), dtype=np.uint32)]
    rows, per_seq, masses = [], [], []
    for j, n in enumerate(progress_bar(ns, desc="martingale gap", enabled=progress, unit="n")):
        x = balanced_sequences(n, n_seqs, rng)
        p1, mass = predict_array(model, x, template=template, batch_size=batch_size, progress=False,
                                 desc=f"martingale_gap: n={n}")
        d = martingale_gap(p1, x)
        lap = martingale_gap(laplace(x), x)
        if not np.all(np.isfinite(d)):
            raise InvalidInputError(f"the predictive is 0 or NaN for an observed symbol at n={n}; cannot take logs.")
        lo, hi = bootstrap_ci(np.mean, d, n_boot=n_boot, seed=ci_seeds[j]) if n_boot else (np.nan, np.nan)
        per_seq.append(d)
        m_mean = float(np.nanmean(mass[:, -2:])) if np.isfinite(mass).any() else float("nan")
        masses.append(m_mean)
        rows.append({"n": n, "n_seqs": n_seqs, "gap_nats": float(d.mean()), "gap_se_nats": float(d.std(ddof=1) / np.sqrt(n_seqs)),
                     "gap_ci_low_nats": lo, "gap_ci_high_nats": hi, "laplace_gap_nats": float(lap.mean()),
                     "laplace_expected_gap_nats": float(laplace_expected_gap(n)), "symbol_mass": m_mean})
    per_n = pd.DataFrame(rows)
    counts = per_n.n_seqs.to_numpy(float)
    nv, gv, lv = per_n.n.to_numpy(float), per_n.gap_nats.to_numpy(), per_n.laplace_gap_nats.to_numpy()
    fit = fit_gap(nv, gv, counts, shape="log", per_seq=per_seq, n_boot=n_boot, seed=fit_ss, weights=weights)
    fit_inv = fit_gap(nv, gv, counts, shape="inv", per_seq=per_seq, n_boot=n_boot, seed=fit_ss, weights=weights)
    comparison = compare_fits(nv, gv, counts, weights=weights)
    lfit = fit_gap(nv, lv, counts, shape="log", weights=weights)
    lfit_inv = fit_gap(nv, lv, counts, shape="inv", weights=weights)
    mass_all = np.array(masses)
    return GapResult(per_n=per_n, fit=fit, fit_inv=fit_inv, comparison=comparison, laplace_fit=lfit,
                     laplace_fit_inv=lfit_inv,
                     mean_symbol_mass=float(np.nanmean(mass_all)) if np.isfinite(mass_all).any() else float("nan"),
                     n_seqs=n_seqs, seed=seed, template=template, per_seq=per_seq)


def gap_sequences(ns: Sequence[int] = range(10, 42, 4), *, n_seqs: int = 100, seed: int = 0,
                  template: Optional[BernoulliTemplate] = None):
    """The balanced sequences :func:`gap` draws for these arguments, as a task prompt set
    (:class:`bayes_lens.tasks.TaskPrompts`, METHODS.md §6a and §8) that :func:`bayes_lens.tasks.export`
    writes as JSONL with a dataset card.

    One item per sequence: the rendered sequence (``template``, default ``"Sequence: 0 1 1 0"``), the
    answers (the separator plus each symbol: ``(" 0", " 1")``), ``k`` = n, ``sequence`` (the bits),
    ``n``, and as its posterior Laplace's rule (Beta(1, 1) prior) for the next bit, ((n − s + 1), (s + 1))
    / (n + 2) with s ones; no outcome (the gap statistic reads every prefix, not a next bit).

    >>> items = gap_sequences(ns=(10, 14), n_seqs=2, seed=0)
    >>> len(items), items[0].text.count(" "), items[0].posterior
    (4, 10, (0.5, 0.5))
    """
    from ..tasks import TaskItem, TaskPrompts

    seed = check_seed(seed)
    n_seqs = check_int(n_seqs, "n_seqs", min=2)
    ns = _check_ns(ns)
    tmpl = template if template is not None else DEFAULT_TEMPLATE
    data_ss = np.random.SeedSequence(seed).spawn(3)[0]  # the stream gap() draws its sequences from
    rng = np.random.default_rng(data_ss)
    answers = tuple(tmpl.separator + s for s in tmpl.symbols)
    items = []
    for n in ns:
        for x in balanced_sequences(n, n_seqs, rng):
            s = int(x.sum())
            items.append(TaskItem(tmpl.render(x), task="martingale_gap", answers=answers,
                                  posterior=((n - s + 1) / (n + 2), (s + 1) / (n + 2)), k=int(n), outcome=None,
                                  prior_posterior=(0.5, 0.5), sequence=[int(b) for b in x], n=int(n)))
    params = {"ns": [int(n) for n in ns], "n_seqs": n_seqs, "prefix": tmpl.prefix, "separator": tmpl.separator,
              "symbols": list(tmpl.symbols)}
    return TaskPrompts(items, task="martingale_gap", seed=seed, generator_version=GAP_SEQUENCES_VERSION, params=params,
                       posterior_definition="balanced 0/1 sequences (floor(n/2) ones, uniformly shuffled) as "
                       "bl.martingale.gap draws them; posterior = Laplace's rule for the next bit, "
                       "((n - s + 1), (s + 1)) / (n + 2).")
