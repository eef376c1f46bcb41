"""Decode a task's sufficient statistic from the residual stream, patch it, and check the posterior follows.

Paper B v3 (arXiv 2507.11768v3; METHODS.md §13, "Sufficient-statistic patching"): if a model is
Bayesian *because* it tracks the counts, then moving the counts it has decoded from one sequence's
value to another's should move its prediction to the exact posterior of the new counts. With s the
statistic (SULA: n₁ − n₂, the net evidence; categorical symbols: the count of each symbol; any
``[n, m]`` array of yours) and x the final-token row of the site at a layer:

* **Decode**: a cross-fitted ridge probe ŝ = Wx + b per statistic column (the standardized ridge of
  :mod:`bayes_lens.ablation._readout`, mapped back to activation space), held-out R² with its interval
  and shuffled-target null per column.
* **Patch**: prompt i gets donor j's statistic (a donor with another exact posterior,
  :func:`bayes_lens.ablation.swap_donors`): at the final position x ← x + ΣWᵀ(WΣWᵀ)⁻¹(s_j − ŝ_i), Σ the
  training rows' covariance: the move along the way the rows actually vary with the decoded statistic
  (the smallest move in the data's own metric), scaled so that the fold's probe reads s_j (the probe never
  saw prompt i). The Euclidean least-norm move Wᵀ(WWᵀ)⁻¹ would instead push along the probe's largest raw
  weights, which sit on the least-varying coordinates.
* **Score**: how many bits closer the model's posterior p over the answers came to the exact
  posterior q_j of the patched statistic: KL(q_j ‖ p_i) − KL(q_j ‖ p_i^patched), averaged over prompts
  with a paired percentile bootstrap interval, and the KL that remains, KL(q_j ‖ p_i^patched).
* **Control**: the same move length along a Haar-random direction, ``n_random`` draws; the band is
  their 2.5–97.5th percentiles of the score. *Follows* (the rule): the score's interval lies above
  the band's upper end and above ``min_effect_bits``.

Example
-------
>>> import bayes_lens as bl
>>> model, planted = bl.models.tiny.planted_model("bridge")
>>> items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4), n_per_k=6)
>>> res = bl.ablation.patch_statistic(model, items, layer=0, n_random=3, folds=3, n_boot=100, n_null=5)
>>> res.follows
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from .. import adapter
from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._validate import check_bool, check_choice, check_count, check_float, check_seed
from ..collect import StreamKeeper, collect
from ..estimators import ALPHAS, fold_ids

from ..interventions import Intervention, swap_donors
from ..errors import InvalidInputError
from ..metrics.calibration import kl_categorical_bits
from ..metrics.stats import bootstrap_indices, keyed_rng, percentile_interval
from ..reads import FinalRows
from ..tasks import answer_posterior, answer_token_ids
from ._common import prompt_data
from ._readout import cross_fitted_readout

__all__ = ["patch_statistic", "StatisticPatch", "sufficient_statistic"]


def sufficient_statistic(items) -> np.ndarray:
    """``[n, m]`` the statistic the exact posterior depends on: SULA's net evidence n₁ − n₂ (one column), a
    categorical task's counts (one column per symbol); other tasks: pass your own array."""
    items = list(items)
    if items and all(hasattr(it, "example_labels") for it in items):
        return np.array([[sum(1 if lab == 0 else -1 for lab in it.example_labels)] for it in items], dtype=np.float64)
    if items and all(hasattr(it, "counts") for it in items):
        return np.array([list(it.counts) for it in items], dtype=np.float64)
    raise InvalidInputError("no known sufficient statistic for these items (SULA items and categorical items have "
                            "one); pass statistic= as an [n, m] array.")


def _probe(xtr: np.ndarray, str_: np.ndarray):
    """(W [m, d], b [m]) of a standardized ridge fit of each column of ``str_`` on ``xtr``, in activation space."""
    from sklearn.linear_model import RidgeCV

    mean = xtr.mean(0)
    sd = xtr.std(0, ddof=1)
    sd = np.where(sd > 1e-12 * max(1.0, float(np.abs(xtr).max())), sd, np.inf)
    fit = RidgeCV(alphas=ALPHAS).fit((xtr - mean) / sd, str_)
    coef = np.atleast_2d(fit.coef_) / sd
    return coef, np.atleast_1d(fit.intercept_) - coef @ mean


