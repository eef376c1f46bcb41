"""The model adapter: the one package that knows TransformerLens internals (METHODS.md §0).

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

The package is split by facet, each a private module behind this one face (import from
``bayes_lens.adapter``, never from a facet):

==============  =====================================================================================
facet           what it owns
==============  =====================================================================================
``_models``     model kinds, shape (:class:`ModelInfo`), layers, weight processing, key weights, windows
``_hooks``      hook names and sites, the hook-point registry, a run's added hooks, the final unembedding
``_tokens``     tokenizing, padding and masks, users' ``ActivationCache`` objects
``_runtime``    devices and the per-model lock
``_weights``    the unembedding, the final norm, an MLP's W_out, TL's projection kernel and interchange (DAS)
``_resume``     running only the blocks after a layer from a kept residual stream, on every kind
==============  =====================================================================================

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

from ._runtime import (  # noqa: F401
    input_device,
    model_device,
    model_lock,
    weights_state,
)
from ._models import (  # noqa: F401
    ModelInfo,
    TLModel,
    attention_window,
    check_model,
    has_hooked_transformer,
    is_bridge,
    key_weights,
    model_info,
    processing,
    resolve_layer,
    resolve_layers,
    value_biases_folded,
    visible_keys,
    writing_weights_centred,
)
from ._hooks import (  # noqa: F401
    HookResolver,
    SITES,
    VECTOR_SITES,
    added_hooks,
    following_saes,
    sae_output_names,
    any_forward_hooks,
    check_hooks,
    check_site,
    final_token_unembedding,
    has_hooks,
    hook_module_path,
    hook_name,
    hook_point,
    hook_names,
    hooked_points,
    live_hook_point,
    output_module,
    register_hook_points,
    site_processing,
    unregister_hook_points,
)
from ._weights import (  # noqa: F401
    FinalNorm,
    parameter_counts,
    final_norm,
    mlp_out_weights,
    projection_kernel,
    interchange,
    untrained_copy,
    unembedding,
)
from ._resume import prefix_cache, run_final_from_layer, run_from_layer  # noqa: F401
from ._tokens import (  # noqa: F401
    cache_contents,
    cache_has,
    cache_model,
    encode_prompts,
    is_activation_cache,
    mask_from_tokens,
    masks_left_padding_from_tokens,
    pad_batch,
    tokenize,
)

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
    "hook_point",
    "any_forward_hooks",
    "hooked_points",
    "hook_module_path",
    "register_hook_points",
    "output_module",
    "HookResolver",
    "live_hook_point",
    "added_hooks",
    "following_saes",
    "sae_output_names",
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
    "weights_state",
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
    "FinalNorm",
    "final_norm",
    "parameter_counts",
    "unembedding",
    "mlp_out_weights",
    "projection_kernel",
    "run_from_layer",
    "prefix_cache",
    "run_final_from_layer",
    "interchange",
    "untrained_copy",
]
