"""The adapter's model facet: what kind of TransformerLens model this is, its shape, its weights.

Part of :mod:`bayes_lens.adapter` (the one package that knows TransformerLens internals; METHODS.md §0
"Model kinds" and "Weights"): the model kinds (:func:`is_bridge`, :func:`has_hooked_transformer`,
:func:`check_model`), their shape (:func:`model_info`, :func:`resolve_layer`), whether and how weights
were processed (:func:`processing`, :func:`value_biases_folded`, :func:`writing_weights_centred`), the
per-KV-head key weights (:func:`key_weights`) and local-attention windows (:func:`attention_window`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Protocol, Tuple, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .._validate import check_int, describe
from ..errors import InvalidInputError, LayerIndexError, MissingHookError, UnsupportedModelError

__all__ = [
    "TLModel",
    "has_hooked_transformer",
    "is_bridge",
    "check_model",
    "ModelInfo",
    "model_info",
    "resolve_layer",
    "resolve_layers",
    "processing",
    "key_weights",
    "attention_window",
    "visible_keys",
    "value_biases_folded",
    "writing_weights_centred",
]


@runtime_checkable
class TLModel(Protocol):
    """Structural type of a TransformerLens model (HookedTransformer or TransformerBridge)."""

    cfg: object

    def run_with_cache(self, *args, **kwargs): ...

    def run_with_hooks(self, *args, **kwargs): ...

    def hooks(self, *args, **kwargs): ...

    def to_tokens(self, *args, **kwargs): ...


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
            f"expected a TransformerLens model: a HookedTransformer or TransformerBridge, got {describe(model)}; load "
            "one with bl.load_model() (or bl.load_model('path/to.gguf')) or TransformerLens."
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
    if isinstance(layer, Tensor) and layer.numel() == 1 and not layer.is_floating_point():
        layer = int(layer)
    layer = check_int(layer, "layer", error=LayerIndexError)
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
