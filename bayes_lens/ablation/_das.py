"""Distributed alignment search as a mediator candidate of :func:`bayes_lens.localize`, with its controls.

METHODS.md §13 ("DAS rows"). DAS (Geiger et al., 2024) learns an orthonormal basis B ``[d, r]`` at a hook so
that the interchange h ← h + (h_source − h)BBᵀ makes the model output what a high-level causal model predicts
for the base with one variable taken from the source. Here the variable is the posterior the model should
report: base = prompt i, source = its swap donor j (``bl.ablation.swap_donors``: another exact posterior, from
the other side of ½ where there is one), target = the donor's most probable answer under the *exact* posterior.
The training is TransformerLens 4.3's own ``tools.analysis.interchange.fit_das`` (through
:func:`bayes_lens.adapter.interchange`; nothing of it is rewritten here), on the task logits at each prompt's
final token of the ``resid_post`` site.

Cross-fitted: the basis applied to fold f is trained on the pairs whose base and donor both lie outside f, and
localize scores it on f's prompts with its removal and swap, the same interventions, band and tests as every
other candidate (the fold bases are the candidate's). Controls, trained the same way (same pairs, rank, budget
and seeds) and reported as rows of kind ``"control"`` (no verdict, outside the Holm family):

* ``placebo``: TL's ``NormMatchedPlacebo`` - each base moved exactly as far as fold f's DAS interchange moves
  it, inside a TL ``random_basis`` of the same rank (its swap; its removal is that random subspace's);
* ``arbitrary labels``: DAS trained on TL's ``arbitrary_targets`` (a fixed pseudo-random answer per donor
  text) instead of the exact posterior's;
* ``untrained model``: DAS trained on an untrained copy of the model (:func:`bayes_lens.adapter.untrained_copy`:
  TL's ``random_init_bridge`` or ``reinitialized``), its basis then scored on the trained model.

Each row also carries ``das_accuracy``: the held-out interchange accuracy (TL's ``intervened_logits``; the
argmax answer against the row's own targets, on the model it was trained on: the untrained copy for that
control), the DAS literature's score, beside the table's Δ MAE and swap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from .. import adapter
from .._validate import check_bool, check_float, check_positive_int
from ..errors import InvalidInputError
from ..interventions import orthonormal, swap_donors
from ..metrics.stats import keyed_rng
from ._rules import angle

__all__ = ["DAS", "CONTROLS", "check_das", "untrained_copy_for", "das_fits", "das_candidates", "das_angle", "das_rule"]

CONTROLS = ("placebo", "arbitrary labels", "untrained model")


@dataclass(frozen=True)
class DAS:
    """Ask :func:`bayes_lens.localize` for a DAS candidate per layer: ``estimators=("ridge", DAS(rank=1))``.
    ``rank`` r of the learned subspace; ``epochs``, ``lr``, ``batch_size`` TransformerLens's ``fit_das`` settings;
    ``controls`` also train and report the norm-matched placebo, arbitrary-label DAS and DAS on an untrained copy.
    Needs TransformerLens 4.3 and ``site="resid_post"``.

    >>> DAS(rank=2).name
    'DAS k=2'
    """

    rank: int = 1
    epochs: int = 20
    lr: float = 1e-2
    batch_size: int = 32
    controls: bool = True

    def __post_init__(self):
        object.__setattr__(self, "rank", check_positive_int(self.rank, "DAS rank"))
        object.__setattr__(self, "epochs", check_positive_int(self.epochs, "DAS epochs"))
        object.__setattr__(self, "batch_size", check_positive_int(self.batch_size, "DAS batch_size"))
        object.__setattr__(self, "lr", check_float(self.lr, "DAS lr", min=0.0, min_inclusive=False))
        object.__setattr__(self, "controls", check_bool(self.controls, "DAS controls"))

    @property
    def name(self) -> str:
        return f"DAS k={self.rank}"

    @property
    def names(self) -> tuple:
        """The table rows it adds: the DAS row, then its controls'."""
        return (self.name,) + ((tuple(f"{self.name} {c}" for c in CONTROLS)) if self.controls else ())


def _task(model, texts, answer_ids):
    """(task_logits, final positions): TL's ``task_logits`` on prompt numbers (the inputs fit_das indexes are
    ``torch.arange(n)``), right-padded so each prompt's final position does not depend on its batch."""
    toks, mask = adapter.tokenize(model, texts, padding_side="right")
    last = (mask.sum(1).long() - 1).cpu()
    ids = torch.as_tensor(list(answer_ids), dtype=torch.long)

    def task_logits(ix):
        ix = torch.as_tensor(ix, dtype=torch.long).cpu()
        width = int(last[ix].max()) + 1
        logits = model(toks[ix.to(toks.device), :width])
        rows = torch.arange(len(ix), device=logits.device)
        return logits[rows, last[ix].to(logits.device)][:, ids.to(logits.device)]

    return task_logits, last


