"""bayes_lens's own named hook points, spliced into a TransformerLens model: ``bl.attach``.

TransformerLens users cache and ablate what a plugin adds *by hook name* — SAELens splices modules
that own ``HookPoint``s into the model so that they appear in ``model.hook_dict`` and in
``run_with_cache``. ``with bl.attach(model, axis=axis):`` does the same for what bayes_lens measures
(Paper A §4.2, §4.5–4.6; METHODS.md §3, §4, §7):

=========================================  ======================  ==========================================
hook name                                  shape                   value
=========================================  ======================  ==========================================
``blocks.{l}.attn.hook_v_axis``            ``[batch, pos]``        the entropy-axis coordinate c = v·u of the
                                                                   value vector (flattened over KV heads) at
                                                                   every position, for each layer the axis
                                                                   was fitted on (``site="v"``)
``blocks.{l}.hook_resid_post_axis``        ``[batch, pos]``        the same for an axis with
                                                                   ``site="resid_post"``
``blocks.{l}.attn.hook_pattern_entropy``   ``[batch, head, q]``    entropy (bits) of every attention row
                                                                   over the keys it attends to
``hook_next_token_entropy``                ``[batch, pos]``        full-vocabulary next-token entropy (bits)
=========================================  ======================  ==========================================

They are ordinary ``HookPoint``s: ``run_with_cache`` records them (respecting ``names_filter``;
``bl.hook_filter(sites=(..., "v_axis"))`` selects them), and ``run_with_hooks`` can read or change
them. The axis coordinate *feeds back*: a hook that changes it to c′ moves the value vector along
u by c′ − c, so **zero-ablating** ``hook_v_axis`` is the projection removal v ← v − (v·u)u
(``axis.removal()`` is exactly that hook) and adding s·σ is ``axis.shift(s)``. The entropy hook
points are read-outs (changing them changes nothing downstream).

Dtypes and memory: the entropies are float64 whatever the model's dtype (bf16/fp16 included), computed
a slice at a time (:func:`bayes_lens.metrics.stats.chunked_entropy_bits`: query rows of the pattern,
positions of the logits), so neither a float64 ``[batch, head, q, k]`` pattern nor a float64
``[batch, pos, vocab]`` logit tensor is ever built; each result stays on the device of its activation.

Cost: each hook point is computed only when something is hooked on it, so an attached model with
nothing hooked runs as the bare model (logits unchanged). Detaching restores the original module
tree and ``hook_dict`` exactly; the ``with`` block detaches also when its body raises.

Example
-------
>>> import bayes_lens as bl                                                        # doctest: +SKIP
>>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model))        # doctest: +SKIP
>>> with bl.attach(model, axis=axis):                                              # doctest: +SKIP
...     logits, cache = model.run_with_cache(tokens, names_filter=lambda n: "axis" in n)
...     ablated = model.run_with_hooks(tokens, fwd_hooks=[(axis.coord_hook_name_, lambda c, hook: 0 * c)])
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Sequence, Tuple

import torch
from torch import Tensor

from . import adapter
from .errors import InvalidInputError
from .metrics.stats import chunked_entropy_bits

__all__ = ["HOOK_POINTS", "attach", "Attachment", "axis_hook_name", "attached_axis_layers", "attached_for"]

#: bayes_lens hook point name templates by short name (``{layer}`` is the layer index).
HOOK_POINTS: Dict[str, str] = {
    "v_axis": "blocks.{layer}.attn.hook_v_axis",
    "resid_post_axis": "blocks.{layer}.hook_resid_post_axis",
    "pattern_entropy": "blocks.{layer}.attn.hook_pattern_entropy",
    "next_token_entropy": "hook_next_token_entropy",
}

_AXIS_SOURCE = {"v": "v", "resid_post": "resid_post"}
_ALL = torch.ones((), dtype=torch.bool)  # every key: a pattern row is renormalized over what it attends to


def axis_hook_name(site: str, layer: int) -> str:
    """The coordinate hook point of an axis at ``site`` (``"v"`` or ``"resid_post"``) and ``layer``."""
    if site not in _AXIS_SOURCE:
        raise InvalidInputError(f"an axis site must be 'v' or 'resid_post', got {site!r}.")
    return HOOK_POINTS[f"{site}_axis"].format(layer=int(layer))


def _hook_point_class():
    from transformer_lens.hook_points import HookPoint

    return HookPoint


def _has_hooks(hp) -> bool:
    return bool(hp._forward_hooks)


class Attachment:
    """What :func:`attach` added to a model; a context manager that detaches on exit.

    ``hook_names`` lists the added hook points. ``detach()`` removes them (idempotent).
    """

    def __init__(self, model):
        self.model = model
        self._added: List[Tuple[str, torch.nn.Module, str, torch.nn.Module]] = []  # (name, parent, attr, hp)
        self._handles: list = []
        self.axis = None
        self.attached = False

    @property
    def hook_names(self) -> Tuple[str, ...]:
        return tuple(name for name, _, _, _ in self._added)

    # --- building ---
    def _add(self, name: str, parent: torch.nn.Module, attr: str):
        hp = _hook_point_class()()
        if attr in parent._modules or hasattr(parent, attr):
            raise InvalidInputError(
                f"the model already has a hook point {name!r}: bayes_lens hook points are attached already "
                "(nested bl.attach on one model is not supported; detach the first one).")
        parent.add_module(attr, hp)
        hp.name = name
        m = self.model
        if adapter.is_bridge(m):
            m._hook_registry[name] = hp
        else:
            m.hook_dict[name] = hp
            m.mod_dict[name] = hp
        self._added.append((name, parent, attr, hp))
        return hp

    def _source(self, name: str) -> torch.nn.Module:
        adapter.check_hooks(self.model, [name])
        return self.model.hook_dict[name]

    # --- removal ---
    def detach(self) -> None:
        """Remove every added hook point and the forward hooks that feed them (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        m = self.model
        for name, parent, attr, hp in reversed(self._added):
            if attr in parent._modules and parent._modules[attr] is hp:
                del parent._modules[attr]
            if adapter.is_bridge(m):
                if m._hook_registry.get(name) is hp:
                    del m._hook_registry[name]
            else:
                if m.hook_dict.get(name) is hp:
                    del m.hook_dict[name]
                if m.mod_dict.get(name) is hp:
                    del m.mod_dict[name]
        self._added = []
        self.attached = False

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"Attachment({state}, {len(self._added)} hook points)"


def _axis_fn(hp, u: Tensor):
    """Forward hook on the source hook point: c = flat(v)·u → hp(c) → v + (c′ − c) u."""
    cache: Dict[Tuple[torch.device, torch.dtype], Tensor] = {}

    def fn(module, inputs, out):
        if not _has_hooks(hp):
            return None
        shape = out.shape
        flat = out.reshape(shape[0], shape[1], -1)
        work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
        key = (work.device, work.dtype)
        if key not in cache:
            cache[key] = u.to(device=work.device, dtype=work.dtype)
        uu = cache[key]
        if work.shape[-1] != uu.shape[0]:
            raise InvalidInputError(
                f"the axis at {hp.name} has dimension {uu.shape[0]} but the activation there is {list(shape)}; "
                "the axis was fitted on another model or site.")
        c = work @ uu  # [batch, pos]
        c_new = hp(c)
        if c_new is c:
            return None
        if not isinstance(c_new, Tensor) or c_new.shape != c.shape:
            raise InvalidInputError(
                f"a hook on {hp.name} returned {getattr(c_new, 'shape', type(c_new).__name__)}; it must return the "
                f"coordinate's shape {list(c.shape)}.")
        moved = work + (c_new.to(work.dtype) - c).unsqueeze(-1) * uu
        return moved.to(out.dtype).reshape(shape)

    return fn


def _pattern_entropy_fn(hp):
    def fn(module, inputs, out):
        if not _has_hooks(hp):
            return None
        hp(chunked_entropy_bits(out.detach(), dim=2, keys=_ALL))  # [batch, head, q] over attended keys, in chunks
        return None

    return fn


def _next_token_entropy_fn(hp):
    def fn(module, inputs, out):
        if not _has_hooks(hp):
            return None
        logits = out if isinstance(out, Tensor) else getattr(out, "logits", None)
        if logits is None:
            return None
        hp(chunked_entropy_bits(logits.detach(), dim=1, from_logits=True))  # [batch, pos], float64, in chunks
        return None

    return fn


def attached_axis_layers(model, site: str) -> List[int]:
    """Layers at which an axis coordinate hook point of ``site`` is attached to ``model``."""
    names = set(adapter.hook_names(model))
    n = int(model.cfg.n_layers)
    return [layer for layer in range(n) if axis_hook_name(site, layer) in names]


def attach(model, axis=None, *, entropies: bool = True) -> Attachment:
    """Splice bayes_lens hook points into ``model``; use as ``with bl.attach(model, axis=axis): ...``.

    Parameters
    ----------
    axis:
        A fitted :class:`bayes_lens.EntropyAxis`: adds its coordinate hook point at each of its layers
        (``blocks.{l}.attn.hook_v_axis`` for ``site="v"``, ``blocks.{l}.hook_resid_post_axis`` for
        ``site="resid_post"``). ``None``: no axis hook points.
    entropies:
        Add ``blocks.{l}.attn.hook_pattern_entropy`` for every layer and ``hook_next_token_entropy``.

    Returns an :class:`Attachment` (already attached; a context manager that detaches on exit, also
    on error; or call ``.detach()``). Each hook point costs nothing unless something hooks it.
    """
    adapter.check_model(model)
    att = Attachment(model)
    try:
        with adapter.model_lock(model):
            if axis is not None:
                axis.check_fitted()
                if axis.model_meta_.get("n_layers") not in (None, int(model.cfg.n_layers)):
                    raise InvalidInputError(
                        f"the axis was fitted on a model with {axis.model_meta_['n_layers']} layers; this one has "
                        f"{model.cfg.n_layers}. Fit the axis on this model.")
                info = adapter.model_info(model)
                dim = info.kv_dim if axis.site_ == "v" else info.d_model
                if int(axis.model_meta_["dim"]) != dim:
                    raise InvalidInputError(
                        f"the axis has dimension {axis.model_meta_['dim']} but this model's {axis.site_!r} site has "
                        f"dimension {dim}; fit the axis on this model.")
                for layer in axis.layers_:
                    name = axis_hook_name(axis.site_, layer)
                    src = adapter.hook_name(model, layer, _AXIS_SOURCE[axis.site_])
                    parent = model.blocks[layer].attn if axis.site_ == "v" else model.blocks[layer]
                    source = att._source(src)
                    hp = att._add(name, parent, name.rsplit(".", 1)[-1])
                    hp.axis_direction = axis.axes_[layer].float().clone()  # which axis this hook point measures
                    att._handles.append(source.register_forward_hook(_axis_fn(hp, hp.axis_direction)))
                att.axis = axis
            if entropies:
                for layer in range(int(model.cfg.n_layers)):
                    name = HOOK_POINTS["pattern_entropy"].format(layer=layer)
                    source = att._source(adapter.hook_name(model, layer, "pattern"))
                    hp = att._add(name, model.blocks[layer].attn, "hook_pattern_entropy")
                    att._handles.append(source.register_forward_hook(_pattern_entropy_fn(hp)))
                hp = att._add(HOOK_POINTS["next_token_entropy"], model, "hook_next_token_entropy")
                att._handles.append(model.unembed.register_forward_hook(_next_token_entropy_fn(hp)))
    except BaseException:
        att.detach()
        raise
    att.attached = True
    return att


def _axis_of_hook(fn):
    """The fitted axis a patch hook acts through (a bound method of a part on an axis coordinate), or None."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and getattr(owner, "on_coordinate", False):
        return getattr(owner, "axis", None)
    return None


@contextlib.contextmanager
def attached_for(model, pairs: Sequence) -> Iterator[List[Attachment]]:
    """Attach, for the block, the axis coordinate hook points that ``pairs`` hook but ``model`` lacks.

    Patches made by :meth:`bayes_lens.EntropyAxis.removal` / ``shift`` act on ``hook_v_axis``; inside
    :func:`bayes_lens.patched` and the runner they work whether or not the user attached the axis.
    """
    have = adapter.hook_names(model)
    axes = []
    for name, fn in pairs:
        ax = _axis_of_hook(fn) if name not in have else None
        if ax is not None and all(a is not ax for a in axes):
            axes.append(ax)
    attachments = []
    try:
        for ax in axes:
            attachments.append(attach(model, axis=ax, entropies=False))
        yield attachments
    finally:
        for att in reversed(attachments):
            att.detach()
