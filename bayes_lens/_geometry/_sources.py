"""Where the geometry metrics read from: a model with prompts, a user's cache, or a Collection.

Every metric of Paper A §4.2/§5.1 (METHODS.md §1–§4) reads final-token rows, attention entropies and
next-token entropies. Whatever the user passes is turned into one
:class:`bayes_lens.collect.Collection` here — by the runner (:func:`bayes_lens.collect.collect`) for a
model and prompts, by :meth:`~bayes_lens.collect.Collection.from_cache` for a cache — so the
statistics have exactly one code path and give the same numbers from every source.
"""

from __future__ import annotations

from typing import Optional, Sequence

import einops
import numpy as np

from .. import adapter
from ..collect import Collection, check_prompts, collect, is_cache_like, source_model
from .._validate import check_choice, check_positive_int, check_seed
from ..errors import InvalidInputError

__all__ = ["SITES", "check_site", "check_stats", "source_model", "source_collection", "resolve_layer", "need_prompts",
           "expand_kv_heads"]

#: accepted spellings of the value-manifold sites
SITES = {"v": "v", "hook_v": "v", "resid_post": "resid_post"}


def check_stats(seed, n_boot=None, n_null=None, n_perm=None) -> None:
    """Seeds and resample counts, checked before any forward pass."""
    check_seed(seed)
    for name, value in (("n_boot", n_boot), ("n_null", n_null), ("n_perm", n_perm)):
        if value is not None:
            check_positive_int(value, name)


def check_site(site: str) -> str:
    """``"v"`` (``hook_v``, the default) or ``"resid_post"``; also accepts ``"hook_v"``."""
    return SITES[check_choice(site, "site", list(SITES))]


def need_prompts(prompts, minimum: int = 3) -> list:
    prompts = check_prompts(prompts)
    if len(prompts) < minimum:
        raise InvalidInputError(f"PCA across prompts needs at least {minimum} prompts, got {len(prompts)}; "
                                "pass more prompts.")
    return prompts


def source_collection(source, prompts=None, *, layers: Sequence[int] = (), site: str = "v",
                      attention: bool = False, positions: str = "last", attention_mask=None, tokens=None,
                      logits=None, model=None, batch_size: int = 16, padding_side: str = "right",
                      progress: Optional[bool] = None, desc: str = "collect", min_prompts: int = 3, run=None):
    """(Collection, model or None) from a model + prompts, a cache (pair, ActivationCache, dict) or a
    Collection, holding final-token rows of ``site`` at ``layers`` and, with ``attention``, entropies.

    ``run`` (a :class:`bayes_lens.shard.AnalysisRun`) collects a model's rows through an engine."""
    if isinstance(source, Collection):
        if prompts is not None:
            raise InvalidInputError("pass either a model with prompts, or a Collection without prompts.")
        return source, model
    if is_cache_like(source):
        if prompts is not None:
            raise InvalidInputError("pass either a model with prompts, or a cache without prompts.")
        col = Collection.from_cache(
            source, model=model, logits=logits, attention_mask=attention_mask, tokens=tokens,
            value_layers=layers if site == "v" else (), resid_layers=layers if site != "v" else (),
            attention=attention, attention_positions=positions)
        return col, source_model(source, model)
    adapter.check_model(source)
    if prompts is None:
        raise InvalidInputError("prompts are required with a model (or pass a cache made with run_with_cache).")
    prompts = need_prompts(prompts, min_prompts)
    col = (collect if run is None else run.collect)(source, prompts, value_layers=list(layers) if site == "v" else (),
                  resid_layers=list(layers) if site != "v" else (), attention=attention, attention_positions=positions,
                  batch_size=batch_size, padding_side=padding_side, progress=progress,
                  desc=f"{desc} {len(prompts)} prompts")
    return col, source


def resolve_layer(source, model, layer: int, site: str) -> int:
    """The layer index a metric reads: resolved against the model, or (a Collection without a model)
    the one layer it holds."""
    if model is not None:
        return adapter.resolve_layer(model, layer)
    store = source.final_values if site == "v" else source.final_resid
    keys = sorted(store)
    if layer in store:
        return layer
    if layer == -1 and len(keys) == 1:
        return keys[0]
    raise InvalidInputError(f"with a Collection pass a non-negative layer index it holds: {keys}.")


def expand_kv_heads(x: np.ndarray, model, expand_kv: bool) -> np.ndarray:
    """Repeat KV heads to the query-head layout (``expand_kv=True``), as grouped-query attention does.

    ``x`` is ``[prompt, (kv_head d_head)]`` (hook_v flattened over KV heads); each KV head is repeated
    ``n_heads // n_kv_heads`` times next to itself (query head h reads KV head h // rep, as in
    ``torch.repeat_interleave`` in TransformerLens), written as an einops pattern.
    """
    if not expand_kv:
        return x
    if model is None:
        raise InvalidInputError("expand_kv=True needs the model (or a cache that records it).")
    info = adapter.model_info(model)
    rep = info.n_heads // info.n_kv_heads
    return einops.repeat(x, "b (kv d) -> b (kv rep d)", kv=info.n_kv_heads, d=info.d_head, rep=rep)