def das_fits(model, layer: int, texts, posteriors, donors, fold_of, answer_ids, spec: DAS, *, seed: int = 0,
             batch_size: int = 8, untrained=None) -> List[dict]:
    """The DAS row and its controls at ``layer`` (module docstring), each ``{"name", "kind", "rank", "fold_bases"
    {fold: [d, r]}, "basis" [d, r], "swap_rows" {fold: [n, d]} or None, "extra" {column: value}}``: the fold bases
    trained on the pairs (i, donors[i]) outside each fold, ``basis`` the DAS fit on every pair (the angle; for a
    control its first fold's). ``untrained``: the untrained copy to train the last control on (default: made here,
    :func:`untrained_copy_for`)."""
    ic = adapter.interchange()
    hook = adapter.hook_name(model, layer, "resid_post")
    post = np.asarray(posteriors, dtype=np.float64)
    donors = np.asarray(donors, dtype=np.int64)
    fid = np.asarray(fold_of, dtype=np.int64)
    n, n_answers = post.shape
    idx = torch.arange(n)
    targets = torch.as_tensor(post[donors].argmax(1), dtype=torch.long)
    task, last = _task(model, texts, answer_ids)
    folds = [int(f) for f in np.unique(fid)]

    def fit(m, m_task, tg, pairs, f):
        with torch.enable_grad():  # fit_das trains the basis by backpropagation, also inside a caller's no_grad
            res = ic.fit_das(m, hook, idx[pairs], idx[donors[pairs]], tg[pairs], m_task, rank=spec.rank,
                             base_positions=last[pairs], source_positions=last[donors[pairs]],
                             epochs=spec.epochs, batch_size=spec.batch_size, lr=spec.lr,
                             seed=int(keyed_rng(seed, 79, layer, spec.rank, f).integers(2 ** 31)),
                             micro_batch_size=batch_size)
        return orthonormal(res.basis.detach().double().cpu().numpy())

    def accuracy(m, m_task, intervention, tg, test) -> np.ndarray:
        src = ic.collect_activations(m, hook, idx[donors[test]], m_task, positions=last[donors[test]],
                                     batch_size=batch_size)
        out = ic.intervened_logits(m, hook, intervention, idx[test], src, m_task, positions=last[test],
                                   batch_size=batch_size)
        return (out.argmax(1) == tg[test]).numpy()

    def interchange(b):
        return ic.SubspaceInterchange(torch.as_tensor(b, dtype=torch.float32))

    def pairs_outside(f):
        pairs = np.flatnonzero((fid != f) & (fid[donors] != f))
        if len(pairs) < 2:
            raise InvalidInputError(f"DAS has {len(pairs)} training pairs outside fold {f}; pass more prompts or "
                                    "fewer folds.")
        return pairs

    rows = {name: {"fold_bases": {}, "hits": np.zeros(n, dtype=bool)} for name in ("das",) + CONTROLS}
    arbitrary = ic.arbitrary_targets([texts[j] for j in donors], n_answers, seed=int(keyed_rng(seed, 81, layer)
                                                                                     .integers(2 ** 31)))
    placebo = ic.random_basis(int(adapter.model_info(model).d_model), spec.rank,
                              seed=int(keyed_rng(seed, 80, layer, spec.rank).integers(2 ** 31)))
    copy = (untrained if untrained is not None else untrained_copy_for(model, seed)) if spec.controls else None
    copy_task = _task(copy, texts, answer_ids)[0] if copy is not None else None
    x = ic.collect_activations(model, hook, idx, task, positions=last, batch_size=batch_size).float()  # clean rows
    swap_rows = {}
    for f in folds:
        train, test = pairs_outside(f), np.flatnonzero(fid == f)
        b = fit(model, task, targets, train, f)
        rows["das"]["fold_bases"][f] = b
        rows["das"]["hits"][test] = accuracy(model, task, interchange(b), targets, test)
        if not spec.controls:
            continue
        nm = ic.NormMatchedPlacebo(interchange(b), placebo)
        swap_rows[f] = nm(x, x[donors]).double().numpy()  # each prompt's row after the placebo interchange
        rows["placebo"]["fold_bases"][f] = orthonormal(placebo.double().numpy())
        rows["placebo"]["hits"][test] = accuracy(model, task, nm, targets, test)
        a = fit(model, task, arbitrary, train, f)
        rows["arbitrary labels"]["fold_bases"][f] = a
        rows["arbitrary labels"]["hits"][test] = accuracy(model, task, interchange(a), arbitrary, test)
        u = fit(copy, copy_task, targets, train, f)
        rows["untrained model"]["fold_bases"][f] = u
        rows["untrained model"]["hits"][test] = accuracy(copy, copy_task, interchange(u), targets, test)
    full = fit(model, task, targets, np.arange(n), len(folds))  # every pair: its own seed key
    out = [{"name": spec.name, "kind": "das", "rank": spec.rank, "fold_bases": rows["das"]["fold_bases"],
            "basis": full, "swap_rows": None, "extra": {"das_accuracy": float(rows["das"]["hits"].mean())}}]
    for c in CONTROLS if spec.controls else ():
        r = rows[c]
        out.append({"name": f"{spec.name} {c}", "kind": "control", "rank": spec.rank, "fold_bases": r["fold_bases"],
                    "basis": r["fold_bases"][folds[0]], "swap_rows": swap_rows if c == "placebo" else None,
                    "extra": {"das_accuracy": float(r["hits"].mean()), "control_of": spec.name}})
    return out


