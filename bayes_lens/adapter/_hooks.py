"""The adapter's hook facet: hook names, the hook-point registry, and hooks added for one run.

Part of :mod:`bayes_lens.adapter` (METHODS.md §0 "Hook points"): the legacy alias hook names both model
kinds accept (:data:`SITES`, :func:`hook_name`, :func:`check_hooks`), where a hook point lives
(:func:`hook_module_path`), registering bayes_lens's own points (:func:`register_hook_points`), the
per-model name table that resolves a hook point once (:class:`HookResolver`), adding a run's hooks at
TransformerLens's own context level (:func:`added_hooks`), the final-token unembedding
(:func:`final_token_unembedding`) and what weight processing changes at a site (:func:`site_processing`).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, List, Optional, Sequence

import torch
from torch import Tensor

from .._validate import check_choice
from ..errors import InvalidInputError, MissingHookError
from ._models import is_bridge, resolve_layer, value_biases_folded, writing_weights_centred
from ._runtime import model_lock

__all__ = [
    "sae_output_names",
    "SITES",
    "VECTOR_SITES",
    "check_site",
    "hook_name",
    "hook_names",
    "hook_point",
    "any_forward_hooks",
    "hooked_points",
    "check_hooks",
    "hook_module_path",
    "register_hook_points",
    "HookResolver",
    "live_hook_point",
    "has_hooks",
    "added_hooks",
    "output_module",
    "final_token_unembedding",
    "unregister_hook_points",
    "site_processing",
]


# Hook sites by short name -> legacy (alias) hook name, accepted by both model kinds.
SITES = {
    "v": "blocks.{layer}.attn.hook_v",
    "k": "blocks.{layer}.attn.hook_k",
    "q": "blocks.{layer}.attn.hook_q",
    "rot_k": "blocks.{layer}.attn.hook_rot_k",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "z": "blocks.{layer}.attn.hook_z",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "mlp_post": "blocks.{layer}.mlp.hook_post",   # the MLP's hidden activation [batch, pos, d_mlp] (a neuron each)
    "final_scale": "ln_final.hook_scale",         # the final norm's scale [batch, pos, 1] (no layer: ignored)
}


#: The sites whose final-token vectors the analyses read and an entropy axis lives at (keys of
#: :data:`SITES`): ``"v"`` is ``hook_v`` flattened over key/value heads (``n_kv_heads·d_head``, the
#: paper's site), ``"resid_post"`` the residual stream after the block (``d_model``).
VECTOR_SITES = ("v", "resid_post")


def check_site(site) -> str:
    """``site`` if it is one of :data:`VECTOR_SITES` (``"v"`` or ``"resid_post"``), else InvalidInputError."""
    try:
        return check_choice(site, "site", VECTOR_SITES)
    except InvalidInputError as err:
        if isinstance(site, str) and site.startswith("hook_") and site[5:] in VECTOR_SITES:
            raise InvalidInputError(f"{str(err).rstrip('.')}: sites are the short names of TransformerLens hooks; "
                                    f"pass site={site[5:]!r}.") from None
        raise


def hook_name(model, layer: int, site: str) -> str:
    """The hook name of ``site`` (a key of :data:`SITES`) at ``layer`` (negative counts from the end)."""
    if site not in SITES:
        raise InvalidInputError(f"unknown site {site!r}; expected one of {sorted(SITES)}.")
    return SITES[site].format(layer=resolve_layer(model, layer))


def hook_names(model) -> set:
    """Every hook name the model accepts (its ``hook_dict`` plus a bridge's legacy aliases)."""
    names = set(getattr(model, "hook_dict", {}).keys())
    if is_bridge(model):
        for reg in ("_hook_alias_registry",):
            names |= set(getattr(model, reg, {}) or {})
        try:
            names |= set(model._collect_hook_aliases_from_registry().keys())  # TL bridge internals
        except Exception:  # noqa: BLE001 - private API, best effort
            pass
    return names


def hook_point(model, name: str):
    """The model's ``HookPoint`` called ``name`` (TransformerLens's ``hook_dict``), or None."""
    points = getattr(model, "hook_dict", None)
    return None if points is None else points.get(name)


def any_forward_hooks(model) -> bool:
    """Whether any hook point of the model carries a forward hook (inside ``bl.patched``, ``model.hooks``, or a
    plain PyTorch hook on a point: :func:`has_hooks`)."""
    points = getattr(model, "hook_dict", None)
    return points is not None and any(has_hooks(hp, "fwd") for hp in points.values())


def hooked_points(model) -> List[str]:
    """Names of the model's hook points that carry a hook now (``bl.patched``, ``model.hooks(...)``,
    ``add_hook``), by TransformerLens's own ``HookPoint.has_hooks()``."""
    try:
        points = model.hook_dict.items()
    except AttributeError:  # pragma: no cover - not a TransformerLens model
        return []
    seen, out = set(), []
    for name, hp in points:
        if id(hp) not in seen and hasattr(hp, "has_hooks") and hp.has_hooks(dir="fwd"):
            seen.add(id(hp))
            out.append(str(name))
    return out


def check_hooks(model, names: Iterable[str]) -> None:
    """Raise MissingHookError listing every name in ``names`` the model has no hook point for."""
    names = list(names)
    resolver = HookResolver(model)
    unresolved = [n for n in names if resolver.find(n) is None]
    if not unresolved:
        return
    have = hook_names(model)  # the slow, complete list (a bridge's alias registries too)
    missing = [n for n in unresolved if n not in have]
    if missing:
        raise MissingHookError(
            f"the model ({type(model).__name__}) has no hook point(s) {missing}; bayes_lens needs them "
            "for this metric. Models loaded with bl.load_model/bl.load_gguf or TransformerLens' "
            "standard loaders have them; a bridge booted natively may lack some."
        )


def hook_module_path(model, name: str) -> str:
    """The module path (``named_modules`` key) of the module behind hook name ``name``.

    A legacy alias on a bridge (``blocks.0.attn.hook_v``) resolves to its canonical hook point's path
    (``blocks.0.attn.v.hook_out``); on a HookedTransformer the name is the path. Also finds a module that
    replaced a hook point (an SAELens SAE wrapper), which is not in ``hook_dict``. Names resolve through
    :class:`HookResolver`, whose table is read once per model (a bridge's ``hook_dict`` is costly).
    """
    mod = None
    if not is_bridge(model):  # a HookedTransformer's mod_dict is a dict; a TL 4 bridge rebuilds its own per read
        mod_dict = getattr(model, "mod_dict", None)
        mod = mod_dict.get(name) if isinstance(mod_dict, dict) else None
    if mod is None:
        mod = HookResolver(model)(name)
    path = getattr(mod, "name", None)
    try:
        if path and model.get_submodule(path) is mod:
            return path
    except AttributeError:
        pass
    for path, m in model.named_modules():
        if m is mod:
            return path
    raise MissingHookError(f"the hook point {name!r} is not a submodule of the model; bayes_lens cannot follow it.")


def register_hook_points(model, points) -> None:
    """Make the hook points ``points`` (name → HookPoint, already submodules) resolvable by name.

    A HookedTransformer rebuilds ``hook_dict``/``mod_dict`` from its module tree with TransformerLens's
    public ``setup()`` (as SAELens does after splicing an SAE); a bridge has no public registration, so
    its hook registry gets the entries (the one place bayes_lens writes a bridge's registry).
    """
    if is_bridge(model):
        for name, hp in points.items():
            hp.name = name
            model._hook_registry[name] = hp
    else:
        model.setup()


class HookResolver:
    """Hook name → ``HookPoint`` for one model, ``hook_dict`` read once per model, not per call.

    A bridge's ``hook_dict`` is a property that rebuilds its legacy aliases on every access (≈ 15 ms on
    SmolLM2, TL 3.9), and its ``hooks()`` reads it twice per hook added: adding a few hooks per batch
    that way cost more than the forward pass of short prompts. The name table is kept on the model
    (a plain attribute: a ``copy.deepcopy`` carries a table of its own points) and trusted only while each
    point it hands out is still the module at its path: a point that was replaced (an SAELens SAE
    spliced in, a module swapped) makes the table be read again, as does a name it lacks. A name whose
    hook point an SAE replaced resolves to the SAE's ``hook_sae_output`` (:func:`live_hook_point`). bayes_lens's own
    points (attached per batch, possibly by another thread) are never in the table: they are looked up
    as module paths each time.
    """

    def __init__(self, model):
        self.model = model

    def _read(self) -> dict:
        with model_lock(self.model):  # bayes_lens's own points come and go with attachments: left out
            table = {k: hp for k, hp in self.model.hook_dict.items() if not getattr(hp, "_bl_point", False)}
        self.model.__dict__[_NAME_TABLE] = table
        return table

    def _live(self, hp) -> bool:
        path = getattr(hp, "name", None)
        try:
            return bool(path) and self.model.get_submodule(path) is hp
        except AttributeError:
            return False

    def _by_path(self, name: str):
        try:
            mod = self.model.get_submodule(name)
        except AttributeError:
            return None
        return live_hook_point(mod)

    def find(self, name: str):
        """The ``HookPoint`` behind ``name`` now, or ``None`` when the model has none by that name."""
        table = self.model.__dict__.get(_NAME_TABLE)
        fresh = table is None
        if fresh:
            table = self._read()
        hp = table.get(name)
        if hp is not None and not self._live(hp):  # replaced since the table was read
            if not fresh:
                table, fresh = self._read(), True
                hp = table.get(name)
            if hp is not None and not self._live(hp):  # hook_dict itself is stale (a HookedTransformer before
                hp = self._by_path(hp.name) or hp  # setup(), a bridge's registry): the point at its path now
        if hp is None:
            hp = self._by_path(name)
        if hp is None and not fresh:  # a name added since the table was read
            hp = self._read().get(name)
        return hp

    def __call__(self, name: str):
        hp = self.find(name)
        if hp is None:
            check_hooks(self.model, [name])  # raises, naming the hook
            raise MissingHookError(f"the model lists a hook {name!r}, but it is not a HookPoint bayes_lens can hook.")
        return hp


_NAME_TABLE = "_bayes_lens_hook_table"  # plain attribute on the model: HookResolver's name table


def live_hook_point(mod):
    """The ``HookPoint`` whose output is what flows on from the module ``mod`` at a hook point's path, or None.

    ``mod`` itself when it is a ``HookPoint``; where SAELens's ``HookedSAETransformer.add_sae`` has put an
    SAE in a hook point's place (the SAE module at the hook's path, no longer in ``hook_dict`` under that
    name), the SAE's ``hook_sae_output``: the reconstruction (plus the error term where the SAE keeps it)
    that the rest of the model reads. So bayes_lens reads, caches and patches a spliced site where the
    model's own computation continues, as its attached hook points do.
    """
    from transformer_lens.hook_points import HookPoint

    if isinstance(mod, HookPoint):
        return mod
    out = getattr(mod, "hook_sae_output", None) if mod is not None else None
    return out if isinstance(out, HookPoint) else None


def has_hooks(hp, dir: str = "both") -> bool:
    """Whether anything is hooked on the ``HookPoint`` ``hp`` (``dir``: ``"fwd"``, ``"bwd"`` or ``"both"``).

    A hook added through TransformerLens (``add_hook``, ``hooks()``, ``run_with_hooks``,
    ``run_with_cache``: TL's public ``HookPoint.has_hooks``) or a plain PyTorch module hook registered on
    the point directly (``register_forward_hook``), which TL's own hook points also run.
    """
    if hp.has_hooks(dir=dir):
        return True
    fwd = bool(hp._forward_hooks or hp._forward_pre_hooks)
    bwd = bool(hp._backward_hooks)
    return {"fwd": fwd, "bwd": bwd}.get(dir, fwd or bwd)


_LEVEL = [10 ** 6]  # TL context levels of hooks added by added_hooks (far above TL's own small counters)


def sae_output_names(model, names: Sequence[str], saes: Sequence = ()) -> List[str]:
    """``names`` with each hook point an SAELens SAE replaces - one spliced on ``model`` now (``add_sae``) or one of
    ``saes`` (to be spliced by ``run_with_saes`` / ``run_with_hooks_with_saes``) - mapped to that SAE's
    ``{name}.hook_sae_output``, the activation that flows on; the others unchanged. TransformerLens refuses the
    replaced name itself (``mod_dict[name]`` is the SAE's wrapper, which has no ``add_hook``)."""
    spliced = set(getattr(model, "acts_to_saes", None) or {}) if model is not None else set()
    for sae in saes:
        cfg = getattr(sae, "cfg", None)
        meta = getattr(cfg, "metadata", None)
        name = getattr(meta, "hook_name", None) or getattr(cfg, "hook_name", None)
        if not isinstance(name, str):
            raise InvalidInputError(f"saes= takes SAELens SAEs (each with cfg.metadata.hook_name); got "
                                    f"{type(sae).__name__}.")
        spliced.add(name)
    return [f"{n}.hook_sae_output" if n in spliced else n for n in names]


@contextlib.contextmanager
def following_saes(model, fwd_hooks: Sequence):
    """While active, a ``(hook_name, fn)`` pair whose hook point an SAELens SAE has replaced
    (``HookedSAETransformer.add_sae``, also inside ``run_with_saes`` / ``run_with_hooks_with_saes``, which splice
    the SAE after this block began) is applied at that SAE's ``hook_sae_output``, the activation that flows on.

    A forward pre-hook on the embedding (which every pass runs, also TransformerLens's ``run_with_hooks``, which calls
    ``forward`` directly) looks the names up at the start of every pass and hooks the spliced SAE's output point for
    that pass; the next pass, and the end of the block, take those hooks off again, so nothing is left on the user's
    SAE. Models that cannot hold SAEs are left alone.
    """
    pairs = [(n, fn) for n, fn in fwd_hooks if isinstance(n, str)]
    embed = getattr(model, "embed", None)
    if not pairs or not hasattr(model, "acts_to_saes") or not isinstance(embed, torch.nn.Module):
        yield
        return
    live: list = []

    def clear():
        while live:
            live.pop().remove()

    def spliced(module, args):
        clear()
        for name, fn in pairs:
            try:
                target = model.get_submodule(name)
            except AttributeError:
                continue
            point = getattr(target, "hook_sae_output", None)
            if point is not None and isinstance(point, torch.nn.Module):
                live.append(point.register_forward_hook(lambda mod, inp, out, fn=fn: fn(out, hook=mod)))

    pre = embed.register_forward_pre_hook(spliced)
    try:
        yield
    finally:
        pre.remove()
        clear()


@contextlib.contextmanager
def added_hooks(model, fwd_hooks: Sequence, resolver: Optional[HookResolver] = None):
    """``model.hooks(fwd_hooks=...)`` on hook points resolved by ``resolver``; removed on exit, also on error.

    Hooks are added with TL's own ``HookPoint.add_hook`` (so a bridge's head-splitting conversion
    applies) at a context level of their own and removed with ``HookPoint.remove_hooks(level=...)``.
    A pair whose name is a filter function goes through ``model.hooks``.
    """
    pairs = list(fwd_hooks)
    if any(not isinstance(name, str) for name, _ in pairs):
        with model.hooks(fwd_hooks=pairs):
            yield
        return
    resolver = resolver or HookResolver(model)
    _LEVEL[0] += 1
    level = _LEVEL[0]
    touched = []
    try:
        for name, fn in pairs:
            hp = resolver(name)
            gated = getattr(model, "_gated_hook_reason", None)  # a bridge's hook points that never fire
            reason = gated(name) if callable(gated) else None
            if reason is not None:
                raise MissingHookError(f"{name} never fires on this bridge because {reason} is off; enable it "
                                       "with the bridge's set_use_*(True) setter first.")
            hp.add_hook(fn, level=level)
            touched.append(hp)
        yield
    finally:
        for hp in {id(h): h for h in touched}.values():
            hp.remove_hooks("fwd", level=level)


def output_module(model) -> torch.nn.Module:
    """The module whose forward output carries the logits the model returns, and is called on every pass.

    A HookedTransformer itself (its ``run_with_cache`` calls the model). A bridge's ``run_with_cache``
    calls ``forward`` directly, skipping the bridge's own module hooks, so for a bridge it is the
    wrapped transformers model, whose output's ``.logits`` (softcapped where the model softcaps) the
    bridge returns.
    """
    return model.original_model if is_bridge(model) else model


def _final_only_prehook(last: Tensor):
    """A forward pre-hook on the unembedding that keeps only each row's final real position."""

    def pre(module, args):
        x = args[0]
        rows = x[torch.arange(x.shape[0], device=x.device), last.to(x.device)]
        return (rows.unsqueeze(1),) + tuple(args[1:])

    return pre


def _plain_unembed_forward(unembed):
    """TransformerLens's ``Unembed.forward`` without its per-call copy of ``W_U.T`` (same numbers).

    TL 3.9's ``Unembed`` computes ``F.linear(x, W_U.T.contiguous(), b_U)``: a copy of the whole
    d_model × d_vocab matrix on every call (0.07 s per call on SmolLM2, more than the final-token
    product itself). ``F.linear`` on the transposed view computes the same product with the same BLAS
    call and no copy; ``hook_in``/``hook_out`` run as before.
    """

    def forward(residual):
        residual = unembed.hook_in(residual)
        return unembed.hook_out(torch.nn.functional.linear(residual, unembed.W_U.T, unembed.b_U))

    return forward


def _is_tl_unembed(unembed) -> bool:
    """TransformerLens's own float32 ``Unembed`` (not a subclass or a replacement), forward not already patched.

    In bf16 TL keeps its copy of ``W_U.T``, which matches Hugging Face's accumulation order.
    """
    try:
        from transformer_lens.components import Unembed
    except ImportError:  # pragma: no cover - a TL without the HookedTransformer components
        return False
    return (type(unembed) is Unembed and "forward" not in vars(unembed)
            and all(hasattr(unembed, a) for a in ("W_U", "b_U", "hook_in", "hook_out"))
            and unembed.W_U.dtype == torch.float32)


@contextlib.contextmanager
def final_token_unembedding(model, last: Tensor):
    """Inside the block, ``model.unembed`` sees only each row's final real position ``last`` ``[batch]``.

    The model then returns logits ``[batch, 1, vocab]``: the unembedding (the largest product of a
    short prompt's pass) runs on one position per row. A forward pre-hook on ``model.unembed`` does the
    slicing (both model kinds); on a HookedTransformer whose unembedding is TL's own float32
    ``Unembed``, its forward also skips TL 3.9's per-call copy of ``W_U.T`` (same numbers). Both are
    undone on exit, also on error.
    """
    unembed = model.unembed
    handle = unembed.register_forward_pre_hook(_final_only_prehook(last))
    swap = _is_tl_unembed(unembed)
    if swap:
        unembed.forward = _plain_unembed_forward(unembed)
    try:
        yield
    finally:
        handle.remove()
        if swap:
            del unembed.forward


def unregister_hook_points(model, points) -> None:
    """Undo :func:`register_hook_points` for ``points`` (already removed from the module tree)."""
    if is_bridge(model):
        for name, hp in points.items():
            if model._hook_registry.get(name) is hp:
                del model._hook_registry[name]
    else:
        model.setup()


def site_processing(model, site: str) -> List[str]:
    """The weight processing that changes ``site``'s activations against the raw model (short phrases).

    ``"v"``: ``fold_value_biases`` (``hook_v`` is shifted by −b_V; :func:`value_biases_folded`).
    ``"resid_post"``: ``center_writing_weights`` (the residual is projected onto the mean-zero subspace;
    :func:`writing_weights_centred`). Folded layer norm and a centred unembedding change neither (the
    folded weights reproduce ``hook_v``; the residual stream and the softmax are unchanged). Empty
    when the site is as on the raw model.
    """
    site = check_site(site)
    if site == "v":
        return ["value biases folded (fold_value_biases)"] if value_biases_folded(model) else []
    return ["writing weights centred (center_writing_weights)"] if writing_weights_centred(model) else []
