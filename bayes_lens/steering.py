"""Steering as a prior: does adding a direction shift the model's prior, or reweight its evidence?

METHODS.md §16. Bigelow, Wurgaft, Wang, Goodman, Ullman, Tanaka, Lubana, "Belief Dynamics Reveal the
Dual Nature of In-Context Learning and Activation Steering" (arXiv 2511.00617) model activation steering
as a change of the prior that adds, in log-belief space, to the evidence of the in-context examples. On a
task with an exact posterior (SULA, METHODS.md §6; the categorical task, §6b; any task of §6a) that is a
sharp test. For prompt i with exact Bayes log-likelihood ratio of its evidence

    LLR_i = logit P_Bayes(label₁ | D_i) − logit P_prior(label₁)                  (nats; label₁ against the rest)

and the model's answer log-odds y_iα = log P(label₁) − log Σ_{j≠1} P(answer_j) (nats, the final token's
full-vocabulary log-probabilities of the answers) after steering by α along a unit direction u at one
layer's site (h ← h + α·s·u, :class:`bayes_lens.interventions.Intervention` ``op="shift"``), fit by
**ordinary least squares on the model's log-odds** over every (prompt, α) of the grid

    y_iα = β₀ + β_α·α + β_e·LLR_i + β_int·α·LLR_i.

β_e = 1, β₀ = 0 is exact Bayes; steering that only moves the prior has β_int = 0 (the evidence weight
β_e + β_int·α does not change with α); steering that reweights the evidence has β_int ≠ 0. The unsteered
model alone (α = 0: y_i0 = β₀ + β_e·LLR_i) gives its effective evidence weight against Bayes's 1.

* **Units of α** (``alpha_unit``): ``"norm"`` multiples of the site's mean final-token L2 norm (the same
  step length for every direction, the default), ``"sigma"`` multiples of the SD of each direction's own
  coordinate x·u over the prompts, ``"raw"`` the length of the added vector. The step s per unit α is in
  the table (``alpha_scale``).
* **Directions**: ``"contrast"`` the difference of the class means of the final-token rows at the site
  (class 1: prompts whose evidence favours label₁, LLR > 0; class 2: LLR < 0; ties left out), unit length,
  cross-fitted (:func:`bayes_lens.estimators.fold_ids`, folds stratified by k: prompt i is steered along the
  direction fitted without its fold); ``"entropy"`` the entropy axis (PC1 of the standardized rows mapped
  back, :class:`bayes_lens.estimators.PC1Axis`, signed to read the model's answer entropy positively),
  cross-fitted; ``user`` directions (e.g. the best mediator of :func:`bayes_lens.localize`); controls:
  ``"haar"`` ``n_random`` directions uniform on the sphere (the random band), ``"norm_matched"`` one random
  direction shaped like the activations (a Gaussian draw with their covariance: Xcᵀg/‖Xcᵀg‖, g ~ N(0, I)),
  and ``"shuffled_contrast"`` the contrast direction fitted with the class labels permuted (cross-fitted
  the same way). Every direction is a unit vector stepped by the same α·s (with ``"norm"``/``"raw"``), so
  the random ones are norm-matched by construction.
* **Intervals**: a paired percentile bootstrap over prompts, resampled within k (every α of a prompt stays
  together), ``n_boot`` resamples; the fit of each resample is the same least squares; the replicates'
  spread about the estimate is widened by √(n/(n − S)) (S the number of k), the variance that resampling
  within small strata loses (without it: 0.89 coverage of β_int for a nominal 0.95 at 12 prompts per k).
* **Verdict rules** (``rule`` in the result says them in words), margin m = ``margin``·|β_e(clean)|/max|α|
  (the evidence weight changes by at most ``margin`` of its unsteered value over the grid):
  *shifts the prior* when β_α's interval excludes 0 and β_int's 95% interval lies inside ±m (an
  equivalence test, :func:`bayes_lens.metrics.stats.equivalence`); *reweights evidence* when β_int's
  interval excludes 0 and does not lie inside ±m; *no effect* when β_α's interval holds 0 and β_int is
  equivalent to 0; else *inconclusive*. The false-positive rate of each rule is measured per direction on
  null cases at the design's n (:func:`null_rates`): simulated log-odds with β_int = 0 exactly (for
  "reweights evidence") or |β_int| = m (the equivalence boundary, for "shifts the prior"), the fitted
  β₀, β_α, β_e, and the fit's residuals, permuted between prompts within k (each prompt's residuals
  across α kept together); ``reliable`` is False where the bare β_int test or the prior-shift verdict
  fires on more than 10% of them (the residuals are then not exchangeable noise: read the verdict as
  descriptive).
* **Runs**: one clean pass, then one pass per (direction, α ≠ 0). At ``resid_post`` the clean pass keeps the
  stream after the layer (:class:`bayes_lens.collect.StreamKeeper`) and each steered pass resumes from it, running
  only the later blocks (``collect(..., resume=)``; the same log-odds as whole passes, tested); at ``v``/``z``, or
  where a kind cannot resume (its one-batch check fails), whole passes.
* **Crossover**: the α that cancels one net example for label₁, α× = −β_e·λ/(β_α + β_int·λ) (λ the
  exact log-likelihood ratio of one example: log(p/(1−p)) on SULA, 1 nat on other tasks), with its
  bootstrap interval.

``bl.steering`` is this module, and calling it calls :func:`steering` (the module is callable), so
``bl.steering(model, items)`` and ``bl.steering.fit_terms(...)`` both work whichever was imported first.

Example
-------
>>> import bayes_lens as bl
>>> model, truth = bl.models.tiny.steering_model("bridge")
>>> items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=4, seed=0)
>>> res = bl.steering(model, items, layer=0, alphas=(-1, 0, 1), alpha_unit="raw", directions=(),
...                   user={"prior": truth.prior_direction}, n_boot=50, n_null=20)
>>> res.verdict("prior"), round(res.beta("prior", "beta_alpha").value, 3)
('shifts the prior', 2.197)
"""

