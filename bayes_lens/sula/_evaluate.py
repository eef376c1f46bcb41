"""SULA evaluation: the model's posterior over the two labels against the exact Bayesian posterior.

METHODS.md §6 (Paper A, "Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752, §4.3,
§5.2). The model's posterior is a pure function of its final-token logits (:func:`label_posterior`:
the next-token probabilities of the two label tokens, renormalized over the two; their raw mass is
kept too). :func:`evaluate` reports per k and overall: MAE(H_model, H_Bayes) in bits, Pearson and
Spearman of the entropies, KL(Bayes ‖ model) in bits, ECE (for the fixed class "first label") and
Brier score of P(L1) against the hidden label next to the exact posterior's own (the Bayes floor),
all with 95% percentile bootstrap intervals over prompts (stratified by k: the prompts are resampled
within each k, whose count the design fixes; a plain resample over-covered, 0.97–0.995); and the geometry on the task: one shared
standardized PCA of the final-token values at ``layer``, with ρ(PC1, H_Bayes), ρ(PC1, H_model),
ρ(k, PC1) and permutation p-values. It reads a :class:`bayes_lens.reduced.ReducedCache`, made by the
runner from a model or by :func:`bayes_lens.collect.reduce_cache` from a user's cache, so
both give the same numbers. Bootstrap resamples and permutations use independent child streams of
one seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .. import adapter
from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._inputs import as_reduced, is_cache_like, source_model
from ..reduced import ReducedCache
from .._validate import check_count, check_seed
from ..errors import InvalidInputError
from ..metrics.calibration import (
    binary_entropy_bits,
    expected_calibration_error,
    kl_bernoulli_bits,
    kl_categorical_bits,
    mae_bits,
    multiclass_brier_score,
    reliability_bins,
    top_label,
)
from ..metrics.pca import pca
from ..metrics.stats import (
    bootstrap_indices,
    child_rngs,
    pearson_rows,
    percentile_interval,
    permutation_pvalue_rows,
    slope_rows,
    spearman_rows,
    entropy_bits,
)
from ..tasks import TaskPrompts, answer_posterior, answer_token_ids, as_task_prompts, is_task_item, label_posterior
from ._task import (
    CARRIER_WORDS,
    CONTROLS,
    SulaItem,
    SulaPrompts,
    check_labels,
    choose_labels,
    get_tokenizer,
    make_prompts,
)

__all__ = ["SulaResult", "SulaControls", "evaluate", "run_controls", "label_posterior", "answer_posterior",
           "as_prompts", "label_token_ids", "evaluate_reduced"]

_METRICS = ("mae_bits", "pearson", "spearman", "kl_bits", "ece", "brier", "bayes_ece", "bayes_brier",
            "label_mass", "h_model_mean_bits")


# --------------------------------------------------------------------------------------------------
# the model's posterior: a pure function of the logits


def label_token_ids(model, labels) -> Tuple[int, int]:
    """The single-token ids of the two labels (each with its leading space) in the model's tokenizer."""
    _, ids = check_labels(get_tokenizer(model), labels)
    return ids


# --------------------------------------------------------------------------------------------------
# statistics (vectorized over bootstrap resamples)


