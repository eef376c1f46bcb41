"""Running only the blocks after layer L from a kept residual stream, on every model kind (METHODS.md §13,
"resuming").

An intervention at ``hook_resid_post`` of layer L changes nothing in blocks 0..L, so its pass needs only the
blocks after L, fed with the clean stream kept after L (edited). How each kind does that:

* **HookedTransformer**: TransformerLens's own ``forward(resid, start_at_layer=L + 1)``, which loops over
  ``blocks[L + 1:]`` only.
* **TransformerBridge** (TL 3.x and 4.x): the bridge hands the layer loop to the wrapped transformers model,
  so TL 4.3's ``start_at_layer`` still executes blocks 0..L (its docstring says so) and TL 3.9 has none. Here
  the forward runs on the tokens as usual (so the embedding, the attention masks and the rotary or position
  inputs are built by the model's own code, for the right length and padding), but while it runs the wrapped
  layer of each block 0..L-1 returns its input untouched and that of block L returns the kept stream: those
  blocks cost nothing, block L + 1 receives exactly the kept stream, and every hook point of the later blocks
  fires as in a whole pass. The output format of a wrapped layer is that of transformers ≥ 5 (the hidden state
  tensor); a caller checks the first batch against the whole pass (``KeptStream.check``) and falls back to
  whole passes where a kind differs.

An edit at the final position only changes nothing at the earlier positions (causal attention), so there only
the final position needs the later blocks, attending to the clean prefix's keys and values:
:func:`prefix_cache` keeps the model's own key-value cache of the clean prefix (TransformerLens's frozen
``TransformerLensKeyValueCache`` on a HookedTransformer; the transformers cache on a bridge, whose attention
reads it under the name TransformerLens expects) and :func:`run_final_from_layer` runs the final position from
layer L against it, several edits of each prompt at once (the cache's rows repeated). Prompts of different
lengths share one cache and one call: the clean prefix pass runs causally over the batch's right-padded tokens
up to the longest prefix (a row's first ``length`` keys are its clean prefix's, whatever follows them), and
each step masks the keys at and after a row's own length and places the final token at that position
(TransformerLens derives the rotary positions from the mask; a bridge is handed ``position_ids``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Optional

import torch
from torch import Tensor

from ._models import is_bridge, model_info


def _wrapped_layer(block) -> Optional[torch.nn.Module]:
    return getattr(block, "original_component", None)


@contextlib.contextmanager
def _skipped_blocks(model, layer: int, resid: Tensor):
    """Blocks 0..``layer`` of a bridge do no work; block ``layer`` hands on ``resid``."""
    patched = []

    def passthrough(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def inject(*args, **kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        return resid.to(device=h.device, dtype=h.dtype)

    try:
        for j in range(layer + 1):
            inner = _wrapped_layer(model.blocks[j])
            if inner is None:
                raise NotImplementedError(f"block {j} of this bridge wraps no layer module")
            inner.forward = inject if j == layer else passthrough
            patched.append(inner)
        yield
    finally:
        for inner in patched:
            if "forward" in vars(inner):
                del inner.forward


def run_from_layer(model, resid: Tensor, layer: int, tokens: Tensor, attention_mask: Tensor) -> Tensor:
    """The model's logits with ``resid`` ``[batch, pos, d_model]`` as ``hook_resid_post`` of ``layer``: only the
    blocks after ``layer``, the final norm and the unembedding run (see the module docstring for each kind).
    ``tokens`` and ``attention_mask`` are the batch the stream was kept from. Hooks already on the model fire
    for the later blocks as in a whole pass."""
    n_layers = int(model_info(model).n_layers)
    if not is_bridge(model):
        if layer + 1 < n_layers:
            return model(resid, start_at_layer=layer + 1, attention_mask=attention_mask, return_type="logits")
        return model.unembed(model.ln_final(resid))
    if resid.shape[:2] != tokens.shape:
        raise ValueError(f"the kept stream's shape {list(resid.shape[:2])} is not the tokens' {list(tokens.shape)}")
    with _skipped_blocks(model, layer, resid):
        return model(tokens, attention_mask=attention_mask, return_type="logits")


# ------------------------------------------------------------------ an edit at the final position only


def _tl_kv_cache_class():
    try:
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as cls
    except ImportError:  # pragma: no cover - older TransformerLens names
        from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache as cls
    return cls


@contextlib.contextmanager
def _cache_named_for_tl(model):
    """transformers 5 hands a layer's attention its key-value cache as ``cache=``; the bridges' attention (TL 3.9
    and 4.3) reads ``past_key_values=`` (or ``layer_past=``), so without this it leaves the cache empty and a cached
    step attends to itself alone. A forward pre-hook on each block's attention passes the cache under the name
    TransformerLens reads; taken off on exit."""
    def rename(mod, args, kwargs):
        if kwargs.get("cache") is not None and kwargs.get("past_key_values") is None:
            kwargs = dict(kwargs)
            kwargs["past_key_values"] = kwargs["cache"]
            return args, kwargs
        return None

    handles = [block.attn.register_forward_pre_hook(rename, with_kwargs=True) for block in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclasses.dataclass(frozen=True)
class _Prefix:
    """A clean prefix's key-value cache (``kv``, the model's own) over right-padded rows and each row's number
    of real prefix tokens (``lengths`` ``[g]``, long, on the CPU)."""

    kv: object
    lengths: Tensor


def prefix_cache(model, tokens: Tensor, lengths: Optional[Tensor] = None) -> _Prefix:
    """The model's own key-value cache of the clean pass over ``tokens`` ``[g, t]``: TransformerLens's frozen
    ``TransformerLensKeyValueCache`` on a HookedTransformer, the Hugging Face cache that
    ``return_type="logits_and_cache"`` hands back on a bridge. ``lengths`` ``[g]`` (default: ``t`` each) is each
    row's number of real prefix tokens, its final token then sitting at that position: the pass is causal and
    unmasked, so a row's first ``length`` keys and values are those of its own prefix alone, and the later ones
    (its final token, padding) are masked out by :func:`run_final_from_layer`. Opaque: pass it to that."""
    from ._hooks import final_token_unembedding

    g, t = tokens.shape
    lengths = torch.full((g,), t, dtype=torch.long) if lengths is None else torch.as_tensor(lengths).long().cpu()
    if lengths.shape != (g,) or t < 1 or bool((lengths < 0).any() | (lengths > t).any()):
        raise ValueError(f"prefix lengths {lengths.tolist()} do not fit tokens of shape {list(tokens.shape)}")
    ones = torch.ones_like(tokens)
    if not is_bridge(model):
        cache = _tl_kv_cache_class().init_cache(model.cfg, model.cfg.device, g)
        model(tokens, attention_mask=ones, past_kv_cache=cache, return_type=None)
        cache.freeze()
        return _Prefix(cache, lengths)
    with final_token_unembedding(model, torch.full((g,), t - 1, dtype=torch.long)), _cache_named_for_tl(model):
        _, cache = model(tokens, attention_mask=ones, use_cache=True, return_type="logits_and_cache")
    return _Prefix(cache, lengths)


def _repeated_tl_cache(cache, repeats: int, first: int):
    """A frozen copy of a TransformerLens cache with every row repeated ``repeats`` times (consecutively) in the
    entries of blocks ``first`` onwards (the earlier blocks do not run)."""
    import dataclasses

    entries = [e if j < first or repeats == 1 else dataclasses.replace(
        e, past_keys=e.past_keys.repeat_interleave(repeats, 0), past_values=e.past_values.repeat_interleave(repeats, 0),
        frozen=True) for j, e in enumerate(cache.entries)]
    return dataclasses.replace(cache, entries=entries,
                               previous_attention_mask=cache.previous_attention_mask.repeat_interleave(repeats, 0),
                               frozen=True)


def _step_cache(cache, repeats: int, first: int):
    """A cache for one cached step that leaves ``cache`` as it was: its layer objects copied (a step rebinds their
    tensors by concatenation), the rows of blocks ``first`` onwards repeated ``repeats`` times, the earlier
    blocks' (which do not run; only their length is read) as zero-copy views. A cache without per-layer
    ``keys``/``values`` (another transformers) is deep-copied and repeated whole."""
    import copy

    layers = getattr(cache, "layers", None)
    if not layers or not all(hasattr(lay, "keys") and hasattr(lay, "values") for lay in layers):
        c = copy.deepcopy(cache)
        if repeats > 1:
            c.batch_repeat_interleave(repeats)
        return c
    c = copy.copy(cache)
    c.layers = [copy.copy(lay) for lay in layers]
    if repeats > 1:
        for j, lay in enumerate(c.layers):
            if j >= first:
                lay.keys, lay.values = lay.keys.repeat_interleave(repeats, 0), lay.values.repeat_interleave(repeats, 0)
            else:
                size = (lay.keys.shape[0] * repeats,) + tuple(lay.keys.shape[1:])
                lay.keys, lay.values = lay.keys[:1].expand(size), lay.values[:1].expand(size)
    return c


def _step_mask(lengths: Tensor, t: int, device) -> Tensor:
    """``[rows, t + 1]``: a row's first ``length`` cached keys and the new position; the rest masked out."""
    keys = torch.arange(t)[None, :] < lengths[:, None]
    return torch.cat([keys, torch.ones(len(lengths), 1, dtype=torch.bool)], 1).long().to(device)


