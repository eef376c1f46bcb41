"""Patches: interventions on a model as TransformerLens ``[(hook_name, fn)]`` pairs, and ``bl.patched``.

Paper A §4.5–4.6 (METHODS.md §7): v ← v − λ(v·u)u (removal; λ = 1 full removal, λ = 0 no change —
the paper's public code had λ reversed), keep-only v ← (v·u)u, and shift v ← v + s·σ·u, applied at
every position. A removal or shift along a fitted axis is an operation on the axis coordinate hook
point of :mod:`bayes_lens.hookpoints` (zero-ablation of ``hook_v_axis`` *is* the removal); keep-only
and the random-direction controls act on ``hook_v`` directly. Both routes compute the change with the
same two functions (:func:`bayes_lens.hookpoints.move_along`, :func:`~bayes_lens.hookpoints.keep_along`)
and the same coordinate operation (:meth:`PatchPart.coordinate_op`), and every patch reaches a model
one way: :func:`patched` and the runner (``fwd_hooks``) both attach the coordinate points
(:func:`bayes_lens.hookpoints.attached_for`) and add the hooks with :func:`bayes_lens.adapter.added_hooks`.
See :mod:`bayes_lens.ablation`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import adapter, hookpoints
from ..errors import InvalidInputError, LayerIndexError
from ._common import site_dim

__all__ = ["PatchPart", "Patch", "patched", "flatten_pairs", "patch_objects", "check_patches"]


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PatchPart:
    """One layer of a patch: the hook, the direction and the operation.

    ``on_coordinate=True``: the hook is the axis's coordinate hook point (``blocks.{l}.hook_v_axis``,
    :mod:`bayes_lens.hookpoints`) and the operation acts on the coordinate c = v·u — removal is
    c ↦ (1 − λ)c (λ = 1: zero-ablation), shift is c ↦ c + s·σ; the hook point moves v along u by the
    change. Otherwise the hook is the site itself (``hook_v``) and the vector is changed directly
    (keep-only, and every random-direction control).
    """

    layer: int
    hook_name: str
    site: str
    op: str  # "removal" | "keep_only" | "shift"
    direction: Tensor  # float32 unit vector [dim]
    lam: float = 1.0  # removal strength
    amount: float = 0.0  # shift distance (s·σ), in activation units
    on_coordinate: bool = False
    axis: object = None  # the fitted EntropyAxis whose coordinate hook point an on_coordinate part uses
    # centred operations (``center=True``): the fitted mean of the site, so that the change does not
    # depend on a constant shift of the activations (a folded value bias). ``offset`` = mean·u for a
    # coordinate part; ``mean`` the mean vector for a part on the site itself, or ``[batch, dim]`` one
    # row per prompt of the batch it runs on (resample-ablation: each prompt's donor row).
    offset: float = 0.0
    mean: Optional[Tensor] = None

    def coordinate_op(self, c: Tensor) -> Tensor:
        """What the part does to the coordinate c = v·u: removal c ↦ (1 − λ)c (centred: c ↦ c − λ(c − μ·u)),
        shift c ↦ c + s·σ. The one definition of both, on the axis coordinate hook point and off it. A
        ``[batch, dim]`` mean sets each row's coordinate toward its own μ_b·u (``c`` is ``[batch, ..., 1]``)."""
        if self.op == "shift":
            return c + self.amount
        offset = self.offset
        if not self.on_coordinate and self.mean is not None:
            if self.mean.ndim == 2:  # one reference row per prompt of the batch
                if self.mean.shape[0] != c.shape[0]:
                    raise InvalidInputError(
                        f"the patch at {self.hook_name} holds {self.mean.shape[0]} per-prompt rows but the batch has "
                        f"{c.shape[0]} prompts; build the patch for this batch's prompts.")
                o = (self.mean.double() @ self.direction.double()).to(device=c.device, dtype=c.dtype)
                return c - self.lam * (c - o.reshape(-1, *([1] * (c.ndim - 1))))
            offset = float(self.mean.double() @ self.direction.double())
        return c * (1.0 - self.lam) if offset == 0.0 else c - self.lam * (c - offset)

    def apply(self, act: Tensor) -> Tensor:
        """The part's operation on its hook's activation: the coordinate ``[..., 1]`` (``on_coordinate``;
        the hook point moves v along u), or the site's activation itself, moved along the direction by
        the same coordinate operation (:func:`bayes_lens.hookpoints.move_along`) or, for keep-only,
        projected onto it (:func:`bayes_lens.hookpoints.keep_along`)."""
        if self.on_coordinate:
            return self.coordinate_op(act)
        what = f"the patch at {self.hook_name}"
        if self.op == "keep_only":
            return hookpoints.keep_along(act, self.direction, self.mean, what=what)
        moved = hookpoints.move_along(act, self.direction, self.coordinate_op, what=what)
        return act if moved is None else moved

    def hook_fn(self, act: Tensor, hook=None) -> Tensor:
        return self.apply(act)

    def digest(self) -> str:
        """SHA-256 (hex) of what this part does: layer, hook, site, operation, λ, shift, direction bytes."""
        fields = [self.layer, self.hook_name, self.site, self.op, self.lam, self.amount, self.on_coordinate]
        if self.offset != 0.0 or self.mean is not None:  # centred: part of what it does (uncentred digests unchanged)
            fields.append(["centred", self.offset])
        h = hashlib.sha256(json.dumps(fields).encode())
        h.update(self.direction.detach().cpu().float().contiguous().numpy().tobytes())
        if self.mean is not None:
            h.update(self.mean.detach().cpu().float().contiguous().numpy().tobytes())
        return h.hexdigest()