def _group_stats(h_m, h_b, kl, cal, mass, *, n_boot: int, rng, n_bins: int, strata=None) -> dict:
    """Point estimates and percentile bootstrap CIs (resampling prompts) of every SULA metric;
    ``strata`` (the k of each prompt): resample within k, the design's fixed count per k.

    ``kl`` is KL(Bayes ‖ model) per prompt; ``cal`` is (model ECE probabilities, their 0/1 events,
    model squared error per prompt, the same three for the exact posterior), or None when the items
    carry no outcome (ECE and Brier are then NaN). SULA passes P(L1), 1[y = L1] and (P(L1) − 1[y = L1])²;
    other tasks the top answer's probability, whether it was drawn, and the multi-class squared error."""
    n = len(h_m)

    def stats(idx):
        hm, hb = h_m[idx], h_b[idx]
        out = {
            "mae_bits": mae_bits(hm, hb),
            "pearson": pearson_rows(hm, hb),
            "spearman": spearman_rows(hm, hb),
            "kl_bits": kl[idx].mean(-1),
            "label_mass": mass[idx].mean(-1),
            "h_model_mean_bits": hm.mean(-1),
        }
        if cal is None:
            nan = np.full(idx.shape[:-1], np.nan)
            out.update(ece=nan, brier=nan, bayes_ece=nan, bayes_brier=nan)
        else:
            pm, ym, sqm, pb, yb, sqb = cal
            out.update(ece=expected_calibration_error(pm[idx], ym[idx], n_bins=n_bins), brier=sqm[idx].mean(-1),
                       bayes_ece=expected_calibration_error(pb[idx], yb[idx], n_bins=n_bins), bayes_brier=sqb[idx].mean(-1))
        return out

    point = {key: float(np.asarray(v).ravel()[0]) for key, v in stats(np.arange(n)[None, :]).items()}
    out = {"n": n, "h_bayes_mean_bits": float(h_b.mean())}
    reps = stats(bootstrap_indices(n, n_boot, seed=rng, strata=strata)) if n >= 2 else {key: np.full(1, np.nan) for key in point}
    for key in _METRICS:
        lo, hi = percentile_interval(reps[key])
        out[key] = point[key]
        out[key + "_ci_low"] = lo
        out[key + "_ci_high"] = hi
    return out


def _slope_with_ci(x: np.ndarray, y: np.ndarray, *, n_boot: int, rng) -> Tuple[float, Tuple[float, float]]:
    """Least-squares slope of y on x (model entropy per extra example) and its bootstrap CI."""
    point = float(slope_rows(x, y))
    if len(x) < 2 or not np.isfinite(point):
        return point, (float("nan"), float("nan"))
    idx = bootstrap_indices(len(x), n_boot, seed=rng)
    return point, percentile_interval(slope_rows(x[idx], y[idx]))


def _geometry_table(pc1, h_b, h_m, k, *, n_boot: int, boot_rng, perm_rng) -> pd.DataFrame:
    rows = []
    n = len(pc1)
    idx = bootstrap_indices(n, n_boot, seed=boot_rng) if n >= 2 else None

    def within_k(a):  # subtract each k's mean: what is left cannot be explained by k (or length)
        out = np.asarray(a, dtype=np.float64).copy()
        for kv in np.unique(k):
            out[k == kv] -= out[k == kv].mean()
        return out

    pairs = (("pc1_vs_bayes_entropy", pc1, h_b), ("pc1_vs_model_entropy", pc1, h_m),
             ("k_vs_pc1", k.astype(np.float64), pc1),
             ("pc1_vs_bayes_entropy_within_k", within_k(pc1), within_k(h_b)),
             ("pc1_vs_model_entropy_within_k", within_k(pc1), within_k(h_m)))
    for name, a, b in pairs:
        r = float(pearson_rows(a, b))
        rs = float(spearman_rows(a, b))
        if idx is not None:
            lo, hi = percentile_interval(pearson_rows(a[idx], b[idx]))
            slo, shi = percentile_interval(spearman_rows(a[idx], b[idx]))
        else:
            lo = hi = slo = shi = float("nan")
        rows.append({"pair": name, "pearson": r, "pearson_ci_low": lo, "pearson_ci_high": hi,
                     "abs_pearson": abs(r) if np.isfinite(r) else float("nan"),
                     "spearman": rs, "spearman_ci_low": slo, "spearman_ci_high": shi,
                     "perm_pvalue": permutation_pvalue_rows(a, b, r, n_perm=n_boot, seed=perm_rng), "n": n})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# results


