"""bayes_lens's own named hook points, spliced into a TransformerLens model: ``bl.attach``.

TransformerLens users cache and ablate what a plugin adds *by hook name* — SAELens splices modules
that own ``HookPoint``s into the model so that they appear in ``model.hook_dict`` and in
``run_with_cache``. ``with bl.attach(model, axis=axis):`` does the same for what bayes_lens measures
(Paper A §4.2, §4.5–4.6; METHODS.md §3, §4, §7):

=========================================  ======================  ==========================================
hook name                                  shape                   value
=========================================  ======================  ==========================================
``blocks.{l}.hook_v_axis``                 ``[batch, pos, 1]``     the entropy-axis coordinate c = v·u of the
                                                                   value vector (flattened over KV heads) at
                                                                   every position, for each layer the axis
                                                                   was fitted on (``site="v"``)
``blocks.{l}.hook_resid_post_axis``        ``[batch, pos, 1]``     the same for an axis with
                                                                   ``site="resid_post"``
``blocks.{l}.hook_pattern_entropy``        ``[batch, pos, head]``  entropy (bits) of every attention row (one
                                                                   per query position and head) over the keys
                                                                   it attends to
``hook_next_token_entropy``                ``[batch, pos, 1]``     full-vocabulary entropy (bits) of the
                                                                   logits the model *returns* (final-logit
                                                                   softcapping and any other transform after
                                                                   the unembedding included)
=========================================  ======================  ==========================================

The names are what TransformerLens's own ``utils.get_act_name`` makes of the short names
(``get_act_name("v_axis", 3) == "blocks.3.hook_v_axis"``), so ``cache["v_axis", 3]``,
``cache.stack_activation("pattern_entropy")`` and ``transformer_lens.patching`` find them; the
position axis is second from last, as TransformerLens's ``run_with_cache(pos_slice=...)`` expects.

Semantics: they are ordinary ``HookPoint``s, and behave like TransformerLens's own under every way
hooks are written — a hook may return a new tensor, edit its argument in place and return it, or
edit in place and return ``None``; forward and backward hooks (``add_hook(dir="bwd")``,
``run_with_cache(incl_bwd=True)``, ``retain_grad`` inside a hook) work; the points follow the
model's ``train()``/``eval()``; ``copy.deepcopy`` of an attached model gives a working attached copy
(:func:`detach` removes the points from it) and ``torch.save``/``pickle`` work as for the bare model.
Order follows TransformerLens's registration-order rule: a derived point is computed as if it were
a hook on its source added together with the first hook on the derived point, so it sees every
edit of hooks on the source added before (a hook that zeroes ``hook_v`` gives a zero coordinate;
``run_with_cache`` lists ``hook_v`` before ``hook_v_axis``), and hooks on the source added after
see what the coordinate's hooks did. The axis coordinate *feeds back*: a hook that changes it
to c′ moves the value vector along u by c′ − c, so **zero-ablating** ``hook_v_axis`` is the
projection removal v ← v − (v·u)u (the numbers of ``axis.removal()``) and adding s·σ is
``axis.shift(s)``; the gradient a backward hook sees there is ∂L/∂c = (∂L/∂v)·u. That feedback is
:func:`move_along`, the one implementation of a change along a direction, and the library's own
patches (:mod:`bayes_lens.ablation`: removal, shift, keep-only with :func:`keep_along`, the
random-direction controls) call the same functions from a hook on ``hook_v`` itself: they need no
attach, and the coordinate hook point is for reading and for your own hooks.
The entropy points are read-outs (changing them changes nothing downstream); the pattern entropy is
:func:`bayes_lens.hooks.row_entropy_bits`.

SAELens: an SAE spliced in at a point's source (``HookedSAETransformer.add_sae`` at
``blocks.{l}.hook_resid_post``, before or after ``bl.attach``) is followed: the coordinate is then
read from, and fed back into, the SAE's output (``hook_sae_output``), which is what flows on. The
source is re-checked by a forward pre-hook on the module that contains it (the block, the attention),
so a splice is followed from the first pass after it however the pass starts — ``model(...)``,
``run_with_hooks`` and ``run_with_hooks_with_saes`` (which call ``forward`` directly, past any hook
on the model itself), ``run_with_saes``.

Dtypes and memory: the entropies are float64 whatever the model's dtype (bf16/fp16 included), computed
a slice at a time (:func:`bayes_lens.metrics.stats.chunked_entropy_bits`: query rows of the pattern,
positions of the logits), so neither a float64 ``[batch, head, q, k]`` pattern nor a float64
``[batch, pos, vocab]`` logit tensor is ever built; each result stays on the device of its activation.

Cost: each hook point is computed only when something is hooked on it, so an attached model with
nothing hooked runs as the bare model (logits unchanged). Detaching restores the original module
tree and ``hook_dict`` exactly; the ``with`` block detaches also when its body raises.

Example
-------
>>> import bayes_lens as bl
>>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
>>> tokens = model.to_tokens(prompts)
>>> with bl.attach(model, axis=axis):
...     logits, cache = model.run_with_cache(tokens, names_filter=lambda n: "axis" in n)
...     ablated = model.run_with_hooks(tokens, fwd_hooks=[(axis.coord_hook_name_, lambda c, hook: 0 * c)])
>>> list(cache.keys()), cache[axis.coord_hook_name_].shape[-1]
(['blocks.1.hook_v_axis'], 1)
>>> torch.allclose(logits, model(tokens))           # attached and unhooked: the bare model's logits
True
>>> removed = model.run_with_hooks(tokens, fwd_hooks=list(axis.removal()))  # the patch hooks hook_v: no attach
>>> torch.allclose(ablated, removed, atol=1e-5)     # zero-ablating the coordinate is the removal
True
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import adapter
from .errors import InvalidInputError, MissingHookError
from .hooks import HOOK_POINTS, row_entropy_bits
from .interventions import keep_along, move_along  # noqa: F401 - re-exported: the one implementation
from .metrics.stats import chunked_entropy_bits

__all__ = ["HOOK_POINTS", "RENAMED", "attach", "detach", "Attachment", "axis_hook_name", "attached_axis_layers"]

#: names of bayes_lens 0.x before the TransformerLens-resolvable names (old template → new template).
#: Not kept as aliases: the shapes changed with them, so old code fails loudly instead of misreading.
RENAMED: Dict[str, str] = {
    "blocks.{layer}.attn.hook_v_axis": HOOK_POINTS["v_axis"],
    "blocks.{layer}.attn.hook_pattern_entropy": HOOK_POINTS["pattern_entropy"],
}

_STATE = "_bayes_lens_points"  # plain attribute on the model: the list of live bindings (copied by deepcopy)


def axis_hook_name(site: str, layer: int) -> str:
    """The coordinate hook point of an axis at ``site`` (``"v"`` or ``"resid_post"``) and ``layer``."""
    return HOOK_POINTS[f"{adapter.check_site(site)}_axis"].format(layer=int(layer))


# The projection: every move along a direction (the axis coordinate's feedback here, every patch and
# intervention elsewhere) is computed by the operation table of bayes_lens.interventions (move_along,
# keep_along), the only code that writes an activation; re-exported here for old imports.


# --------------------------------------------------------------------------------------------
# Derivations: what a source hook point's output becomes at a bayes_lens point
# --------------------------------------------------------------------------------------------


class _AxisCoordinate:
    """Forward hook on the source ``x``: c = flat(x)·u → hp(c) → x + (c′ − c)u (:func:`move_along`)."""

    def __init__(self, hp, direction: Tensor):
        self.hp = hp
        self.direction = direction
        self._u: Dict[Tuple[torch.device, torch.dtype], Tensor] = {}

    def _through_point(self, c: Tensor) -> Tensor:
        # the hook point gets its own copy: an in-place edit (TL's patching setters) must not touch c
        c_new = self.hp(c.clone())
        if not isinstance(c_new, Tensor) or c_new.shape != c.shape:
            raise InvalidInputError(
                f"a hook on {self.hp.name} returned {getattr(c_new, 'shape', type(c_new).__name__)}; it must return "
                f"the coordinate's shape {list(c.shape)}.")
        return c_new

    def __call__(self, module, inputs, out: Tensor):
        if not adapter.has_hooks(self.hp):
            return None
        return move_along(out, self.direction, self._through_point, what=f"the axis at {self.hp.name}",
                          cache=self._u)


class _PatternEntropy:
    """Forward hook on the source pattern ``[batch, head, q, k]``: row entropies → hp ``[batch, q, head]``."""

    def __init__(self, hp):
        self.hp = hp

    def __call__(self, module, inputs, out: Tensor):
        if adapter.has_hooks(self.hp):
            # differentiable when grad is on (a backward hook on the entropy then fires), chunked either way
            self.hp(row_entropy_bits(out).transpose(1, 2).contiguous())
        return None


def _hook_point_class():
    from transformer_lens.hook_points import HookPoint

    return HookPoint


def _reposition_then(register):
    def method(self, hook, *args, **kwargs):
        binding = self.__dict__.get("_bl_binding")
        if binding is not None and not adapter.has_hooks(self):
            binding.reposition()
        return register(self, hook, *args, **kwargs)

    method.__name__ = register.__name__
    return method


_POINT_CLASS = None


def _point_class():
    """``HookPoint`` whose first hook places its derivation after every hook its source has *now*.

    This is TransformerLens's own registration-order rule, as if the derivation were a hook on the
    source added together with the first hook on the derived point: hooks on ``hook_v`` added before
    (a user's edit, TL's caching hooks of ``run_with_cache``) are seen by the coordinate; hooks on
    ``hook_v`` added after see the value the coordinate's hooks moved.
    """
    global _POINT_CLASS
    if _POINT_CLASS is None:
        base = _hook_point_class()
        _POINT_CLASS = type("BayesLensHookPoint", (base,), {
            "__module__": __name__,
            "__doc__": "A bayes_lens hook point (a TransformerLens HookPoint); see bayes_lens.hookpoints.",
            "register_forward_hook": _reposition_then(base.register_forward_hook),
            "register_full_backward_hook": _reposition_then(base.register_full_backward_hook),
        })
    return _POINT_CLASS


def __getattr__(name: str):
    # unpickling an attached model looks the class up by name before anything made it
    if name == "BayesLensHookPoint":
        return _point_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _remove_hook_fn(module, fn) -> None:
    for key in [k for k, f in module._forward_hooks.items() if f is fn]:
        del module._forward_hooks[key]


# --------------------------------------------------------------------------------------------
# Bindings: a bayes_lens point, where it lives, and the source it is derived from
# --------------------------------------------------------------------------------------------


class _Binding:
    """One attached point: ``hp`` (a child ``attr`` of ``parent``), derived from the module at ``source_path``.

    ``watch`` is the module that contains the source (the source path's parent, e.g. the block of
    ``blocks.1.hook_resid_post``): a forward pre-hook on it (:func:`_rebind_pre_hook`) makes sure, just
    before the source can run, that the derivation sits on the hook point that is at ``source_path`` now.
    """

    def __init__(self, name: str, hp, parent, attr: str, derive=None, source_path: Optional[str] = None,
                 source=None, watch=None):
        self.name, self.hp, self.parent, self.attr = name, hp, parent, attr
        self.derive, self.source_path, self.source, self.watch = derive, source_path, source, watch

    def bind(self, source) -> None:
        if self.source is not None:
            _remove_hook_fn(self.source, self.derive)
        self.source = source
        if source is not None:
            source.register_forward_hook(self.derive)

    def follow(self, model) -> None:
        """Bind to the hook point at ``source_path`` now, if the source was replaced (an SAE added or removed)."""
        live = _live_source(model, self.source_path, self.name)
        if live is not self.source:
            self.bind(live)

    def reposition(self) -> None:
        """Move the derivation to the end of the live source's hooks (see :func:`_point_class`)."""
        if self.source is None:
            return
        model = _model_of_watched(self.watch) if self.watch is not None else None
        if model is not None:
            live = _live_source(model, self.source_path, self.name)
            if live is not self.source:
                self.bind(live)
                return
        self.bind(self.source)


