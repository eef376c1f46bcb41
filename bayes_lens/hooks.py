"""Metric hooks: reduce activations inside the forward pass, and the ``names_filter`` for caches.

A metric over many prompts needs very little of each forward pass: the value vector of the final
*real* token at a few layers (Paper A §4.2, METHODS.md §1), the entropy of the final query row
of every attention head (Paper A §4.2, §4.5, METHODS.md §3), the next-token distribution at the
final token. The builders here return TransformerLens-style ``[(hook_name, fn)]`` lists whose
functions compute exactly that inside the hook and append the small result to a dict you pass,
so nothing of size [batch, pos, ...] outlives the forward pass:

* :func:`final_token_hooks` — ``act[b, last_b]`` at a site (``"v"`` → ``hook_v`` flattened over
  *key/value* heads, ``[b, n_kv·d_head]``; ``"resid_post"`` → ``[b, d_model]``),
* :func:`attention_entropy_hooks` — H = −Σ_j α_j log₂ α_j of the final query row over the valid
  keys, per head (``positions="last"``), or the mean of that over every valid query row
  (``positions="all"``, Paper A §4.5), ``[b, n_heads]`` per layer,
* :func:`hook_filter` — a ``names_filter`` for ``run_with_cache`` keeping just the hooks the
  geometry metrics read, for users who prefer to make a cache themselves.

"Final real token" and "valid key" come from the attention mask given to a builder (the runner,
:func:`bayes_lens.collect.forward_batches`, builds the hooks once per batch with that batch's mask
and its prompts' global indices); without a mask every position is real. Padded keys are removed from a pattern row and the row is
renormalized over the valid keys (METHODS.md §0: an entropy including pad keys is wrong).

The reductions are also exposed as plain functions (:func:`final_rows`,
:func:`pattern_entropy_bits`) so that an ``ActivationCache`` gives the same numbers as the
streaming path.

Devices and dtypes: every index and mask is moved to the device of the tensor it
indexes (a model split across GPUs hands each layer's hook a tensor on that layer's device); entropies
are computed in float64 from the activation's own dtype (bf16/fp16 models included), and an all-rows
reduction walks the query rows in chunks (:func:`bayes_lens.metrics.stats.chunked_entropy_bits`) instead
of building a float64 ``[batch, head, q, k]`` copy of the pattern.

Example
-------
>>> import bayes_lens as bl
>>> tokens, mask = bl.adapter.tokenize(model, ["The cat sat", "Hi"])
>>> store = {}
>>> hooks = bl.hooks.final_token_hooks(model, [-1], out=store, attention_mask=mask)
>>> with model.hooks(fwd_hooks=hooks):
...     _ = model(tokens, attention_mask=mask)
>>> store[model.cfg.n_layers - 1][0].shape  # [batch, n_kv_heads * d_head]
torch.Size([2, 32])
>>> _, cache = model.run_with_cache(tokens, attention_mask=mask)   # "Hi" ends at position 1, not 6
>>> v = cache["blocks.1.attn.hook_v"]
>>> torch.allclose(store[1][0][1], v[1, int(mask[1].sum()) - 1].flatten())
True
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from . import adapter
from ._validate import check_positions
from .errors import InvalidInputError, NonFiniteError
from .metrics.stats import chunked_entropy_bits, entropy_bits

__all__ = [
    "final_token_hooks",
    "attention_entropy_hooks",
    "hook_filter",
    "final_rows",
    "last_index",
    "pattern_entropy_bits",
    "row_entropy_bits",
    "mean_over_real_rows",
    "final_query_rows",
    "check_finite",
    "HOOK_POINTS",
]

HookList = List[Tuple[str, Callable]]

#: bayes_lens's own hook point name templates by short name (``{layer}`` is the layer index); the
#: points are added by :func:`bayes_lens.attach` (:mod:`bayes_lens.hookpoints`, which re-exports this).
HOOK_POINTS: Dict[str, str] = {
    "v_axis": "blocks.{layer}.hook_v_axis",
    "resid_post_axis": "blocks.{layer}.hook_resid_post_axis",
    "pattern_entropy": "blocks.{layer}.hook_pattern_entropy",
    "next_token_entropy": "hook_next_token_entropy",
}

_ALL_KEYS = torch.ones((), dtype=torch.bool)  # every key: each row is renormalized over what it attends to


def _mask_for(act: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
    """The [batch, pos] mask for ``act``: the one given (checked against its shape, left on its own device:
    indices are computed there and moved to the tensor they index), else all ones on ``act``'s device."""
    batch, pos = act.shape[0], act.shape[1]
    if attention_mask is None:
        return torch.ones(batch, pos, dtype=torch.long, device=act.device)
    if attention_mask.ndim != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] != pos:
        raise InvalidInputError(
            f"attention_mask has shape {list(attention_mask.shape)} but the activations are "
            f"[batch={batch}, pos={pos}, ...]; pass the mask of the tokens that produced them."
        )
    return attention_mask