# --------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class SulaResult(Result):
    """SULA evaluation of one condition (METHODS.md §6).

    ``table`` has one row per k and a final row ``k == "all"``: n, mean Bayes / model entropy (bits),
    ``mae_bits``, ``pearson``, ``spearman`` (of H_model and H_Bayes), ``kl_bits`` (mean KL(Bayes ‖
    model)), ``ece`` and ``brier`` (calibration of P(first label) against the hidden label: the ECE
    is for that fixed class, not the top-label ECE), ``bayes_ece`` and ``bayes_brier`` (the same for
    the exact posterior on the same prompts: the Bayes floor a perfect model would reach, ≈ 0.02 and
    ≈ 0.08 at 250 prompts and p = 0.9), ``label_mass`` (raw next-token probability on the two
    labels), each with ``_ci_low``/``_ci_high`` (95% percentile bootstrap over prompts), and
    ``mae_ignore_evidence_bits``: the MAE of a model that always answers with each prompt's prior
    (the evidence-blind baseline). ``geometry`` has ρ(PC1, H_Bayes),
    ρ(PC1, H_model), ρ(k, PC1) (Pearson and Spearman, CIs, permutation p-values), and the same two
    entropy correlations *within k* (each variable minus its per-k mean). H_Bayes falls with k and
    prompt length grows with k, so PC1 can track H_Bayes through length alone (even a random model
    does); the within-k rows remove that confound. The sign of PC1 is arbitrary (``abs_pearson``).
    ``entropy_slope_bits_per_example`` is the least-squares slope of the model's entropy on k:
    negative when the model uses the evidence.

    The headline numbers (``mae_bits``, ``pearson``, ``spearman``, ``kl_bits``, ``ece``, ``brier``,
    ``bayes_ece``, ``bayes_brier``, ``label_mass``, ``rho_pc1_bayes``, ``rho_pc1_model``, ``rho_k_pc1``,
    ``entropy_slope_bits_per_example``) are :class:`~bayes_lens.Estimate` values over all prompts
    (95% percentile bootstrap over prompts, ``n`` prompts). ``mae_bits.null`` is the evidence-blind
    MAE (``mae_ignore_evidence_bits``); correlations and the slope have ``null`` 0. The Pearson
    ``rho_*`` are those of the ``geometry`` table.
    """

    condition: str
    labels: Tuple[str, str]
    layer: int
    table: pd.DataFrame
    geometry: pd.DataFrame
    reliability: pd.DataFrame
    mae_bits: Estimate
    pearson: Estimate
    spearman: Estimate
    kl_bits: Estimate
    ece: Estimate
    brier: Estimate
    bayes_ece: Estimate
    bayes_brier: Estimate
    label_mass: Estimate
    rho_pc1_bayes: Estimate
    rho_pc1_model: Estimate
    rho_k_pc1: Estimate
    pc1_explained_variance: float
    entropy_slope_bits_per_example: Estimate
    model_p_first: Tensor
    model_entropy_bits: Tensor
    model_label_mass: Tensor
    bayes_p_first: Tensor
    bayes_entropy_bits: Tensor
    k: Tensor
    hidden_label: Tensor
    pc1: Tensor
    prompts: Union[SulaPrompts, TaskPrompts]
    n_boot: int
    seed: int
    task: str = "sula"
    model_posterior: Optional[Tensor] = None
    bayes_posterior: Optional[Tensor] = None

    def _summary(self):
        title = (f"condition {self.condition!r}, labels {tuple(self.labels)}, layer {self.layer}, "
                 f"n = {int(self.k.shape[0])} prompts")
        return title, [
            ("MAE |H_model - H_Bayes|", f"{fmt(self.mae_bits)} bits", fmt_ci(self.mae_bits), ""),
            ("Pearson(H_model, H_Bayes)", fmt(self.pearson), fmt_ci(self.pearson), f"Spearman {fmt(self.spearman)}"),
            ("ECE / Brier" if self.task == "sula" else "ECE (top answer) / Brier (multi-class)",
             f"{fmt(self.ece)} / {fmt(self.brier)}", "",
             f"Bayes floor {fmt(self.bayes_ece)} / {fmt(self.bayes_brier)}"),
            ("entropy slope on k", f"{fmt(self.entropy_slope_bits_per_example)} bits/example",
             fmt_ci(self.entropy_slope_bits_per_example), f"label mass {fmt(self.label_mass)}"),
        ]

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: condition, k, metric, value, ci_low, ci_high (geometry rows have k = "all")."""
        rows = []
        for _, r in self.table.iterrows():
            for m in _METRICS + ("h_bayes_mean_bits", "mae_ignore_evidence_bits"):
                rows.append({"condition": self.condition, "k": r["k"], "metric": m, "value": r[m],
                             "ci_low": r.get(m + "_ci_low", np.nan), "ci_high": r.get(m + "_ci_high", np.nan)})
        for _, g in self.geometry.iterrows():
            rows.append({"condition": self.condition, "k": "all", "metric": "rho_" + g["pair"],
                         "value": g["pearson"], "ci_low": g["pearson_ci_low"], "ci_high": g["pearson_ci_high"]})
        return pd.DataFrame(rows)

    def per_prompt(self) -> pd.DataFrame:
        """One row per prompt: k, hidden label, Bayes and model P(first label) and entropies, PC1."""
        return pd.DataFrame({
            "condition": self.condition, "text": self.prompts.texts, "k": self.k.numpy(),
            "hidden_label": self.hidden_label.numpy(), "bayes_p_first": self.bayes_p_first.numpy(),
            "model_p_first": self.model_p_first.numpy(), "bayes_entropy_bits": self.bayes_entropy_bits.numpy(),
            "model_entropy_bits": self.model_entropy_bits.numpy(), "label_mass": self.model_label_mass.numpy(),
            "pc1": self.pc1.numpy(),
        })

    def plot(self):
        """Entropy vs k (model vs Bayes), PC1 vs k, and the reliability diagram."""
        return _plot({self.condition: self})


@dataclass(frozen=True, eq=False)
class SulaControls(Result):
    """The main task and every control (:func:`run_controls`): ``table`` and ``geometry`` stack the
    conditions' tables with a ``condition`` column; ``results`` maps condition -> :class:`SulaResult`."""

    table: pd.DataFrame
    geometry: pd.DataFrame
    results: Dict[str, SulaResult]
    labels: Dict[str, Tuple[str, str]]
    layer: int

    def __getitem__(self, condition: str) -> SulaResult:
        return self.results[condition]

    def _summary(self):
        rows = []
        for name, r in self.results.items():
            rows.append((f"{name}: MAE", f"{fmt(r.mae_bits)} bits", fmt_ci(r.mae_bits),
                         f"Pearson {fmt(r.pearson)} {fmt_ci(r.pearson)}".rstrip() + f", n = {int(r.k.shape[0])}"))
        return f"{len(self.results)} conditions at layer {self.layer}", rows

    def to_dataframe(self) -> pd.DataFrame:
        """Long format over all conditions (see :meth:`SulaResult.to_dataframe`)."""
        return pd.concat([r.to_dataframe() for r in self.results.values()], ignore_index=True)

    def plot(self):
        """Entropy vs k per condition (model solid, Bayes dashed), PC1 vs k, reliability diagrams."""
        return _plot(self.results)


