"""Checks the geometry metrics share: seeds and resample counts, sites, layers, KV-head expansion.

Every metric of Paper A §4.2/§5.1 (METHODS.md §1–§4) reads final-token rows, attention entropies and
next-token entropies from one :class:`~bayes_lens.reduced.ReducedCache`, made at its entry by
``bayes_lens._inputs.as_reduced`` from whatever the user passed.
"""

from __future__ import annotations

import einops
import numpy as np

from .. import adapter
from ..adapter import check_site
from ..reduced import ReducedCache
from .._validate import check_count, check_seed
from ..errors import InvalidInputError

__all__ = ["check_site", "check_stats", "resolve_layer", "expand_kv_heads"]


def check_stats(seed, n_boot=None, n_null=None, n_perm=None) -> None:
    """Seeds and resample counts, checked before any forward pass."""
    check_seed(seed)
    for name, value in (("n_boot", n_boot), ("n_null", n_null), ("n_perm", n_perm)):
        if value is not None:
            check_count(value, name)


def resolve_layer(rc: ReducedCache, model, layer: int, site: str) -> int:
    """The layer index a metric reads: resolved against the model, or (a reduced cache without a model)
    the one layer of ``site`` it holds for ``-1``."""
    if model is not None:
        return adapter.resolve_layer(model, layer)
    held = rc.layers(site) if isinstance(rc, ReducedCache) else []
    if isinstance(layer, int) and layer >= 0:
        return layer
    if layer == -1 and len(held) == 1:
        return held[0]
    raise InvalidInputError(f"without the model, pass a non-negative layer index the reduced cache holds ({held}), "
                            "or pass model=.")


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
