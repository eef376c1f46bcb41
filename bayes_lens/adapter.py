"""The model adapter: the one module that knows TransformerLens internals.

bayes_lens accepts any "TransformerLens model": a TL 3.x ``HookedTransformer`` or a
``TransformerBridge`` (TL 3.x and 4.x). Everything else in the package asks this module for

* the model's shape (:func:`model_info`: layers, query heads, key/value heads, d_head, d_model),
* hook names (:func:`hook_name`), using the legacy alias names (``blocks.3.attn.hook_v``) that
  both model kinds accept, and checks that a hook exists (:func:`check_hooks`),
* per-KV-head key weights :func:`key_weights` ``[n_kv_heads, d_model, d_head]`` - never the copies
  that TL 3.9's ``HookedTransformer.W_K`` expands to n_heads under grouped-query attention,
* whether weights were processed (:func:`processing`): folded layer norm / centred weights on a
  HookedTransformer, ``enable_compatibility_mode`` / ``process_weights`` on a bridge. A direction or
  a weight statistic measured in one basis is wrong in the other (METHODS.md §0 "Weights"),
* tokenization of a batch with padding and an attention mask (:func:`tokenize`),
* where inputs go (:func:`input_device`: the embedding's device, which for a model split across
  devices with ``TransformerBridge.boot_transformers(..., n_devices=N)`` is not the device of the
  first parameter), and which multi-device set-ups are refused (:func:`check_model`: a
  ``HookedTransformer`` with ``cfg.n_devices > 1``, whose TL 3.9 placement is broken, TL #907),
* how many keys a layer's query can see (:func:`attention_window`, :func:`visible_keys`): local
  (sliding-window) layers such as Gemma 3's see at most ``window`` keys, their own included.

Example
-------
>>> import bayes_lens as bl
>>> model = bl.models.tiny.tiny_model("bridge")               # or bl.load_model(): SmolLM2-135M
>>> bl.adapter.model_info(model).n_kv_heads
2
>>> bl.adapter.hook_name(model, -1, "v")                      # layer -1 is the last layer
'blocks.1.attn.hook_v'
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .errors import InvalidInputError, LayerIndexError, MissingHookError, TokenizationError, UnsupportedModelError

__all__ = [
    "TLModel",
    "ModelInfo",
    "model_info",
    "has_hooked_transformer",
    "is_bridge",
    "resolve_layer",
    "resolve_layers",
    "hook_name",
    "check_hooks",
    "hooked_points",
    "hook_module_path",
    "register_hook_points",
    "output_module",
    "HookResolver",
    "live_hook_point",
    "added_hooks",
    "unregister_hook_points",
    "key_weights",
    "attention_window",
    "visible_keys",
    "processing",
    "tokenize",
    "encode_prompts",
    "pad_batch",
    "model_device",
    "input_device",
    "model_lock",
    "check_model",
    "hook_names",
    "is_activation_cache",
    "mask_from_tokens",
    "cache_model",
    "cache_has",
    "cache_contents",
    "SITES",
    "VECTOR_SITES",
    "check_site",
    "has_hooks",
    "final_token_unembedding",
    "value_biases_folded",
    "writing_weights_centred",
    "site_processing",
    "masks_left_padding_from_tokens",
]


@runtime_checkable
class TLModel(Protocol):
    """Structural type of a TransformerLens model (HookedTransformer or TransformerBridge)."""

    cfg: object

    def run_with_cache(self, *args, **kwargs): ...

    def run_with_hooks(self, *args, **kwargs): ...

    def hooks(self, *args, **kwargs): ...

    def to_tokens(self, *args, **kwargs): ...


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
}

#: The sites whose final-token vectors the analyses read and an entropy axis lives at (keys of
#: :data:`SITES`): ``"v"`` is ``hook_v`` flattened over key/value heads (``n_kv_heads·d_head``, the
#: paper's site), ``"resid_post"`` the residual stream after the block (``d_model``).
VECTOR_SITES = ("v", "resid_post")


def check_site(site) -> str:
    """``site`` if it is one of :data:`VECTOR_SITES` (``"v"`` or ``"resid_post"``), else InvalidInputError."""
    if isinstance(site, str) and site in VECTOR_SITES:
        return site
    hint = ""
    if isinstance(site, str) and site.startswith("hook_") and site[5:] in VECTOR_SITES:
        hint = f": sites are the short names of TransformerLens hooks; pass site={site[5:]!r}"
    elif isinstance(site, (list, tuple)) and len(site) == 1 and site[0] in VECTOR_SITES:
        hint = f" (pass site={site[0]!r}, a single string, not a list)"
    raise InvalidInputError(f"site must be one of {list(VECTOR_SITES)}, got {site!r}{hint}.")


@functools.lru_cache(maxsize=None)
def has_hooked_transformer() -> bool:
    """True when the installed TransformerLens still has ``HookedTransformer`` (3.x)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def is_bridge(model) -> bool:
    """True for a ``TransformerBridge`` (any TL version)."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - TL < 3.4
        return False
    return isinstance(model, TransformerBridge)


def check_model(model) -> None:
    """Raise InvalidInputError unless ``model`` is a TransformerLens model (has ``cfg`` and the hook API).

    A ``HookedTransformer`` with ``cfg.n_devices > 1`` raises :class:`UnsupportedModelError`: TL 3.9
    places its blocks inconsistently across devices (TL #907, declined); the bridge splits a model
    with accelerate's device map instead.
    """
    if not isinstance(model, TLModel) or not hasattr(model, "cfg"):
        raise InvalidInputError(
            f"expected a TransformerLens model (HookedTransformer or TransformerBridge), got "
            f"{type(model).__name__}. Load one with bl.load_model() or TransformerLens."
        )
    n_devices = getattr(model.cfg, "n_devices", 1)
    if isinstance(n_devices, int) and n_devices > 1 and not is_bridge(model):
        raise UnsupportedModelError(
            f"this {type(model).__name__} is split over cfg.n_devices={n_devices} devices; TransformerLens 3.x "
            "HookedTransformer does not place a split model consistently (TransformerLens GitHub issue #907), so bayes_lens refuses "
            "it. Load the model as a TransformerBridge split by accelerate instead: "
            "TransformerBridge.boot_transformers(name, n_devices=N) (or device_map='auto' / a dict), or use one "
            "device (n_devices=1)."
        )


@dataclass(frozen=True)
class ModelInfo:
    """Shape and identity of a model, read from its config."""

    kind: str  # "hooked" | "bridge"
    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    n_ctx: int
    processed: bool
    processing: str

    @property
    def kv_dim(self) -> int:
        """Size of one final-token value sample: n_kv_heads · d_head."""
        return self.n_kv_heads * self.d_head


def model_info(model) -> ModelInfo:
    """Read layers, heads (query and key/value), widths and processing state from ``model``."""
    check_model(model)
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    n_kv = getattr(cfg, "n_key_value_heads", None) or n_heads
    d_model = int(cfg.d_model)
    d_head = int(getattr(cfg, "d_head", None) or d_model // n_heads)
    processed, how = processing(model)
    return ModelInfo(
        kind="bridge" if is_bridge(model) else "hooked",
        name=str(getattr(cfg, "model_name", None) or type(model).__name__),
        n_layers=int(cfg.n_layers),
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        d_head=d_head,
        d_model=d_model,
        d_vocab=int(getattr(cfg, "d_vocab", 0) or 0),
        n_ctx=int(getattr(cfg, "n_ctx", 0) or 0),
        processed=processed,
        processing=how,
    )


def resolve_layer(model_or_n_layers, layer: int) -> int:
    """Turn a possibly negative layer index into ``0 <= layer < n_layers`` or raise LayerIndexError."""
    n = model_or_n_layers if isinstance(model_or_n_layers, int) else int(model_or_n_layers.cfg.n_layers)
    import numbers

    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        if isinstance(layer, Tensor) and layer.numel() == 1 and not layer.is_floating_point():
            layer = int(layer)
        else:
            raise LayerIndexError(f"layer must be an integer, got {layer!r}.")
    layer = int(layer)
    if not -n <= layer < n:
        raise LayerIndexError(
            f"layer {layer} is out of range for a model with {n} layers; use 0..{n - 1} or -{n}..-1."
        )
    return layer % n


def resolve_layers(model, layers) -> List[int]:
    """Resolve an int, a sequence of ints, or ``"all"`` into a sorted list of distinct layers."""
    n = int(model.cfg.n_layers)
    if isinstance(layers, str):
        if layers != "all":
            raise LayerIndexError(f"layers must be an int, a list of ints or 'all', got {layers!r}.")
        return list(range(n))
    if isinstance(layers, int):
        return [resolve_layer(n, layers)]
    out = sorted({resolve_layer(n, layer) for layer in layers})
    if not out:
        raise LayerIndexError("the list of layers is empty.")
    return out


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


def processing(model) -> Tuple[bool, str]:
    """Whether the model's weights were processed, and how (a short description).

    HookedTransformer: ``normalization_type`` ``"LNPre"``/``"RMSPre"`` means layer norm was folded
    into the next weights; an embedding whose rows all have mean 0 means writing weights were
    centred (:func:`writing_weights_centred`); value biases folded into ``b_O`` are named too
    (:func:`value_biases_folded`), but alone they leave the basis raw (False): directions and ``W_K``
    are the raw model's, only ``hook_v`` is shifted by a constant. TransformerBridge: ``enable_compatibility_mode()`` / ``process_weights()``.
    """
    if is_bridge(model):
        done = bool(getattr(model, "_weights_processed", False))
        compat = bool(getattr(model, "compatibility_mode", False))
        if done:
            return True, "bridge weights processed (enable_compatibility_mode / process_weights)"
        if compat:
            return False, "bridge in compatibility mode without weight processing"
        return False, "raw weights"
    cfg = model.cfg
    reasons = []
    if getattr(cfg, "normalization_type", None) in ("LNPre", "RMSPre"):
        reasons.append(f"layer norm folded (normalization_type={cfg.normalization_type!r})")
    if writing_weights_centred(model):
        reasons.append("writing weights centred")
    folded = _hooked_value_biases_folded(model)
    if reasons:
        return True, "; ".join(reasons + (["value biases folded"] if folded else []))
    if folded:
        # fold_value_biases alone: hook_v is shifted by -b_V, but directions and W_K are the raw model's
        # (the basis is raw); said here so that nobody reads it as untouched weights
        return False, "value biases folded into b_O (fold_value_biases); otherwise raw weights"
    return False, "raw weights"


def key_weights(model, layer: int, *, info: Optional[ModelInfo] = None) -> Float[Tensor, "n_kv_heads d_model d_head"]:
    """W_K of ``layer`` per key/value head, ``[n_kv_heads, d_model, d_head]`` (float32, detached).

    Under grouped-query attention TL 3.9's ``HookedTransformer.W_K`` repeats each KV head
    ``n_heads / n_kv_heads`` times; the real parameter is ``attn._W_K``. A bridge keeps W_K grouped.
    Pass ``info=model_info(model)`` when reading many layers (it scans the embedding once).
    """
    info = model_info(model) if info is None else info
    layer = resolve_layer(info.n_layers, layer)
    attn = model.blocks[layer].attn
    w = None
    if is_bridge(model):
        w = _bridge_key_weight(model, layer, info)
    else:
        w = getattr(attn, "_W_K", None)
        if w is None:
            w = attn.W_K
    w = w.detach().float().cpu()
    if w.shape[0] == info.n_heads and info.n_kv_heads != info.n_heads:
        w = w[:: info.n_heads // info.n_kv_heads]  # undo repeat_interleave: keep one copy per KV head
    if tuple(w.shape) != (info.n_kv_heads, info.d_model, info.d_head):
        raise MissingHookError(
            f"could not read W_K of layer {layer} as [n_kv_heads, d_model, d_head] = "
            f"{[info.n_kv_heads, info.d_model, info.d_head]}; got {list(w.shape)}."
        )
    return w


def attention_window(model, layer: int) -> Optional[int]:
    """The sliding window of ``layer``'s attention (keys a query sees, itself included), or None.

    None means a global (full causal) layer. A HookedTransformer says so in ``cfg.use_local_attn``,
    ``cfg.attn_types`` and ``cfg.window_size``; a bridge in its Hugging Face config
    (``layer_types`` = ``"sliding_attention"`` with ``sliding_window``, or Mistral-style one
    ``sliding_window`` for every layer unless ``use_sliding_window`` is False). Both conventions
    mean: query ``q`` sees keys ``q - window + 1 .. q``.
    """
    check_model(model)
    n_layers = int(model.cfg.n_layers)
    layer = resolve_layer(n_layers, layer)
    if not is_bridge(model):
        cfg = model.cfg
        types = getattr(cfg, "attn_types", None)
        if getattr(cfg, "use_local_attn", False) and types is not None and types[layer] == "local":
            return int(cfg.window_size)
        return None
    hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
    if hf_cfg is None:
        return None
    if hasattr(hf_cfg, "get_text_config"):
        hf_cfg = hf_cfg.get_text_config()
    window = getattr(hf_cfg, "sliding_window", None)
    if not window:
        return None
    types = getattr(hf_cfg, "layer_types", None)
    if types is not None:  # transformers 5 spells out every layer (Gemma 2/3, Qwen2, ...)
        return int(window) if types[layer] in ("sliding_attention", "local") else None
    if getattr(hf_cfg, "use_sliding_window", True) is False:
        return None
    return int(window)  # Mistral-style: one window for every layer


def visible_keys(n_tokens: int, window: Optional[int]) -> Int[Tensor, "n_tokens"]:
    """Keys each query position ``q = 0 .. n_tokens-1`` attends over: ``min(q + 1, window)``.

    The log2 of these is the entropy of uniform attention (the focusing baseline, METHODS.md §3):
    for the final row ``log2(min(n_tokens, window))``; over all rows their mean.
    """
    counts = torch.arange(1, int(n_tokens) + 1)
    return counts if window is None else counts.clamp(max=int(window))


def _bridge_key_weight(model, layer: int, info: ModelInfo) -> Tensor:
    attn = model.blocks[layer].attn
    # Prefer the wrapped linear layer's own weight ([n_kv*d_head, d_model] in HF layout).
    for path in ("k.original_component", "k_proj", "k"):
        obj = attn
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        weight = getattr(obj, "weight", None)
        if isinstance(weight, Tensor) and weight.ndim == 2:
            if weight.shape == (info.n_kv_heads * info.d_head, info.d_model):
                return weight.view(info.n_kv_heads, info.d_head, info.d_model).transpose(1, 2)
            if weight.shape == (info.d_model, info.n_kv_heads * info.d_head):  # Conv1D layout
                return weight.view(info.d_model, info.n_kv_heads, info.d_head).permute(1, 0, 2)
    w = attn.W_K
    if w.ndim == 2:  # [d_model, n_kv*d_head]
        w = w.view(info.d_model, -1, info.d_head).permute(1, 0, 2)
    return w


_LOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model) -> "threading.RLock":
    """The re-entrant lock that serializes bayes_lens's forward passes (and patches) on ``model``.

    Hooks in TransformerLens are global state of the model: a hook one thread adds fires on another
    thread's forward pass. Every runner and patch context of bayes_lens holds this lock for the whole
    time its hooks are attached, so two threads analysing one model take turns instead of mixing.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = threading.RLock()
            _LOCKS[model] = lock
        return lock


def model_device(model) -> torch.device:
    """The device of the model's first parameter (CPU when it has none); where inputs go is :func:`input_device`."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model.cfg, "device", None) or "cpu")


def _first_param_device(module) -> Optional[torch.device]:
    params = getattr(module, "parameters", None)
    if params is None:
        return None
    try:
        for p in params():
            return p.device
    except (TypeError, AttributeError):
        return None
    return None


def input_device(model) -> torch.device:
    """The device token ids and masks go to: the token embedding's.

    A model split across devices (``TransformerBridge.boot_transformers(..., n_devices=N)`` or a
    ``device_map``) has its embedding on one device and other parameters elsewhere, so the first
    parameter's device is not where inputs belong. Order: the Hugging Face model's input embeddings
    (a bridge), ``model.embed`` (both kinds), ``cfg.device`` (which TransformerLens sets to the
    embedding's device), the first parameter, the CPU.
    """
    hf = getattr(model, "original_model", None)
    get = getattr(hf, "get_input_embeddings", None)
    if callable(get):
        try:
            dev = _first_param_device(get())
        except (NotImplementedError, AttributeError):
            dev = None
        if dev is not None:
            return dev
    embed = getattr(model, "embed", None)
    dev = _first_param_device(embed) if isinstance(embed, torch.nn.Module) else None
    if dev is not None:
        return dev
    cfg_device = getattr(getattr(model, "cfg", None), "device", None)
    if cfg_device:
        return torch.device(cfg_device)
    return model_device(model)


def _tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError(
            "the model has no tokenizer; pass token ids instead of strings, or attach a tokenizer "
            "(model.set_tokenizer(...))."
        )
    return tok


def tokenize(
    model,
    prompts: Sequence[str],
    *,
    padding_side: str = "right",
    prepend_bos: Optional[bool] = None,
) -> Tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Tokenize ``prompts`` into a padded batch: ``(tokens, attention_mask)`` on :func:`input_device`.

    ``prepend_bos`` defaults to the model's own setting (``cfg.default_prepend_bos``; False for the
    GGUF models, whose tokenizer adds no BOS). Raises for an empty list, a non-string, an empty
    prompt, or a prompt longer than the model's context. The same as
    ``pad_batch(model, encode_prompts(model, prompts), padding_side=...)``.
    """
    if padding_side not in ("left", "right"):
        raise InvalidInputError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    return pad_batch(model, encode_prompts(model, prompts, prepend_bos=prepend_bos), padding_side=padding_side)


def encode_prompts(model, prompts: Sequence[str], *, prepend_bos: Optional[bool] = None) -> List[List[int]]:
    """The token ids of each prompt (BOS first when ``prepend_bos``, default the model's setting), checked
    as :func:`tokenize` checks them; errors name the prompt by its position in ``prompts``."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings, not one string; wrap it: [prompt].")
    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("the prompt list is empty; pass at least one prompt.")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise InvalidInputError(f"prompt {i} is a {type(p).__name__}, expected a string.")
        if not p:
            raise InvalidInputError(f"prompt {i} is the empty string; every prompt needs at least one token.")
    tok = _tokenizer(model)
    if prepend_bos is None:
        prepend_bos = bool(getattr(model.cfg, "default_prepend_bos", False))
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if prepend_bos:
        bos = tok.bos_token_id
        if bos is None:
            raise TokenizationError("prepend_bos=True but the tokenizer has no BOS token.")
        ids = [[bos] + i for i in ids]
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    for i, seq in enumerate(ids):
        if not seq:
            raise TokenizationError(f"prompt {i} ({prompts[i]!r}) tokenizes to no tokens.")
        if n_ctx and len(seq) > n_ctx:
            raise TokenizationError(
                f"prompt {i} has {len(seq)} tokens but the model's context is {n_ctx}; shorten it."
            )
    return ids


def pad_batch(model, ids: Sequence[Sequence[int]], *, padding_side: str = "right"
              ) -> Tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Token id lists (from :func:`encode_prompts`) as a padded ``(tokens, attention_mask)`` batch on
    :func:`input_device`, padded with the tokenizer's pad token (else EOS) on ``padding_side``."""
    if padding_side not in ("left", "right"):
        raise InvalidInputError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    tok = _tokenizer(model)
    width = max(len(s) for s in ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    tokens = torch.full((len(ids), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, seq in enumerate(ids):
        if padding_side == "right":
            tokens[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        else:
            tokens[i, width - len(seq):] = torch.tensor(seq)
            mask[i, width - len(seq):] = 1
    device = input_device(model)
    return tokens.to(device), mask.to(device)


def mask_from_tokens(model, tokens: Int[Tensor, "batch pos"],
                     padding_side: Optional[str] = None) -> Int[Tensor, "batch pos"]:
    """The attention mask of padded ``tokens``: 0 on the run of pad tokens at the padded end, else 1.

    The padded end is the tokenizer's ``padding_side`` (``model.to_tokens`` pads on the right), as
    TransformerLens decides it; a leading BOS that shares the pad id stays real. Only the trailing
    (right) or leading (left) run of pad ids counts as padding, so a pad id inside a prompt is kept.
    """
    tok = _tokenizer(model)
    side = padding_side or getattr(tok, "padding_side", "right") or "right"
    if side not in ("left", "right"):
        raise InvalidInputError(f"padding_side must be 'left' or 'right', got {side!r}.")
    pad = tok.pad_token_id
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2:
        raise InvalidInputError(f"tokens must be [batch, pos], got shape {list(tokens.shape)}.")
    mask = torch.ones_like(tokens, dtype=torch.long)
    if pad is None:
        return mask
    real = tokens.ne(int(pad)).long()
    if side == "right":
        pad_run = real.flip(-1).cumsum(-1).flip(-1) == 0
    else:
        pad_run = real.cumsum(-1) == 0
        bos = getattr(tok, "bos_token_id", None)
        if bos is not None and int(bos) == int(pad) and bool(getattr(model.cfg, "default_prepend_bos", False)):
            first_real = pad_run.sum(-1) - 1
            rows = (first_real >= 0).nonzero().flatten()
            pad_run[rows, first_real[rows]] = False
    mask[pad_run] = 0
    if not bool(mask.any(dim=1).all()):
        bad = (~mask.bool().any(dim=1)).nonzero().flatten().tolist()
        raise InvalidInputError(f"rows {bad} of the tokens are all pad tokens; pass attention_mask= instead.")
    return mask


def is_activation_cache(obj) -> bool:
    """True for a TransformerLens ``ActivationCache`` (what ``run_with_cache`` returns)."""
    try:
        from transformer_lens import ActivationCache
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, ActivationCache)


def cache_model(cache):
    """The model an ``ActivationCache`` was made by (for its config: layers, heads, hook names)."""
    model = getattr(cache, "model", None)
    if model is None or not hasattr(model, "cfg"):
        raise InvalidInputError(
            "this ActivationCache does not record the model that made it; make it with "
            "model.run_with_cache(...) or pass the model and prompts instead."
        )
    return model


def cache_has(cache, name: str) -> bool:
    """Whether an ``ActivationCache`` holds the activation ``name``."""
    try:
        return name in cache.cache_dict
    except AttributeError:  # pragma: no cover
        return name in dict(cache.items())


def cache_contents(cache, *, limit: int = 8) -> str:
    """What a cache holds, for an error message: ``"blocks.{15-29}.attn.hook_v, hook_embed"``.

    Hook names under ``blocks.{l}.`` are grouped by the rest of the name with their layers as ranges;
    at most ``limit`` groups are listed (then "and N more"). ``"nothing"`` for an empty cache.
    """
    try:
        names = list(cache.cache_dict)
    except AttributeError:
        names = list(dict(cache.items()) if hasattr(cache, "items") else cache)
    groups: Dict[str, List[int]] = {}
    for name in map(str, names):
        m = re.match(r"blocks\.(\d+)\.(.+)$", name)
        key, layer = (m.group(2), int(m.group(1))) if m else (name, None)
        groups.setdefault(key, [])
        if layer is not None:
            groups[key].append(layer)
    if not groups:
        return "nothing"

    def ranges(layers):
        layers, out = sorted(set(layers)), []
        for k in layers:
            if out and k == out[-1][1] + 1:
                out[-1][1] = k
            else:
                out.append([k, k])
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)

    said = [f"blocks.{{{ranges(layers)}}}.{key}" if layers else key for key, layers in groups.items()]
    more = len(said) - limit
    return ", ".join(said[:limit]) + (f" and {more} more" if more > 0 else "")


# --- read-only questions about a model (weight basis, padding) --------------------------------------

#: architectures whose attention has no value bias and whose norms have no bias (RMSNorm)
_NO_VALUE_BIAS = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "GemmaForCausalLM",
                  "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Qwen3ForCausalLM")
_VALUE_PROJECTIONS = ("v_proj", "c_attn", "query_key_value", "qkv_proj", "Wqkv")


def _hooked_value_biases_folded(model) -> Optional[bool]:
    """A HookedTransformer's own weights say whether ``fold_value_biases`` moved value biases out of ``hook_v``.

    Folding sets every ``b_V`` to zero and adds ``b_V·W_O`` to ``b_O``: all ``b_V`` zero with some ``b_O``
    non-zero is folded (True), any non-zero ``b_V`` is not (False), and all-zero biases leave nothing that
    folding could have moved (False: ``hook_v`` is the raw value). None when the blocks have no ``b_V``.
    Read from the weights, not from the other processing flags: ``fold_value_biases`` alone (what
    ``from_pretrained`` keeps with fold_ln, center_writing_weights and center_unembed turned off) leaves
    layer norm and the embedding raw.
    """
    b_v, b_o = [], []
    for blk in getattr(model, "blocks", ()):
        attn = getattr(blk, "attn", None)
        v, o = getattr(attn, "b_V", None), getattr(attn, "b_O", None)
        if isinstance(v, Tensor):
            b_v.append(bool(v.detach().ne(0).any()))
        if isinstance(o, Tensor):
            b_o.append(bool(o.detach().ne(0).any()))
    if not b_v:
        return None
    if any(b_v):
        return False
    return any(b_o)


def value_biases_folded(model) -> Optional[bool]:
    """Whether weight processing (``fold_value_biases``) moved non-zero value biases out of ``hook_v``.

    True: ``hook_v`` is the raw value minus a constant per head (b_V, including a folded LayerNorm
    bias), so an operation that is not shift-invariant (``v − (v·u)u``) acts differently than on the
    raw model. False: raw weights, or an architecture without value or norm biases (Llama, Gemma,
    Mistral, ...), or biases still in place. None: processed, and the architecture is unknown.
    A HookedTransformer is read from its weights (``fold_value_biases`` alone included, which leaves
    :func:`processing`'s other signs raw); a bridge from its processing state and architecture.
    """
    if not is_bridge(model):
        folded = _hooked_value_biases_folded(model)
        if folded is not None:
            return folded
    processed, _ = processing(model)
    if not processed:
        return False
    if is_bridge(model):
        hf = getattr(model, "original_model", None)
        if hf is None:
            return None
        for name, mod in hf.named_modules():
            if isinstance(mod, torch.nn.LayerNorm) and getattr(mod, "bias", None) is not None:
                return True
            if name.endswith(_VALUE_PROJECTIONS) and getattr(mod, "bias", None) is not None:
                return True
        return False
    cfg = model.cfg
    if getattr(cfg, "normalization_type", None) in ("LN", "LNPre"):
        return True
    arch = getattr(cfg, "original_architecture", None)
    if arch in _NO_VALUE_BIAS:
        return False
    return None if arch is None else True


def writing_weights_centred(model) -> bool:
    """Whether the weights that write to the residual stream were centred (``center_writing_weights``).

    Centring makes every residual-stream vector mean-zero over ``d_model``: ``hook_resid_*`` is then the
    raw residual projected onto the mean-zero subspace, so its principal directions (a
    ``site="resid_post"`` entropy axis) and any intervention along them differ from the raw model's.
    ``hook_v`` is unchanged (layer norm removes the mean anyway; RMSNorm models are never centred).
    Read from the embedding (both model kinds): centring makes *every* row of ``W_E`` mean zero, so
    4,096 evenly spaced rows decide it.
    """
    try:
        w_e = model.W_E.detach()
    except Exception:  # noqa: BLE001 - a model without a readable embedding: nothing to say
        return False
    if w_e.ndim != 2 or w_e.shape[-1] < 2:
        return False
    w_e = w_e[:: max(1, w_e.shape[0] // 4096)].float()
    return float(w_e.mean(-1).abs().max()) < 1e-5 * float(w_e.abs().mean() + 1e-12)


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


def masks_left_padding_from_tokens(model) -> bool:
    """Whether ``model(tokens)`` without ``attention_mask=`` masks left padding itself.

    A HookedTransformer builds the mask from the tokens when its tokenizer pads on the left (TL's
    ``get_attention_mask``); a TransformerBridge passes no mask to the Hugging Face model, so its
    real tokens attend to left pads.
    """
    return not is_bridge(model)