def _plot(results: Dict[str, SulaResult]):
    go = plotly()
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "entropy vs k (model solid, Bayes dashed)", "PC1 of final-token values vs k",
        f"reliability diagram ({next(iter(results))})"))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for i, (cond, res) in enumerate(results.items()):
        color = palette[i % len(palette)]
        t = res.table[res.table["k"] != "all"]
        ks = t["k"].astype(int).to_numpy()
        fig.add_trace(go.Scatter(
            x=ks, y=t["h_model_mean_bits"], mode="lines+markers", name=f"{cond}: model", line=dict(color=color),
            error_y=dict(type="data", symmetric=False,
                         array=t["h_model_mean_bits_ci_high"] - t["h_model_mean_bits"],
                         arrayminus=t["h_model_mean_bits"] - t["h_model_mean_bits_ci_low"])), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=t["h_bayes_mean_bits"], mode="lines+markers", name=f"{cond}: Bayes",
                                 line=dict(color=color, dash="dash")), row=1, col=1)
        kk = res.k.numpy().astype(float)
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, size=kk.shape)
        fig.add_trace(go.Scatter(x=kk + jitter, y=res.pc1.numpy(), mode="markers", name=f"{cond}: PC1",
                                 marker=dict(color=color, size=4, opacity=0.5)), row=1, col=2)
        if i == 0:  # the reliability diagram of the main task only. A control's Bayes posterior is ½ for every
            # prompt, so its diagram has no calibrated curve to compare with, and its few prompts fill a few
            # bins: on SmolLM2's quick report the shuffled-labels control (red) had 27 of 30 prompts at
            # P ≈ 0.02 and two one-prompt bins at P = 0.785 (observed 0) and 0.802 (observed 1), which the
            # joining line drew as the stray vertical red line at x ≈ 0.8.
            rel = res.reliability
            fig.add_trace(go.Scatter(x=rel["mean_predicted"], y=rel["observed_frequency"], mode="lines+markers",
                                     name=f"{cond}: reliability", line=dict(color=color),
                                     text=[f"n={c}" for c in rel["count"]]), row=1, col=3)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line=dict(color="gray", dash="dot")), row=1, col=3)
    fig.update_xaxes(title_text="k (examples)", row=1, col=1)
    fig.update_yaxes(title_text="entropy (bits)", row=1, col=1)
    fig.update_xaxes(title_text="k (examples)", row=1, col=2)
    fig.update_yaxes(title_text="PC1 score", row=1, col=2)
    first = next(iter(results.values()))
    fig.update_xaxes(title_text="mean predicted P(first label)" if first.task == "sula" else
                     "mean predicted P(top answer)", range=[0, 1], row=1, col=3)
    fig.update_yaxes(title_text="observed frequency", range=[0, 1], row=1, col=3)
    # the legend below the panels, inside the figure (a legend on the right ran off a report's page); no fixed
    # width: the figure takes its box's (a width of 1300 px ran out of the report's 1180 px column)
    fig.update_layout(title=("SULA" if first.task == "sula" else f"task {first.task!r}") +
                      ": model vs exact Bayesian posterior", height=520,
                      legend=dict(orientation="h", x=0, xanchor="left", y=-0.22, yanchor="top"),
                      margin=dict(b=150))
    return fig


