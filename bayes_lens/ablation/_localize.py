"""Readout or mediator: where a model keeps the uncertainty it reads out, and where the one it uses.

METHODS.md §13. Paper A (arXiv 2512.23752, §4.5–4.6) removes one direction (PC1 of the values) and
finds calibration unchanged; the wind tunnel's newer work (github vishalmisra/bayesian-wind-tunnel,
``experiments/jlens``, result ``P4b``) fits the entropy axis by ridge regression (held-out R² ≈ 1),
ablates it (calibration moves by −0.001 bits) and ablates the model's "hypothesis frame" instead
(+0.745 bits): readable is not the same as used. :func:`localize` runs that test on a
TransformerLens model and SULA items, per layer, as one call and one table:

* **Readout** (:mod:`bayes_lens.ablation._readout`): the held-out R² of each estimator (``"ridge"``,
  ``"pca"``; the frame's top-k coordinates; each user basis) reading the target (``"bayes"`` entropy,
  the posterior ``"log_odds"``, or the ``"model"``'s own entropy) from the final-token rows of the
  site, K-fold cross-fitted, with its bootstrap interval and shuffled-target null. *Readable*: the
  interval lies above the null's 95th percentile and above ``min_r2``.
* **Interventions**: the candidate subspace S (orthonormal basis B, rank k) at the layer's site, at
  every position (``positions="all"``; ``"final"`` the last token; ``"answers"`` every demonstration's answer
  token, :func:`bayes_lens.ablation.answer_positions`, one tuple of positions per prompt):
  ``operation="removal"`` v ← v − BBᵀv; ``"mean"`` v ← v − BBᵀ(v − μ) (the component replaced by its
  mean over the fitting prompts); ``"resample"`` v ← v − BBᵀ(v − r_j) (resample-ablation,
  as causal scrubbing and the IOI circuit's resample ablation: the component replaced by the same
  component of another prompt j, a seeded uniform draw among the fitting prompts, :func:`resample_donors`;
  r_j is j's final-token row, the reference distribution mean-ablation averages). Fitted subspaces are cross-fitted: the prompts of
  fold f run with the subspace fitted without them. A rank-k patch is the sum of k rank-one axis
  parts on orthonormal directions (for orthonormal u₁…u_k, Π(I − u_j u_jᵀ) = I − BBᵀ) at the site's
  own hook, with the flagship removal's operations (:mod:`bayes_lens.ablation._patch`); every
  candidate and every random control reaches the activation by this one route, in the same order.
* **Effect**: Δ MAE (|H_model − H_Bayes|, bits), Δ ECE and Δ Brier (P(first label) against the hidden
  label) of patched minus clean; Δ MAE and the swap's move get the stratified Student-t interval over
  prompts (strata: the evidence counts k; coverage measured, METHODS §13), the others a paired bootstrap.
* **Swap** (``swap=True``, the wind tunnel's swap patching): at the final position of prompt i, the
  component in S is taken from a donor j with another exact posterior (a seeded draw among the prompts
  whose posterior log-odds differs by at least one net example, from the other side of ½ where there
  is one): v ← v − BBᵀv + BBᵀv_j (v_j the donor's clean row). Score: how many bits closer the output
  came to the donor's clean output q_j, KL(q_j ‖ p_i) − KL(q_j ‖ p_i^swapped) (p the model's posterior over
  the answers), averaged over prompts with a percentile bootstrap interval; a full swap scores
  KL(q_j ‖ p_i).
* **Downstream** (Δρ): for each intervention at layer L and each later layer L′ in ``layers``, the Spearman
  ρ of the target with the coordinate of L′'s best rank-one readout (fitted on every clean prompt), patched
  minus clean, with its paired bootstrap interval and random band; the correlation and its degenerate rule
  are :func:`bayes_lens.compare_patched`'s downstream geometry (:func:`coordinate_corr_rows`).
* **Runs**: every intervention is an :class:`~bayes_lens.interventions.Intervention` (a cross-fitted
  subspace: one per fold, each on its fold's prompts) run by the one runner,
  :func:`bayes_lens.collect.collect` (``interventions=``): at ``resid_post`` resumed from the clean stream
  the clean pass kept after the layer (``resume=``, ``start_at_layer``), elsewhere (or where a kind
  cannot resume, or inside ``bl.shard.sharded``) in a whole pass. Inside ``bl.shard.sharded(...)`` every
  intervention runs in shards, its folder named by the interventions' digests, so a killed run resumes.
* **Null draws**: ``n_random`` random subspaces of the same rank at the same layer from the null that
  matches how each candidate was chosen (``Design.nulls``): Haar (QR of a Gaussian matrix) for user bases,
  covariance-matched (directions drawn from N(0, Σ̂) of the site's rows) for fitted axes and frames; one
  keyed seed per draw. The band shown is their 2.5–97.5th percentiles.
* **Verdict** (the rule, :mod:`bayes_lens.ablation._rules`): each candidate's removal and swap are tested
  against its null's draws (a one-sided p: by default the two-stage rank p, exact for any null, the null
  drawn on only where a candidate beats all of its first draws; ``p_value="interval"`` the prediction-interval
  p, whose measured family-wise error is 13–23% over 18 Haar null tests on tiny models, METHODS §13), Holm's
  correction runs over every test of the table, and a test clears when its adjusted p ≤ ``alpha`` and its
  estimate exceeds ``min_effect_bits``. Each subspace, and each layer, is then "readout and mediator" (naming
  what cleared: removal, swap or both), "readout only", "mediator only" or "neither"; null and control rows carry
  no verdict.
* **Readout–mediator angle** (arXiv 2605.29126's question): the angle θ between the best readout
  direction u (the largest held-out R² among the rank-one estimators, fitted on all prompts) and the
  most causal subspace S (the mediator with the smallest adjusted p; no mediator at the layer: no angle):
  cos θ = ‖Bᵀu‖. Under the Haar null (u uniform on the sphere of dimension d) cos²θ ~ Beta(k/2, (d − k)/2),
  so p = P(cos²θ ≥ observed) is exact for independent directions; no p where u lies in S by construction,
  and a null drawn from the rows' span for two directions fitted on the same rows (:func:`_rules.angle`).

Example
-------
>>> import bayes_lens as bl
>>> model = bl.models.tiny.tiny_model("bridge")
>>> items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=6)
>>> loc = bl.localize(model, items, layers=[0], ranks=(1,), n_random=3, folds=3, n_boot=50, n_null=5)
>>> sorted(set(loc.to_dataframe()["kind"]))
['estimator', 'random']
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import adapter
from .._inputs import classify
from ..collect import RunOptions, StreamKeeper, collect, collect_each, reduce_cache, runner_active
from ..estimators import FixedBasis, PC1Axis, RidgeAxis, SubspaceEstimator, TopKFrame, fold_ids, standardized_pc_basis
from ..interventions import (Intervention, crossfitted, haar_draw, head_blocks, orthonormal, resample_donors,
                             swap_donors)
from ..reads import FinalRows
from ..tasks import answer_posterior, answer_token_ids
from .._progress import note, progress as progress_bar
from .._results import Result, fmt, plotly
from .._validate import (check_bool, check_choice, check_choices, check_count, check_float, check_nonneg_int,
                          check_positive_int)
from ..errors import InvalidInputError
from ..reduced import TOKEN_LOGPROBS, row_name
from ..metrics.calibration import (brier_score, expected_calibration_error, kl_categorical_bits,
                                   multiclass_brier_score, top_label)
from ..metrics.stats import bootstrap_indices, entropy_bits, percentile_interval
from ._rules import (P_VALUES, VERDICTS, band_columns, cov_draw, exact_draws_needed, gate, layer_rows, matched_null,
                     mean_interval, mediator_columns, rule_text)
from ._common import model_meta, prompt_data, site_dim
from ._compare import coordinate_corr_rows
from ._das import DAS, check_das, das_angle, das_candidates, das_rule
from ._patch import Patch, PatchPart, link_model
from ._positions import answer_positions
from ._seeds import layer_seed_columns, seed_columns
from ._readout import Readout, cross_fitted_readout

__all__ = ["localize", "Localization", "Design", "subspace_patch", "swap_donors", "resample_donors", "head_blocks",
           "default_layers", "TARGETS", "OPERATIONS", "POSITIONS"]

TARGETS = ("bayes", "log_odds", "model")
SITES = ("resid_post", "v", "z")
OPERATIONS = ("removal", "mean", "resample")
_OP = {"removal": "remove", "mean": "mean", "resample": "resample"}
#: where the removal (mean-, resample-ablation) acts: every position, each prompt's last token, or every
#: demonstration's answer token (:func:`bayes_lens.ablation.answer_positions`)
POSITIONS = ("all", "final", "answers")
_WHERE = {"all": "at every position", "final": "at the final position",
          "answers": "at every demonstration's answer position"}


@dataclass(frozen=True)
class Design:
    """The statistics of the readout-or-mediator test (METHODS.md §13): ``folds`` K of the cross-fitting, ``n_boot``
    bootstrap replicates, ``n_null`` shuffled-target refits, ``n_random`` draws per null, layer and rank (40 by
    default; fewer than 20 warns), ``nulls`` the null families drawn (``"haar"``; ``"cov"`` covariance-matched,
    the null of fitted candidates), ``alpha`` the family-wise level (Holm over the table's tests), ``p_value`` the
    p Holm runs on (``"interval"``: the prediction-interval p, normal premise, family-wise error measured above
    ``alpha`` on skewed nulls; ``"rank"``: the rank p, exact, needing ``n_random + 1 ≥ tests/alpha``; ``"exact"``
    (the default): the two-stage rank p, exact, drawing a null on to ⌈tests/alpha⌉ − 1 draws only where a
    candidate beats all of its first ``n_random``), ``swap`` also
    run the interchange, the verdict's practical thresholds ``min_effect_bits`` and ``min_r2``, and ``reseeds`` R:
    rerun the whole test with the seeds ``seed + 1 … seed + R`` (new folds, bootstrap resamples, shuffled nulls,
    null subspaces and donors; the clean pass and every intervention again, so the call costs 1 + R times as
    much) and report beside each row the spread of its verdict-bearing numbers over the 1 + R seeds and how many
    agree on its verdict (:func:`bayes_lens.ablation.seed_columns`; 0: one seed, spread 0).

    >>> Design(n_random=40).n_random
    40
    """

    n_random: int = 40
    folds: int = 5
    n_boot: int = 1000
    n_null: int = 100
    swap: bool = True
    min_effect_bits: float = 0.01
    min_r2: float = 0.1
    nulls: tuple = ("haar", "cov")
    alpha: float = 0.05
    reseeds: int = 0
    p_value: str = "exact"

    def __post_init__(self):
        object.__setattr__(self, "nulls", tuple(check_choices(self.nulls, "nulls", ("haar", "cov"))))
        if "haar" not in self.nulls:
            raise InvalidInputError("nulls must include 'haar' (user bases are tested against it); pass "
                                    "nulls=('haar',) or ('haar', 'cov').")
        object.__setattr__(self, "alpha", check_float(self.alpha, "alpha", min=0.0, max=1.0))
        object.__setattr__(self, "p_value", check_choice(self.p_value, "p_value", P_VALUES))
        for name in ("n_random", "folds", "n_boot"):
            object.__setattr__(self, name, check_count(getattr(self, name), name))
        object.__setattr__(self, "n_null", check_count(self.n_null, "n_null", allow_zero=True))
        object.__setattr__(self, "reseeds", check_count(self.reseeds, "reseeds"))
        object.__setattr__(self, "swap", check_bool(self.swap, "swap"))
        object.__setattr__(self, "min_effect_bits", check_float(self.min_effect_bits, "min_effect_bits", min=0.0))
        object.__setattr__(self, "min_r2", check_float(self.min_r2, "min_r2"))


def _settings(design, options, kw) -> tuple:
    """(:class:`Design`, :class:`~bayes_lens.collect.RunOptions`) with any of their fields passed by name in ``kw``
    (``n_random=40``, ``batch_size=8``: the spellings of earlier releases, still accepted)."""
    design = Design() if design is None else design
    options = RunOptions() if options is None else options
    if not isinstance(design, Design) or not isinstance(options, RunOptions):
        raise InvalidInputError("design= takes a bl.ablation.Design(...) and options= a bl.collect.RunOptions(...); "
                                f"got {type(design).__name__} and {type(options).__name__}.")
    fields = {f: "design" for f in Design.__dataclass_fields__}
    fields.update({f: "options" for f in RunOptions.__dataclass_fields__})
    unknown = sorted(set(kw) - set(fields))
    if unknown:
        raise InvalidInputError(f"localize() got unknown keyword(s) {unknown}; it takes layers, site, ranks, "
                                f"estimators, bases, target, operation, positions, clean, design, options, and by name "
                                f"any field "
                                f"of Design or RunOptions: {sorted(fields)}.")
    design = replace(design, **{k: v for k, v in kw.items() if fields[k] == "design"})
    options = replace(options, **{k: v for k, v in kw.items() if fields[k] == "options"})
    return design, options


def subspace_patch(model, layer: int, basis, *, site: str = "resid_post", operation: str = "removal",
                   mean=None, donor_rows=None, label: Optional[str] = None) -> Patch:
    """The patch that removes (``"removal"``), mean-ablates (``"mean"``, needs ``mean`` ``[d]``) or
    resample-ablates (``"resample"``, needs ``donor_rows`` ``[m, d]``) the span of ``basis`` ``[d, k]``
    (orthonormalized here) at ``layer``'s ``site``, at every position: k rank-one parts
    (:class:`PatchPart`, one per orthonormal direction, applied in turn at the site's hook), the operation
    table's moves (:mod:`bayes_lens.interventions`), so a candidate subspace and its random control reach the
    activation by the same route and hook order. Removal v ← v − BBᵀv; mean v ← v − BBᵀ(v − μ); resample
    v ← v − BBᵀ(v − r_b) with r_b the donor row of prompt b of the batch (row b of ``donor_rows``: a
    resample patch is built for one batch's prompts, in their order). ``bl.interventions.Intervention`` is the
    same change as one object (``op="remove"``, ``"mean"``, ``"resample"``).

    >>> p = subspace_patch(model, 0, np.eye(model.cfg.d_model)[:, :2])
    >>> len(p.parts)
    2
    """
    check_choice(operation, "operation", OPERATIONS)
    q = orthonormal(basis)
    if operation == "mean" and mean is None:
        raise InvalidInputError("operation='mean' needs the mean activation (mean=[d]) the component is set to.")
    if operation == "resample":
        rows = np.asarray(donor_rows if donor_rows is not None else np.zeros((0,)), dtype=np.float64)
        if donor_rows is None or rows.ndim != 2 or rows.shape[1] != q.shape[0] or not np.all(np.isfinite(rows)):
            raise InvalidInputError(f"operation='resample' needs donor_rows=[m, {q.shape[0]}]: the donor activation "
                                    "of each prompt of the batch the patch runs on (bl.ablation.resample_donors "
                                    "picks the donors).")
    info = adapter.model_info(model)
    layer = adapter.resolve_layer(model, layer)
    if q.shape[0] != site_dim(info, site):
        raise InvalidInputError(f"the basis has {q.shape[0]} rows but this model's {site!r} site has dimension "
                                f"{site_dim(info, site)}.")
    name = adapter.hook_name(model, layer, site)
    ref = {"removal": None, "mean": mean, "resample": donor_rows}[operation]
    mu = None if ref is None else torch.as_tensor(np.asarray(ref, dtype=np.float32))
    parts = [PatchPart(layer=layer, hook_name=name, site=site, op="removal",
                       direction=torch.tensor(q[:, j], dtype=torch.float32), mean=mu) for j in range(q.shape[1])]
    tag = {"removal": "removal", "mean": "mean-ablation", "resample": "resample-ablation"}[operation]
    patch = Patch(parts, label=label or f"{tag} of a rank-{q.shape[1]} subspace at layer {layer}", kind="removal",
                  params={"operation": operation, "rank": int(q.shape[1])}, model_meta=model_meta(model, site))
    link_model(patch, model)  # list(patch) names an SAE's output where one replaces the hook point (Patch)
    return patch


@dataclass
class _Candidate:
    name: str
    kind: str  # "estimator" | "frame" | "user" | "random"
    layer: int
    rank: int
    fold_bases: Optional[Dict[int, np.ndarray]]  # fold -> [d, k] (cross-fitted) or None (one basis)
    basis: np.ndarray  # [d, k] fitted on all prompts (the angle; the run when not cross-fitted)
    readout: Optional[Readout] = None
    null: str = "haar"  # the null it is tested against (a null draw: the null it belongs to)
    swap_rows: Optional[Dict[int, np.ndarray]] = None  # fold -> [n, d] swap sources other than the donors' rows
    extra: Optional[dict] = None  # further columns of its row (DAS: das_accuracy, control_of)


@dataclass(frozen=True, eq=False)
class Localization(Result):
    """What :func:`localize` measured: ``table`` (one row per layer × subspace: readout, effects, band,
    verdict, and Δρ of the readout at the next layer tested), ``layers_table`` (one row per layer: its verdict
    and the readout–mediator angle), ``n_prompts``, ``site``, ``target``, ``operation``, ``rule`` (the verdict
    rule in words), ``downstream`` (one row per layer × subspace × later layer tested: the Spearman ρ of
    that layer's best readout with the target, clean and patched, Δρ with its paired interval and the
    random band), ``gate`` (does the model follow the exact posterior at all: ρ, p, answer mass, the rule),
    ``n_tests`` (the family Holm's correction ran over), ``alpha`` (its family-wise level) and ``positions``
    (where the removal acted: ``"all"``, ``"final"``, ``"answers"``; the swap acts at the final position; the table's
    ``positions`` and ``swap_positions`` columns say the same per row), ``seeds`` (the seeds run: the reported one
    first, then ``Design.reseeds`` more; the table's ``*_seed_sd/min/max`` and ``*_seeds_agree`` columns are over
    them)."""

    table: object
    layers_table: object
    n_prompts: int
    site: str
    target: str
    operation: str
    rule: str
    downstream: object = None
    gate: Optional[dict] = None
    n_tests: Optional[int] = None
    alpha: Optional[float] = None
    positions: str = "all"
    seeds: tuple = (0,)

    def gate_sentence(self) -> str:
        """Whether the model follows the task's exact posterior, and what the verdicts are therefore about."""
        g = self.gate
        if not g:
            return ""
        stats = (f"Spearman ρ = {fmt(g['rho'], 2)}, one-sided p = {fmt(g['p'], 2)}; "
                 f"{100 * g['answer_mass']:.1f}% of its probability on the answers")
        if g["follows"]:
            head = f"The model follows the task's exact posterior ({stats})"
        else:   # say which half of the rule failed: a ρ of 0.9 beside "does not follow" reads as a contradiction
            why = [w for w, bad in (("its answers do not rank with the exact posterior", not g["p"] < 0.05),
                                    ("less than 5% of its probability is on the answers", g["answer_mass"] < 0.05))
                   if bad]
            head = f"The model does not follow the task's exact posterior: {' and '.join(why)} ({stats})"
        if self.target == "model":
            return head + ": the verdicts are about the model's own entropy (target='model')."
        if g["follows"]:
            return head + "."
        return (head + ": the verdicts below are about the model's own entropy, not Bayesian uncertainty; "
                "pass target='model' to ask that question explicitly.")

    def _summary(self):
        rows = []
        for _, r in self.layers_table.iterrows():
            p = r["angle_p"]
            rows.append((f"layer {r['layer']}", r["verdict"], f"angle {fmt(r['angle_deg'], 3)}°",
                         f"p = {fmt(p, 3)}" if np.isfinite(p) else (r.get("angle_note") or "no p-value")))
        fam = "" if self.n_tests is None else f"; Holm over {self.n_tests} tests at α = {self.alpha}"
        if len(self.seeds) > 1:
            fam += f"; spread over seeds {list(self.seeds)}"
        head = (f"Readout or mediator ({self.site}, target {self.target}, {self.operation} "
                f"{_WHERE.get(self.positions, self.positions)}) on "
                f"{self.n_prompts} prompts{fam}")
        g = self.gate_sentence()
        return (f"{g}\n{head}" if g else head), rows

    def to_dataframe(self):
        """The per-subspace table (long: one row per layer × subspace)."""
        return self.table.copy()

    def verdict(self, layer: int) -> str:
        """The verdict at ``layer``."""
        t = self.layers_table
        if int(layer) not in set(int(x) for x in t["layer"]):
            raise InvalidInputError(f"layer {layer} was not localized; layers: {list(t['layer'])}.")
        return str(t.loc[t["layer"] == int(layer), "verdict"].iloc[0])

    def plot(self):
        """Δ MAE (bits) per subspace and layer with its interval; the random band of each rank drawn as a bar."""
        go = plotly()
        t = self.table
        fig = go.Figure()
        real = t[t["kind"] != "random"]
        x = [f"L{r.layer} {r.subspace}" for r in real.itertuples()]
        fig.add_trace(go.Scatter(
            x=x, y=real["delta_mae_bits"], mode="markers", name="Δ MAE (bits)",
            error_y=dict(type="data", symmetric=False, array=real["delta_mae_ci_high"] - real["delta_mae_bits"],
                         arrayminus=real["delta_mae_bits"] - real["delta_mae_ci_low"])))
        fig.add_trace(go.Bar(x=x, y=real["band_high"] - real["band_low"], base=real["band_low"], opacity=0.3,
                             name="random band (same rank)"))
        fig.update_layout(title="Readout or mediator: calibration change per subspace",
                          yaxis_title="Δ MAE vs Bayes (bits)")
        return fig


def default_layers(n_layers: int, count: int = 3) -> List[int]:
    """``count`` evenly spaced interior layers of an ``n_layers`` model (one: the middle; three: the quarters)."""
    fractions = [(i + 1) / (count + 1) for i in range(count)]
    return sorted({min(n_layers - 1, max(0, int(round(f * (n_layers - 1))))) for f in fractions})


def _target(target, items, h_model, p_model) -> np.ndarray:
    _, bayes = prompt_data(items)
    if target == "bayes":
        return bayes
    if target == "model":
        return h_model
    post = np.array([it.posterior for it in items], dtype=np.float64)
    if post.shape[1] != 2:
        raise InvalidInputError(f"target='log_odds' needs a task with two answers; these items have {post.shape[1]}: "
                                "use target='bayes' (the exact posterior's entropy).")
    post = np.clip(post, 1e-12, None)
    return np.log(post[:, 0]) - np.log(post[:, 1])


#: ``localize(..., quick=True)``: the design of a first look (with one middle layer and rank one): 20 draws per
#: null, 300 bootstrap replicates, 20 shuffled refits
QUICK = {"n_random": 20, "n_boot": 300, "n_null": 20}


def _plan_line(run, candidates, swap: bool, clean_seconds: Optional[float]) -> str:
    """What the run will cost, said before it starts: the interventions, the forward passes over the prompts they
    amount to (resumed ones count their later blocks only), and a time at the pace of the clean pass and the fits
    when they ran here (an upper figure: stacked and final-position passes cost less)."""
    n_layers = int(adapter.model_info(run.model).n_layers)
    total, n_iv = 0.0, 0
    for layer in run.layers:
        m = sum(c.layer == layer for c in candidates)
        n_iv += m * (2 if swap else 1)
        share = 1.0 - (layer + 1) / n_layers if run.keeper is not None else 1.0
        total += m * share * (2 if swap else 1)
    line = (f"localize: {n_iv} interventions ({len(run.layers)} layer(s), {len(candidates)} subspaces"
            f"{', a removal and a swap each' if swap else ''}), about {total:.0f} forward passes' worth over "
            f"{run.n} prompts")
    if clean_seconds is not None and clean_seconds > 0:
        line += (f"; those passes take about {_minutes(clean_seconds * total)} here (the clean pass took "
                 f"{clean_seconds:.1f} s; the fits, bootstraps and null draws come on top)")
    return line + "."


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def localize(model, items, *, layers=None, site: str = "resid_post", ranks: Sequence[int] = (1, 4),
             estimators: Sequence = ("ridge", "pca"), bases: Optional[dict] = None, target: str = "bayes",
             operation: str = "removal", positions: str = "all", clean=None, design: Optional[Design] = None,
             options: Optional[RunOptions] = None, **settings) -> Localization:
    """Readout or mediator, per layer (METHODS.md §13; the maths and the verdict rule are in the module docstring).

    ``model`` a TransformerLens model; ``items`` SULA items (:func:`bayes_lens.sula.make_prompts`) or any task's
    items (:mod:`bayes_lens.tasks`): their exact posteriors are the reference; ``layers`` (default: three evenly
    spaced layers); ``site`` ``"resid_post"``, ``"v"`` (flattened over KV heads) or ``"z"``; ``ranks`` of the frame
    (top-k standardized PCs) and of the random bands; ``estimators`` the fitted candidates: ``"ridge"``,
    ``"pca"`` (rank-one axes) or any :mod:`bayes_lens.estimators` estimator (``PLSSubspace(rank=4)``: a new
    estimator is one class); ``bases`` ``{name: [d] or [d, k] array, or {layer: array}}`` user subspaces;
    ``target`` (``"bayes"`` entropy, ``"log_odds"`` of the exact posterior, ``"model"`` entropy); ``operation``
    ``"removal"``, ``"mean"`` or ``"resample"``; ``positions`` where that operation acts: ``"all"`` (default),
    ``"final"`` (each prompt's last token) or ``"answers"`` (every demonstration's answer token of each prompt, found
    in its tokenization by :func:`bayes_lens.ablation.answer_positions`; SULA and the categorical task, or items with
    ``demonstration_answers``; a prompt with k = 0 is left unpatched; the swap stays at the final position);
    ``design`` the test's statistics (:class:`Design`: ``n_random``,
    ``folds``, ``n_boot``, ``n_null``, ``swap``, ``min_effect_bits``, ``min_r2``); ``options`` how the model runs
    (:class:`~bayes_lens.collect.RunOptions`: ``batch_size``, ``progress``, ``resume``, ``seed``). ``reseeds=R``
    (a :class:`Design` field) reruns everything seeded - and so the clean pass and every intervention: R more
    times the cost - with R other seeds and adds each number's spread over the seeds and how many agree on each
    verdict (the seed variance, apart from the bootstrap's sampling variance). Any field of the
    two may also be passed by name (``n_random=40, batch_size=8``). Each intervention is one forward pass over the
    prompts (a cross-fitted one: K interventions over 1/K of them each, in one pass); at ``resid_post`` it resumes
    from the clean stream kept after its layer (checked against the whole pass, with a fallback).

    The clean pass can come from elsewhere: ``clean=`` what ``model.run_with_cache`` returned on the items' texts
    (the ``(logits, cache)`` pair, or the ``ActivationCache`` / ``dict(cache.items())``; pass ``attention_mask=``
    or ``tokens=`` by name when the batch was padded) holding the site at ``layers``, or a
    :class:`~bayes_lens.ReducedCache` (``bl.collect.collect`` / ``bl.shard.merge``, with the site's rows at
    ``layers`` and ``token_ids=`` the answers' ids); the interventions then run as whole passes. Inside
    ``bl.shard.sharded(...)`` the clean pass and every intervention run in shards (named by the interventions'
    digests), so the merged table equals the one-process one and a killed run resumes.

    >>> items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=6)
    >>> loc = bl.localize(model, items, layers=[0], ranks=(1,), n_random=3, folds=3, n_boot=50, n_null=5)
    >>> loc.verdict(0).split(" (")[0] in ("readout and mediator", "readout only", "mediator", "mediator only", "neither")
    True
    """
    import pandas as pd

    cache_kw = {k: settings.pop(k) for k in ("attention_mask", "tokens") if k in settings}
    if check_bool(settings.pop("quick", False), "quick"):  # one middle layer, rank one, 20 draws per null
        layers = default_layers(adapter.model_info(model).n_layers, 1) if layers is None else layers
        ranks = (1,) if tuple(ranks) == (1, 4) else ranks
        if design is None:
            settings = {**QUICK, **settings}
    design, options = _settings(design, options, settings)
    if design.n_random < 20:
        warnings.warn(f"n_random={design.n_random}: fewer than 20 null draws per layer and rank make the mediator "
                      "test's p-values coarse and its size unmeasured; use n_random ≥ 40 (the default).",
                      UserWarning, stacklevel=2)
    check_choice(positions, "positions", POSITIONS)
    items = list(items)
    where = answer_positions(model, items) if positions == "answers" else positions  # before any pass: fails fast
    t0 = time.perf_counter()
    run = _prepare(model, items, layers, site, ranks, estimators, target, operation, clean, cache_kw, design, options)
    clean_seconds = time.perf_counter() - t0 if clean is None else None
    run.positions = where
    _check_bases(bases, run.layers, estimators, ranks)
    candidates = _candidates(run, estimators, bases, ranks)
    note(_plan_line(run, candidates, design.swap, clean_seconds), enabled=options.progress)
    readers = {}  # the downstream readout at each layer: its best rank-one readout (fitted on every prompt)
    for layer in run.layers:
        ones = [c for c in candidates if c.layer == layer and c.kind == "estimator" and c.rank == 1 and c.readout]
        if ones:
            best = max(ones, key=lambda c: c.readout.r2.value if np.isfinite(c.readout.r2.value) else -np.inf)
            readers[layer] = (best.name, best.basis[:, 0])
    clean_rho = {k: coordinate_corr_rows(run.X[k] @ u, run.h_clean if target == "model" else run.y, run.idx,
                                         "spearman")[0] for k, (_, u) in readers.items()}
    removed, swapped = {}, {}  # candidate number -> its posteriors: one stacked call per layer and kind of edit
    for layer in run.layers:
        mine = [i for i, c in enumerate(candidates) if c.layer == layer]
        later = [k for k in readers if k > layer]
        got = run.posteriors(layer, [_removal(run, candidates[i]) for i in mine], later,
                             f"localize: layer {layer}, {len(mine)} removals")
        removed.update(zip(mine, got))
        if design.swap:
            got = run.posteriors(layer, [_swap(run, candidates[i]) for i in mine], [],
                                 f"localize: layer {layer}, {len(mine)} swaps")
            swapped.update((i, g[0]) for i, g in zip(mine, got))
    records, down_records = [], []
    for ci, c in enumerate(candidates):
        later = [k for k in readers if k > c.layer]
        p, rows = removed[ci]
        h = entropy_bits(p)
        m = run.metrics(h, p)
        rec = {"layer": c.layer, "subspace": c.name, "kind": c.kind, "rank": c.rank, "null": c.null,
               "positions": positions, **(c.extra or {})}
        for k in later:  # Δρ of the downstream readout, as compare_patched's axis–entropy correlation
            name, u = readers[k]
            r, degenerate = coordinate_corr_rows(rows[k] @ u, h if target == "model" else run.y, run.idx, "spearman",
                                                 clean=run.X[k] @ u)
            diff = r - clean_rho[k]
            lo, hi = percentile_interval(diff[1:])
            down_records.append({"layer": c.layer, "subspace": c.name, "kind": c.kind, "rank": c.rank, "null": c.null,
                                 "readout_layer": k, "readout": name, "rho_clean": float(clean_rho[k][0]),
                                 "rho_patched": float(r[0]), "delta_rho": float(diff[0]), "delta_rho_ci_low": lo,
                                 "delta_rho_ci_high": hi, "degenerate": degenerate})
        if design.swap:
            ps = swapped[ci]
            # bits closer to the donor's clean output: KL(q_donor ‖ p_clean) − KL(q_donor ‖ p_swapped)
            move = (kl_categorical_bits(run.p_clean[run.donors], run.p_clean, eps=1e-9)
                    - kl_categorical_bits(run.p_clean[run.donors], ps, eps=1e-9))
            mv, lo_, hi_ = mean_interval(move, run.strata)
            rec.update(swap_bits=mv, swap_ci_low=lo_, swap_ci_high=hi_, swap_positions="final")
        ro = c.readout
        rec.update(r2=ro.r2.value if ro else np.nan, r2_ci_low=ro.r2.ci_low if ro else np.nan,
                   r2_ci_high=ro.r2.ci_high if ro else np.nan, r2_null_q95=ro.null_r2_q95 if ro else np.nan,
                   r2_p=ro.p_value if ro else np.nan, rho=ro.rho if ro else np.nan, readable=ro.readable if ro else False)
        per_prompt = np.abs(h - run.bayes) - np.abs(run.h_clean - run.bayes)  # Δ MAE is their mean
        est, lo, hi = mean_interval(per_prompt, run.strata)
        rec.update(delta_mae_bits=est, delta_mae_ci_low=lo, delta_mae_ci_high=hi)
        for key in ("ece", "brier"):
            diff = m[key] - run.clean_m[key]
            lo, hi = percentile_interval(diff[1:])
            rec.update({f"delta_{key}": float(diff[0]), f"delta_{key}_ci_low": lo, f"delta_{key}_ci_high": hi})
        records.append(rec)
    table = pd.DataFrame.from_records(records)
    n_tests = mediator_columns(table, swap=design.swap, min_effect=design.min_effect_bits, alpha=design.alpha,
                               p_value=design.p_value, first=design.n_random)
    if design.p_value == "exact" and n_tests:
        table = _extend_draws(run, table, design, n_tests)
    if design.p_value == "rank" and n_tests and (design.n_random + 1) * design.alpha < n_tests:
        warnings.warn(f"p_value='rank' with n_random={design.n_random}: the rank p is never below "
                      f"1/{design.n_random + 1}, and Holm over {n_tests} tests needs p ≤ {design.alpha}/{n_tests}, so "
                      f"no test of this table can clear; use n_random ≥ {int(np.ceil(n_tests / design.alpha)) - 1}.",
                      UserWarning, stacklevel=2)
    down = _downstream(pd.DataFrame.from_records(down_records, columns=list(_DOWN_COLUMNS)), table)
    about = "the model's own entropy" if target == "model" or not run.gate["follows"] else "Bayesian uncertainty"
    rows_of_layers = layer_rows(table, run.layers, {(c.layer, c.name): c.basis for c in candidates}, swap=design.swap,
                                clean_mae=float(run.clean_m["mae"][0]), rows_of=run.X, about=about, seed=run.seed)
    das_angle(rows_of_layers, readers, [c for c in candidates if c.kind == "das"], run.X, seed=run.seed)
    rule = rule_text(folds=design.folds, min_r2=design.min_r2, operation=f"{operation} {_WHERE[positions]}",
                     swap=design.swap,
                     n_random=design.n_random, min_effect=design.min_effect_bits, alpha=design.alpha,
                     n_tests=n_tests, nulls=design.nulls, p_value=design.p_value) + das_rule(estimators)
    layers_table = pd.DataFrame.from_records(rows_of_layers)
    again = [localize(model, items, layers=run.layers, site=site, ranks=ranks, estimators=estimators, bases=bases,
                      target=target, operation=operation, positions=positions, clean=clean,
                      design=replace(design, reseeds=0), options=replace(options, seed=seed), **cache_kw)
             for seed in range(options.seed + 1, options.seed + 1 + design.reseeds)]  # seed variance: all again
    table = seed_columns(table, [a.table for a in again])
    layers_table = layer_seed_columns(layers_table, [a.layers_table for a in again])
    return Localization(table=table, layers_table=layers_table, n_prompts=run.n, site=site,
                        target=target, operation=operation, rule=rule, downstream=down.reset_index(drop=True),
                        gate=run.gate, n_tests=n_tests, alpha=design.alpha, positions=positions,
                        seeds=tuple(range(options.seed, options.seed + 1 + design.reseeds)))


_DOWN_COLUMNS = ("layer", "subspace", "kind", "rank", "null", "readout_layer", "readout", "rho_clean", "rho_patched",
                 "delta_rho", "delta_rho_ci_low", "delta_rho_ci_high", "degenerate")


def _downstream(down, table):
    """The Δρ table with its random band (the same rank's random subspaces at the same layer, read at the same
    layer); the main table gets the next downstream layer's columns."""
    import pandas as pd

    if len(down):
        band_columns(down, "delta_rho", ("layer", "rank", "readout_layer"), "rho_band_low", "rho_band_high",
                     null_col="null")
    else:
        down["rho_band_low"] = down["rho_band_high"] = pd.Series(dtype=float)
    nxt = down.sort_values("readout_layer").drop_duplicates(["layer", "subspace"]).set_index(["layer", "subspace"])
    for col, src in (("downstream_layer", "readout_layer"), ("rho_clean", "rho_clean"), ("delta_rho", "delta_rho"),
                     ("delta_rho_ci_low", "delta_rho_ci_low"), ("delta_rho_ci_high", "delta_rho_ci_high"),
                     ("rho_band_low", "rho_band_low"), ("rho_band_high", "rho_band_high")):
        table[col] = [nxt[src].get((r.layer, r.subspace), np.nan) for r in table.itertuples()]
    return down


class _Run:
    """What one localize call measures on: the clean pass, the targets, folds, bootstrap indices and donors, and
    the runner calls of its interventions (resumed from the kept stream where it can)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.streams: Dict[int, object] = {}

    def metrics(self, h, p) -> dict:
        idx, bayes, outcome = self.idx, self.bayes, self.outcome
        out = {"mae": np.abs(h[idx] - bayes[idx]).mean(-1)}
        if outcome is None:  # no drawn outcome: no ECE or Brier
            out["ece"] = out["brier"] = np.full(idx.shape[0], np.nan)
        elif p.shape[1] == 2:  # P(first answer) against "the first answer was drawn", as bl.sula.evaluate
            first = (outcome == 0).astype(np.float64)
            out["ece"] = expected_calibration_error(p[:, 0][idx], first[idx])
            out["brier"] = brier_score(p[:, 0][idx], first[idx])
        else:  # top-answer ECE and the multi-class Brier score
            conf, correct = top_label(p, outcome)
            out["ece"] = expected_calibration_error(conf[idx], correct[idx])
            out["brier"] = multiclass_brier_score(p[idx], outcome[idx])
        return out

    def stream(self, layer: int):
        """The kept clean stream after ``layer`` (site resid_post, resume on), None for whole passes."""
        if self.keeper is None:
            return None
        if layer not in self.streams:
            r = self.keeper.stream(layer, self.n)
            why = "the clean pass ran elsewhere (its stream was not kept here)" if r is None else \
                r.check(self.answer_ids, self.clean_lp)
            if why is not None:
                warnings.warn(f"{type(self.model).__name__} does not resume after layer {layer} ("
                              f"{why}); localize runs a whole pass per intervention there instead (same numbers, "
                              "slower).", UserWarning, stacklevel=4)
                r = None
            self.streams[layer] = r
        return self.streams[layer]

    def posteriors(self, layer: int, conditions, read_layers, desc):
        """Per condition (an intervention list at ``layer``): (the answer posterior ``[n, K]``, ``{layer: [n, d]}``
        final-token rows of the site at ``read_layers``), through the runner; resumed conditions share passes
        (:func:`~bayes_lens.collect.collect_each`)."""
        rcs = collect_each(self.model, self.texts, conditions, token_ids=self.answer_ids,
                           reads=[FinalRows(k, self.site) for k in read_layers], resume=self.stream(layer),
                           batch_size=self.batch_size, progress=self.progress, desc=desc)
        return [(answer_posterior(rc.token_logprobs())[0],
                 {k: rc.value_rows(k, self.site).double().numpy() for k in read_layers}) for rc in rcs]


def _prepare(model, items, layers, site, ranks, estimators, target, operation, clean, cache_kw, design, options):
    """Validate, run (or read) the clean pass, and set up the targets, folds, bootstrap and donors."""
    adapter.check_model(model)
    check_choice(site, "site", SITES)
    check_choice(target, "target", TARGETS)
    check_choice(operation, "operation", OPERATIONS)
    for e in estimators:
        if isinstance(e, DAS):
            check_das(site)
        elif not isinstance(e, SubspaceEstimator):
            check_choice(e, "estimators", ("ridge", "pca"))
    ranks = [check_positive_int(k, "each rank") for k in ranks]
    if not ranks:
        raise InvalidInputError("ranks must hold at least one positive integer, such as (1, 4, 16).")
    items = list(items)
    texts, bayes = prompt_data(items)
    if bayes is None:
        raise InvalidInputError("localize needs items with exact posteriors: SULA items (bl.sula.make_prompts(model, "
                                "...)) or any task's items (bl.tasks).")
    answers = {tuple(it.answers) for it in items}
    if len(answers) > 1:
        raise InvalidInputError(f"localize needs items of one task (one answer set); these mix {len(answers)}: "
                                f"{sorted(answers)[:2]}. Localize each task's items separately.")
    info = adapter.model_info(model)
    d = site_dim(info, site)
    if max(ranks) >= d:
        raise InvalidInputError(f"rank {max(ranks)} is not below the site's dimension {d}; pass smaller ranks.")
    layers = default_layers(info.n_layers) if layers is None else adapter.resolve_layers(model, layers)
    n = len(items)
    strata = np.array([it.k for it in items])
    outcomes = [getattr(it, "outcome", None) for it in items]
    outcome = None if any(o is None for o in outcomes) else np.array(outcomes, dtype=np.int64)
    answer_ids = list(answer_token_ids(model, items[0].answers))
    keeper = None
    if clean is not None:
        rc = _clean_rows(clean, model, n, layers, site, answer_ids, cache_kw.get("attention_mask"),
                         cache_kw.get("tokens"))
        _check_clean_fits(rc, model, texts, answer_ids, cache_kw.get("tokens"), options.batch_size)
    elif cache_kw:
        raise InvalidInputError("attention_mask= and tokens= describe a cache passed as clean=; without one, drop them.")
    else:
        # the clean pass; at resid_post it also keeps the stream after each layer, which the interventions resume
        # from (not inside bl.shard.sharded: there the interventions run in shards, as whole passes)
        keeper = StreamKeeper(model, layers) if options.resume and site == "resid_post" and not runner_active() \
            else None
        rc = collect(model, texts, token_ids=answer_ids, reads=[FinalRows(layer, site) for layer in layers],
                     fwd_hooks=keeper if keeper is not None else (), batch_size=options.batch_size,
                     progress=options.progress, desc="localize: clean")
    p_clean, mass = answer_posterior(rc.token_logprobs())
    h_clean = entropy_bits(p_clean)
    post = np.clip(np.array([it.posterior for it in items], dtype=np.float64), 1e-12, None)
    pc = np.clip(p_clean, 1e-12, None)
    follows = gate(np.log(pc[:, 0]) - np.log(pc[:, 1]), np.log(post[:, 0]) - np.log(post[:, 1]), mass) \
        if post.shape[1] == 2 else gate(h_clean, bayes, mass)
    X = {layer: rc.value_rows(layer, site).double().numpy() for layer in layers}
    for layer, x in X.items():
        if np.ptp(x, axis=0).max() <= 1e-9 * max(1.0, float(np.abs(x).max())):
            raise InvalidInputError(f"the {site!r} site's final-token rows at layer {layer} are the same for every prompt "
                                    "(nothing there depends on the context: e.g. hook_v at layer 0 when every prompt ends "
                                    "in the same token), so nothing can be read or removed there; choose other layers.")
    seed = options.seed
    fid = fold_ids(n, design.folds, seed=seed, strata=strata)
    run = _Run(model=model, items=items, texts=texts, bayes=bayes, n=n, d=d, site=site, layers=layers,
                strata=strata, outcome=outcome, answer_ids=answer_ids, keeper=keeper, p_clean=p_clean,
                h_clean=h_clean, y=_target(target, items, h_clean, p_clean), X=X, fid=fid, design=design,
                operation=operation, seed=seed, batch_size=options.batch_size, progress=options.progress,
                idx=np.concatenate([np.arange(n)[None, :], bootstrap_indices(n, design.n_boot, seed=seed,
                                                                             strata=strata)]),
                donors=swap_donors(items, seed=seed) if design.swap else None,
                rdonors=resample_donors(fid, seed=seed) if operation == "resample" else None,
                clean_lp=rc.token_logprobs().double().numpy(), gate=follows)
    run.clean_m = run.metrics(h_clean, p_clean)
    return run


def _candidates(run, estimators, bases, ranks) -> List[_Candidate]:
    """Every candidate subspace, one route: fitted estimators (cross-fitted: fold → basis fitted without the fold),
    the top-k frames, user bases, and the Haar band of each rank, per layer."""
    design, out = run.design, []
    kw = dict(folds=design.folds, strata=run.strata, n_boot=design.n_boot, n_null=design.n_null,
              min_r2=design.min_r2, seed=run.seed)
    names = [e if isinstance(e, str) else None for e in estimators]
    user = bases or {}
    for layer in run.layers:
        x = run.X[layer]
        for e in estimators:
            if isinstance(e, DAS):  # trained on the model's interchanges, not on the rows (_das.py)
                for fit in das_candidates(run, e, layer):  # a DAS row reads y off its basis as a user basis
                    ro = cross_fitted_readout(x, run.y, estimator=FixedBasis(fit["basis"]), **kw) \
                        if fit["kind"] == "das" else None
                    out.append(_Candidate(layer=layer, readout=ro, **fit))
                continue
            est = {"ridge": RidgeAxis, "pca": PC1Axis}[e]() if isinstance(e, str) else e
            ro = cross_fitted_readout(x, run.y, estimator=e if isinstance(e, str) else est, **kw)
            if isinstance(e, str):  # a rank-one axis: its fold directions are the cross-fitted subspaces
                fb = {f: u[:, None] for f, u in ro.fold_directions.items()}
                full = ro.direction[:, None]
            else:
                fb = {int(f): est.fit_basis(x[run.fid != f], run.y[run.fid != f]) for f in np.unique(run.fid)}
                full = est.fit_basis(x, run.y)
            out.append(_Candidate(f"{e} axis" if isinstance(e, str) else est.name, "estimator", layer,
                                  full.shape[1], fb, full, ro))
        for k in ranks:
            if k == 1 and "pca" in names:
                continue  # the frame of rank one is the PCA axis
            full = standardized_pc_basis(x, k)
            ro = cross_fitted_readout(x, run.y, estimator="basis", basis=full, **kw)
            fb = {int(f): TopKFrame(rank=k).fit(x[run.fid != f]).basis_ for f in np.unique(run.fid)}
            out.append(_Candidate(f"frame k={k}", "frame", layer, k, fb, full, ro))
        for name, b in user.items():
            b = b.get(layer) if isinstance(b, dict) else b
            if b is None:
                continue
            q = _user_basis(name, b, run.d, run.site)
            ro = cross_fitted_readout(x, run.y, estimator=FixedBasis(q), **kw)
            out.append(_Candidate(str(name), "user", layer, q.shape[1], None, q, ro))
        for c in out:
            if c.layer == layer:
                c.null = matched_null(c.kind, design.nulls)
        for k in sorted({c.rank for c in out if c.layer == layer} | set(ranks)):
            for null in ("haar",) + (("cov",) if "cov" in design.nulls else ()):  # Haar's draws first, as always
                out += [_null_draw(run, layer, k, null, i) for i in range(design.n_random)]
    return out


def _null_draw(run, layer: int, k: int, null: str, i: int) -> _Candidate:
    """Draw ``i`` of a null at (layer, rank k): Haar, or covariance-matched to the site's rows (one keyed seed each,
    so a draw is the same whether made with the first ``n_random`` or by ``p_value="exact"``'s extension)."""
    basis = haar_draw(run.d, k, seed=run.seed, layer=layer, i=i) if null == "haar" else \
        cov_draw(run.X[layer], k, seed=run.seed, layer=layer, i=i)
    return _Candidate(f"{'random' if null == 'haar' else 'cov'} k={k} #{i}", "random", layer, k, None, basis,
                      null=null, extra={"draw": i})


def _user_basis(name, b, d: int, site: str) -> np.ndarray:
    """A user basis ``[d]`` or ``[d, k]`` as an orthonormal ``[d, k]``, refused when it is not a finite array of full
    column rank of the site's width."""
    if not isinstance(b, (np.ndarray, torch.Tensor)):
        raise InvalidInputError(f"basis {name!r} must be a numpy array or torch tensor [d] or [d, k], got "
                                f"{type(b).__name__}; wrap it with np.asarray(...).")
    b = np.asarray(b.detach().cpu() if isinstance(b, torch.Tensor) else b, dtype=np.float64)
    b = b[:, None] if b.ndim == 1 else b
    if b.ndim != 2 or b.shape[0] != d:
        raise InvalidInputError(f"basis {name!r} has shape {list(b.shape)}; the {site!r} site has dimension {d} "
                                "(pass [d] or [d, k]).")
    return orthonormal(b, what=f"basis {name!r}")


def _check_bases(bases, layers, estimators, ranks) -> None:
    """Refuse what localize would otherwise ignore or mislabel: a layer-keyed basis at a layer not asked for (or keyed
    by something that is not a layer number), and a name that collides with an estimator's or a null's row."""
    if bases is None:
        return
    if not isinstance(bases, dict):
        raise InvalidInputError(f"bases must be a dict {{name: array}} or {{name: {{layer: array}}}}, got "
                                f"{type(bases).__name__}.")
    taken = {f"{e} axis" if isinstance(e, str) else e.name for e in estimators} | {f"frame k={k}" for k in ranks} \
        | {n for e in estimators if isinstance(e, DAS) for n in e.names}
    for name, b in bases.items():
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"each basis needs a name (a non-empty str), got {name!r}.")
        if name in taken or name.startswith(("random k=", "cov k=")):
            raise InvalidInputError(f"basis name {name!r} is the name of another row of the table (an estimator, a "
                                    "frame or a null draw); rename it.")
        if isinstance(b, dict):
            bad = [k for k in b if not _is_layer(k, layers)]
            if bad:
                raise InvalidInputError(f"basis {name!r} is keyed by {bad[:3]}, which are not among the layers "
                                        f"localized ({list(layers)}); key it by those layer numbers (ints).")


def _is_layer(key, layers) -> bool:
    try:
        return check_nonneg_int(key, "a basis's layer key") in layers
    except InvalidInputError:
        return False


def _extend_draws(run, table, design, n_tests: int):
    """``p_value="exact"``: where a tested candidate beat every one of its null's first ``n_random`` draws (its
    rank p, 1/(n_random + 1), cannot reach Holm's α/n), that null is drawn on - the same keyed draws, numbered on
    - until 1/(m + 1) ≤ α/n, for the test(s) that need it only (a swap-only cell runs swaps, at the final position);
    then every test is decided again on the two-stage p (:func:`_rules.two_stage_p`). Returns the new table."""
    import pandas as pd

    m = exact_draws_needed(n_tests, design.alpha)
    if m <= design.n_random:
        return table
    real = ~table["kind"].isin(("random", "control"))
    tests = [("removal", "delta_mae_bits")] + ([("swap", "swap_bits")] if design.swap else [])
    need: Dict[tuple, set] = {}  # (layer, rank, null) -> the tests whose draws run on
    for test, col in tests:
        beat_all = table[f"{test}_p_rank"] <= 1.0 / (design.n_random + 1) + 1e-12
        hit = table[real & beat_all & (table[col] > design.min_effect_bits) & ~(table[f"{test}_p_holm"] <= design.alpha)]
        for r in hit.itertuples():
            need.setdefault((int(r.layer), int(r.rank), str(r.null)), set()).add(test)
    if not need:
        return table
    note(f"localize: p_value='exact': {len(need)} null(s) drawn on from {design.n_random} to {m} draws, where a "
         f"candidate beat all of its first ones (Holm over {n_tests} tests needs p ≤ {design.alpha}/{n_tests})",
         enabled=run.progress)
    records = []
    for (layer, k, null), which in sorted(need.items()):
        draws = [_null_draw(run, layer, k, null, i) for i in range(design.n_random, m)]
        recs = [{"layer": layer, "subspace": c.name, "kind": "random", "rank": k, "null": null, "draw": c.extra["draw"],
                 "readable": False} for c in draws]
        if "removal" in which:
            got = run.posteriors(layer, [_removal(run, c) for c in draws], [],
                                 f"localize: layer {layer}, {len(draws)} more {null} k={k} removals")
            for rec, (p, _) in zip(recs, got):
                h = entropy_bits(p)
                rec["delta_mae_bits"] = float(np.mean(np.abs(h - run.bayes) - np.abs(run.h_clean - run.bayes)))
        if "swap" in which:
            got = run.posteriors(layer, [_swap(run, c) for c in draws], [],
                                 f"localize: layer {layer}, {len(draws)} more {null} k={k} swaps")
            q = run.p_clean[run.donors]
            base = kl_categorical_bits(q, run.p_clean, eps=1e-9)
            for rec, (ps, _) in zip(recs, got):
                rec["swap_bits"] = float(np.mean(base - kl_categorical_bits(q, ps, eps=1e-9)))
        records += recs
    table = pd.concat([table, pd.DataFrame.from_records(records)], ignore_index=True)
    mediator_columns(table, swap=design.swap, min_effect=design.min_effect_bits, alpha=design.alpha,
                     p_value="exact", first=design.n_random)
    return table


def _bases(c: _Candidate) -> Dict[int, np.ndarray]:
    return {0: c.basis} if c.fold_bases is None else {int(f): b for f, b in c.fold_bases.items()}


def _removal(run, c: _Candidate):
    """The candidate's removal / mean- / resample-ablation: one intervention per fold, at ``run.positions``."""
    bases = _bases(c)
    fold_of = np.zeros(run.n, dtype=np.int64) if c.fold_bases is None else run.fid
    x = run.X[c.layer]
    if run.operation == "resample":  # each prompt's donor row at this layer
        src = {f: x[run.rdonors] for f in bases}
    elif run.operation == "mean":
        src = {f: (x.mean(0) if c.fold_bases is None else x[run.fid != f].mean(0)) for f in bases}
    else:
        src = None
    return crossfitted(c.layer, run.site, bases, fold_of, op=_OP[run.operation], positions=run.positions,
                       source_of_fold=src, label=c.name)


def _swap(run, c: _Candidate):
    """The candidate's swap: at the final position, its component replaced by the donor's (one per fold)."""
    fold_of = np.zeros(run.n, dtype=np.int64) if c.fold_bases is None else run.fid
    donor_rows = run.X[c.layer][run.donors]
    src = c.swap_rows or {f: donor_rows for f in _bases(c)}
    return crossfitted(c.layer, run.site, _bases(c), fold_of, op="swap", positions="final",
                       source_of_fold=src, label=f"swap {c.name}")


def _check_clean_fits(rc, model, texts, answer_ids, tokens, batch_size: int) -> None:
    """Refuse a clean pass that is not these items' on this model: its tokens (when given) against the items'
    texts, else the answers' log-probabilities of the first batch rerun here (one batch, through the runner)."""
    if tokens is not None:
        ids = adapter.encode_prompts(model, texts)
        toks = torch.as_tensor(tokens)
        for i, want in enumerate(ids):
            got = toks[i, :len(want)].tolist() if i < toks.shape[0] else None
            if got != list(want):
                raise InvalidInputError(f"clean= does not hold these items in their order: row {i} of tokens= is not "
                                        f"the tokens of item {i}'s text. Pass the cache of the items' texts, in order.")
        return
    first = list(range(min(batch_size, len(texts))))
    here = collect(model, [texts[i] for i in first], token_ids=answer_ids, batch_size=batch_size, progress=False,
                   desc="localize: check clean").token_logprobs().double().numpy()
    given = rc.token_logprobs().double().numpy()[first]
    worst = float(np.max(np.abs(here - given)))
    if worst > 1e-2:
        raise InvalidInputError(f"clean= is not these items' clean pass on this model: the answers' log-probabilities "
                                f"of the first {len(first)} items differ by up to {worst:.3g} from a pass run here "
                                "(another order of the items, or another model's cache). Pass the cache of the "
                                "items' texts, in order, from this model.")


def _clean_rows(clean, model, n: int, layers: Sequence[int], site: str, answer_ids, attention_mask, tokens):
    """The clean pass's reduced cache from ``clean=`` (a cache of the items' texts or a reduced cache), checked
    to hold the site's final-token rows at ``layers`` and the answers' log-probabilities for ``n`` prompts."""
    kind = classify(clean)
    if kind == "model" or kind == "layers":
        raise InvalidInputError("clean= takes the clean pass: what model.run_with_cache(...) returned on the items' "
                                "texts, or a bl.ReducedCache (bl.collect.collect / bl.shard.merge); got "
                                f"{type(clean).__name__}.")
    if kind == "reduced":
        if attention_mask is not None or tokens is not None:
            raise InvalidInputError("attention_mask= and tokens= describe a cache; a reduced cache is already reduced. "
                                    "Drop them.")
        rc = clean
        spell = {"v": "value_layers", "resid_post": "resid_layers"}.get(site, "reads=[FinalRows(layer, 'z')]")
        for layer in layers:
            rc.require(row_name(layer, site), f"collect it with {spell}={list(layers)} (the layers localize tests).")
        lp = rc.require(TOKEN_LOGPROBS, f"collect it with token_ids={list(answer_ids)} (the items' answer ids).")
        if int(lp.shape[1]) != len(answer_ids):
            raise InvalidInputError(f"the reduced cache holds log-probabilities of {int(lp.shape[1])} tokens, not the "
                                    f"items' {len(answer_ids)} answers; collect it with token_ids={list(answer_ids)}.")
    else:
        rc = reduce_cache(clean, model=model, attention_mask=attention_mask, tokens=tokens, token_ids=answer_ids,
                          reads=[FinalRows(layer, site) for layer in layers])
    if rc.n_prompts != n:
        raise InvalidInputError(f"clean= holds {rc.n_prompts} prompts but {n} items were given; pass the cache of the "
                                "items' texts, in their order.")
    return rc