def untrained_copy_for(model, seed: int):
    """The untrained copy the DAS control trains on (:func:`bayes_lens.adapter.untrained_copy`, keyed seed (seed, 82):
    one copy for every layer and rank of a run)."""
    return adapter.untrained_copy(model, int(keyed_rng(seed, 82).integers(2 ** 31)))


def check_das(site: str) -> None:
    """Refuse DAS before any pass runs: a site other than ``resid_post``, or a TransformerLens without fit_das."""
    if site != "resid_post":
        raise InvalidInputError(f"DAS candidates run at site='resid_post' (TransformerLens's fit_das needs one "
                                f"[batch, pos, d_model] activation); got site={site!r}.")
    adapter.interchange()


def das_candidates(run, spec: DAS, layer: int) -> List[dict]:
    """:func:`das_fits` on a localize run's prompts, folds, donors (its swap donors; drawn the same way when the
    swap is off) and seed."""
    check_das(run.site)
    donors = run.donors if run.donors is not None else swap_donors(run.items, seed=run.seed)
    post = [it.posterior for it in run.items]
    if spec.controls and getattr(run, "das_untrained", None) is None:  # built once per run, not per layer
        run.das_untrained = untrained_copy_for(run.model, run.seed)
    return das_fits(run.model, layer, run.texts, post, donors, run.fid, run.answer_ids, spec, seed=run.seed,
                    batch_size=run.batch_size, untrained=getattr(run, "das_untrained", None))


def das_angle(layer_rows: List[dict], readers: dict, das: list, rows_of: dict, *, seed: int = 0) -> None:
    """Add to each layer's row (``layer_rows``, in place) the angle between its best rank-one readout (``readers``
    ``{layer: (name, u)}``) and its first DAS subspace (``das``: the layer's DAS candidates, ``.basis`` fitted on
    every pair): ``das_subspace``, ``das_angle_deg``, ``das_cos2``, ``das_angle_p``, ``das_angle_note``. The premise
    is "same rows": both were fitted on the same prompts' activations (DAS also on the model's outputs there), so
    the Haar law does not hold; p comes from directions drawn from the rows' covariance."""
    first = {}
    for c in das:
        first.setdefault(c.layer, c)
    for row in layer_rows:
        c = first.get(row["layer"])
        if c is None:
            continue
        out = {"das_subspace": c.name, "das_angle_deg": np.nan, "das_cos2": np.nan, "das_angle_p": np.nan,
               "das_angle_note": "no rank-one readout at this layer"}
        if row["layer"] in readers:
            a = angle(readers[row["layer"]][1], c.basis, premise="same rows", rows=rows_of.get(row["layer"]),
                      seed=seed)
            note = (a["angle_note"] + "; DAS was fitted on the same prompts" if np.isfinite(a["angle_p"]) else
                    "no p-value: the readout lies in the DAS subspace (cos² ≈ 1)")
            out.update(das_angle_deg=a["angle_deg"], das_cos2=a["cos2"], das_angle_p=a["angle_p"], das_angle_note=note)
        row.update(out)


def das_rule(estimators) -> str:
    """The DAS clause of the table's rule sentence ("" when no DAS row was asked for)."""
    if not any(isinstance(e, DAS) for e in estimators):
        return ""
    return ("; a DAS row (TransformerLens's fit_das, cross-fitted: trained on the pairs outside each fold, scored on "
            "the fold) is tested against the Haar null and must also lie above every one of its controls' intervals "
            "(norm-matched placebo, arbitrary labels, an untrained copy: rows of kind 'control', no verdict, outside "
            "the Holm family)")