# --------------------------------------------------------------------------------------------------
# evaluation


def as_prompts(prompts) -> Union[SulaPrompts, TaskPrompts]:
    """SULA items as a :class:`SulaPrompts` (one label pair; every item carries its p and prior); any
    other task's items (:mod:`bayes_lens.tasks`) as a :class:`bayes_lens.tasks.TaskPrompts`."""
    if isinstance(prompts, (SulaPrompts, TaskPrompts)):
        items = prompts
    else:
        if prompts is None or isinstance(prompts, str) or not isinstance(prompts, Iterable):
            raise InvalidInputError("prompts must be the output of bl.sula.make_prompts (or a list of its items), or "
                                    "a task's prompt set from bl.tasks.")
        items = list(prompts)
    if not len(items):
        raise InvalidInputError("the prompt list is empty; make prompts with bl.sula.make_prompts(model).")
    if isinstance(items, TaskPrompts) or not any(isinstance(it, SulaItem) for it in items) and \
            all(is_task_item(it) for it in items):
        return as_task_prompts(prompts)
    bad = [i for i, it in enumerate(items) if not isinstance(it, SulaItem)]
    if bad:
        raise InvalidInputError(
            f"prompt {bad[0]} is a {type(items[bad[0]]).__name__}, not a SULA item (nor an item of another task): "
            "evaluate needs the exact posterior each item carries. Make prompts with bl.sula.make_prompts(model) "
            "or a task generator of bl.tasks.")
    missing = [i for i, it in enumerate(items) if getattr(it, "prior", None) is None or getattr(it, "p", None) is None]
    if missing:
        raise InvalidInputError(
            f"item {missing[0]} does not carry its p and prior (made by an older bayes_lens?); make the prompts "
            "again with bl.sula.make_prompts(model, p=..., prior=...).")
    pairs = {it.labels for it in items}
    if len(pairs) != 1:
        raise InvalidInputError(f"all items must share one label pair, got {sorted(pairs)}; evaluate each set separately.")
    if isinstance(items, SulaPrompts):
        return items
    conds = {it.condition for it in items}
    ps, priors = {it.p for it in items}, {it.prior for it in items}
    ks = tuple(dict.fromkeys(it.k for it in items))
    return SulaPrompts(items, labels=items[0].labels, p=ps.pop() if len(ps) == 1 else None,
                       prior=priors.pop() if len(priors) == 1 else None,
                       control=conds.pop() if len(conds) == 1 else "mixed", ks=ks, n_per_k=None,
                       template=None, seed=None)


def _check_n_boot(n_boot) -> int:
    return check_count(n_boot, "n_boot")