from __future__ import annotations

import math
import sys
import time
import types
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import adapter
from ._results import Estimate, Result, fmt, fmt_ci, plotly
from ._validate import check_choice, check_count, check_float, check_int, check_seed
from .errors import InvalidInputError
from .metrics.stats import bootstrap_indices, equivalence, keyed_rng, percentile_interval

__all__ = ["steering", "Steering", "fit_terms", "null_rates", "DIRECTIONS", "ALPHA_UNITS", "TERMS"]

#: the built-in directions (controls included), in the order they run
DIRECTIONS = ("contrast", "entropy", "shuffled_contrast", "norm_matched", "haar")
#: what one unit of α is
ALPHA_UNITS = ("norm", "sigma", "raw")
#: the fitted coefficients, in the order of the design's columns [1, α, LLR, α·LLR]
TERMS = ("beta_0", "beta_alpha", "beta_e", "beta_int")
_SITES = ("resid_post", "v", "z")
_CI = "paired percentile bootstrap over prompts, within k (95%)"
_VERDICTS = ("shifts the prior", "reweights evidence", "no effect", "inconclusive")


# ------------------------------------------------------------------------------------------------ the fit
def _design(alphas: np.ndarray, llr: np.ndarray) -> np.ndarray:
    """``[n, A, 4]``: the columns 1, α, LLR, α·LLR of every (prompt, α)."""
    a = np.broadcast_to(alphas[None, :], (len(llr), len(alphas)))
    e = np.broadcast_to(llr[:, None], a.shape)
    return np.stack([np.ones_like(a), a, e, a * e], axis=-1)


def fit_terms(alphas, llr, log_odds) -> np.ndarray:
    """(β₀, β_α, β_e, β_int): least squares of ``log_odds`` ``[n, A]`` (prompt i steered by ``alphas[a]``) on
    1, α, LLR, α·LLR (``llr`` ``[n]``, nats), by :func:`numpy.linalg.lstsq` over the n·A rows.

    >>> llr = np.array([-2.0, 0.0, 2.0]); a = np.array([-1.0, 0.0, 1.0])
    >>> y = 0.5 + 2 * a[None, :] + 0.8 * llr[:, None] + 0.1 * a[None, :] * llr[:, None]
    >>> np.round(fit_terms(a, llr, y), 6).tolist()
    [0.5, 2.0, 0.8, 0.1]
    """
    a, e, y = (np.asarray(v, dtype=np.float64) for v in (alphas, llr, log_odds))
    if y.shape != (len(e), len(a)):
        raise InvalidInputError(f"log_odds must be [n prompts, n alphas] = [{len(e)}, {len(a)}], got {list(y.shape)}.")
    x = _design(a, e).reshape(-1, 4)
    return np.linalg.lstsq(x, y.reshape(-1), rcond=None)[0]


