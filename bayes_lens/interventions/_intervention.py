"""One intervention object: what changes at one layer's site, for which prompts, at which positions.

METHODS.md §7 and §13. An :class:`Intervention` is frozen data - layer, site, an orthonormal basis
B ``[d, k]``, an operation of :mod:`bayes_lens.interventions._ops`' table, positions, a source (a
fixed row μ, or one row per prompt: donors' rows, a statistic's move), a strength s, and optionally
the prompts it applies to - so it can be named (:meth:`Intervention.digest`), written down
(:meth:`Intervention.spec` / :meth:`Intervention.from_spec`, JSON), renumbered for a sharded run
(:meth:`Intervention.renumbered`) and handed to TransformerLens as plain ``[(hook_name, fn)]`` pairs
(:meth:`Intervention.pairs`), which work in ``model.hooks(...)`` / ``run_with_hooks`` without
bayes_lens attached. A list of interventions is what the runner (:func:`bayes_lens.collect.collect`,
``interventions=``) applies in one pass: a cross-fitted subspace is one intervention per fold, each on
that fold's prompts (:func:`crossfitted`).

Prompt numbers are the runner's global indices (``Batch.indices``: the position of the prompt in the
list given to the analysis); without a batch (plain ``run_with_hooks``) the rows of the tensor are
prompts 0, 1, … and ``"final"`` is the last position of the tensor (unpadded prompts).

Example
-------
>>> import numpy as np, torch
>>> import bayes_lens as bl
>>> model = bl.models.tiny.tiny_model("bridge")
>>> B = np.linalg.qr(np.random.default_rng(0).normal(size=(model.cfg.d_model, 2)))[0]
>>> iv = bl.interventions.Intervention(layer=0, site="resid_post", basis=B, op="remove")
>>> toks = model.to_tokens(["a b c", "d e f"])
>>> out = model.run_with_hooks(toks, fwd_hooks=iv.pairs(model))       # plain TransformerLens
>>> len(iv.digest()), iv.rank
(64, 2)
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .. import adapter
from .._validate import check_choice, check_nonneg_int
from ..errors import InvalidInputError
from ._ops import OPERATIONS, apply_at

__all__ = ["Intervention", "crossfitted", "orthonormal", "SITES", "POSITIONS"]

SITES = ("resid_post", "v", "z", "mlp_post", "final_scale")
POSITIONS = ("all", "final")
_NEEDS_SOURCE = {"mean": "a fixed row μ [d]", "resample": "one donor row per prompt [n, d]",
                 "swap": "one donor row per prompt [n, d] (or a fixed row [d])"}


def orthonormal(basis, what: str = "the basis") -> np.ndarray:
    """``[d, k]`` orthonormal basis of the span of ``basis`` (``[d]`` or ``[d, k]``, QR), or InvalidInputError
    when it is not finite or its columns are dependent (rank < k)."""
    b = np.asarray(basis, dtype=np.float64)
    b = b[:, None] if b.ndim == 1 else b
    if b.ndim != 2 or b.shape[1] == 0 or not np.all(np.isfinite(b)):
        raise InvalidInputError(f"{what} must be a finite [d, k] array, got shape {list(np.shape(basis))}.")
    q, r = np.linalg.qr(b)
    if np.min(np.abs(np.diag(r))) < 1e-8 * max(1.0, float(np.abs(b).max())):
        raise InvalidInputError(f"{what} has dependent columns (rank < {b.shape[1]}); pass linearly independent "
                                "vectors.")
    return q


def _per_prompt(positions) -> bool:
    """Whether ``positions`` is the per-prompt form (a tuple of tuples: entry i the positions of prompt i)."""
    return isinstance(positions, tuple) and bool(positions) and isinstance(positions[0], tuple)


def _is_seq(x) -> bool:
    return not isinstance(x, (str, bytes)) and hasattr(x, "__iter__")


def _check_positions(pos):
    """``"all"`` / ``"final"``, a shared tuple of position indices, or per-prompt tuples (sorted, deduplicated)."""
    if not _is_seq(pos):
        return check_choice(pos, "positions (or a tuple of position indices, or one such tuple per prompt)", POSITIONS)
    pos = list(pos.tolist() if isinstance(pos, (np.ndarray, Tensor)) else pos)
    if not pos:
        raise InvalidInputError("explicit positions must hold at least one position index (or one tuple per prompt).")
    nested = [_is_seq(p) for p in pos]
    if any(nested) and not all(nested):
        raise InvalidInputError("positions mixes position indices and per-prompt tuples; pass either one tuple of "
                                "indices shared by every prompt or one tuple per prompt.")
    if all(nested):
        out = tuple(tuple(sorted({check_nonneg_int(p, "each per-prompt position") for p in (
            row.tolist() if isinstance(row, (np.ndarray, Tensor)) else row)})) for row in pos)
        if not any(out):
            raise InvalidInputError("per-prompt positions name no position in any prompt; the intervention would "
                                    "change nothing.")
        return out
    return tuple(check_nonneg_int(p, "each explicit position") for p in pos)


def _positions_json(pos):
    if isinstance(pos, str):
        return pos
    return [list(p) for p in pos] if _per_prompt(pos) else list(pos)


def _array(x, dtype) -> Optional[np.ndarray]:
    if x is None:
        return None
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    out = np.ascontiguousarray(np.asarray(x, dtype=dtype))
    out.setflags(write=False)
    return out


def _b64(a: Optional[np.ndarray]) -> Optional[Dict[str, Any]]:
    if a is None:
        return None
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _unb64(d) -> Optional[np.ndarray]:
    if d is None:
        return None
    return np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


@dataclass(frozen=True, eq=False)
class Intervention:
    """One change of ``layer``'s ``site`` (the module docstring; the operations are :mod:`._ops`' table).

    ``basis`` ``[d, k]`` orthonormal columns (checked; :func:`orthonormal` makes one from any basis of a
    span; None only for ``op="shift"`` by a ``source`` vector); ``op`` one of ``"remove"``, ``"mean"``,
    ``"resample"``, ``"swap"``, ``"shift"``, ``"keep_only"``; ``positions`` ``"all"``, ``"final"`` (each
    prompt's last real token), explicit positions shared by every prompt (a tuple of ints), or per-prompt
    positions (a tuple of tuples of ints: entry i the positions of prompt number i, indexed as a per-prompt
    ``source`` is; an entry may be empty, leaving that prompt as it is); ``source`` None, a fixed row ``[d]``
    (μ of mean-ablation, the vector of a shift) or one row per prompt ``[n, d]`` (donors' rows, per-prompt
    moves), indexed by prompt number; ``strength`` s; ``prompts`` the prompt numbers it applies to (None:
    all); ``label`` a name (not part of the digest).
    """

    layer: int
    site: str
    basis: Optional[np.ndarray]
    op: str = "remove"
    positions: Union[str, Tuple[int, ...]] = "all"
    source: Optional[np.ndarray] = None
    strength: float = 1.0
    prompts: Optional[np.ndarray] = None
    label: str = field(default="", compare=False)

    def __post_init__(self):
        check_choice(self.op, "op", OPERATIONS)
        check_choice(self.site, "site", SITES)
        object.__setattr__(self, "layer", check_nonneg_int(self.layer, "layer (a non-negative int: resolve "
                                                            "negative layers with bl.adapter.resolve_layer first)"))
        s = float(self.strength)
        if not np.isfinite(s):
            raise InvalidInputError(f"strength must be a finite number, got {self.strength!r}.")
        object.__setattr__(self, "strength", s)
        object.__setattr__(self, "positions", _check_positions(self.positions))
        b = _array(self.basis, np.float32)
        if b is None:
            if not (self.op == "shift" and self.source is not None):
                raise InvalidInputError(f"op={self.op!r} needs basis= ([d, k] orthonormal columns); only a shift by "
                                        "a source vector has none.")
        else:
            if b.ndim == 1:
                b = _array(b[:, None], np.float32)
            if b.ndim != 2 or not np.all(np.isfinite(b)):
                raise InvalidInputError(f"basis must be a finite [d, k] array, got shape {list(b.shape)}.")
            gram = b.astype(np.float64).T @ b.astype(np.float64)
            if np.max(np.abs(gram - np.eye(b.shape[1]))) > 1e-4:
                raise InvalidInputError("basis must have orthonormal columns (BᵀB = I); make one from any basis of "
                                        "the span with bl.interventions.orthonormal(basis).")
        object.__setattr__(self, "basis", b)
        src = _array(self.source, np.float32)
        if src is None and self.op in _NEEDS_SOURCE:
            raise InvalidInputError(f"op={self.op!r} needs source=: {_NEEDS_SOURCE[self.op]}.")
        if src is not None:
            if src.ndim not in (1, 2) or not np.all(np.isfinite(src)):
                raise InvalidInputError(f"source must be a finite [d] or [n, d] array, got shape {list(src.shape)}.")
            if b is not None and src.shape[-1] != b.shape[0]:
                raise InvalidInputError(f"source rows have {src.shape[-1]} entries but the basis has {b.shape[0]} "
                                        "rows; both live in the site's space.")
            if self.op == "resample" and src.ndim != 2:
                raise InvalidInputError("op='resample' needs one donor row per prompt: source=[n, d].")
        object.__setattr__(self, "source", src)
        pr = _array(self.prompts, np.int64)
        if pr is not None:
            pr = _array(np.unique(pr.ravel()), np.int64)
            if len(pr) and pr[0] < 0:
                raise InvalidInputError("prompts must be non-negative prompt numbers.")
        object.__setattr__(self, "prompts", pr)

    # --- description ---
    @property
    def dim(self) -> int:
        """The site's width d."""
        return int(self.basis.shape[0] if self.basis is not None else self.source.shape[-1])

    @property
    def rank(self) -> int:
        """k, the number of basis columns (0 for a shift by a source vector)."""
        return 0 if self.basis is None else int(self.basis.shape[1])

    def hook_name(self, model) -> str:
        """The site's TransformerLens hook point on ``model`` (``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_v``)."""
        return adapter.hook_name(model, self.layer, self.site)

    def spec(self) -> Dict[str, Any]:
        """A JSON-safe dict of everything the intervention does (arrays as base64 with dtype and shape)."""
        return {"layer": self.layer, "site": self.site, "op": self.op, "positions": _positions_json(self.positions),
                "strength": self.strength, "basis": _b64(self.basis), "source": _b64(self.source),
                "prompts": _b64(self.prompts), "label": self.label}

    @classmethod
    def from_spec(cls, spec: Dict[str, Any]) -> "Intervention":
        """The intervention :meth:`spec` wrote (checked as a new one)."""
        if not isinstance(spec, dict):
            raise InvalidInputError(f"an intervention spec is a dict (Intervention.spec()), got {type(spec).__name__}.")
        known = {"layer", "site", "op", "positions", "strength", "basis", "source", "prompts", "label"}
        unknown = sorted(set(spec) - known)
        if unknown or "layer" not in spec or "site" not in spec:
            raise InvalidInputError(f"an intervention spec needs 'layer' and 'site' and takes only {sorted(known)}; "
                                    f"got {sorted(spec)}.")
        pos = spec.get("positions", "all")
        try:
            return cls(layer=spec["layer"], site=spec["site"], basis=_unb64(spec.get("basis")),
                       op=spec.get("op", "remove"), positions=pos,
                       source=_unb64(spec.get("source")), strength=spec.get("strength", 1.0),
                       prompts=_unb64(spec.get("prompts")), label=spec.get("label", ""))
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidInputError(f"the intervention spec does not read ({type(err).__name__}: {err}); write it "
                                    "with Intervention.spec().") from err

    def digest(self) -> str:
        """SHA-256 (hex) of what it does: layer, site, operation, positions, strength, and the bytes of the basis,
        the source and the prompt set (not the label). Equal digests, equal changes to the model."""
        h = hashlib.sha256(json.dumps([self.layer, self.site, self.op, _positions_json(self.positions),
                                       self.strength]).encode())
        for name, a in (("basis", self.basis), ("source", self.source), ("prompts", self.prompts)):
            h.update(f"\0{name}:{None if a is None else list(a.shape)}".encode())
            if a is not None:
                h.update(a.tobytes())
        return h.hexdigest()

    def __repr__(self) -> str:
        extra = "" if self.prompts is None else f", {len(self.prompts)} prompts"
        pos = self.positions if isinstance(self.positions, str) else (
            f"per-prompt ({len(self.positions)} prompts)" if _per_prompt(self.positions) else list(self.positions))
        return (f"Intervention({self.op} rank {self.rank} at layer {self.layer} {self.site}, positions={pos!r}, "
                f"strength={self.strength:g}{extra}{', ' + repr(self.label) if self.label else ''})")

    # --- new ones from this one ---
    def with_(self, **changes) -> "Intervention":
        """A copy with ``changes`` (checked as a new one)."""
        return replace(self, **changes)

    def renumbered(self, order: Sequence[int]) -> "Intervention":
        """The same intervention for the prompts listed in ``order`` (position j holds prompt ``order[j]``): per-prompt
        sources, per-prompt positions and the prompt set are renumbered, so a sharded run that reorders prompts applies
        each prompt's own."""
        order = np.asarray(order, dtype=np.int64)
        src = self.source
        if src is not None and src.ndim == 2:
            src = src[order]
        pos = self.positions
        if _per_prompt(pos):
            pos = tuple(pos[i] if i < len(pos) else () for i in order.tolist())
        pr = self.prompts
        if pr is not None:
            inv = np.full(int(max(order.max(initial=-1), pr.max(initial=-1))) + 1, -1, dtype=np.int64)
            inv[order] = np.arange(len(order))
            pr = inv[pr[pr < len(inv)]]
            pr = pr[pr >= 0]
        if _per_prompt(pos) and not any(pos):  # none of these prompts is changed: keep the rows, change nothing
            return replace(self, source=src, prompts=np.zeros(0, dtype=np.int64))
        return replace(self, source=src, prompts=pr, positions=pos)

    # --- applying it ---
    def _tensors(self, device) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        key = str(device)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            b = None if self.basis is None else torch.from_numpy(self.basis.copy()).to(device)
            s = None if self.source is None else torch.from_numpy(self.source.copy()).to(device)
            cache[key] = (b, s)
        return cache[key]

    def apply(self, act: Tensor, *, indices=None, last_index=None) -> Tensor:
        """``act`` (the site's activation ``[batch, pos, ...]``) after the intervention, for the prompts numbered
        ``indices`` (``[batch]``; None: 0, 1, …) whose last real tokens are at ``last_index`` (None: the last
        position). Rows of other prompts are returned unchanged; the result has ``act``'s shape and dtype."""
        what = f"the intervention at layer {self.layer} ({self.site})"
        b = act.shape[0]
        flat = act.reshape(b, act.shape[1], -1)
        if flat.shape[-1] != self.dim:
            raise InvalidInputError(f"{what} has dimension {self.dim} but the activation there is {list(act.shape)} "
                                    f"({flat.shape[-1]} per position); build it for this model's site.")
        idx = np.arange(b) if indices is None else np.asarray(torch.as_tensor(indices).cpu(), dtype=np.int64)
        sel = np.arange(b) if self.prompts is None else np.flatnonzero(np.isin(idx, self.prompts))
        if not len(sel):
            return act
        directions, source = self._tensors(act.device)
        ref = source
        if source is not None and source.ndim == 2 and indices is None and source.shape[0] != b:
            raise InvalidInputError(f"{what} holds {source.shape[0]} per-prompt rows but the batch has {b} prompts "
                                    "(without a runner's batch the rows of the tensor are prompts 0, 1, …); build it "
                                    "for this batch's prompts.")
        if source is not None and source.ndim == 2:
            if idx[sel].max() >= source.shape[0]:
                raise InvalidInputError(f"{what} holds source rows for {source.shape[0]} prompts but prompt "
                                        f"{int(idx[sel].max())} ran; build it for this run's prompts.")
            ref = source[torch.as_tensor(idx[sel], device=source.device)]
        positions = self.positions
        if _per_prompt(positions):  # each selected row's own positions, by its prompt number
            if idx[sel].max() >= len(positions):
                raise InvalidInputError(f"{what} holds per-prompt positions for {len(positions)} prompts but prompt "
                                        f"{int(idx[sel].max())} ran; build it for this run's prompts.")
            positions = [positions[i] for i in idx[sel].tolist()]
        return apply_at(self.op, act, sel, positions, last_index, directions, self.strength, ref, what=what)

    def pairs(self, model, batch=None) -> List[tuple]:
        """``[(hook_name, fn)]`` for TransformerLens (``model.hooks(fwd_hooks=...)``, ``run_with_hooks``): ``fn``
        applies the intervention to the site's activation. ``batch`` (a :class:`bayes_lens.collect.Batch`) gives
        the prompts' numbers and last real tokens; without one, rows are prompts 0, 1, … and ``"final"`` is the
        tensor's last position."""
        return [(self.hook_name(model), _Hook(self, batch).run)]


class _Hook:
    """A TransformerLens hook function applying one intervention to one batch (its ``digest`` names it, so a
    sharded run can tell two apart)."""

    def __init__(self, intervention: Intervention, batch=None):
        self.intervention, self.batch = intervention, batch

    def digest(self) -> str:
        return self.intervention.digest()

    def run(self, act: Tensor, hook=None) -> Tensor:
        b = self.batch
        return self.intervention.apply(act, indices=None if b is None else b.indices,
                                       last_index=None if b is None else b.last_index)


def crossfitted(layer: int, site: str, bases_of_fold: Dict[int, np.ndarray], fold_of, *, op: str = "remove",
                positions="all", source_of_fold: Optional[Dict[int, Any]] = None, strength: float = 1.0,
                label: str = "") -> Tuple[Intervention, ...]:
    """One intervention per fold, each on that fold's prompts with the basis fitted without them (``bases_of_fold``
    ``{fold: [d, k]}``, orthonormalized here; ``fold_of`` ``[n]`` each prompt's fold; one fold: every prompt),
    in fold order: what the runner applies as one cross-fitted condition."""
    fold_of = np.asarray(fold_of, dtype=np.int64)
    single = len(bases_of_fold) == 1
    out = []
    for f in sorted(bases_of_fold):
        src = None if source_of_fold is None else source_of_fold[f]
        out.append(Intervention(layer=layer, site=site, basis=orthonormal(bases_of_fold[f]), op=op,
                                positions=positions, source=src, strength=strength,
                                prompts=None if single else np.flatnonzero(fold_of == f),
                                label=label if single else f"{label} (fold {f})"))
    return tuple(out)