class Patch:
    """An intervention (possibly at several layers): an iterable of ``(hook_name, fn)`` pairs.

    Made by :class:`EntropyAxis` (``removal``, ``keep_only``, ``shift``, ``random_control``). Use it
    as ``with bl.patched(model, patch):`` (which attaches the hook points the patch needs), or hand its
    pairs to TransformerLens — ``model.hooks(fwd_hooks=list(patch))``,
    ``model.run_with_hooks(tokens, fwd_hooks=list(patch))`` — *inside* ``with bl.attach(model,
    axis=patch.axis):``: a removal or shift hooks the axis's coordinate hook point
    (``blocks.{l}.hook_v_axis``), which the model has only while it is attached (outside, a
    HookedTransformer raises ``KeyError`` and a TransformerBridge ignores the unknown name: the run is
    silently unpatched). Keep-only and the random controls hook ``hook_v`` itself and need no attach.
    ``patch_a + patch_b`` applies both (also patches of different axes: ``bl.patched`` and
    ``bl.compare_patched`` attach every axis they need).

    Attributes: ``label``, ``kind`` (``"removal"``, ``"keep_only"``, ``"shift"``, ``"combined"``),
    ``layers``, ``hook_names``, ``site``, ``random_seed`` (None unless a random control),
    ``directions`` (layer → unit vector), ``axis`` (the :class:`EntropyAxis` it came from; None for a sum of
    patches of different axes), ``axes`` (every axis it came from, in order).

    >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
    >>> tokens = model.to_tokens(prompts)
    >>> with bl.patched(model, axis.removal()):
    ...     removed = model(tokens)
    >>> with bl.attach(model, axis=axis):            # the coordinate hook point exists while attached
    ...     by_pairs = model.run_with_hooks(tokens, fwd_hooks=list(axis.removal()))
    >>> torch.allclose(removed, by_pairs, atol=1e-5)
    True
    """

    def __init__(self, parts: Sequence[PatchPart], *, label: str, kind: str, axis: Optional["EntropyAxis"] = None,
                 random_seed: Optional[int] = None, params: Optional[dict] = None,
                 model_meta: Optional[dict] = None):
        self._parts = tuple(parts)
        self.label = label
        self.kind = kind
        self.axis = axis
        self.random_seed = random_seed
        self.params = dict(params or {})
        self.model_meta = model_meta
        self._axes: Tuple[object, ...] = () if axis is None else (axis,)
        self._pairs = tuple((p.hook_name, p.hook_fn) for p in self._parts)

    # --- the [(hook_name, fn)] protocol ---
    def __iter__(self) -> Iterator[Tuple[str, Callable]]:
        return iter(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, i):
        return self._pairs[i]

    def __add__(self, other):
        if isinstance(other, Patch):
            site = self.site if self.site == other.site else "mixed"
            out = Patch(self._parts + other._parts, label=f"{self.label} + {other.label}", kind="combined",
                        axis=self.axis if self.axis is other.axis else None,
                        model_meta=self.model_meta if site != "mixed" else None)
            axes = list(self._axes)
            axes += [a for a in other._axes if all(a is not b for b in axes)]
            out._axes = tuple(axes)
            return out
        if isinstance(other, (list, tuple)):
            return list(self) + list(other)
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, (list, tuple)):
            return list(other) + list(self)
        return NotImplemented

    # --- description ---
    @property
    def parts(self) -> Tuple[PatchPart, ...]:
        """The per-layer parts (hook, direction, operation)."""
        return self._parts

    @property
    def axes(self) -> Tuple[object, ...]:
        """Every :class:`EntropyAxis` this patch came from, in order (several for ``a1.removal() + a2.removal()``)."""
        return self._axes

    @property
    def layers(self) -> Tuple[int, ...]:
        return tuple(p.layer for p in self._parts)

    @property
    def hook_names(self) -> Tuple[str, ...]:
        return tuple(p.hook_name for p in self._parts)

    @property
    def site(self) -> str:
        sites = {p.site for p in self._parts}
        return sites.pop() if len(sites) == 1 else "mixed"

    @property
    def directions(self) -> Dict[int, Tensor]:
        return {p.layer: p.direction.clone() for p in self._parts}

    @property
    def is_random_control(self) -> bool:
        return self.random_seed is not None

    @property
    def group(self) -> str:
        """The label without the seed: random controls of different seeds share a group."""
        return self.params.get("group", self.label)

    def digest(self) -> str:
        """SHA-256 (hex) of what the patch does (its parts' digests, in order): equal digests, equal
        changes to the model. A sharded run's settings hash covers it (through the task label).

        >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
        >>> axis.removal().digest() == axis.removal(lam=1.0).digest() != axis.removal(0.5).digest()
        True
        """
        h = hashlib.sha256()
        for p in self._parts:
            h.update(p.digest().encode())
        return h.hexdigest()

    def random_like(self, *, seed: int) -> "Patch":
        """The random-direction control of this patch: same op, λ/shift, layers and site."""
        if self.axis is None or self.kind not in ("removal", "keep_only", "shift"):
            raise InvalidInputError("random_like needs a patch made by an EntropyAxis (removal, keep_only or shift).")
        return self.axis.random_control(seed=seed, op=self.kind, lam=self.params.get("lam", 1.0),
                                        sigmas=self.params.get("sigmas"), layers=self.layers,
                                        center=bool(self.params.get("center", False)))

    def __repr__(self) -> str:
        return f"Patch({self.label!r}, hooks={list(self.hook_names)})"