def _normal_parts(x: np.ndarray, y: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per prompt XᵢᵀXᵢ ``[n, p, p]`` and Xᵢᵀyᵢ ``[n, p]`` (a bootstrap resample's fit sums them)."""
    return np.einsum("naj,nak->njk", x, x), np.einsum("naj,na->nj", x, y)


def _boot_fits(xtx: np.ndarray, xty: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``[B, p]`` the least-squares coefficients of each resample (rows of ``idx`` ``[B, n]``); NaN where singular."""
    b, n = idx.shape
    counts = np.zeros((b, n))
    np.add.at(counts, (np.repeat(np.arange(b), n), idx.ravel()), 1.0)
    m = np.einsum("bn,njk->bjk", counts, xtx)
    v = np.einsum("bn,nj->bj", counts, xty)
    out = np.full(v.shape, np.nan)
    cond = np.linalg.cond(m)
    ok = np.isfinite(cond) & (cond < 1e12)
    if ok.any():
        out[ok] = np.linalg.solve(m[ok], v[ok][..., None])[..., 0]
    return out


def _inflate(reps: np.ndarray, est, n: int, n_strata: int) -> np.ndarray:
    """Replicates spread about the estimate by √(n/(n − S)) (S strata): resampling n_s prompts within each
    stratum shrinks the variance by (n_s − 1)/n_s, which at 6-12 prompts per k under-covers (measured: 0.89
    for a nominal 0.95 at n = 60, S = 5); the factor undoes it for equal strata."""
    f = math.sqrt(n / max(n - n_strata, 1))
    return np.asarray(est) + f * (reps - np.asarray(est))


def _crossover(beta: np.ndarray, lam: float) -> np.ndarray:
    """α× = −β_e·λ/(β_α + β_int·λ) for each row of ``beta`` ``[..., 4]`` (NaN where the denominator is 0)."""
    den = beta[..., 1] + beta[..., 3] * lam
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.abs(den) > 1e-12, -beta[..., 2] * lam / den, np.nan)


def _margin(rel: float, beta_e_clean: float, alphas: np.ndarray) -> float:
    return max(rel * abs(beta_e_clean) / float(np.max(np.abs(alphas))), 1e-12)


def _decide(ci_alpha, ci_int, margin: float) -> str:
    """The verdict rule (module docstring) on β_α's and β_int's 95% intervals."""
    eq = equivalence(0.5 * (ci_int[0] + ci_int[1]), ci_int, margin).outcome == "equivalent"
    moves = _excl(ci_alpha)
    if moves and eq:
        return "shifts the prior"
    if _excl(ci_int) and not eq:
        return "reweights evidence"
    if not moves and eq:
        return "no effect"
    return "inconclusive"


def _excl(ci) -> bool:
    lo, hi = float(ci[0]), float(ci[1])
    return bool(math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0))


def null_rates(alphas, llr, strata, *, beta, residuals=None, margin: float, n_null: int = 200, n_boot: int = 200,
               seed: int = 0, noise_sd: float = 0.5, prompt_sd: float = 0.5) -> Dict[str, float]:
    """The false-positive rates of the two verdicts on null cases at this design (METHODS.md §16).

    Simulated log-odds y* = β₀ + β_α·α + β_e·LLR + β_int*·α·LLR + noise, with ``beta`` = (β₀, β_α, β_e, ·) and
    the noise either ``residuals`` ``[n, A]`` (a fit's residuals, whole prompts permuted within the strata) or,
    without them, Gaussian: a prompt effect of SD ``prompt_sd`` plus independent noise of SD ``noise_sd``.
    ``fpr_reweights``: the fraction of ``n_null`` data sets with β_int* = 0 exactly that the rule calls
    "reweights evidence", and ``fpr_int_test`` the fraction whose β_int interval excludes 0 (the bare test, nominal
    5%); ``fpr_prior_shift``: the fraction with β_int* = ±``margin`` (the equivalence boundary, the sign of
    ``beta[3]``) that it calls "shifts the prior" (nominal ≤ 2.5%). Each data set gets its own stratified
    bootstrap of ``n_boot`` resamples, its intervals made as :func:`steering` makes them.

    >>> r = null_rates([-1, 0, 1], np.repeat([-4.0, -2.0, 0.0, 2.0, 4.0], 6), np.repeat([4, 2, 0, 2, 4], 6),
    ...                beta=(0.0, 1.0, 1.0, 0.0), margin=0.1, n_null=50, n_boot=100)
    >>> sorted(r), 0.0 <= r["fpr_reweights"] <= 1.0
    (['fpr_int_test', 'fpr_prior_shift', 'fpr_reweights', 'n_null'], True)
    """
    a, e = np.asarray(alphas, dtype=np.float64), np.asarray(llr, dtype=np.float64)
    strata = np.asarray(strata)
    n_null, n_boot = check_count(n_null, "n_null"), check_count(n_boot, "n_boot")
    x = _design(a, e)
    b = np.asarray(beta, dtype=np.float64)
    rng = keyed_rng(check_seed(seed), 95)
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    sign = 1.0 if b[3] >= 0 else -1.0
    hits = {"fpr_reweights": 0, "fpr_prior_shift": 0, "fpr_int_test": 0}
    for _ in range(n_null):
        if residuals is None:
            noise = rng.normal(0, prompt_sd, (len(e), 1)) + rng.normal(0, noise_sd, (len(e), len(a)))
        else:
            perm = np.arange(len(e))
            for g in groups:
                perm[g] = rng.permutation(g)
            noise = np.asarray(residuals, dtype=np.float64)[perm]
        idx = bootstrap_indices(len(e), n_boot, seed=rng, strata=strata)
        for key, b_int, wanted in (("fpr_reweights", 0.0, "reweights evidence"),
                                   ("fpr_prior_shift", sign * margin, "shifts the prior")):
            y = x @ np.array([b[0], b[1], b[2], b_int]) + noise
            reps = _inflate(_boot_fits(*_normal_parts(x, y), idx), fit_terms(a, e, y), len(e), len(groups))
            ci_a = percentile_interval(reps[:, 1])
            ci_i = percentile_interval(reps[:, 3])
            hits[key] += _decide(ci_a, ci_i, margin) == wanted
            if b_int == 0.0:
                hits["fpr_int_test"] += _excl(ci_i)
    return {k: v / n_null for k, v in hits.items()} | {"n_null": n_null}


# ------------------------------------------------------------------------------------------------ the result
@dataclass(frozen=True, eq=False)
class Steering(Result):
    """What :func:`steering` measured (METHODS.md §16).

    ``table``: one row per direction (``direction``, ``kind`` - fitted, control, random or user -, the four
    β's with ``_ci_low``/``_ci_high``, ``crossover_alpha``, the evidence weight at the grid's ends, the
    ``margin`` of the equivalence test, ``equivalence`` outcome, ``verdict``, the measured null rates
    ``fpr_reweights``/``fpr_prior_shift``, ``alpha_scale`` the step per unit α in the site's raw units,
    ``beyond_random`` whether |β_α|'s interval lies above every Haar direction's |β_α|). ``grid``: one row per
    direction × prompt × α (``llr_bayes_nats``, ``log_odds_nats``). ``evidence_weight``/``clean_intercept``: the
    unsteered model's β_e (null 1: exact Bayes) and β₀ (nats). ``rule``: the verdict rules in words.
    """

    table: object
    grid: object
    evidence_weight: Estimate
    clean_intercept: Estimate
    layer: int
    site: str
    positions: str
    alphas: Tuple[float, ...]
    alpha_unit: str
    margin: float
    rule: str
    task: str
    label: str
    n_prompts: int
    n_boot: int
    n_null: int
    nats_per_example: float
    seconds: float

    def _summary(self):
        rows = [("evidence weight β_e (unsteered; Bayes = 1)", fmt(self.evidence_weight.value),
                 fmt_ci(self.evidence_weight), f"n = {self.n_prompts} prompts")]
        for r in self.table.itertuples():
            rows.append((f"{r.direction} ({r.kind})", r.verdict,
                         f"β_α {fmt(r.beta_alpha, 3)} {fmt_ci((r.beta_alpha_ci_low, r.beta_alpha_ci_high), 3)}",
                         f"β_int {fmt(r.beta_int, 3)} {fmt_ci((r.beta_int_ci_low, r.beta_int_ci_high), 3)}"))
        return (f"Steering as a prior ({self.task}, layer {self.layer} {self.site}, α in units of "
                f"{self.alpha_unit}: {list(self.alphas)})", rows)

    def _row(self, direction: str):
        t = self.table
        if direction not in set(t["direction"]):
            raise InvalidInputError(f"no direction {direction!r} was steered; directions: {list(t['direction'])}.")
        return t[t["direction"] == direction].iloc[0]

    def verdict(self, direction: str) -> str:
        """The verdict for ``direction`` (one of "shifts the prior", "reweights evidence", "no effect", "inconclusive")."""
        return str(self._row(direction)["verdict"])

    def beta(self, direction: str, term: str) -> Estimate:
        """One coefficient (``"beta_0"``, ``"beta_alpha"``, ``"beta_e"``, ``"beta_int"`` or ``"crossover_alpha"``)
        of ``direction`` with its interval."""
        check_choice(term, "term", TERMS + ("crossover_alpha",))
        r = self._row(direction)
        return Estimate(float(r[term]), (float(r[term + "_ci_low"]), float(r[term + "_ci_high"])), _CI,
                        null=0.0 if term != "beta_e" else 1.0, n=self.n_prompts)

    def to_dataframe(self):
        """Long format: one row per direction × term (``value``, ``ci_low``, ``ci_high``, ``units``)."""
        import pandas as pd

        units = {"beta_0": "nats", "beta_alpha": f"nats per alpha ({self.alpha_unit})", "beta_e": "nats per nat",
                 "beta_int": f"per alpha ({self.alpha_unit})", "crossover_alpha": f"alpha ({self.alpha_unit})"}
        rows = []
        for r in self.table.to_dict("records"):
            for term, unit in units.items():
                rows.append({"direction": r["direction"], "kind": r["kind"], "term": term, "value": r[term],
                             "ci_low": r[term + "_ci_low"], "ci_high": r[term + "_ci_high"], "units": unit,
                             "verdict": r["verdict"]})
        return pd.DataFrame.from_records(rows)

    def plot(self, direction: Optional[str] = None):
        """The model's log-odds against LLR_Bayes (both nats) for ``direction`` (default: the first one steered),
        one colour per α: the prompts as points, the fitted lines β₀ + β_α·α + (β_e + β_int·α)·LLR."""
        go = plotly()
        direction = str(self.table["direction"].iloc[0]) if direction is None else direction
        r = self._row(direction)
        g = self.grid[self.grid["direction"] == direction]
        fig = go.Figure()
        lo, hi = float(g["llr_bayes_nats"].min()), float(g["llr_bayes_nats"].max())
        for a in self.alphas:
            at = g[np.isclose(g["alpha"], a)]
            name = f"α = {a:g}"
            fig.add_trace(go.Scatter(x=at["llr_bayes_nats"], y=at["log_odds_nats"], mode="markers", name=name,
                                     legendgroup=name, opacity=0.6))
            xs = np.array([lo, hi])
            fig.add_trace(go.Scatter(x=xs, y=r.beta_0 + r.beta_alpha * a + (r.beta_e + r.beta_int * a) * xs,
                                     mode="lines", name=f"fit, {name}", legendgroup=name, showlegend=False))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="exact Bayes (prior 0)",
                                 line=dict(dash="dot", color="grey")))
        fig.update_layout(title=f"Steering along {direction} (layer {self.layer} {self.site}): {r.verdict}",
                          xaxis_title="LLR_Bayes of the prompt's evidence (nats)",
                          yaxis_title=f"model log-odds of{self.label} (nats)")
        return fig


# ------------------------------------------------------------------------------------------------ the run
def _items(items, label: int):
    from .tasks import is_task_item

    items = list(items)
    if not items or not all(is_task_item(it) for it in items):
        raise InvalidInputError("steering needs task items with an exact posterior (bl.sula.make_prompts, "
                                "bl.tasks.categorical_prompts or your own bl.tasks.TaskItem list).")
    answers = tuple(items[0].answers)
    if any(tuple(it.answers) != answers for it in items):
        raise InvalidInputError("every item must have the same answers (one task's prompt set).")
    label = check_int(label, "label (the index of the answer whose log-odds are read)", min=0, max=len(answers) - 1)
    post = np.clip(np.array([it.posterior for it in items], dtype=np.float64), 1e-300, 1.0)
    prior = np.clip(np.array([it.prior_posterior for it in items], dtype=np.float64), 1e-300, 1.0)

    def logit(p):
        return np.log(p[:, label]) - np.log(np.clip(1.0 - p[:, label], 1e-300, None))
    llr = logit(post) - logit(prior)
    if np.ptp(llr) < 1e-9:
        raise InvalidInputError("every prompt has the same exact evidence (LLR_Bayes); make prompts with several k "
                                "(e.g. ks=(0, 1, 2, 4, 8)).")
    ks = np.array([it.k for it in items])
    lam = 1.0
    if hasattr(items[0], "example_labels"):   # SULA: λ = LLR / (n₁ − n₂), the same for every prompt
        net = np.array([sum(1 if x == label else -1 for x in it.example_labels) for it in items], dtype=np.float64)
        ok = net != 0
        if ok.any():
            lam = float(np.median(np.abs(llr[ok] / net[ok])))
    return items, answers, label, llr, ks, lam


def _log_odds(lp: np.ndarray, label: int) -> np.ndarray:
    others = np.delete(lp, label, axis=1)
    return lp[:, label] - np.logaddexp.reduce(others, axis=1)


def _unit(v, what: str) -> np.ndarray:
    v = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float64).ravel()
    nrm = float(np.linalg.norm(v))
    if not np.all(np.isfinite(v)) or nrm < 1e-12:
        raise InvalidInputError(f"{what} must be a finite non-zero vector, got norm {nrm:g}.")
    return v / nrm


def _contrast(x: np.ndarray, cls: np.ndarray, folds_of: np.ndarray) -> Dict[int, np.ndarray]:
    out = {}
    for f in np.unique(folds_of):
        tr = folds_of != f
        pos, neg = tr & (cls > 0), tr & (cls < 0)
        if not pos.any() or not neg.any():
            raise InvalidInputError("the contrast direction needs prompts whose evidence favours each side in every "
                                    "fold's training set; use more prompts per k or fewer folds.")
        out[int(f)] = _unit(x[pos].mean(0) - x[neg].mean(0), "the contrast direction")
    return out


def _entropy_axis(x: np.ndarray, h: np.ndarray, folds_of: np.ndarray) -> Dict[int, np.ndarray]:
    from .estimators import PC1Axis

    return {int(f): PC1Axis().fit(x[folds_of != f], h[folds_of != f]).basis_[:, 0] for f in np.unique(folds_of)}


def _rule_text(margin: float, n_boot: int) -> str:
    return (f"fit y = β₀ + β_α·α + β_e·LLR_Bayes + β_int·α·LLR_Bayes by least squares on the model's log-odds over "
            f"every (prompt, α); 95% intervals by a paired percentile bootstrap over prompts within k ({n_boot} "
            f"resamples). Margin m = {margin:g}·|β_e(unsteered)|/max|α|. 'shifts the prior': β_α's interval excludes 0 "
            "and β_int's interval lies inside ±m; 'reweights evidence': β_int's interval excludes 0 and not inside "
            "±m; 'no effect': β_α's interval holds 0 and β_int's lies inside ±m; otherwise 'inconclusive'. False-"
            "positive rates measured per direction on simulated null log-odds (fpr_* columns).")


def steering(model, items, *, layer="middle", site: str = "resid_post", alphas: Sequence[float] = (-0.5, -0.25, 0, 0.25, 0.5),
             alpha_unit: str = "norm", directions: Sequence[str] = DIRECTIONS, user=None, label: int = 0,
             positions: str = "all", n_random: int = 3, folds: int = 5, n_boot: int = 1000, n_null: int = 200,
             margin: float = 0.1, seed: int = 0, batch_size: int = 16, progress: Optional[bool] = None) -> Steering:
    """Steer ``model`` along each direction at ``layer``'s ``site`` by every α of ``alphas`` and decompose the answer
    log-odds into prior shift and evidence reweighting against the exact posterior (the module docstring; METHODS.md §16).

    Parameters
    ----------
    items:
        Task items with an exact posterior, one task (SULA, the categorical task, ...), several k.
    layer, site, positions:
        Where to steer: a layer (``"middle"``, an int, negative from the end), ``"resid_post"``, ``"v"`` or ``"z"``,
        at ``"all"`` positions or the ``"final"`` one.
    alphas, alpha_unit:
        Steering strengths (0 and at least one other; the unsteered fit reads α = 0) in units of ``"norm"`` (the
        site's mean final-token norm), ``"sigma"`` (each direction's coordinate SD) or ``"raw"``.
    directions, user, n_random:
        Built-in directions (any of :data:`DIRECTIONS`; ``"haar"`` draws ``n_random``) and the user's, a vector
        ``[d]`` or ``{name: vector}`` (e.g. localize's best mediator).
    label:
        Which answer's log-odds against the rest are read (0: the first, SULA's first label).
    folds, n_boot, n_null, margin, seed:
        Cross-fitting folds; bootstrap resamples; null data sets per direction for the false-positive rates (0:
        not measured); the equivalence margin as a fraction of the unsteered evidence weight over the grid; seed.
    """
    import pandas as pd

    from .collect import StreamKeeper, collect
    from .estimators import fold_ids
    from .interventions import Intervention, haar_draw
    from .reads import FinalRows
    from .tasks import answer_token_ids

    t0 = time.perf_counter()
    items, answers, label, llr, ks, lam = _items(items, label)
    site = check_choice(site, "site", _SITES)
    positions = check_choice(positions, "positions", ("all", "final"))
    alpha_unit = check_choice(alpha_unit, "alpha_unit", ALPHA_UNITS)
    alphas = np.array([check_float(a, "each alpha") for a in alphas], dtype=np.float64)
    if len(set(alphas.tolist())) != len(alphas) or not np.any(alphas == 0) or not np.any(alphas != 0):
        raise InvalidInputError(f"alphas must be distinct and hold 0 (the unsteered model) and at least one other "
                                f"strength, e.g. (-1, 0, 1); got {alphas.tolist()}.")
    directions = tuple(directions)
    for d in directions:
        check_choice(d, "each of directions", DIRECTIONS)
    n_random = check_count(n_random, "n_random")
    folds = check_count(folds, "folds")
    n_boot = check_count(n_boot, "n_boot")
    n_null = check_count(n_null, "n_null", allow_zero=True)
    margin = check_float(margin, "margin", min=0.0, min_inclusive=False)
    seed = check_seed(seed)
    n_layers = int(model.cfg.n_layers)
    layer = n_layers // 2 if layer == "middle" else adapter.resolve_layer(model, layer)
    if user is not None and not isinstance(user, dict):
        user = {"user": user}
    if not directions and not user:
        raise InvalidInputError("nothing to steer: pass directions=(...) or user=vector / {name: vector}.")

    ids = answer_token_ids(model, answers)
    texts = [str(it) for it in items]
    n = len(items)
    # at resid_post the clean stream after the layer is kept, so each steered pass runs only the later blocks
    keeper = StreamKeeper(model, [layer]) if site == "resid_post" else None
    clean = collect(model, texts, token_ids=ids, reads=[FinalRows(layer, site)], batch_size=batch_size,
                    progress=progress, desc=f"steering: clean pass, {n} prompts",
                    fwd_hooks=keeper if keeper is not None else ())
    x = clean[f"final_rows.{site}.{layer}"].double().numpy()
    lp0 = clean.token_logprobs().double().numpy()
    resume = None
    if keeper is not None:   # a kind that cannot resume (the check fails on one batch) runs whole passes instead
        kept = keeper.stream(layer, n)
        if kept is not None and kept.check(ids, lp0) is None:
            resume = kept
    y0 = _log_odds(lp0, label)
    post0 = np.exp(lp0 - np.logaddexp.reduce(lp0, axis=1, keepdims=True))
    h_model = -(post0 * np.log2(np.clip(post0, 1e-300, None))).sum(1)
    folds_of = fold_ids(n, folds, seed=seed, strata=ks)
    cls = np.sign(llr)

    # the directions: name -> (kind, {fold: unit vector} or {-1: unit vector})
    dirs: Dict[str, Tuple[str, Dict[int, np.ndarray]]] = {}
    for d in directions:
        if d == "contrast":
            dirs[d] = ("fitted", _contrast(x, cls, folds_of))
        elif d == "entropy":
            dirs[d] = ("fitted", _entropy_axis(x, h_model, folds_of))
        elif d == "shuffled_contrast":
            lab = np.flatnonzero(cls != 0)
            shuf = cls.copy()
            shuf[lab] = cls[keyed_rng(seed, 92, layer).permutation(lab)]
            dirs[d] = ("control", _contrast(x, shuf, folds_of))
        elif d == "norm_matched":
            xc = x - x.mean(0)
            dirs[d] = ("control", {-1: _unit(xc.T @ keyed_rng(seed, 91, layer).standard_normal(n), "norm_matched")})
        elif d == "haar":
            for i in range(n_random):
                dirs[f"haar {i}"] = ("random", {-1: haar_draw(x.shape[1], 1, seed=seed, layer=layer, i=i)[:, 0]})
    for name, v in (user or {}).items():
        if name in dirs:
            raise InvalidInputError(f"user direction {name!r} has a built-in direction's name; rename it.")
        u = _unit(v, f"user direction {name!r}")
        if u.shape[0] != x.shape[1]:
            raise InvalidInputError(f"user direction {name!r} has {u.shape[0]} entries but the site {site!r} at layer "
                                    f"{layer} has {x.shape[1]}.")
        dirs[str(name)] = ("user", {-1: u})

    norm_scale = float(np.linalg.norm(x, axis=1).mean())
    xa = _design(alphas, llr)
    idx = bootstrap_indices(n, n_boot, seed=keyed_rng(seed, 93), strata=ks)
    xtx0, xty0 = _normal_parts(xa[:, :1, [0, 2]], y0[:, None])
    clean_fit = np.linalg.lstsq(np.c_[np.ones(n), llr], y0, rcond=None)[0]
    n_strata = len(np.unique(ks))
    clean_reps = _inflate(_boot_fits(xtx0, xty0, idx), clean_fit, n, n_strata)
    evidence_weight = Estimate(float(clean_fit[1]), percentile_interval(clean_reps[:, 1]), _CI, null=1.0, n=n)
    clean_intercept = Estimate(float(clean_fit[0]), percentile_interval(clean_reps[:, 0]), _CI, null=0.0, n=n)
    m = _margin(margin, clean_fit[1], alphas)

    records, grids = [], []
    for name, (kind, per_fold) in dirs.items():
        coords = np.empty(n)
        for f, u in per_fold.items():
            sel = slice(None) if f == -1 else folds_of == f
            coords[sel] = x[sel] @ u
        scale = {"norm": norm_scale, "sigma": float(np.std(coords, ddof=1)), "raw": 1.0}[alpha_unit]
        y = np.empty((n, len(alphas)))
        for j, a in enumerate(alphas):
            if a == 0:
                y[:, j] = y0
                continue
            ivs = [Intervention(layer=layer, site=site, basis=u[:, None], op="shift", strength=float(a * scale),
                                positions=positions, prompts=None if f == -1 else np.flatnonzero(folds_of == f),
                                label=f"steer {name} α={a:g}") for f, u in per_fold.items()]
            rc = collect(model, texts, token_ids=ids, interventions=ivs, batch_size=batch_size, progress=progress,
                         desc=f"steering: {name}, α = {a:g}", resume=resume)
            y[:, j] = _log_odds(rc.token_logprobs().double().numpy(), label)
        beta = fit_terms(alphas, llr, y)
        reps = _inflate(_boot_fits(*_normal_parts(xa, y), idx), beta, n, n_strata)
        rec = {"direction": name, "kind": kind, "alpha_scale": scale}
        for t, term in enumerate(TERMS):
            rec[term] = float(beta[t])
            rec[term + "_ci_low"], rec[term + "_ci_high"] = percentile_interval(reps[:, t])
        cross = _crossover(beta, lam)
        rec["crossover_alpha"] = float(cross)
        rec["crossover_alpha_ci_low"], rec["crossover_alpha_ci_high"] = percentile_interval(_crossover(reps, lam))
        for end, a in (("min", alphas.min()), ("max", alphas.max())):
            rec[f"evidence_weight_at_alpha_{end}"] = float(beta[2] + beta[3] * a)
            rec[f"evidence_weight_at_alpha_{end}_ci_low"], rec[f"evidence_weight_at_alpha_{end}_ci_high"] = \
                percentile_interval(reps[:, 2] + reps[:, 3] * a)
        ci_a = (rec["beta_alpha_ci_low"], rec["beta_alpha_ci_high"])
        ci_i = (rec["beta_int_ci_low"], rec["beta_int_ci_high"])
        rec["margin"] = m
        rec["equivalence"] = equivalence(beta[3], ci_i, m, n=n).outcome
        rec["verdict"] = _decide(ci_a, ci_i, m)
        if n_null:
            resid = y - (xa @ beta)
            rates = null_rates(alphas, llr, ks, beta=beta, residuals=resid, margin=m, n_null=n_null,
                               n_boot=min(n_boot, 200), seed=seed)
            for key in ("fpr_reweights", "fpr_int_test", "fpr_prior_shift"):
                rec[key] = rates[key]
        else:
            rec["fpr_reweights"] = rec["fpr_int_test"] = rec["fpr_prior_shift"] = float("nan")
        rec["reliable"] = bool(n_null and rec["fpr_int_test"] <= 0.10 and rec["fpr_prior_shift"] <= 0.10)
        records.append(rec)
        for j, a in enumerate(alphas):
            grids.append(pd.DataFrame({"direction": name, "kind": kind, "prompt": np.arange(n), "k": ks, "alpha": a,
                                       "alpha_raw": a * scale, "llr_bayes_nats": llr, "log_odds_nats": y[:, j]}))
    table = pd.DataFrame.from_records(records)
    band = table.loc[table["kind"] == "random", "beta_alpha"].abs()
    top = float(band.max()) if len(band) else float("nan")
    lo_abs = np.where(np.sign(table["beta_alpha_ci_low"]) == np.sign(table["beta_alpha_ci_high"]),
                      np.minimum(table["beta_alpha_ci_low"].abs(), table["beta_alpha_ci_high"].abs()), 0.0)
    table["random_band_beta_alpha_abs_max"] = top
    table["beyond_random"] = (lo_abs > top) if math.isfinite(top) else False
    return Steering(table=table, grid=pd.concat(grids, ignore_index=True), evidence_weight=evidence_weight,
                    clean_intercept=clean_intercept, layer=int(layer), site=site, positions=positions,
                    alphas=tuple(float(a) for a in alphas), alpha_unit=alpha_unit, margin=float(margin),
                    rule=_rule_text(margin, n_boot), task=str(getattr(items[0], "task", "task")),
                    label=answers[label], n_prompts=n, n_boot=n_boot, n_null=n_null, nats_per_example=lam,
                    seconds=time.perf_counter() - t0)


class _CallableModule(types.ModuleType):
    """This module's type: calling the module calls :func:`steering` (``bl.steering(model, items, ...)``)."""

    def __call__(self, *args, **kwargs) -> Steering:
        return steering(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
