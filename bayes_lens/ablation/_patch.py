"""Patches: interventions on a model as TransformerLens ``[(hook_name, fn)]`` pairs, and ``bl.patched``.

Paper A §4.5–4.6 (METHODS.md §7): v ← v − λ(v·u)u (removal; λ = 1 full removal, λ = 0 no change —
the paper's public code had λ reversed), keep-only v ← (v·u)u, and shift v ← v + s·σ·u, applied at
every position. Every part of every patch — a removal or shift along a fitted axis, keep-only, the
random-direction controls, a subspace removal — takes one route: a hook on the site's own
TransformerLens hook point (``blocks.{l}.attn.hook_v``, ``blocks.{l}.hook_resid_post``) that changes
the activation with :func:`bayes_lens.interventions.move_along` and the part's coordinate operation
(:meth:`PatchPart.coordinate_op`), or projects it with :func:`~bayes_lens.interventions.keep_along`. So a
treatment and its control differ only in the direction, and a patch's pairs work in plain
TransformerLens (``model.hooks(fwd_hooks=list(patch))``, ``run_with_hooks``) without ``bl.attach``. Where an
SAELens SAE replaces the site's hook point, TransformerLens refuses that name (a raw ``TypeError`` from its
``hooks``: the SAE's wrapper has no ``add_hook``), so a patch made on a model (an axis fitted on it,
``from_directions``, ``load(model=)``, ``subspace_patch``) names, when iterated, the SAE's ``hook_sae_output``
where an SAE is spliced on that model at that moment (``add_sae``, or inside ``run_with_hooks_with_saes`` when
the patch itself is passed as ``fwd_hooks=patch``); a list made *before* SAELens splices the SAE inside the call
cannot know of it, so there pass :meth:`Patch.pairs` (``fwd_hooks=patch.pairs(model, saes=[sae])``) or use
:func:`patched`. :func:`patched` and the runner (``fwd_hooks``) add the pairs the same way
(:func:`bayes_lens.adapter.added_hooks`). See :mod:`bayes_lens.ablation`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import Tensor

from .. import adapter
from ..errors import InvalidInputError, LayerIndexError
from ..interventions import Intervention
from ..interventions import coordinate_map
from ._common import site_dim

__all__ = ["PatchPart", "Patch", "patched", "flatten_pairs", "patch_objects", "check_patches"]


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------

# axis or patch -> weak reference to the model it was made on (kept out of the objects, so they pickle as before)
_MODELS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def link_model(owner, model) -> None:
    """Remember, weakly, that ``owner`` (an :class:`EntropyAxis` or :class:`Patch`) was made on ``model``."""
    if owner is None or model is None:
        return
    try:
        _MODELS[owner] = weakref.ref(model)
    except TypeError:  # not weak-referenceable or not hashable: nothing to follow
        pass


def linked_model(owner):
    """The live model ``owner`` was made on (:func:`link_model`), or None."""
    try:
        ref = _MODELS.get(owner)
    except TypeError:
        return None
    return ref() if ref is not None else None



@dataclass(frozen=True, eq=False)
class PatchPart:
    """One layer of a patch: the hook, the direction and the operation.

    The hook is the site's own TransformerLens hook point (``hook_name``: ``blocks.{l}.attn.hook_v`` for
    ``site="v"``, ``blocks.{l}.hook_resid_post``), for every operation and for an axis's direction and a
    random control's alike. The operation changes the coordinate c = x·u of each position's row x
    (``hook_v`` flattened over heads): removal c ↦ (1 − λ)c, shift c ↦ c + s·σ (:meth:`coordinate_op`,
    applied by :func:`bayes_lens.interventions.move_along`), or keep-only x ↦ (x·u)u
    (:func:`bayes_lens.interventions.keep_along`).
    """

    layer: int
    hook_name: str
    site: str
    op: str  # "removal" | "keep_only" | "shift"
    direction: Tensor  # float32 unit vector [dim]
    lam: float = 1.0  # removal strength
    amount: float = 0.0  # shift distance (s·σ), in activation units
    # centred operations (``center=True``): the fitted mean of the site, so that the change does not
    # depend on a constant shift of the activations (a folded value bias): the mean vector ``[dim]``, or
    # ``[batch, dim]`` one row per prompt of the batch it runs on (resample-ablation: each prompt's donor row).
    mean: Optional[Tensor] = None

    def coordinate_op(self, c: Tensor) -> Tensor:
        """What the part does to the coordinate c = x·u: removal c ↦ (1 − λ)c (centred:
        c ↦ c − λ(c − μ·u)), shift c ↦ c + s·σ - the operation table's coordinate map
        (:func:`bayes_lens.interventions.apply_op`), for an axis and for its random controls alike."""
        op = "shift" if self.op == "shift" else "remove" if self.mean is None else "mean"
        return coordinate_map(op, self.direction, self.amount if op == "shift" else self.lam, self.mean,
                              what=f"the patch at {self.hook_name}")(c)

    @property
    def intervention(self) -> Intervention:
        """The part as an :class:`~bayes_lens.interventions.Intervention` (what :meth:`apply` runs): removal →
        ``"remove"`` (centred on a mean row: ``"mean"``; on one row per prompt: ``"resample"``), shift →
        ``"shift"`` by s·σ, keep-only → ``"keep_only"``; at every position, strength λ (or s·σ)."""
        got = self.__dict__.get("_intervention")
        if got is None:
            if self.op == "removal":
                op = "remove" if self.mean is None else "resample" if self.mean.ndim == 2 else "mean"
            else:
                op = self.op
            got = Intervention(layer=self.layer, site=self.site, basis=self.direction.detach().cpu().float()[:, None],
                               op=op, strength=self.amount if op == "shift" else self.lam,
                               source=None if op == "shift" else self.mean, label=self.hook_name)
            self.__dict__["_intervention"] = got
        return got

    def apply(self, act: Tensor) -> Tensor:
        """The part's operation on the site's activation, by its :attr:`intervention` (the operation table of
        :mod:`bayes_lens.interventions`, the one code that writes an activation)."""
        return self.intervention.apply(act)

    def hook_fn(self, act: Tensor, hook=None) -> Tensor:
        return self.apply(act)

    def digest(self) -> str:
        """SHA-256 (hex) of what this part does: layer, hook, site, operation, λ, shift, direction bytes."""
        # the literal False and 0.0 stand where a former field (the coordinate route) and a scalar offset
        # were, so that the digests of parts whose hook and operation did not change stay what they were
        fields = [self.layer, self.hook_name, self.site, self.op, self.lam, self.amount, False]
        if self.mean is not None:  # centred: part of what it does (uncentred digests unchanged)
            fields.append(["centred", 0.0])
        h = hashlib.sha256(json.dumps(fields).encode())
        h.update(self.direction.detach().cpu().float().contiguous().numpy().tobytes())
        if self.mean is not None:
            h.update(self.mean.detach().cpu().float().contiguous().numpy().tobytes())
        return h.hexdigest()


class Patch:
    """An intervention (possibly at several layers): an iterable of ``(hook_name, fn)`` pairs.

    Made by :class:`EntropyAxis` (``removal``, ``keep_only``, ``shift``, ``random_control``). Use it
    as ``with bl.patched(model, patch):``, or hand its pairs to TransformerLens as they are —
    ``model.hooks(fwd_hooks=list(patch))``, ``model.run_with_hooks(tokens, fwd_hooks=list(patch))`` —
    with no ``bl.attach``. Under SAELens, where an SAE replaces the patch's hook point, TransformerLens refuses
    the replaced name with a raw ``TypeError`` before any hook runs; so a patch that knows its model (made by an
    axis fitted on it, ``from_directions``, ``load(model=)``, or ``subspace_patch``) yields the SAE's
    ``hook_sae_output`` (what flows on) for a hook point an SAE replaces on that model when it is iterated:
    ``model.add_sae(sae)`` then ``fwd_hooks=list(patch)`` works, and so does
    ``run_with_hooks_with_saes(tokens, saes=[sae], fwd_hooks=patch)`` (the call iterates the patch after it
    splices the SAE). ``fwd_hooks=list(patch)`` built *before* that call cannot see the SAE the call splices
    (TransformerLens's ``TypeError`` again): there pass ``fwd_hooks=patch.pairs(model, saes=[sae])``, or run
    inside ``bl.patched(model, patch)``. Every part hooks its site's own hook point (``blocks.{l}.attn.hook_v``,
    ``blocks.{l}.hook_resid_post``), the removal and shift of the axis exactly as their random controls
    and keep-only, so a treatment and its control reach the activation the same way and in the same
    order relative to other hooks on that site (TransformerLens runs a hook point's hooks in the order
    they were added). ``patch_a + patch_b`` applies both (also patches of different axes).

    Attributes: ``label``, ``kind`` (``"removal"``, ``"keep_only"``, ``"shift"``, ``"combined"``),
    ``layers``, ``hook_names``, ``site``, ``random_seed`` (None unless a random control),
    ``directions`` (layer → unit vector), ``axis`` (the :class:`EntropyAxis` it came from; None for a sum of
    patches of different axes), ``axes`` (every axis it came from, in order).

    >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
    >>> tokens = model.to_tokens(prompts)
    >>> with bl.patched(model, axis.removal()):
    ...     removed = model(tokens)
    >>> by_pairs = model.run_with_hooks(tokens, fwd_hooks=list(axis.removal()))   # plain TransformerLens
    >>> torch.allclose(removed, by_pairs, atol=1e-5), axis.removal().hook_names == (axis.hook_name_,)
    (True, True)
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
        model = self._model()
        return iter(self._pairs if model is None else self.pairs(model))

    def _model(self):
        """The model this patch was made on, while it lives (the one model of all its axes); else None."""
        model = linked_model(self)
        if model is not None or not self._axes:
            return model
        models = [linked_model(a) for a in self._axes]
        return models[0] if all(m is not None and m is models[0] for m in models) else None

    def pairs(self, model=None, *, saes: Sequence = ()) -> List[Tuple[str, Callable]]:
        """The ``(hook_name, fn)`` pairs for plain TransformerLens / SAELens calls: the hook points' own names, except
        that a hook point an SAELens SAE replaces - one spliced on ``model`` (``add_sae``) or one of ``saes`` (to be
        spliced by ``run_with_saes`` / ``run_with_hooks_with_saes`` during the call) - is named by the SAE's
        ``{hook}.hook_sae_output``, the activation that flows on (TransformerLens refuses the replaced name itself):
        ``model.run_with_hooks_with_saes(tokens, saes=[sae], fwd_hooks=patch.pairs(model, saes=[sae]))``.
        ``list(patch)`` is ``patch.pairs(m)`` for the model ``m`` the patch was made on, read when it is iterated.

        >>> patch = bl.EntropyAxis.from_directions(model, {0: torch.ones(model.cfg.d_model)}, site="resid_post",
        ...                                        sigma=1.0).removal()
        >>> patch.pairs(model) == list(patch)     # no SAE: the same pairs
        True
        """
        names = adapter.sae_output_names(model, [n for n, _ in self._pairs], saes)
        return [(n, fn) for n, (_, fn) in zip(names, self._pairs)]

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, i):
        return list(self)[i]

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
    if isinstance(patches, Patch):  # the hook points themselves: patched() follows an SAE there on its own
        return list(patches._pairs)
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
    shape = [(key, meta.get(key), now) for key, now in (("n_layers", info.n_layers), ("d_model", info.d_model),
                                                        ("n_kv_heads", info.n_kv_heads), ("d_head", info.d_head))
             if meta is not None and meta.get(key) is not None and int(meta[key]) != int(now)]
    if shape:  # the patch's own fingerprint: it was made for another model
        what = "; ".join(f"{key} {was} there, {now} here" for key, was, now in shape)
        raise InvalidInputError(
            f"the patch {patch.label!r} was fitted on another model ({meta.get('model_name')!r}: {what}); a "
            "direction fitted on one model means nothing in another. Refit the axis on this model (or load it "
            "with EntropyAxis.load(path, model=model), which checks).")
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
             if p.site == "resid_post" or (p.op != "shift" and p.mean is None)}
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