def run_final_from_layer(model, resid: Tensor, layer: int, final_tokens: Tensor, cache: _Prefix,
                         repeats: int = 1) -> Tensor:
    """Logits ``[g·repeats, 1, vocab]`` at the final position when only that position's ``hook_resid_post`` of
    ``layer`` changed: ``resid`` ``[g·repeats, 1, d_model]`` is the edited final row (each prompt's ``repeats``
    edits consecutively), ``final_tokens`` ``[g, 1]`` the final tokens and ``cache`` the clean prefix's
    (:func:`prefix_cache`; row ``i``'s final token sits at position ``cache.lengths[i]``). Causal attention makes
    the earlier positions' later blocks equal to the clean pass's, so only the final position runs the blocks
    after ``layer``, against the cached keys and values of its own prefix (the rest masked), all rows in one
    call; the cache is left as it was (TransformerLens's is frozen; a bridge's is copied layer by layer)."""
    n_layers = int(model_info(model).n_layers)
    lengths = cache.lengths.repeat_interleave(repeats)
    if not is_bridge(model):
        if layer + 1 >= n_layers:
            return model.unembed(model.ln_final(resid))
        stacked = _repeated_tl_cache(cache.kv, repeats, layer + 1)
        mask = _step_mask(lengths, stacked.previous_attention_mask.shape[1], resid.device)
        return model(resid, start_at_layer=layer + 1, past_kv_cache=stacked, attention_mask=mask,
                     return_type="logits")
    c = _step_cache(cache.kv, repeats, layer + 1)
    toks = final_tokens.repeat_interleave(repeats, 0)
    mask = _step_mask(lengths, int(c.get_seq_length()), toks.device)
    position_ids = lengths[:, None].to(toks.device)
    with _skipped_blocks(model, layer, resid), _cache_named_for_tl(model), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
        return model(toks, attention_mask=mask, position_ids=position_ids, past_key_values=c, use_cache=True,
                     return_type="logits")