def _live_source(model, path: str, what: str):
    """The hook point whose output *is* the activation at ``path`` now.

    That is the hook point at ``path``, or — where SAELens's ``HookedSAETransformer.add_sae`` has put its
    SAE wrapper in the hook point's place — the wrapper's ``hook_sae_output``, which is what flows on
    (:func:`bayes_lens.adapter.live_hook_point`).
    """
    try:
        mod = model.get_submodule(path)
    except AttributeError:
        mod = None
    live = adapter.live_hook_point(mod)
    if live is not None:
        return live
    raise MissingHookError(
        f"{what} is derived from {path}, but the model has {type(mod).__name__ if mod is not None else 'nothing'} "
        "there, not a HookPoint (nor an SAELens SAE whose hook_sae_output bayes_lens could follow). Detach "
        "bayes_lens (bl.detach(model)) before replacing that hook point, and attach again afterwards.")


def _model_of_output_module(module):
    return module.__dict__.get("_bl_model", module)


def _model_of_watched(module):
    model = module.__dict__.get("_bl_model")
    return model if model is not None else (module if _STATE in module.__dict__ else None)


def _rebind_pre_hook(module, args):
    """Forward pre-hook on a module that contains sources: follow a source replaced since attach.

    It sits on the source's parent (the block of ``hook_resid_post``, the attention of ``hook_pattern``),
    which runs on every pass that reaches the source however the pass was started: ``model(...)``,
    ``run_with_cache``, and ``run_with_hooks``, which calls ``forward`` directly and so skips hooks on
    the model itself. So an SAE spliced after ``bl.attach`` (``add_sae``, ``run_with_saes``,
    ``run_with_hooks_with_saes``) is followed from the first pass after the splice.
    """
    model = _model_of_watched(module)
    if model is None:
        return None
    for b in model.__dict__.get(_STATE, ()):
        if b.watch is module and b.source_path is not None:
            b.follow(model)
    return None


