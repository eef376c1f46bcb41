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
  every position: ``operation="removal"`` v ← v − BBᵀv; ``"mean"`` v ← v − BBᵀ(v − μ) (the component
  replaced by its mean over the fitting prompts); ``"resample"`` v ← v − BBᵀ(v − r_j) (resample-ablation,
  as causal scrubbing and the IOI circuit's resample ablation: the component replaced by the same
  component of another prompt j, a seeded uniform draw among the fitting prompts, :func:`resample_donors`;
  r_j is j's final-token row, the reference distribution mean-ablation averages). Fitted subspaces are cross-fitted: the prompts of
  fold f run with the subspace fitted without them. A rank-k patch is the sum of k rank-one axis
  parts on orthonormal directions (for orthonormal u₁…u_k, Π(I − u_j u_jᵀ) = I − BBᵀ) at the site's
  own hook, with the flagship removal's operations (:mod:`bayes_lens.ablation._patch`); every
  candidate and every random control reaches the activation by this one route, in the same order.
* **Effect**: Δ MAE (|H_model − H_Bayes|, bits), Δ ECE and Δ Brier (P(first label) against the hidden
  label) of patched minus clean, each with a paired percentile bootstrap interval over prompts
  (resampled within k).
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
* **Runs**: every intervention is one edit of the site's activation, run by
  :func:`bayes_lens.ablation._intervene.run_edit`: at ``resid_post`` on the clean stream that the clean pass kept
  after the layer (``start_at_layer``), elsewhere (or where a kind cannot resume) by a hook in a whole pass.
* **Random band**: ``n_random`` Haar-random subspaces of the same rank at the same layer (QR of a
  Gaussian matrix, one keyed seed per draw); the band is the 2.5–97.5th percentiles of their Δ MAE.
* **Verdict** (the rule): a subspace is a *mediator* when the lower end of its Δ MAE interval, or of
  its swap move, lies above both that quantity's random band's upper end and ``min_effect_bits``;
  each subspace, and each layer (any non-random subspace readable; any a mediator), is then
  "readout and mediator", "readout only", "mediator only" or "neither".
* **Readout–mediator angle** (arXiv 2605.29126's question): the angle θ between the best readout
  direction u (the largest held-out R² among the rank-one estimators, fitted on all prompts) and the
  most causal subspace S (the mediator whose interval lies furthest above its band, removal or swap;
  no mediator at the layer: no angle): cos θ = ‖Bᵀu‖. Under the Haar null (u uniform on
  the sphere of dimension d) cos²θ ~ Beta(k/2, (d − k)/2), so p = P(cos²θ ≥ observed) is exact.

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

import contextlib
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import adapter
from .._inputs import classify
from ..collect import collect, reduce_cache, runner_active, use_runner
from ..reads import FinalRows
from ..tasks import answer_token_ids
from .._progress import progress as progress_bar
from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._validate import check_bool, check_choice, check_count, check_float, check_positive_int, check_seed
from ..errors import InvalidInputError
from ..reduced import TOKEN_LOGPROBS, row_name
from ..metrics.calibration import (brier_score, expected_calibration_error, kl_categorical_bits,
                                   multiclass_brier_score, top_label)
from ..metrics.stats import bootstrap_indices, entropy_bits, keyed_rng, percentile_interval
from ._common import model_meta, prompt_data, site_dim
from ._compare import coordinate_corr_rows
from ._intervene import ResumedStream, StreamKeeper, run_edit
from ._patch import Patch, PatchPart
from ._readout import Readout, cross_fitted_readout, fold_ids, standardized_pc_basis

__all__ = ["localize", "Localization", "subspace_patch", "swap_donors", "resample_donors", "head_blocks", "default_layers", "TARGETS", "OPERATIONS"]

TARGETS = ("bayes", "log_odds", "model")
SITES = ("resid_post", "v", "z")
OPERATIONS = ("removal", "mean", "resample")
VERDICTS = ("readout and mediator", "readout only", "mediator only", "neither")


def subspace_patch(model, layer: int, basis, *, site: str = "resid_post", operation: str = "removal",
                   mean=None, donor_rows=None, label: Optional[str] = None) -> Patch:
    """The patch that removes (``"removal"``), mean-ablates (``"mean"``, needs ``mean`` ``[d]``) or
    resample-ablates (``"resample"``, needs ``donor_rows`` ``[m, d]``) the span of ``basis`` ``[d, k]``
    (orthonormalized here) at ``layer``'s ``site``, at every position: k rank-one parts
    (:class:`PatchPart`, one per orthonormal direction, applied in turn at the site's hook) with the
    flagship removal's operations, so a candidate subspace and its random control reach the activation
    by the same route and hook order. Removal v ← v − BBᵀv; mean v ← v − BBᵀ(v − μ); resample
    v ← v − BBᵀ(v − r_b) with r_b the donor row of prompt b of the batch (row b of ``donor_rows``: a
    resample patch is built for one batch's prompts, in their order).

    >>> p = subspace_patch(model, 0, np.eye(model.cfg.d_model)[:, :2])
    >>> len(p.parts)
    2
    """
    check_choice(operation, "operation", OPERATIONS)
    b = np.asarray(basis, dtype=np.float64)
    b = b[:, None] if b.ndim == 1 else b
    if b.ndim != 2 or not np.all(np.isfinite(b)):
        raise InvalidInputError(f"a basis must be a finite [d, k] array, got shape {list(np.shape(basis))}.")
    q, r = np.linalg.qr(b)
    if np.min(np.abs(np.diag(r))) < 1e-8 * max(1.0, float(np.abs(b).max())):
        raise InvalidInputError("the basis has dependent columns (rank < k); pass linearly independent vectors.")
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
    return Patch(parts, label=label or f"{tag} of a rank-{q.shape[1]} subspace at layer {layer}", kind="removal",
                 params={"operation": operation, "rank": int(q.shape[1])}, model_meta=model_meta(model, site))


def resample_donors(fold_of, *, seed: int = 0) -> np.ndarray:
    """``[n]`` the resample donor of each prompt: a seeded uniform draw among the prompts of the *other* folds
    (``fold_of`` ``[n]``, :func:`bayes_lens.ablation.cross_fitted_readout`'s folds), the prompts a cross-fitted
    subspace applied to that prompt was fitted on; never the prompt itself. One draw per prompt, shared by
    every subspace and every layer, so a candidate and its random band differ only in the subspace.

    >>> d = resample_donors(np.array([0, 0, 1, 1, 2, 2]), seed=0)
    >>> bool(np.all(np.array([0, 0, 1, 1, 2, 2])[d] != np.array([0, 0, 1, 1, 2, 2])))
    True
    """
    f = np.asarray(fold_of, dtype=np.int64).ravel()
    seed = check_seed(seed)
    if len(np.unique(f)) < 2:
        raise InvalidInputError("resample donors come from the other folds: pass fold numbers of at least two folds.")
    rng = keyed_rng(seed, 76)
    return np.array([rng.choice(np.flatnonzero(f != f[i])) for i in range(len(f))], dtype=np.int64)


def _haar(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return q * np.sign(np.diag(r))


@dataclass
class _Candidate:
    name: str
    kind: str  # "estimator" | "frame" | "user" | "random"
    layer: int
    rank: int
    fold_bases: Optional[Dict[int, np.ndarray]]  # fold -> [d, k] (cross-fitted) or None (one basis)
    basis: np.ndarray  # [d, k] fitted on all prompts (the angle; the run when not cross-fitted)
    readout: Optional[Readout] = None


@dataclass(frozen=True, eq=False)
class Localization(Result):
    """What :func:`localize` measured: ``table`` (one row per layer × subspace: readout, effects, band,
    verdict, and Δρ of the readout at the next layer tested), ``layers_table`` (one row per layer: its verdict
    and the readout–mediator angle), ``n_prompts``, ``site``, ``target``, ``operation``, ``rule`` (the verdict
    rule in words), ``downstream`` (one row per layer × subspace × later layer tested: the Spearman ρ of
    that layer's best readout with the target, clean and patched, Δρ with its paired interval and the
    random band)."""

    table: object
    layers_table: object
    n_prompts: int
    site: str
    target: str
    operation: str
    rule: str
    downstream: object = None

    def _summary(self):
        rows = []
        for _, r in self.layers_table.iterrows():
            rows.append((f"layer {r['layer']}", r["verdict"],
                         f"angle {fmt(r['angle_deg'], 3)}°", f"Haar p = {fmt(r['angle_p'], 3)}"))
        return (f"Readout or mediator ({self.site}, target {self.target}, {self.operation}) on "
                f"{self.n_prompts} prompts", rows)

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


def localize(model, items, *, layers=None, site: str = "resid_post", ranks: Sequence[int] = (1, 4),
             estimators: Sequence[str] = ("ridge", "pca"), bases: Optional[dict] = None, target: str = "bayes",
             operation: str = "removal", n_random: int = 20, folds: int = 5, n_boot: int = 1000, n_null: int = 100,
             swap: bool = True, resume: bool = True, min_effect_bits: float = 0.01, min_r2: float = 0.1, seed: int = 0, batch_size: int = 16,
             clean=None, attention_mask=None, tokens=None, progress: Optional[bool] = None) -> Localization:
    """Readout or mediator, per layer (METHODS.md §13; the maths and the verdict rule are in the module docstring).

    ``model`` a TransformerLens model; ``items`` SULA items (:func:`bayes_lens.sula.make_prompts`) or any
    task's items (:mod:`bayes_lens.tasks`): their exact posteriors are the reference; ``layers`` (default: three evenly spaced layers); ``site``
    ``"resid_post"`` or ``"v"`` (flattened over KV heads); ``ranks`` of the frame (top-k standardized
    PCs) and of the random bands; ``estimators`` rank-one readout axes (``"ridge"``, ``"pca"``);
    ``bases`` ``{name: [d] or [d, k] array, or {layer: array}}`` user subspaces; ``target``
    (``"bayes"`` entropy, ``"log_odds"`` of the exact posterior, ``"model"`` entropy); ``operation``
    ``"removal"``, ``"mean"`` or ``"resample"``; ``swap`` also run the interchange (each prompt's component taken from a donor
    with another exact posterior, at the final position; scored by how many bits closer the output came to
    the donor's clean output, in KL); ``resume`` at ``site="resid_post"``, run each intervention from the
    clean stream kept after its layer (TL's ``start_at_layer``; checked against the whole pass, with a
    fallback); ``n_random`` Haar subspaces per layer and rank (≥ 20 for a band worth
    the name); ``folds`` K of the cross-fitting; ``n_boot``, ``n_null``; ``min_effect_bits`` and
    ``min_r2`` the verdict's practical thresholds. Each intervention is one forward pass over the
    prompts (a cross-fitted one: K passes over 1/K of them).

    The clean pass can come from elsewhere: ``clean=`` what ``model.run_with_cache`` returned on the
    items' texts (the ``(logits, cache)`` pair, or the ``ActivationCache`` / ``dict(cache.items())``; pass
    ``attention_mask=`` or ``tokens=`` when the batch was padded) holding the site at ``layers``, or a
    :class:`~bayes_lens.ReducedCache` (from ``bl.collect.collect`` or ``bl.shard.merge`` of a sharded
    collection, with the site's rows at ``layers`` and ``token_ids=`` the answers' ids). The
    interventions, which need the model, then run as whole passes (no kept stream to resume from).
    Inside ``bl.shard.sharded(...)`` the clean pass runs in the block's shards and the interventions in
    this process (their edits differ per prompt, which no shard folder can name; a warning says so).

    >>> items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=6)
    >>> loc = bl.localize(model, items, layers=[0], ranks=(1,), n_random=3, folds=3, n_boot=50, n_null=5)
    >>> loc.verdict(0) in ("readout and mediator", "readout only", "mediator only", "neither")
    True
    """
    import pandas as pd

    from ..sula import answer_posterior

    adapter.check_model(model)
    check_choice(site, "site", SITES)
    check_choice(target, "target", TARGETS)
    check_choice(operation, "operation", OPERATIONS)
    swap = check_bool(swap, "swap")
    resume = check_bool(resume, "resume")
    for e in estimators:
        check_choice(e, "estimators", ("ridge", "pca"))
    n_random = check_count(n_random, "n_random")
    folds = check_count(folds, "folds")
    n_boot = check_count(n_boot, "n_boot")
    n_null = check_count(n_null, "n_null", allow_zero=True)
    seed = check_seed(seed)
    min_effect = check_float(min_effect_bits, "min_effect_bits", min=0.0)
    min_r2 = check_float(min_r2, "min_r2")
    ranks = [check_positive_int(k, "each rank") for k in ranks]
    if not ranks:
        raise InvalidInputError("ranks must hold at least one positive integer, such as (1, 4, 16).")
    items = list(items)
    texts, bayes = prompt_data(items)
    if bayes is None:
        raise InvalidInputError("localize needs items with exact posteriors: SULA items (bl.sula.make_prompts(model, "
                                "...)) or any task's items (bl.tasks).")
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
    in_shards = runner_active()
    keeper = None
    if clean is not None:
        rc = _clean_rows(clean, model, n, layers, site, answer_ids, attention_mask, tokens)
    elif attention_mask is not None or tokens is not None:
        raise InvalidInputError("attention_mask= and tokens= describe a cache passed as clean=; without one, drop them.")
    else:
        # the clean pass; at resid_post it also keeps the stream after each layer, which the interventions resume
        # from (not inside bl.shard.sharded: the pass runs in the block's shards, so the interventions run whole)
        keeper = StreamKeeper(model, layers) if resume and site == "resid_post" and not in_shards else None
        rc = collect(model, texts, token_ids=answer_ids, reads=[FinalRows(layer, site) for layer in layers],
                     fwd_hooks=keeper if keeper is not None else (), batch_size=batch_size, progress=progress,
                     desc="localize: clean")
        if in_shards:
            warnings.warn("inside bl.shard.sharded, localize runs its clean pass in shards and its interventions in "
                          "this process: each intervention edits every prompt differently (its fold's subspace, its "
                          "donor), which no shard folder can name.", UserWarning, stacklevel=2)
    p_clean = answer_posterior(rc.token_logprobs())[0]
    h_clean = entropy_bits(p_clean)
    y = _target(target, items, h_clean, p_clean)
    X = {layer: rc.value_rows(layer, site).double().numpy() for layer in layers}
    for layer, x in X.items():
        if np.ptp(x, axis=0).max() <= 1e-9 * max(1.0, float(np.abs(x).max())):
            raise InvalidInputError(f"the {site!r} site's final-token rows at layer {layer} are the same for every prompt "
                                    "(nothing there depends on the context: e.g. hook_v at layer 0 when every prompt ends "
                                    "in the same token), so nothing can be read or removed there; choose other layers.")
    fid = fold_ids(n, folds, seed=seed, strata=strata)
    idx = np.concatenate([np.arange(n)[None, :], bootstrap_indices(n, n_boot, seed=seed, strata=strata)])

    def metrics(h, p):
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

    clean_m = metrics(h_clean, p_clean)
    donors = swap_donors(items, seed=seed) if swap else None
    rdonors = resample_donors(fid, seed=seed) if operation == "resample" else None
    user = bases or {}
    candidates: List[_Candidate] = []
    kw = dict(folds=folds, strata=strata, n_boot=n_boot, n_null=n_null, min_r2=min_r2, seed=seed)
    for layer in layers:
        x = X[layer]
        for e in estimators:
            ro = cross_fitted_readout(x, y, estimator=e, **kw)
            candidates.append(_Candidate(f"{e} axis", "estimator", layer, 1,
                                         {f: u[:, None] for f, u in ro.fold_directions.items()},
                                         ro.direction[:, None], ro))
        for k in ranks:
            if k == 1 and "pca" in estimators:
                continue  # the frame of rank one is the PCA axis
            full = standardized_pc_basis(x, k)
            ro = cross_fitted_readout(x, y, estimator="basis", basis=full, **kw)
            fb = {int(f): standardized_pc_basis(x[fid != f], k) for f in np.unique(fid)}
            candidates.append(_Candidate(f"frame k={k}", "frame", layer, k, fb, full, ro))
        for name, b in user.items():
            b = b.get(layer) if isinstance(b, dict) else b
            if b is None:
                continue
            b = np.asarray(b, dtype=np.float64)
            b = b[:, None] if b.ndim == 1 else b
            if b.shape[0] != d:
                raise InvalidInputError(f"basis {name!r} has {b.shape[0]} rows; the {site!r} site has dimension {d}.")
            q = np.linalg.qr(b)[0]
            ro = cross_fitted_readout(x, y, estimator="basis", basis=q, **kw)
            candidates.append(_Candidate(str(name), "user", layer, q.shape[1], None, q, ro))
        for k in sorted({c.rank for c in candidates if c.layer == layer} | set(ranks)):
            for i in range(n_random):
                b = _haar(d, k, keyed_rng(seed, 73, layer, k, i))
                candidates.append(_Candidate(f"random k={k} #{i}", "random", layer, k, None, b))

    resumers: Dict[int, Optional[ResumedStream]] = {}
    clean_lp = rc.token_logprobs().double().numpy()

    def resumer(layer: int) -> Optional[ResumedStream]:
        """The kept clean stream after ``layer`` (site resid_post, ``resume=True``), None for whole passes."""
        if keeper is None:
            return None
        if layer not in resumers:
            r = keeper.stream(layer, answer_ids, clean_lp, n)
            why = "the clean pass ran elsewhere (its stream was not kept here)" if r is None else r.check()
            if why is not None:
                warnings.warn(f"{type(model).__name__} does not resume after layer {layer} (start_at_layer: {why}); "
                              "localize runs a whole pass per intervention there instead (same numbers, slower).",
                              UserWarning, stacklevel=3)
                r = None
            resumers[layer] = r
        return resumers[layer]

    # the downstream readout at each layer: the best rank-one readout direction there (fitted on every prompt)
    readers = {}
    for layer in layers:
        ones = [c for c in candidates if c.layer == layer and c.kind == "estimator" and c.readout is not None]
        if ones:
            best = max(ones, key=lambda c: c.readout.r2.value if np.isfinite(c.readout.r2.value) else -np.inf)
            readers[layer] = (best.name, best.basis[:, 0])
    clean_rho = {k: coordinate_corr_rows(X[k] @ u, h_clean if target == "model" else y, idx, "spearman")[0]
                 for k, (_, u) in readers.items()}
    down_records = []

    records = []
    bar = progress_bar(candidates, desc="localize: interventions", enabled=progress)
    here = use_runner(None) if in_shards else contextlib.nullcontext()
    with here:
        for c in bar:
            x = X[c.layer]
            res = resumer(c.layer)
            fold_of = np.zeros(n, dtype=np.int64) if c.fold_bases is None else fid
            bases_of = {0: c.basis} if c.fold_bases is None else {int(f): b for f, b in c.fold_bases.items()}
            means_of = {f: (x.mean(0) if c.fold_bases is None else x[fid != f].mean(0)) for f in bases_of}
            donor_x = None if rdonors is None else x[rdonors]  # resample: each prompt's donor row at this layer
            fixed = {} if donor_x is not None else \
                {f: subspace_patch(model, c.layer, bases_of[f], site=site, operation=operation, mean=means_of[f]).parts
                 for f in bases_of}

            def parts_of(f, rows, fixed=fixed, donor_x=donor_x, layer=c.layer):
                """The candidate's parts for fold ``f``'s prompts ``rows`` (only resample's depend on the prompts)."""
                if fixed:
                    return fixed[f]
                return subspace_patch(model, layer, bases_of[f], site=site, operation=operation, mean=means_of[f],
                                      donor_rows=donor_x[rows]).parts

            later = [k for k in readers if k > c.layer]
            p, rows = run_edit(model, texts, answer_ids, _rows_edit(parts_of, fold_of), layer=c.layer, site=site,
                               stream=res, read_layers=later, batch_size=batch_size, desc=f"localize: {c.name}")
            h = entropy_bits(p)
            m = metrics(h, p)
            rec = {"layer": c.layer, "subspace": c.name, "kind": c.kind, "rank": c.rank}
            for k in later:  # Δρ of the downstream readout, as compare_patched's axis–entropy correlation
                name, u = readers[k]
                r, degenerate = coordinate_corr_rows(rows[k] @ u, h if target == "model" else y, idx, "spearman",
                                                     clean=X[k] @ u)
                diff = r - clean_rho[k]
                lo, hi = percentile_interval(diff[1:])
                down_records.append({"layer": c.layer, "subspace": c.name, "kind": c.kind, "rank": c.rank,
                                     "readout_layer": k, "readout": name, "rho_clean": float(clean_rho[k][0]),
                                     "rho_patched": float(r[0]), "delta_rho": float(diff[0]), "delta_rho_ci_low": lo,
                                     "delta_rho_ci_high": hi, "degenerate": degenerate})
            if swap:
                ps, _ = run_edit(model, texts, answer_ids, _swap_edit(bases_of, fold_of, x[donors]), layer=c.layer,
                                 site=site, stream=res, batch_size=batch_size, desc=f"localize: swap {c.name}")
                # bits closer to the donor's clean output: KL(q_donor ‖ p_clean) − KL(q_donor ‖ p_swapped)
                move = (kl_categorical_bits(p_clean[donors], p_clean, eps=1e-9)
                        - kl_categorical_bits(p_clean[donors], ps, eps=1e-9))
                mv = move[idx].mean(-1)
                lo_, hi_ = percentile_interval(mv[1:])
                rec.update(swap_bits=float(mv[0]), swap_ci_low=lo_, swap_ci_high=hi_)
            if c.readout is not None:
                rec.update(r2=c.readout.r2.value, r2_ci_low=c.readout.r2.ci_low, r2_ci_high=c.readout.r2.ci_high,
                           r2_null_q95=c.readout.null_r2_q95, r2_p=c.readout.p_value, rho=c.readout.rho,
                           readable=c.readout.readable)
            else:
                rec.update(r2=np.nan, r2_ci_low=np.nan, r2_ci_high=np.nan, r2_null_q95=np.nan, r2_p=np.nan,
                           rho=np.nan, readable=False)
            for key in ("mae", "ece", "brier"):
                diff = m[key] - clean_m[key]
                lo, hi = percentile_interval(diff[1:])
                rec.update({f"delta_{key}{'_bits' if key == 'mae' else ''}": float(diff[0]),
                            f"delta_{key}_ci_low": lo, f"delta_{key}_ci_high": hi})
            records.append(rec)
    table = pd.DataFrame.from_records(records)
    band = (table[table["kind"] == "random"].groupby(["layer", "rank"])["delta_mae_bits"]
            .quantile([0.025, 0.975]).unstack())
    table["band_low"] = [band.loc[(r.layer, r.rank), 0.025] for r in table.itertuples()]
    table["band_high"] = [band.loc[(r.layer, r.rank), 0.975] for r in table.itertuples()]
    table["removal_matters"] = table["delta_mae_ci_low"] > np.maximum(table["band_high"], min_effect)
    if swap:
        sband = (table[table["kind"] == "random"].groupby(["layer", "rank"])["swap_bits"]
                 .quantile([0.025, 0.975]).unstack())
        table["swap_band_low"] = [sband.loc[(r.layer, r.rank), 0.025] for r in table.itertuples()]
        table["swap_band_high"] = [sband.loc[(r.layer, r.rank), 0.975] for r in table.itertuples()]
        table["swap_redirects"] = table["swap_ci_low"] > np.maximum(table["swap_band_high"], min_effect)
        table["mediator"] = table["removal_matters"] | table["swap_redirects"]
    else:
        table["mediator"] = table["removal_matters"]
    table["verdict"] = [_verdict(bool(r.readable), bool(r.mediator)) for r in table.itertuples()]
    down = pd.DataFrame.from_records(down_records, columns=[
        "layer", "subspace", "kind", "rank", "readout_layer", "readout", "rho_clean", "rho_patched", "delta_rho",
        "delta_rho_ci_low", "delta_rho_ci_high", "degenerate"])
    if len(down):  # the random band of Δρ: the same rank's random subspaces at the same layer, read at the same layer
        dband = (down[down["kind"] == "random"].groupby(["layer", "rank", "readout_layer"])["delta_rho"]
                 .quantile([0.025, 0.975]).unstack())
        down["rho_band_low"] = [dband.loc[(r.layer, r.rank, r.readout_layer), 0.025] for r in down.itertuples()]
        down["rho_band_high"] = [dband.loc[(r.layer, r.rank, r.readout_layer), 0.975] for r in down.itertuples()]
    else:
        down["rho_band_low"] = down["rho_band_high"] = pd.Series(dtype=float)
    # the main table carries the next downstream layer's row (all of them: .downstream)
    nxt = down.sort_values("readout_layer").drop_duplicates(["layer", "subspace"]).set_index(["layer", "subspace"])
    for col, src in (("downstream_layer", "readout_layer"), ("rho_clean", "rho_clean"), ("delta_rho", "delta_rho"),
                     ("delta_rho_ci_low", "delta_rho_ci_low"), ("delta_rho_ci_high", "delta_rho_ci_high"),
                     ("rho_band_low", "rho_band_low"), ("rho_band_high", "rho_band_high")):
        table[col] = [nxt[src].get((r.layer, r.subspace), np.nan) for r in table.itertuples()]

    layer_rows = []
    by_name = {(c.layer, c.name): c for c in candidates}
    for layer in layers:
        t = table[table["layer"] == layer]
        est = t[t["kind"] == "estimator"]
        real = t[t["kind"] != "random"]
        readable = bool(real["readable"].any()) if len(real) else False
        mediator = bool(real["mediator"].any()) if len(real) else False
        row = {"layer": layer, "verdict": _verdict(readable, mediator), "clean_mae_bits": float(clean_m["mae"][0])}
        ones = real[real["rank"] == 1] if len(est) == 0 else est
        meds = real[real["mediator"]]
        if len(ones) and len(meds) and ones["r2"].notna().any():
            # the most causal: the mediator furthest above its band (removal or swap, whichever is further)
            excess = meds["delta_mae_ci_low"] - meds["band_high"]
            if swap:
                excess = np.maximum(excess, meds["swap_ci_low"] - meds["swap_band_high"])
            best_r = by_name[(layer, ones.loc[ones["r2"].idxmax(), "subspace"])]
            best_c = by_name[(layer, meds.loc[excess.idxmax(), "subspace"])]
            u = best_r.basis[:, 0]
            cos2 = float(np.clip(np.sum((best_c.basis.T @ u) ** 2) / float(u @ u), 0.0, 1.0))
            from scipy.stats import beta

            k = best_c.rank
            row.update(best_readout=best_r.name, most_causal=best_c.name, angle_deg=float(np.degrees(np.arccos(np.sqrt(cos2)))),
                       cos2=cos2, cos2_null_mean=k / d, angle_p=float(beta.sf(cos2, k / 2, (d - k) / 2)))
        else:
            row.update(best_readout=None, most_causal=None, angle_deg=np.nan, cos2=np.nan, cos2_null_mean=np.nan,
                       angle_p=np.nan)
        layer_rows.append(row)
    rule = (f"readable: the held-out R² interval (cross-fitted, {folds} folds) lies above the shuffled-target null's "
            f"95th percentile and {min_r2}; mediator: the Δ MAE interval (paired bootstrap, 95%) of the {operation}"
            + (" or the swap's move toward the donor (bits of KL)" if swap else "") +
            f" lies above its random band's 97.5th percentile ({n_random} Haar subspaces of the same rank) and "
            f"{min_effect} bits")
    return Localization(table=table, layers_table=pd.DataFrame.from_records(layer_rows), n_prompts=n, site=site,
                        target=target, operation=operation, rule=rule, downstream=down.reset_index(drop=True))


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


def _rows_edit(parts_of, fold_of: np.ndarray):
    """``edit(batch, resid)`` applying to each row its fold's patch parts (every position), in the parts' order:
    ``parts_of(fold, prompts)`` gives the parts for those prompts (global indices, in the batch's row order)."""
    def edit(batch, x):
        idx = batch.indices.numpy()
        folds = fold_of[idx]
        for f in np.unique(folds):
            sel = np.flatnonzero(folds == f)
            rows = torch.as_tensor(sel)
            y = x[rows]
            for part in parts_of(int(f), idx[sel]):
                y = part.apply(y)
            x[rows] = y
        return x
    return edit


def _swapped(a: torch.Tensor, donor: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The swap, the one definition both routes use: ``a`` with its component in span(b) (``b`` orthonormal
    ``[d, k]``) replaced by ``donor``'s, a − (a b) bᵀ + (donor b) bᵀ (rows or single vectors)."""
    return a - (a @ b) @ b.T + (donor @ b) @ b.T


def _swap_edit(basis_of_fold: dict, fold_of: np.ndarray, donor_rows: np.ndarray):
    """``edit(batch, resid)``: at each row's final position, its fold's subspace component replaced by its donor's."""
    bases = {f: torch.as_tensor(np.linalg.qr(b)[0], dtype=torch.float32) for f, b in basis_of_fold.items()}
    donor = torch.as_tensor(np.asarray(donor_rows), dtype=torch.float32)

    def edit(batch, x):
        folds = fold_of[batch.indices.numpy()]
        for r in range(x.shape[0]):
            b = bases[int(folds[r])]
            a = x[r, batch.last_index[r]].float()
            d = donor[int(batch.indices[r])]
            x[r, batch.last_index[r]] = _swapped(a, d, b).to(x.dtype)
        return x
    return edit


def head_blocks(model, *, site: str = "z") -> dict:
    """``{"head h": [n·d_head, d_head] basis}``: the coordinate block of each attention head in the flattened
    ``z`` site (query heads) or ``v`` site (key/value heads), for :func:`localize`'s ``bases=``. With
    ``site="z"`` the localisation table becomes the layer × head grid: each head's readout (ridge on its
    d_head coordinates) and the calibration change when its output is removed (zero-ablation, or
    mean-ablation with ``operation="mean"``), against random subspaces of rank d_head of the same site.

    >>> sorted(head_blocks(model))[:2], head_blocks(model)["head 0"].shape
    (['head 0', 'head 1'], (64, 16))
    """
    check_choice(site, "site", ("z", "v"))
    info = adapter.model_info(model)
    n = info.n_heads if site == "z" else info.n_kv_heads
    eye = np.eye(n * info.d_head)
    return {f"head {h}": eye[:, h * info.d_head:(h + 1) * info.d_head] for h in range(n)}


def swap_donors(items, *, seed: int = 0) -> np.ndarray:
    """``[n]`` the donor of each item for a swap: a seeded draw among the items whose exact posterior has another
    most probable answer (for SULA: the other side of ½), else, where there is none, among those whose posterior
    differs at all (total variation > 10⁻⁹)."""
    post = np.array([it.posterior for it in items], dtype=np.float64)
    rng = keyed_rng(seed, 74)
    out = np.empty(len(items), dtype=np.int64)
    mode = post.argmax(1)
    ties = np.isclose(post.max(1), np.sort(post, 1)[:, -2]) if post.shape[1] > 1 else np.zeros(len(items), bool)
    for i in range(len(items)):
        tv = 0.5 * np.abs(post - post[i]).sum(1)
        differ = tv > 1e-9
        other = np.flatnonzero(differ & (mode != mode[i]) & ~ties) if not ties[i] else np.flatnonzero(differ & ~ties)
        pool = other if len(other) else np.flatnonzero(differ)
        if not len(pool):
            raise InvalidInputError("a swap needs items with different posteriors (several k, both labels); "
                                    "make prompts with ks=(0, 1, 2, 4) or pass swap=False.")
        out[i] = rng.choice(pool)
    return out


def _verdict(readable: bool, mediator: bool) -> str:
    return VERDICTS[0] if readable and mediator else VERDICTS[1] if readable else \
        VERDICTS[2] if mediator else VERDICTS[3]