def flatten_pairs(patches) -> List[Tuple[str, Callable]]:
    if patches is None:
        return []
    if isinstance(patches, Patch):
        return list(patches)
    if isinstance(patches, tuple) and len(patches) == 2 and isinstance(patches[0], str):
        if not callable(patches[1]):
            raise InvalidInputError(f"each hook must be a (hook_name: str, fn: callable) pair, got "
                                    f"({patches[0]!r}, {patches[1]!r}); the second element must be a function.")
        return [patches]
    if isinstance(patches, (str, bytes)) or not hasattr(patches, "__iter__"):
        raise InvalidInputError(f"patches must be a Patch, a (hook_name, fn) pair, or a list of those; "
                                f"got {type(patches).__name__}.")
    out = []
    for p in patches:
        out += flatten_pairs(p)
    return out


def patch_objects(patches) -> List[Patch]:
    if isinstance(patches, Patch):
        return [patches]
    if isinstance(patches, (list, tuple)) and not (len(patches) == 2 and isinstance(patches[0], str)):
        return [q for p in patches for q in patch_objects(p)]
    return []


def check_against_model(model, patch: Patch) -> None:
    """Refuse a patch of the wrong shape for ``model``; warn when the weight basis differs."""
    info = adapter.model_info(model)
    for part in patch._parts:
        if part.layer >= info.n_layers:
            raise LayerIndexError(f"the patch acts on layer {part.layer} but the model has {info.n_layers} layers.")
        dim = site_dim(info, part.site)
        if part.direction.shape[0] != dim:
            raise InvalidInputError(
                f"the patch {patch.label!r} has an axis of dimension {part.direction.shape[0]} at {part.hook_name}, "
                f"but this model's {part.site!r} site has dimension {dim}; fit the axis on this model.")
    meta = patch.model_meta
    if meta is not None and bool(meta.get("processed")) != bool(info.processed):
        warnings.warn(
            f"the patch {patch.label!r} was fitted on a model with {meta.get('processing')!r} but this model has "
            f"{info.processing!r}: a direction measured in one weight basis is wrong in the other "
            "(METHODS.md §0 'Weights'). Refit the axis on this model.", UserWarning, stacklevel=3)
    elif meta is not None:
        _warn_site_processing(model, patch, meta)