def _watch(model, binding: _Binding) -> None:
    """Put :func:`_rebind_pre_hook` on the module containing ``binding``'s source (once per module)."""
    parent_path = binding.source_path.rpartition(".")[0]
    module = model.get_submodule(parent_path)
    binding.watch = module
    if any(fn is _rebind_pre_hook for fn in module._forward_pre_hooks.values()):
        return
    if module is not model:
        module.__dict__["_bl_model"] = model  # a plain reference (not a submodule): copies keep it consistent
    module.register_forward_pre_hook(_rebind_pre_hook)


def _unwatch(model, bindings: Sequence[_Binding]) -> None:
    """Remove the pre-hooks of modules that no live binding of ``model`` watches any more."""
    live = {id(b.watch) for b in model.__dict__.get(_STATE, ()) if b.watch is not None}
    for b in bindings:
        module, b.watch = b.watch, None
        if module is None or id(module) in live:
            continue
        for key in [k for k, f in module._forward_pre_hooks.items() if f is _rebind_pre_hook]:
            del module._forward_pre_hooks[key]
        if not any(f is _next_token_entropy_hook for f in module._forward_hooks.values()):
            module.__dict__.pop("_bl_model", None)


def _next_token_entropy_hook(module, args, out):
    """Forward hook: the entropy of the logits the model returns, into ``hook_next_token_entropy``."""
    model = _model_of_output_module(module)
    hp = model._modules.get(HOOK_POINTS["next_token_entropy"])
    if hp is None or not getattr(hp, "_bl_point", False) or not adapter.has_hooks(hp):
        return None
    logits = out[0] if isinstance(out, tuple) and out else getattr(out, "logits", out)
    d_vocab = int(getattr(model.cfg, "d_vocab_out", 0) or getattr(model.cfg, "d_vocab", 0) or -1)
    if not isinstance(logits, Tensor) or logits.ndim != 3 or logits.shape[-1] != d_vocab:
        return None  # return_type="loss"/None, stop_at_layer: no logits, no next-token entropy
    hp(chunked_entropy_bits(logits, dim=1, from_logits=True).unsqueeze(-1))  # [batch, pos, 1], float64
    return None