@dataclass(frozen=True, eq=False)
class StatisticPatch(Result):
    """What :func:`patch_statistic` measured: ``decode_r2`` (one :class:`~bayes_lens.Estimate` per statistic
    column), ``move_bits`` (bits closer to the patched statistic's exact posterior; its null is the random
    band), ``kl_after_bits`` (KL from that posterior left after the patch), ``kl_clean_bits`` (the clean
    model's KL from its own exact posterior, for scale), ``random_move_bits`` (per draw), ``follows`` (the
    rule in ``rule``), ``layer``, ``site``, ``n_prompts``, ``per_prompt`` (a DataFrame)."""

    decode_r2: tuple
    move_bits: Estimate
    kl_after_bits: Estimate
    kl_clean_bits: Estimate
    random_move_bits: np.ndarray
    follows: bool
    rule: str
    layer: int
    site: str
    n_prompts: int
    per_prompt: object

    def _summary(self):
        rows = [(f"decode R² (column {i})", fmt(e.value), fmt_ci(e.ci), "") for i, e in enumerate(self.decode_r2)]
        rows.append(("bits toward the patched posterior", fmt(self.move_bits.value), fmt_ci(self.move_bits.ci),
                     f"random band {fmt_ci(self.move_bits.null_interval)}"))
        rows.append(("KL left after the patch (bits)", fmt(self.kl_after_bits.value), fmt_ci(self.kl_after_bits.ci),
                     f"clean model vs its own posterior {fmt(self.kl_clean_bits.value)}"))
        rows.append(("follows", str(self.follows), "", self.rule))
        return (f"Sufficient-statistic patch at layer {self.layer} ({self.site}) on {self.n_prompts} prompts", rows)

    def to_dataframe(self):
        """The per-prompt table: statistic, donor, decoded value, score and KLs."""
        return self.per_prompt.copy()

    def plot(self):
        """The score per prompt against the random band."""
        go = plotly()
        t = self.per_prompt
        fig = go.Figure(go.Histogram(x=t["move_bits"], name="patched along the probe"))
        fig.add_trace(go.Histogram(x=self.random_move_bits, name="random direction (mean per draw)"))
        fig.update_layout(title="Sufficient-statistic patch: bits toward the patched statistic's posterior",
                          xaxis_title="bits", barmode="overlay")
        return fig


