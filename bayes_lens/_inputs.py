"""Inputs normalised once: whatever an analysis is given becomes one reduced cache.

Every analysis that reads a run's statistics (Paper A §4.2/§5.1 and the SULA evaluation, METHODS.md
§1–§6) takes the same forms of input, and each is turned into a
:class:`~bayes_lens.reduced.ReducedCache` here, at the analysis's entry, by the one function
:func:`as_reduced`:

* a model and prompts → :func:`bayes_lens.collect.collect` (one batched pass; inside
  ``bl.shard.sharded(...)`` in checked shards);
* what ``run_with_cache`` returned: the ``(logits, cache)`` pair, an ``ActivationCache`` (with
  ``logits=``), or a plain dict of tensors keyed by hook name (``dict(cache.items())``, with
  ``model=``) → :func:`bayes_lens.collect.reduce_cache`, the runner's reducers;
* a :class:`~bayes_lens.reduced.ReducedCache` (from ``collect``, ``bl.shard.merge``, or
  ``ReducedCache.load``) → checked to hold what the analysis reads.

So the statistics have one code path and every form gives the streaming numbers.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Optional, Sequence, Tuple

from torch import Tensor

from . import adapter
from .collect import check_prompts, collect, reduce_cache
from ._validate import check_int
from .errors import InvalidInputError, LayerIndexError
from .reduced import TAIL_LOGITS, TOKEN_LOGPROBS, ReducedCache, row_name

__all__ = ["as_reduced", "classify", "is_cache_like", "source_model", "is_layer_dict"]


def classify(obj) -> str:
    """What kind of input ``obj`` is, decided once: ``"reduced"`` (a :class:`ReducedCache`), ``"pair"``
    (``(logits, cache)``), ``"cache"`` (an ActivationCache), ``"dict"`` (tensors keyed by hook name),
    ``"layers"`` (arrays keyed by layer number) or ``"model"`` (anything else; checked where it is used)."""
    if isinstance(obj, ReducedCache):
        return "reduced"
    if adapter.is_activation_cache(obj):
        return "cache"
    if isinstance(obj, Mapping):
        return "layers" if is_layer_dict(obj) else "dict"
    if (isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], Tensor)
            and (adapter.is_activation_cache(obj[1]) or isinstance(obj[1], Mapping))):
        return "pair"
    return "model"


def is_layer_dict(obj) -> bool:
    """A non-empty dict keyed by layer numbers (the ``{layer: values}`` arrays form), not a cache."""
    return (isinstance(obj, Mapping) and not isinstance(obj, ReducedCache) and bool(obj)
            and all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in obj))


def is_cache_like(obj) -> bool:
    """True for what ``run_with_cache`` returns or holds: an ActivationCache, a dict of tensors keyed by hook
    name, or the ``(logits, cache)`` pair (a :class:`ReducedCache` is not: it is already reduced)."""
    return classify(obj) in ("pair", "cache", "dict")


def source_model(source, model=None, kind: Optional[str] = None):
    """The model behind ``source``: itself, ``model=``, or the model an ActivationCache records; None for a
    reduced cache or a dict without ``model=``."""
    if model is not None:
        adapter.check_model(model)
        return model
    kind = kind or classify(source)
    if kind == "model":
        adapter.check_model(source)
        return source
    cache = source[1] if kind == "pair" else source
    return adapter.cache_model(cache) if kind in ("pair", "cache") and adapter.is_activation_cache(cache) else None


def _layers(model, spec, rc: Optional[ReducedCache], site: str):
    spec = [spec] if isinstance(spec, (str, int)) else list(spec)
    if not spec:
        return []
    if model is not None:
        return adapter.resolve_layers(model, spec)
    held = rc.layers(site) if rc is not None else []
    out = []
    for layer in spec:
        layer = check_int(layer, "layer", error=LayerIndexError)
        if layer < 0:
            if len(held) != 1 or layer != -1:
                raise LayerIndexError(f"without the model, pass a non-negative layer this reduced cache holds "
                                      f"({held}), or pass model= to resolve {layer}.")
            layer = held[0]
        out.append(int(layer))
    return out


def as_reduced(source, prompts=None, *, model=None, logits=None, attention_mask=None, tokens=None,
               value_layers=(), resid_layers=(), attention: bool = False, attention_positions: str = "last",
               token_ids=None, tail_positions: int = 0, fwd_hooks=(), batch_size: int = 16,
               padding_side: str = "right", progress: Optional[bool] = None, desc: str = "collect",
               min_prompts: int = 1) -> Tuple[ReducedCache, object]:
    """``(reduced cache, model or None)`` holding what an analysis reads, from any documented input form.

    ``prompts`` are run when ``source`` is a model (at least ``min_prompts``); with a cache or a reduced
    cache they are not run, only counted against its rows. ``logits``, ``attention_mask`` and
    ``tokens`` apply to a cache; ``fwd_hooks``, ``batch_size``, ``padding_side``, ``progress`` and
    ``desc`` to a run. What to keep: ``value_layers`` / ``resid_layers`` (final-token rows),
    ``attention`` (entropies at ``attention_positions``), ``token_ids`` (their log-probabilities) and
    ``tail_positions`` (see :func:`bayes_lens.collect.collect`).
    """
    kind = classify(source)
    if kind == "layers":
        raise InvalidInputError(
            "a dict keyed by layer numbers holds arrays, not a cache: pass what run_with_cache returned (the "
            "(logits, cache) pair, the ActivationCache, or dict(cache.items()) keyed by hook name, with model=), "
            "a bl.collect reduced cache, or a model with prompts.")
    m = source_model(source, model, kind)
    texts = None if prompts is None else check_prompts(prompts)
    needs = dict(attention=attention, attention_positions=attention_positions, token_ids=token_ids,
                 tail_positions=tail_positions)
    if kind == "reduced":
        rc = source
        v = _layers(m, value_layers, rc, "v")
        r = _layers(m, resid_layers, rc, "resid_post")
        _check_holds(rc, v, r, m, **needs)
    elif kind != "model":
        if fwd_hooks:
            raise InvalidInputError("fwd_hooks apply to a run of the model; a cache was already made. Make the cache "
                                    "under those hooks (model.run_with_cache(..., fwd_hooks=...)) or pass the model.")
        rc = reduce_cache(source, model=m, logits=logits, attention_mask=attention_mask, tokens=tokens,
                          value_layers=value_layers, resid_layers=resid_layers, **needs)
    else:
        if texts is None:
            raise InvalidInputError("prompts are required with a model (or pass a cache made with run_with_cache, "
                                    "or a reduced cache).")
        if len(texts) < min_prompts:
            raise InvalidInputError(f"this analysis needs at least {min_prompts} prompts, got {len(texts)}; "
                                    "pass more prompts.")
        return collect(source, texts, value_layers=value_layers, resid_layers=resid_layers, fwd_hooks=fwd_hooks,
                       batch_size=batch_size, padding_side=padding_side, progress=progress,
                       desc=f"{desc} {len(texts)} prompts", **needs), m
    if any(x is not None for x in (logits, attention_mask, tokens)) and kind == "reduced":
        raise InvalidInputError("logits=, attention_mask= and tokens= describe a cache; a reduced cache is already "
                                "reduced with its own. Drop them.")
    if texts is not None and rc.n_prompts != len(texts):
        raise InvalidInputError(f"the cache holds {rc.n_prompts} prompts but {len(texts)} were given; pass the "
                                "prompts the cache was made on.")
    if rc.n_prompts < min_prompts:
        raise InvalidInputError(f"this analysis needs at least {min_prompts} prompts, the cache holds {rc.n_prompts}.")
    return rc, m


def _check_holds(rc: ReducedCache, v_layers: Sequence[int], r_layers: Sequence[int], model, *, attention,
                 attention_positions, token_ids, tail_positions) -> None:
    """A reduced cache given as input holds what the analysis reads, or a MissingHookError saying how to get it."""
    for site, layers, arg in (("v", v_layers, "value_layers"), ("resid_post", r_layers, "resid_layers")):
        for layer in layers:
            rc.require(row_name(layer, site), f"collect with {arg}=[{layer}].")
    if attention:
        n_layers = None if model is None else int(model.cfg.n_layers)
        rc.attention_entropy_bits(n_layers, positions=attention_positions)  # names the positions it does hold
    if token_ids is not None:
        lp = rc.require(TOKEN_LOGPROBS, "collect with token_ids= (the label token ids).")
        if int(lp.shape[1]) != len(list(token_ids)):
            raise InvalidInputError(f"the reduced cache holds log-probabilities of {int(lp.shape[1])} tokens, not the "
                                    f"{len(list(token_ids))} asked for; collect with those token_ids.")
    if tail_positions:
        rc.require(TAIL_LOGITS, f"collect with tail_positions={tail_positions}.")