def _warn_site_processing(model, patch: Patch, meta: dict) -> None:
    """Warn when the processing that changes the patch's site differs between the fitting model and ``model``
    (:func:`bayes_lens.adapter.site_processing`): value biases at ``hook_v`` (uncentred removal and
    keep-only only; a shift and ``center=True`` do not depend on them), centred writing weights at
    ``hook_resid_post`` (every operation)."""
    sites = {p.site for p in patch.parts
             if p.site == "resid_post" or (p.op != "shift" and p.offset == 0.0 and p.mean is None)}
    for site, key in (("v", "value_bias_folded"), ("resid_post", "writing_weights_centred")):
        fitted = meta.get(key)
        if site not in sites or fitted is None:
            continue
        now = adapter.value_biases_folded(model) if site == "v" else adapter.writing_weights_centred(model)
        if now is None or bool(now) == bool(fitted):
            continue
        what = "value biases folded out of hook_v" if site == "v" else "writing weights centred"
        fix = ("pass center=True to the patch, which is the same intervention in both" if site == "v" else
               "refit the axis on this model")
        warnings.warn(
            f"the patch {patch.label!r} acts on {site!r}, and the model it was fitted on had {what} = {bool(fitted)} "
            f"but this model has {bool(now)}: the {site!r} activations differ between the two, so the patch is a "
            f"different intervention here (METHODS.md §7). To compare like with like, {fix}.",
            UserWarning, stacklevel=4)


def _check_attached_axis(model, part: PatchPart) -> None:
    hp = adapter.hook_point(model, part.hook_name)
    u = getattr(hp, "axis_direction", None)
    if u is not None and not torch.equal(u.cpu(), part.direction.cpu()):
        raise InvalidInputError(
            f"{part.hook_name} is attached for a different axis than the one this patch came from; detach it "
            "(or attach this patch's axis) before patching.")


def _coordinate_parts(patches) -> List[PatchPart]:
    return [part for p in patch_objects(patches) for part in p.parts if part.on_coordinate]


def check_patches(model, patches) -> List[Tuple[str, Callable]]:
    """Every check :func:`patched` makes, before any compute; returns the ``[(hook_name, fn)]`` pairs.

    The pairs' shape, each patch's fit to the model (layers, width, weight basis) and the hook names:
    a hook on an axis coordinate point that is not attached is fine (:func:`patched` and the runner
    attach it), one attached for another axis is refused, any other missing hook is an error.
    """
    adapter.check_model(model)
    pairs = flatten_pairs(patches)
    for name, fn in pairs:
        if not isinstance(name, str) or not callable(fn):
            raise InvalidInputError(f"each hook must be a (hook_name: str, fn: callable) pair, got ({name!r}, {fn!r}).")
    for p in patch_objects(patches):
        check_against_model(model, p)
    names = sorted({n for n, _ in pairs})
    coords = _coordinate_parts(patches)
    if not coords:
        adapter.check_hooks(model, names)
        return pairs
    have = adapter.hook_names(model)  # a bridge's hook_dict is costly: read once
    attachable = {part.hook_name for part in coords}
    missing = [n for n in names if n not in have and n not in attachable]
    if missing:
        adapter.check_hooks(model, missing)  # raises, naming them
    for part in coords:
        if part.hook_name in have:
            _check_attached_axis(model, part)
    return pairs


@contextlib.contextmanager
def patched(model, patches):
    """Run ``model`` with ``patches`` inside the block; all their hooks are removed on exit, also on error.

    ``patches`` is a :class:`Patch`, a list of patches, or any ``[(hook_name, fn)]`` list; an empty
    list runs the clean model. A removal or shift of a fitted axis acts on the axis's coordinate hook
    point (zero-ablation of ``blocks.{l}.hook_v_axis`` is the removal): the hook points are
    attached for the block when they are not attached already, and detached on exit. Hook points
    are checked first (:func:`check_patches`: a misspelt or out-of-range hook is an error, never a
    silent no-op), and a patch whose axis has the wrong dimension for the model is refused. The
    hooks are added as the runner adds a run's ``fwd_hooks`` (:func:`bayes_lens.adapter.added_hooks`).
    The model's lock is held for the whole block (another thread's forward pass waits instead of
    running with these hooks).

    >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
    >>> tokens = model.to_tokens(prompts)
    >>> with bl.patched(model, axis.removal()):
    ...     logits = model(tokens)
    >>> torch.equal(logits, model(tokens)), axis.coord_hook_name_ in model.hook_dict   # restored on exit
    (False, False)
    """
    pairs = check_patches(model, patches)
    with adapter.model_lock(model), hookpoints.attached_for(model, pairs), adapter.added_hooks(model, pairs):
        yield model