def check_patches(model, patches) -> List[Tuple[str, Callable]]:
    """Every check :func:`patched` makes, before any compute; returns the ``[(hook_name, fn)]`` pairs.

    The pairs' shape, each patch's fit to the model (layers, width, weight basis) and the hook names
    (a missing hook is an error, never a silent no-op).
    """
    adapter.check_model(model)
    pairs = flatten_pairs(patches)
    for name, fn in pairs:
        if not isinstance(name, str) or not callable(fn):
            raise InvalidInputError(f"each hook must be a (hook_name: str, fn: callable) pair, got ({name!r}, {fn!r}).")
    for p in patch_objects(patches):
        check_against_model(model, p)
    adapter.check_hooks(model, sorted({n for n, _ in pairs}))
    return pairs


@contextlib.contextmanager
def patched(model, patches):
    """Run ``model`` with ``patches`` inside the block; all their hooks are removed on exit, also on error.

    ``patches`` is a :class:`Patch`, a list of patches, or any ``[(hook_name, fn)]`` list; an empty
    list runs the clean model. Every patch hooks its site's own hook point (``hook_v``), as
    ``model.hooks(fwd_hooks=list(patch))`` would; nothing is attached. Where an SAELens SAE replaces that hook
    point (``add_sae``, or inside ``run_with_saes`` / ``run_with_hooks_with_saes`` in the block) the patch acts
    on the SAE's ``hook_sae_output``, the activation that flows on (:func:`bayes_lens.adapter.following_saes`),
    as ``fwd_hooks=patch.pairs(model, saes=[sae])`` does outside the block. Hook points are checked first
    (:func:`check_patches`: a misspelt or out-of-range hook is an error, never a silent no-op), and a
    patch whose axis has the wrong dimension for the model is refused. The hooks are added as the
    runner adds a run's ``fwd_hooks`` (:func:`bayes_lens.adapter.added_hooks`). The model's lock is
    held for the whole block (another thread's forward pass waits instead of running with these hooks).

    >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
    >>> tokens = model.to_tokens(prompts)
    >>> with bl.patched(model, axis.removal()):
    ...     logits = model(tokens)
    >>> torch.equal(logits, model(tokens))   # restored on exit
    False
    """
    pairs = check_patches(model, patches)
    with adapter.model_lock(model), adapter.added_hooks(model, pairs), adapter.following_saes(model, pairs):
        yield model