# --------------------------------------------------------------------------------------------
# Reductions (shared by hooks and the ActivationCache path)
# --------------------------------------------------------------------------------------------


def last_index(attention_mask: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch"]:
    """Position of the final real (mask = 1) token of every row, for left or right padding."""
    mask = attention_mask.bool()
    if not bool(mask.any(dim=1).all()):
        bad = (~mask.any(dim=1)).nonzero().flatten().tolist()
        raise InvalidInputError(f"rows {bad} of the attention mask have no real token.")
    pos = mask.shape[1]
    return (pos - 1 - mask.flip(1).long().argmax(dim=1)).long()


def check_finite(x: Shaped[Tensor, "batch *rest"], what: str, indices: Optional[Int[Tensor, "batch"]] = None) -> None:
    """Raise NonFiniteError naming the prompts (global ``indices`` when given) whose rows of ``x`` hold NaN/inf.

    A tensor on the ``meta`` device holds no values (shape-only runs) and passes.
    """
    if x.device.type == "meta":
        return
    finite = torch.isfinite(x).reshape(x.shape[0], -1).all(dim=1)
    if not bool(finite.all()):
        rows = (~finite).nonzero().flatten()
        if indices is not None:
            rows = indices.to(rows.device)[rows]
        raise NonFiniteError(
            f"{what} contains NaN or infinity for prompt(s) {rows.tolist()}; check the model's "
            "weights and dtype (float16 overflow?) or drop those prompts."
        )


def final_rows(act: Float[Tensor, "batch pos *rest"], attention_mask: Optional[Int[Tensor, "batch pos"]] = None, *,
               what: str = "activation", indices: Optional[Int[Tensor, "batch"]] = None) -> Float[Tensor, "batch d"]:
    """``act[b, last_b]`` flattened over trailing dims, float32 on the CPU.

    ``act`` is ``[batch, pos, ...]`` (e.g. ``hook_v`` ``[batch, pos, n_kv_heads, d_head]`` →
    ``[batch, n_kv_heads·d_head]``). Raises NonFiniteError on NaN/inf in the rows read, naming the
    prompts by ``indices`` (their global numbers) when given. ``attention_mask=None``: every position
    is real.
    """
    if act.ndim < 3:
        raise InvalidInputError(f"{what}: expected [batch, pos, ...], got shape {list(act.shape)}.")
    mask = _mask_for(act, attention_mask)
    idx = last_index(mask).to(act.device)
    rows = act[torch.arange(act.shape[0], device=act.device), idx]
    rows = rows.reshape(rows.shape[0], -1).detach().float()
    check_finite(rows, what, indices)
    return rows.cpu()


def _check_pattern(pattern: Tensor, what: str) -> None:
    if pattern.ndim != 4:
        raise InvalidInputError(f"{what}: expected [batch, head, q, k], got shape {list(pattern.shape)}.")
    if pattern.shape[2] != pattern.shape[3]:
        raise InvalidInputError(f"{what}: query and key lengths differ ({pattern.shape[2]} vs {pattern.shape[3]}); "
                                "key-value caching is not supported here.")


def final_query_rows(pattern: Float[Tensor, "batch head q k"], attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
                     *, what: str = "hook_pattern", last: Optional[Int[Tensor, "batch"]] = None
                     ) -> Float[Tensor, "batch head k"]:
    """The attention row of each prompt's final real query, ``pattern[b, :, last_b, :]`` (a copy, same dtype/device).

    ``last`` (the final positions of ``attention_mask``, :func:`last_index`) saves recomputing them
    when the same batch's rows are read at every layer."""
    _check_pattern(pattern, what)
    mask = _mask_for(pattern.permute(0, 2, 1, 3), attention_mask)  # also: the mask must be this pattern's
    return _rows_at(pattern, last_index(mask) if last is None else last)


def _rows_at(pattern: Tensor, last: Tensor) -> Tensor:
    """``pattern[b, :, last[b], :]``: query row ``last[b]`` of every prompt (``last`` on any device).

    Indexed through the ``[b, q, h, k]`` view, so the two index tensors sit on adjacent dimensions: the
    same rows as ``pattern[arange(b), :, last, :]``, which torch gathers by a general kernel about 100×
    slower (1.1 ms against 0.01 ms for a ``[16, 9, 64, 64]`` pattern on this project's CPU; it runs once
    per layer and batch)."""
    rows = torch.arange(pattern.shape[0], device=pattern.device)
    return pattern.transpose(1, 2)[rows, last.to(pattern.device)]


def key_entropy_bits(rows: Float[Tensor, "batch *rows k"], keys: Bool[Tensor, "batch *rows k"], *,
                     what: str = "hook_pattern",
                     indices: Optional[Int[Tensor, "batch"]] = None) -> Float[Tensor, "batch *rows"]:
    """Entropy in bits of attention rows ``[batch, ..., k]`` over the valid keys only (float64, rows' device).

    ``keys`` is a boolean mask broadcastable to ``rows`` (``[batch, 1, k]`` for final-query rows):
    pad keys are removed and each row is renormalized over the rest before H = −Σ p log₂ p.
    """
    p = torch.where(keys.to(rows.device), rows.double(), torch.zeros((), dtype=torch.float64, device=rows.device))
    check_finite(p, what, indices)
    return entropy_bits(p / p.sum(-1, keepdim=True).clamp_min(1e-300))


def pattern_entropy_bits(pattern: Float[Tensor, "batch head q k"],
                         attention_mask: Optional[Int[Tensor, "batch pos"]] = None, *, positions: str = "last", what: str = "hook_pattern",
                         indices: Optional[Int[Tensor, "batch"]] = None) -> Float[Tensor, "batch head"]:
    """Entropy in bits of attention rows over the valid keys, per head (float64 on the CPU).

    ``positions="last"``: the final real query row. ``positions="all"``: the mean over every real
    query row (Paper A §4.5). Pad keys are removed and each row is renormalized over the rest.
    """
    check_positions(positions)
    _check_pattern(pattern, what)
    mask = _mask_for(pattern.permute(0, 2, 1, 3), attention_mask).bool()
    if positions == "last":
        return key_entropy_bits(final_query_rows(pattern, mask, what=what), mask[:, None, :], what=what,
                                indices=indices).cpu()
    # "all": only real query rows over real keys (a pad query row may be NaN on some backends); a NaN/inf
    # on a valid key makes its row's entropy NaN, so checking the entropies names the same prompts as
    # checking the pattern
    h = row_entropy_bits(pattern, mask)
    check_finite(h, what, indices)
    return mean_over_real_rows(h, mask).cpu()


def mean_over_real_rows(h: Float[Tensor, "batch head q"], attention_mask: Int[Tensor, "batch q"]) -> Float[Tensor, "batch head"]:
    """The mean of per-query-row values ``h`` over each prompt's real query rows (pad rows ignored,
    even when they hold NaN): Paper A §4.5's "mean over positions" (METHODS.md §3)."""
    q = attention_mask.bool().to(h.device)[:, None, :]
    kept = torch.where(q, h, torch.zeros((), dtype=h.dtype, device=h.device))
    return kept.sum(-1) / q.sum(-1).to(h.dtype).clamp_min(1.0)


def row_entropy_bits(pattern: Float[Tensor, "batch head q k"],
                     attention_mask: Optional[Tensor] = None) -> Float[Tensor, "batch head q"]:
    """Entropy in bits of every attention row (query position) over its keys (float64, pattern's device).

    With ``attention_mask`` ``[batch, pos]`` only real keys count (pad keys removed, each row
    renormalized over the rest) and a pad query row's entropy is computed over no keys (0; read only
    the real ones); without it every key counts and each row is renormalized over what it attends
    to (also when ``q != k``, e.g. one new query over a key-value cache). A few query rows at a time
    (:func:`bayes_lens.metrics.stats.chunked_entropy_bits`): no float64 ``[batch, head, q, k]`` copy of
    the pattern is built, and the result is differentiable when the pattern is.
    """
    if pattern.ndim != 4:
        raise InvalidInputError(f"hook_pattern: expected [batch, head, q, k], got shape {list(pattern.shape)}.")
    if attention_mask is None:
        keys = _ALL_KEYS
    else:
        _check_pattern(pattern, "hook_pattern")
        mask = _mask_for(pattern.permute(0, 2, 1, 3), attention_mask).bool()
        keys = mask[:, None, None, :] & mask[:, None, :, None]
    return chunked_entropy_bits(pattern, dim=2, keys=keys)


# --------------------------------------------------------------------------------------------
# Hook builders
# --------------------------------------------------------------------------------------------


def _layers(model, layers) -> List[int]:
    return adapter.resolve_layers(model, layers)


def final_token_hooks(model, layers: Union[int, Sequence[int], str] = -1, site: str = "v", *,
                      out: Dict[int, List[Float[Tensor, "batch d"]]],
                      attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
                      indices: Optional[Int[Tensor, "batch"]] = None, check: bool = True) -> HookList:
    """Hooks that append the final-real-token activation of ``site`` at each layer to ``out[layer]``.

    ``site="v"`` reads ``hook_v`` per key/value head (never repeated query-head copies) and stores
    ``[batch, n_kv_heads·d_head]``; any other :data:`bayes_lens.adapter.SITES` key works too
    (``"resid_post"`` → ``[batch, d_model]``). Layers may be negative or ``"all"``. ``check=False``
    skips the check that the model has the hooks (a caller that adds them through
    :class:`bayes_lens.adapter.HookResolver`, which refuses a missing name, builds hooks per batch
    without reading a bridge's costly ``hook_dict`` each time).
    """
    if not isinstance(out, dict):
        raise InvalidInputError("out must be a dict (layer -> list of tensors) the hooks append to.")
    hooks: HookList = []
    for layer in _layers(model, layers):
        name = adapter.hook_name(model, layer, site)

        def fn(act, hook=None, _layer=layer, _name=name):
            out.setdefault(_layer, []).append(final_rows(act, attention_mask, what=_name, indices=indices))
            return None

        hooks.append((name, fn))
    if check:
        adapter.check_hooks(model, [n for n, _ in hooks])
    return hooks


def attention_entropy_hooks(model, layers: Union[int, Sequence[int], str] = "all", *,
                            out: Dict[int, List[Float[Tensor, "batch head"]]], positions: str = "last",
                            attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
                            indices: Optional[Int[Tensor, "batch"]] = None, check: bool = True) -> HookList:
    """Hooks on ``hook_pattern`` appending per-head attention entropies ``[batch, n_heads]`` (bits).

    Reads ``hook_pattern`` (post-softmax), never ``hook_attn_scores`` (post-softmax on some bridges).
    The full pattern is reduced inside the hook and never stored. ``check``: as in :func:`final_token_hooks`.
    """
    if not isinstance(out, dict):
        raise InvalidInputError("out must be a dict (layer -> list of tensors) the hooks append to.")
    check_positions(positions)
    hooks: HookList = []
    for layer in _layers(model, layers):
        name = adapter.hook_name(model, layer, "pattern")

        def fn(pattern, hook=None, _layer=layer, _name=name):
            out.setdefault(_layer, []).append(
                pattern_entropy_bits(pattern, attention_mask, positions=positions, what=_name, indices=indices))
            return None

        hooks.append((name, fn))
    if check:
        adapter.check_hooks(model, [n for n, _ in hooks])
    return hooks


def hook_filter(model=None, *, layers: Union[int, Sequence[int], str] = "all",
                sites: Sequence[str] = ("v", "pattern")) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` keeping the hooks the analyses read.

    ``sites`` are short names of TransformerLens hooks (:data:`bayes_lens.adapter.SITES`: ``"v"``,
    ``"pattern"``, ``"resid_post"``, ...) and of bayes_lens's own hook points
    (:data:`bayes_lens.hookpoints.HOOK_POINTS`: ``"v_axis"``, ``"resid_post_axis"``,
    ``"pattern_entropy"``, ``"next_token_entropy"``; present inside ``bl.attach(model)``). By default
    ``hook_v`` and ``hook_pattern`` of every layer (value manifold, attention focusing, SULA, the
    axis). With a ``model`` and ``layers`` the filter keeps only those layers (negative indices
    resolved).

    >>> f = hook_filter()
    >>> f("blocks.3.attn.hook_v"), f("blocks.3.attn.hook_pattern"), f("blocks.3.hook_resid_pre")
    (True, True, False)
    >>> hook_filter(sites=("v", "v_axis", "next_token_entropy"))("blocks.2.hook_v_axis")
    True
    """
    if isinstance(sites, str):
        raise InvalidInputError(f"sites must be a list of site names, not one string; wrap it: [{sites!r}].")
    known = {**adapter.SITES, **HOOK_POINTS}
    for s in sites:
        if s not in known:
            raise InvalidInputError(f"unknown site {s!r}; expected some of {sorted(known)}.")
    if model is not None:
        names = {known[s].format(layer=layer) for layer in _layers(model, layers) for s in sites}
        return lambda name: name in names
    if layers != "all":
        raise InvalidInputError("pass the model to hook_filter(model, layers=...) to select layers.")
    pats = [re.compile("^" + re.escape(known[s]).replace(re.escape("{layer}"), r"\d+") + "$") for s in sites]
    return lambda name: any(p.match(name) for p in pats)