def patch_statistic(model, items, *, layer: int, statistic=None, site: str = "resid_post", donors=None,
                    folds: int = 5, n_random: int = 20, n_boot: int = 1000, n_null: int = 100,
                    min_effect_bits: float = 0.01, resume: bool = True, seed: int = 0, batch_size: int = 16,
                    progress: Optional[bool] = None) -> StatisticPatch:
    """Decode ``statistic`` (default :func:`sufficient_statistic`) at ``layer``, patch it to a donor's value at the
    final position, and score whether the posterior follows (the maths, the control and the rule are in the
    module docstring). ``donors`` ``[n]`` indices (default :func:`swap_donors`): the donor's *exact posterior*
    is the target, so each donor's statistic must determine it (as for SULA and categorical items).

    >>> model, planted = bl.models.tiny.planted_model("bridge")
    >>> items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4), n_per_k=6)
    >>> round(bl.ablation.patch_statistic(model, items, layer=0, n_random=3, folds=3, n_boot=100,
    ...                                   n_null=5).kl_after_bits.value, 2)
    0.0
    """
    import pandas as pd

    adapter.check_model(model)
    check_choice(site, "site", ("resid_post", "v", "z"))
    folds = check_count(folds, "folds")
    n_random = check_count(n_random, "n_random")
    n_boot = check_count(n_boot, "n_boot")
    n_null = check_count(n_null, "n_null", allow_zero=True)
    min_effect = check_float(min_effect_bits, "min_effect_bits", min=0.0)
    resume = check_bool(resume, "resume")
    seed = check_seed(seed)
    items = list(items)
    texts, bayes = prompt_data(items)
    if bayes is None:
        raise InvalidInputError("patch_statistic needs items with exact posteriors (bl.sula.make_prompts, bl.tasks).")
    layer = adapter.resolve_layer(model, layer)
    s = sufficient_statistic(items) if statistic is None else np.asarray(statistic, dtype=np.float64)
    s = s[:, None] if s.ndim == 1 else s
    n = len(items)
    if s.ndim != 2 or s.shape[0] != n or not np.all(np.isfinite(s)):
        raise InvalidInputError(f"statistic must be a finite [n, m] array with n = {n} rows, got {list(s.shape)}.")
    d = np.arange(n)
    donor = swap_donors(items, seed=seed) if donors is None else np.asarray(donors, dtype=np.int64)
    if donor.shape != (n,) or donor.min() < 0 or donor.max() >= n:
        raise InvalidInputError(f"donors must be {n} indices into the items, got shape {list(donor.shape)}.")
    strata = np.array([it.k for it in items])
    answer_ids = list(answer_token_ids(model, items[0].answers))
    keeper = StreamKeeper(model, [layer]) if resume and site == "resid_post" else None
    rc = collect(model, texts, token_ids=answer_ids, reads=[FinalRows(layer, site)], batch_size=batch_size,
                 fwd_hooks=keeper if keeper is not None else (), progress=progress, desc="patch_statistic: clean")
    x = rc.value_rows(layer, site).double().numpy()
    p_clean = answer_posterior(rc.token_logprobs())[0]
    q = np.array([it.posterior for it in items], dtype=np.float64)
    fid = fold_ids(n, folds, seed=seed, strata=strata)
    decode = tuple(cross_fitted_readout(x, s[:, c], estimator="ridge", folds=folds, strata=strata, n_boot=n_boot,
                                        n_null=n_null, seed=seed).r2 for c in range(s.shape[1]))
    # each prompt's least-norm move to its donor's statistic, by the probe fitted without its fold
    move = np.zeros_like(x)
    decoded = np.zeros_like(s)
    for f in np.unique(fid):
        te = fid == f
        W, b = _probe(x[~te], s[~te])
        decoded[te] = x[te] @ W.T + b
        xc = x[~te] - x[~te].mean(0)
        sw = xc.T @ (xc @ W.T) / max(len(xc) - 1, 1)  # Σ Wᵀ [d, m]: how the rows vary with the decoded statistic
        move[te] = (s[donor[te]] - decoded[te]) @ np.linalg.pinv(W @ sw).T @ sw.T
    norms = np.linalg.norm(move, axis=1)

    def run(delta: np.ndarray) -> np.ndarray:
        """The posterior with ``delta`` [n, d] added to each prompt's final-position row of the site."""
        iv = Intervention(layer=layer, site=site, basis=None, op="shift", positions="final", source=delta,
                          label="statistic move")
        rc_ = collect(model, texts, token_ids=answer_ids, interventions=[iv], resume=res, batch_size=batch_size,
                      progress=False, desc="patch_statistic: patched")
        return answer_posterior(rc_.token_logprobs())[0]

    res = None if keeper is None else keeper.stream(layer, n)
    if res is not None and res.check(answer_ids, rc.token_logprobs().double().numpy()) is not None:
        res = None
    p_patched = run(move)
    target = q[donor]
    kl_before = kl_categorical_bits(target, p_clean, eps=1e-9)
    kl_after = kl_categorical_bits(target, p_patched, eps=1e-9)
    score = kl_before - kl_after
    idx = np.concatenate([d[None, :], bootstrap_indices(n, n_boot, seed=seed, strata=strata)])
    randoms = []
    for i in range(n_random):
        r = keyed_rng(seed, 75, layer, i).standard_normal(x.shape)
        r *= (norms / np.linalg.norm(r, axis=1))[:, None]
        pr = run(r)
        randoms.append(float(np.mean(kl_before - kl_categorical_bits(target, pr, eps=1e-9))))
    randoms = np.array(randoms)
    band = (float(np.quantile(randoms, 0.025)), float(np.quantile(randoms, 0.975)))
    sm = score[idx].mean(1)
    move_ci = percentile_interval(sm[1:])
    ka = kl_after[idx].mean(1)
    kc_all = kl_categorical_bits(q, p_clean, eps=1e-9)
    kc = kc_all[idx].mean(1)
    how = "paired percentile bootstrap over prompts (95%, within k)"
    follows = bool(move_ci[0] > max(band[1], min_effect))
    rule = (f"follows when the interval of the bits toward the patched posterior lies above the random band's "
            f"97.5th percentile ({n_random} Haar directions of the same length) and {min_effect} bits")
    table = pd.DataFrame({"statistic": [list(r) for r in s], "donor": donor, "decoded": [list(r) for r in decoded],
                          "move_norm": norms, "move_bits": score, "kl_before_bits": kl_before,
                          "kl_after_bits": kl_after})
    return StatisticPatch(
        decode_r2=decode, move_bits=Estimate(float(sm[0]), move_ci, how, null=float(np.median(randoms)),
                                             null_interval=band, n=n),
        kl_after_bits=Estimate(float(ka[0]), percentile_interval(ka[1:]), how, n=n),
        kl_clean_bits=Estimate(float(kc[0]), percentile_interval(kc[1:]), how, n=n),
        random_move_bits=randoms, follows=follows, rule=rule, layer=layer, site=site, n_prompts=n, per_prompt=table)