def evaluate_reduced(rc: ReducedCache, items: SulaPrompts, *, layer: int, seed: int = 0, n_boot: int = 1000,
                     n_bins: int = 10) -> "SulaResult":
    """The SULA statistics of ``items`` from a reduced cache holding the two labels' log-probabilities
    (``token_ids`` = the label ids, in order) and the final-token values at ``layer``."""
    items = as_prompts(items)
    n_boot = _check_n_boot(n_boot)
    if rc.n_prompts != len(items):
        raise InvalidInputError(f"{rc.n_prompts} prompts were run but {len(items)} items were given; pass "
                                "the items in the order their texts were run.")
    k = items.k
    if isinstance(items, SulaPrompts):
        p_m, mass = label_posterior(rc.token_logprobs())
        h_m = binary_entropy_bits(p_m)
        p_b, h_b = items.bayes_p_first, items.bayes_entropy_bits
        hidden = items.hidden_label
        outcome = (hidden == 0).astype(np.float64)
        h_prior = binary_entropy_bits(np.array([it.prior for it in items], dtype=np.float64))
        kl = kl_bernoulli_bits(p_b, p_m)
        cal = (p_m, outcome, (p_m - outcome) ** 2, p_b, outcome, (p_b - outcome) ** 2)
        post_m, post_b = np.stack([p_m, 1.0 - p_m], 1), np.stack([p_b, 1.0 - p_b], 1)
        condition, labels, task = (items.control if isinstance(items.control, str) else "main"), tuple(items.labels), "sula"
    else:
        lp = rc.token_logprobs()
        if lp.shape[1] != len(items.answers):
            raise InvalidInputError(f"the cache holds {lp.shape[1]} token log-probabilities per prompt but the task has "
                                    f"{len(items.answers)} answers; collect with token_ids = the answers' ids.")
        post_m, mass = answer_posterior(lp)
        h_m = np.asarray(entropy_bits(post_m), dtype=np.float64)
        post_b, h_b = items.posterior, items.entropy_bits
        p_m, p_b = post_m[:, 0], post_b[:, 0]
        hidden = items.outcome
        h_prior = np.asarray(entropy_bits(items.prior_posterior), dtype=np.float64)
        kl = kl_categorical_bits(post_b, post_m)
        if np.all(hidden >= 0):
            conf_m, hit_m = top_label(post_m, hidden)
            conf_b, hit_b = top_label(post_b, hidden)
            cal = (conf_m, hit_m, multiclass_brier_score(post_m[:, None, :], hidden[:, None]),
                   conf_b, hit_b, multiclass_brier_score(post_b[:, None, :], hidden[:, None]))
        else:  # no (or not every) item carries an outcome: no ECE or Brier score
            cal = None
        condition, labels, task = items.task, tuple(items.answers), items.task

    groups = [(int(kv), k == kv) for kv in dict.fromkeys(k.tolist())] + [("all", np.ones_like(k, dtype=bool))]
    streams = child_rngs(len(groups) + 3, seed=seed)
    rows = []
    for gi, (name, sel) in enumerate(groups):
        st = _group_stats(h_m[sel], h_b[sel], kl[sel], None if cal is None else tuple(a[sel] for a in cal), mass[sel],
                          n_boot=n_boot, rng=streams[gi], n_bins=n_bins, strata=k[sel])
        rows.append({"k": name, **st, "mae_ignore_evidence_bits": float(mae_bits(h_prior[sel], h_b[sel]))})
    table = pd.DataFrame(rows)
    table["k"] = table["k"].astype(object)
    overall = rows[-1]

    values = rc.value_rows(layer, "v").double().numpy()
    try:
        fit = pca(values, n_components=1)
        pc1, evr = fit.coords[:, 0], float(fit.explained_variance_ratio[0])
    except InvalidInputError:  # fewer than 3 prompts, or identical values: PCA undefined
        pc1, evr = np.full(values.shape[0], np.nan), float("nan")
    geometry = _geometry_table(pc1, h_b, h_m, k, n_boot=n_boot, boot_rng=streams[-3], perm_rng=streams[-2])
    if cal is not None:
        rel = pd.DataFrame(reliability_bins(cal[0], cal[1], n_bins=n_bins))
    else:  # no outcomes: the diagram's bins, empty
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        rel = pd.DataFrame({"bin_low": edges[:-1], "bin_high": edges[1:], "count": np.zeros(n_bins, dtype=np.int64),
                            "mean_predicted": np.nan, "observed_frequency": np.nan})
    slope, slope_ci = _slope_with_ci(k.astype(np.float64), h_m, n_boot=n_boot, rng=streams[-1])

    def t(a, dtype=torch.float64):
        return torch.as_tensor(np.asarray(a), dtype=dtype)

    n, method = int(len(k)), "95% percentile bootstrap over prompts"

    def est(key, null=None):  # a metric over all prompts, its interval from the "all" row of the table
        return Estimate(float(overall[key]), (float(overall[key + "_ci_low"]), float(overall[key + "_ci_high"])),
                        method, null=null, n=n)

    def rho(pair):  # a Pearson row of the geometry table
        r = geometry.set_index("pair").loc[pair]
        return Estimate(float(r["pearson"]), (float(r["pearson_ci_low"]), float(r["pearson_ci_high"])), method,
                        null=0.0, n=n)

    return SulaResult(
        condition=condition, labels=labels, layer=layer, table=table, geometry=geometry, reliability=rel,
        mae_bits=est("mae_bits", null=float(overall["mae_ignore_evidence_bits"])),
        pearson=est("pearson", null=0.0), spearman=est("spearman", null=0.0), kl_bits=est("kl_bits"),
        ece=est("ece"), brier=est("brier"), bayes_ece=est("bayes_ece"), bayes_brier=est("bayes_brier"),
        label_mass=est("label_mass"), rho_pc1_bayes=rho("pc1_vs_bayes_entropy"),
        rho_pc1_model=rho("pc1_vs_model_entropy"), rho_k_pc1=rho("k_vs_pc1"),
        pc1_explained_variance=evr,
        entropy_slope_bits_per_example=Estimate(slope, slope_ci, method, null=0.0, n=n),
        model_p_first=t(p_m), model_entropy_bits=t(h_m), model_label_mass=t(mass), bayes_p_first=t(p_b),
        bayes_entropy_bits=t(h_b), k=t(k, torch.long), hidden_label=t(hidden, torch.long), pc1=t(pc1),
        prompts=items, n_boot=int(n_boot), seed=int(seed), task=task, model_posterior=t(post_m),
        bayes_posterior=t(post_b),
    )