def _install_root_hooks(model) -> None:
    out = adapter.output_module(model)
    if any(fn is _next_token_entropy_hook for fn in out._forward_hooks.values()):
        return
    if out is not model:
        out.__dict__["_bl_model"] = model  # a plain reference (not a submodule): copies keep it consistent
    out.register_forward_hook(_next_token_entropy_hook)


def _remove_root_hooks(model) -> None:
    out = adapter.output_module(model)
    for key in [k for k, f in out._forward_hooks.items() if f is _next_token_entropy_hook]:
        del out._forward_hooks[key]
    if not any(fn is _rebind_pre_hook for fn in out._forward_pre_hooks.values()):
        out.__dict__.pop("_bl_model", None)


def _unbind(model, bindings: Sequence[_Binding]) -> None:
    """Remove ``bindings`` from ``model``: their modules, registry entries and derivations (idempotent)."""
    bindings = list(bindings)
    for b in reversed(bindings):
        b.bind(None)
        if b.parent._modules.get(b.attr) is b.hp:
            del b.parent._modules[b.attr]
    live = [b for b in model.__dict__.get(_STATE, ()) if all(b is not x for x in bindings)]
    adapter.unregister_hook_points(model, {b.name: b.hp for b in bindings})
    if live:
        model.__dict__[_STATE] = live
    else:
        model.__dict__.pop(_STATE, None)
    _unwatch(model, bindings)
    if not live:
        _remove_root_hooks(model)


