"""Geometry of a trained wind-tunnel model vs an untrained one of the same shape (METHODS.md §11).

Runs the geometry suite (:func:`bayes_lens.geometry`, METHODS.md §1–§4) on both models over the
same prompts and returns one table. The prompts are task sequences cut right after a scored
position (a bijection prefix ending at x_k, an HMM prefix ending at ``O`` or o_t), with the cut
point stratified uniformly over the K scored positions, so that the *exact* Bayes entropy of the
final-token prediction is known for every prompt. Rows:

* value manifold PC1 and PC1+PC2 (fractions, bootstrap CIs, Gaussian null at the same n × d);
* key orthogonality: mean over layers of the mean off-diagonal |cos| of W_K columns, with the
  dimension-matched Gaussian and the paper's √(2/(π d_head)) baselines;
* attention focusing: reduction (H_first − H_last)/H_first of the final-row attention entropy;
* alignment with the **exact** Bayes entropy: Spearman (and Pearson) of the per-prompt PC1
  coordinate with H_Bayes (bootstrap CI, permutation p-value; the sign of a PC is arbitrary),
  and the usual alignment with the model's own next-token entropy;
* the entropy error (Paper I's MAE, bits) of each model on the task.

Paper A's wind-tunnel reference (Part I, arXiv 2512.22471; Paper A arXiv 2512.23752): PC1+PC2
84–95%, key orthogonality 0.09–0.12, focusing 85–90%; they sit in the ``paper_low``/``paper_high``
columns. Paper I's models were larger (6 layers, width 192, V = 20) than ours.

Example
-------
>>> import bayes_lens as bl
>>> cmp = bl.windtunnel.compare("bijection", n_prompts=200, seed=0)      # doctest: +SKIP
>>> cmp.table                                                     # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from .._results import Result, fmt, fmt_ci, plotly
from .._validate import check_int
from ..errors import InvalidInputError
from .tasks import make_task

__all__ = ["WindTunnelComparison", "compare", "geometry_prompts", "task_prompts"]

# Paper A's wind-tunnel reference ranges (METHODS.md §11)
PAPER_REFERENCE = {
    "value_manifold_pc12_fraction": (0.84, 0.95),
    "key_orthogonality_mean_abs_cos": (0.09, 0.12),
    "focusing_reduction_fraction": (0.85, 0.90),
}


@dataclass(frozen=True, eq=False)
class WindTunnelComparison(Result):
    """Trained vs untrained geometry on a wind-tunnel task; ``table`` has one row per metric."""

    task: str
    n_prompts: int
    seed: int
    table: object
    bayes_entropy_bits: np.ndarray
    prompts: List[str] = field(repr=False)
    trained_geometry: object = field(repr=False)
    untrained_geometry: object = field(repr=False)

    def _summary(self):
        t = self.table
        rows = [(str(r["metric"]), f"trained {fmt(r['trained'])}",
                 fmt_ci((r.get("trained_ci_low"), r.get("trained_ci_high"))), f"untrained {fmt(r['untrained'])}")
                for _, r in t.iterrows()][:9]
        return f"task {self.task!r}, n = {self.n_prompts} prompts, seed {self.seed}", rows

    def to_dataframe(self):
        return self.table.copy()

    def plot(self):
        go = plotly()
        t = self.table
        fig = go.Figure()
        fig.add_bar(x=t["metric"], y=t["trained"], name="trained")
        fig.add_bar(x=t["metric"], y=t["untrained"], name="untrained")
        fig.update_layout(barmode="group", title=f"Wind tunnel ({self.task}): trained vs untrained geometry")
        return fig


def task_prompts(task, n_prompts: int = 200, *, seed: int = 0):
    """``n_prompts`` task prefixes ending at a scored position, as task items (METHODS.md §6a) with the exact
    posterior over the answer symbols: what :func:`bayes_lens.localize`, :func:`bayes_lens.sula.evaluate` and
    every consumer of the task protocol take.

    Prompt i is sequence i of ``task.sample(n_prompts, seed=seed)`` cut right after scored position
    k_i = ``i mod K`` (0-based; so every position appears n/K times), rendered as task words (the
    wind-tunnel model's word tokenizer reads them back to the same token ids, no BOS). Its ``answers`` are the
    task's answer words as written (``"y1" … "yV"``, ``"o1" … "oV"``: one token each), ``posterior`` the exact
    Bayes predictive of the next symbol there (bijection: uniform over the V − k_i outputs not yet revealed;
    HMM: the forward algorithm on the written parameters), ``k`` = k_i the evidence in context (revealed pairs;
    observations), ``outcome`` the symbol that actually follows, ``prior_posterior`` the predictive at the
    first scored position (before any pair or observation). :func:`geometry_prompts` is the same cut.

    >>> from bayes_lens.windtunnel import BijectionTask
    >>> items = task_prompts(BijectionTask(V=4), 8, seed=0)
    >>> items[2].text.split()[-1].startswith("x"), items[2].k, items[2].posterior.count(0.0)
    (True, 2, 2)
    """
    from ..tasks import TaskItem, TaskPrompts

    task = make_task(task)
    n = check_int(n_prompts, "n_prompts", min=3)
    batch = task.sample(n, seed=seed)
    K = len(batch.target_positions)
    k = np.arange(n) % K
    ends = batch.target_positions[k] + 1
    answers = tuple(task.vocab[int(a)] for a in batch.answer_ids)
    outcome = batch.targets[np.arange(n), k] - batch.answer_ids[0]
    items = [TaskItem(task.to_text(batch.tokens[i, : ends[i]])[0], task=f"windtunnel-{task.name}", answers=answers,
                      posterior=batch.bayes_probs[i, k[i]], k=int(k[i]), outcome=int(outcome[i]),
                      prior_posterior=batch.bayes_probs[i, 0])
             for i in range(n)]
    return TaskPrompts(items, task=f"windtunnel-{task.name}", seed=int(seed), generator_version="windtunnel-1",
                       params={**task.to_dict(), "n_prompts": n},
                       posterior_definition="the exact Bayes predictive of the next answer symbol (bijection: "
                       "uniform over the unrevealed outputs; HMM: the forward algorithm on the prompt's parameters)")


def geometry_prompts(task, n_prompts: int = 200, *, seed: int = 0):
    """``(prompts, bayes_entropy_bits, position)``: ``n_prompts`` task prefixes ending at a scored position.

    The scored position k of prompt i is ``i mod K`` + 1 (so every k appears n/K times); the
    sequences themselves are fresh draws with ``seed``. The texts of :func:`task_prompts`.
    """
    items = task_prompts(task, n_prompts, seed=seed)
    return items.texts, items.entropy_bits, items.k + 1


def compare(model, untrained=None, task=None, *, n_prompts: int = 200, seed: int = 0, layer: int = -1,
            n_boot: int = 1000, n_null: int = 200, n_perm: int = 1000, n_eval_seqs: int = 1000,
            progress: Optional[bool] = None) -> WindTunnelComparison:
    """Geometry suite and entropy error on the trained ``model`` vs ``untrained`` (same shape, same prompts).

    ``model`` is a trained TransformerLens model built for ``task``'s vocabulary, or the name / folder of a
    checkpoint (``"bijection"``, ``"hmm"``): then ``task`` comes from it and ``untrained`` defaults
    to a same-shape random model (seed ``seed``). ``n_prompts`` prompts (stratified over positions,
    seeded); ``n_eval_seqs`` sequences for the entropy error (:func:`bayes_lens.windtunnel.evaluate`).
    """
    trained = model
    from .._geometry import geometry
    from ..metrics.stats import bootstrap_ci, pearson, permutation_pvalue, spearman
    from . import load, untrained as make_untrained
    from .evaluate import evaluate

    if isinstance(trained, str) or hasattr(trained, "__fspath__"):
        name = trained
        trained, ck_task = load(name)
        if task is not None and make_task(task) != ck_task:
            raise InvalidInputError(f"task {task!r} differs from the checkpoint's {ck_task!r}.")
        task = ck_task
        if untrained is None:
            untrained, _ = make_untrained(name, seed=seed)
    if task is None or untrained is None:
        raise InvalidInputError("pass both models and the task: compare(model, untrained, task), or a checkpoint "
                                "name: compare('bijection').")
    task = make_task(task)
    prompts, h_bayes, _ = geometry_prompts(task, n_prompts=n_prompts, seed=seed)
    kw = dict(layer=layer, seed=seed, n_boot=n_boot, n_null=n_null, n_perm=n_perm, progress=progress)
    geo_t = geometry(trained, prompts, reference=untrained, **kw)
    geo_u = geometry(untrained, prompts, **kw)
    ev_t = evaluate(trained, task, n_seqs=n_eval_seqs, seed=seed, n_boot=n_boot, progress=progress)
    ev_u = evaluate(untrained, task, n_seqs=n_eval_seqs, seed=seed, n_boot=n_boot, progress=progress)

    def bayes_alignment(geo, stat):
        pc1 = geo.value_manifold.coords[:, 0].numpy().astype(np.float64)
        val = stat(pc1, h_bayes)
        ci = bootstrap_ci(stat, pc1, h_bayes, n_boot=n_boot, seed=seed)
        p = permutation_pvalue(pc1, h_bayes, stat, n_perm=n_perm, seed=seed)
        return val, ci, p

    rows = []

    def add(metric, t, tci, u, uci, baseline=np.nan, baseline_label="", p_t=np.nan, p_u=np.nan):
        lo, hi = PAPER_REFERENCE.get(metric, (np.nan, np.nan))
        rows.append(dict(metric=metric, trained=float(t), trained_ci_low=tci[0], trained_ci_high=tci[1],
                         untrained=float(u), untrained_ci_low=uci[0], untrained_ci_high=uci[1],
                         baseline=float(baseline), baseline_label=baseline_label, trained_pvalue=float(p_t),
                         untrained_pvalue=float(p_u), paper_low=lo, paper_high=hi))

    vt, vu = geo_t.value_manifold, geo_u.value_manifold
    add("value_manifold_pc1_fraction", vt.pc1, vt.pc1.ci, vu.pc1, vu.pc1.ci, vt.pc1.null, "Gaussian null (same n x d)")
    add("value_manifold_pc12_fraction", vt.pc12, vt.pc12.ci, vu.pc12, vu.pc12.ci, vt.pc12.null,
        "Gaussian null (same n x d)")
    kt, ku = geo_t.key_orthogonality, geo_u.key_orthogonality
    nan2 = (np.nan, np.nan)
    pt = tuple(float(x) for x in np.asarray(kt.percentiles)[[0, 2]])
    pu = tuple(float(x) for x in np.asarray(ku.percentiles)[[0, 2]])
    add("key_orthogonality_mean_abs_cos", float(kt.layer_mean.mean()), pt, float(ku.layer_mean.mean()), pu,
        kt.gaussian_baseline, "Gaussian E|cos| in R^d_model (CI columns: 10/90% over heads)")
    add("key_orthogonality_paper_baseline", kt.paper_baseline, nan2, ku.paper_baseline, nan2, kt.paper_baseline,
        "sqrt(2/(pi d_head)), the paper's convention")
    ft, fu = geo_t.attention_focusing, geo_u.attention_focusing
    add("focusing_reduction_fraction", ft.reduction, ft.reduction.ci, fu.reduction, fu.reduction.ci, 0.0,
        "no focusing")
    for name, stat in (("spearman", spearman), ("pearson", pearson)):
        (a, aci, ap), (b, bci, bp) = bayes_alignment(geo_t, stat), bayes_alignment(geo_u, stat)
        add(f"alignment_pc1_vs_bayes_entropy_{name}", a, aci, b, bci, 0.0, "independence", ap, bp)
    at, au = geo_t.entropy_alignment, geo_u.entropy_alignment
    add("alignment_pc1_vs_model_entropy_spearman", at.spearman, at.spearman.ci, au.spearman, au.spearman.ci, 0.0,
        "independence", at.spearman_pvalue, au.spearman_pvalue)
    add("entropy_mae_bits", ev_t.mae_bits, ev_t.mae_bits.ci, ev_u.mae_bits, ev_u.mae_bits.ci, 0.0, "exact Bayes")
    import pandas as pd

    return WindTunnelComparison(task=task.name, n_prompts=len(prompts), seed=int(seed), table=pd.DataFrame(rows),
                                bayes_entropy_bits=np.asarray(h_bayes), prompts=prompts, trained_geometry=geo_t,
                                untrained_geometry=geo_u)