def evaluate(
    source,
    prompts: Optional[Sequence[SulaItem]] = None,
    *,
    layer: int = -1,
    fwd_hooks=(),
    attention_mask=None,
    tokens=None,
    logits=None,
    model=None,
    batch_size: int = 16,
    seed: int = 0,
    n_boot: int = 1000,
    n_bins: int = 10,
    progress: Optional[bool] = None,
) -> SulaResult:
    """Compare the model's posterior over the two labels with the exact Bayesian posterior.

    Parameters
    ----------
    source:
        A TransformerLens model (the prompts are run in batches), or what ``run_with_cache`` returned
        on the prompts' texts: the ``(logits, cache)`` pair (or the cache with ``logits=``; a dict of
        its tensors with ``model=``), holding ``hook_v`` at ``layer``; pass the ``tokens`` (or their
        ``attention_mask``) of a padded batch.
    prompts:
        Output of :func:`make_prompts` (with a model the default is ``make_prompts(model, seed=seed)``,
        250 prompts); required with a cache, in the order of the cache's rows.
    layer:
        Layer whose final-token ``hook_v`` (per KV head) enters the shared PCA (negative from the end).
    fwd_hooks:
        ``[(hook_name, fn)]`` patches active during the forward passes (e.g. an entropy-axis removal);
        always removed afterwards. (For patches made by an axis, prefer ``with bl.patched(model, patch):``.)
    seed, n_boot, n_bins:
        Bootstrap seed and resamples (95% percentile CIs over prompts); ECE bins.

    ``prompts`` may be any task's items (:mod:`bayes_lens.tasks`, METHODS.md §6a): the posterior is
    then over the task's K answers, ECE is for the top answer and the Brier score is the multi-class
    one; ``condition`` is the task's name and ``labels`` its answers.

    A cache may also be a reduced cache (:func:`bayes_lens.collect.collect` with ``token_ids`` = the
    label ids, or :func:`bayes_lens.shard.merge`) with ``model=``. To run the forward passes in shards,
    call it inside ``with bl.shard.sharded(...)`` (batch-aligned shards give the one-process numbers).

    Example
    -------
    >>> items = bl.sula.make_prompts(model, ks=(0, 1, 2), n_per_k=4, seed=0)
    >>> res = bl.sula.evaluate(model, items, n_boot=200)
    >>> bool(res.mae_bits.ci_low <= res.mae_bits.value <= res.mae_bits.ci_high)
    True
    >>> bool(np.isclose(res.mae_bits.value, np.abs(res.model_entropy_bits - res.bayes_entropy_bits).mean()))
    True
    >>> toks, mask = bl.adapter.tokenize(model, res.prompts.texts)
    >>> pair = model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())
    >>> bl.sula.evaluate(pair, res.prompts, attention_mask=mask, n_boot=200).mae_bits.value == res.mae_bits.value
    True
    """
    _check_n_boot(n_boot)
    check_seed(seed)
    m = source_model(source, model)
    if m is None:
        raise InvalidInputError("a plain dict of tensors or a reduced cache does not record its model; pass model=.")
    if prompts is None:
        if is_cache_like(source) or isinstance(source, ReducedCache):
            raise InvalidInputError("with a cache pass the SULA items it was made from: evaluate(cache, prompts).")
        prompts = make_prompts(m, seed=seed)
    items = as_prompts(prompts)
    layer = adapter.resolve_layer(m, layer)
    rc, _ = as_reduced(source, items.texts, model=model, logits=logits, attention_mask=attention_mask,
                       tokens=tokens, value_layers=[layer],
                       token_ids=list(label_token_ids(m, items.labels) if isinstance(items, SulaPrompts)
                                      else answer_token_ids(m, items.answers)),
                       fwd_hooks=fwd_hooks, batch_size=batch_size, progress=progress, desc="sula.evaluate:")
    return evaluate_reduced(rc, items, layer=layer, seed=seed, n_boot=n_boot, n_bins=n_bins)