def detach(model) -> None:
    """Remove every bayes_lens hook point from ``model`` (e.g. from a ``copy.deepcopy`` of an attached model).

    ``with bl.attach(...)`` and :meth:`Attachment.detach` do this for the model they attached to;
    this is for copies, which carry working points but no :class:`Attachment`. Idempotent.
    """
    _unbind(model, list(model.__dict__.get(_STATE, ())))


class Attachment:
    """What :func:`attach` added to a model; a context manager that detaches on exit.

    ``hook_names`` lists the added hook points. ``detach()`` removes them (idempotent).
    """

    def __init__(self, model):
        self.model = model
        self._bindings: List[_Binding] = []
        self.axis = None
        self.attached = False

    @property
    def hook_names(self) -> Tuple[str, ...]:
        return tuple(b.name for b in self._bindings)

    # --- building ---
    def _add(self, name: str, parent: torch.nn.Module, derive_of=None, source_name: Optional[str] = None) -> object:
        attr = name.rsplit(".", 1)[-1]
        if attr in parent._modules or hasattr(parent, attr):
            raise InvalidInputError(
                f"the model already has a hook point {name!r}: bayes_lens hook points are attached already "
                "(nested bl.attach on one model is not supported; detach the first one).")
        hp = _point_class()()
        hp.name = name
        hp._bl_point = True
        hp.train(parent.training)  # TL 4's patching refuses any submodule left in training mode
        parent.add_module(attr, hp)
        b = _Binding(name, hp, parent, attr)
        self._bindings.append(b)
        model = self.model
        model.__dict__.setdefault(_STATE, []).append(b)
        if derive_of is not None:
            path = adapter.hook_module_path(model, source_name)
            b.derive = derive_of(hp)
            b.source_path = path
            b.bind(_live_source(model, path, name))
            _watch(model, b)
            hp._bl_binding = b
        return hp

    # --- removal ---
    def detach(self) -> None:
        """Remove every added hook point and what feeds them (idempotent)."""
        _unbind(self.model, self._bindings)
        self._bindings = []
        self.attached = False

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"Attachment({state}, {len(self._bindings)} hook points)"


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
        (``blocks.{l}.hook_v_axis`` for ``site="v"``, ``blocks.{l}.hook_resid_post_axis`` for
        ``site="resid_post"``). ``None``: no axis hook points.
    entropies:
        Add ``blocks.{l}.hook_pattern_entropy`` for every layer and ``hook_next_token_entropy``.

    Returns an :class:`Attachment` (already attached; a context manager that detaches on exit, also
    on error; or call ``.detach()``). Each hook point costs nothing unless something hooks it. The
    points behave like TransformerLens's own under TL's own client code (module docstring).
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
                    direction = axis.axes_[layer].float().clone()
                    hp = att._add(axis_hook_name(axis.site_, layer), model.blocks[layer],
                                  derive_of=lambda hp, u=direction: _AxisCoordinate(hp, u),
                                  source_name=adapter.hook_name(model, layer, axis.site_))
                    hp.axis_direction = direction  # which axis this hook point measures
                att.axis = axis
            if entropies:
                for layer in range(int(model.cfg.n_layers)):
                    att._add(HOOK_POINTS["pattern_entropy"].format(layer=layer), model.blocks[layer],
                             derive_of=_PatternEntropy, source_name=adapter.hook_name(model, layer, "pattern"))
                att._add(HOOK_POINTS["next_token_entropy"], model)
            _install_root_hooks(model)
            adapter.register_hook_points(model, {b.name: b.hp for b in att._bindings})
    except BaseException:
        att.detach()
        raise
    att.attached = True
    return att