def run_controls(
    model,
    *,
    controls: Sequence[str] = CONTROLS,
    ks: Sequence[int] = (0, 1, 2, 4, 8),
    n_per_k: int = 50,
    p: float = 0.9,
    prior: float = 0.5,
    seed: int = 0,
    labels: Optional[Sequence[str]] = None,
    remap_labels: Optional[Sequence[str]] = None,
    layer: int = -1,
    fwd_hooks=(),
    batch_size: int = 16,
    n_boot: int = 1000,
    n_bins: int = 10,
    progress: Optional[bool] = None,
    **prompt_kwargs,
) -> SulaControls:
    """Evaluate the main task and every control (paired: one seed for all) into one table.

    ``labels`` is the main pair (default: chosen automatically); ``remap_labels`` the pair of the
    lexical-remap control (default: the next single-token pair, never overlapping the main pair).
    Other keyword arguments (``template``, ``carriers``, ``query_word``, ...) go to :func:`make_prompts`.
    """
    controls = tuple(controls)
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise InvalidInputError(f"unknown control(s) {bad}; choose from {CONTROLS}.")
    tok = get_tokenizer(model)
    common = dict(ks=ks, n_per_k=n_per_k, p=p, prior=prior, seed=seed, **prompt_kwargs)
    main = make_prompts(model, labels=labels, **common)
    if "lexical_remap" in controls and remap_labels is None:
        carriers = prompt_kwargs.get("carriers", CARRIER_WORDS)
        qw = prompt_kwargs.get("query_word", "query")
        remap_labels = choose_labels(tok, 2, exclude=set(main.labels) | set(carriers) | ({qw} if qw else set()),
                                     label_seed=prompt_kwargs.get("label_seed", 0))
    results: Dict[str, SulaResult] = {}
    for cond in ("main",) + controls:
        if cond == "main":
            prompts = main
        else:
            prompts = make_prompts(model, control=cond,
                                   labels=remap_labels if cond == "lexical_remap" else main.labels, **common)
        results[cond] = evaluate(model, prompts, layer=layer, fwd_hooks=fwd_hooks, batch_size=batch_size,
                                 seed=seed, n_boot=n_boot, n_bins=n_bins, progress=progress)
    table = pd.concat([r.table.assign(condition=c) for c, r in results.items()], ignore_index=True)
    table = table[["condition"] + [col for col in table.columns if col != "condition"]]
    geometry = pd.concat([r.geometry.assign(condition=c) for c, r in results.items()], ignore_index=True)
    geometry = geometry[["condition"] + [col for col in geometry.columns if col != "condition"]]
    first = next(iter(results.values()))
    return SulaControls(table=table, geometry=geometry, results=results,
                        labels={c: r.labels for c, r in results.items()}, layer=first.layer)
