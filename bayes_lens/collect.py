"""Batched, padded, mask-aware runs of prompts: the streaming counterpart of ``run_with_cache``.

METHODS.md §0: "final token" is the last *real* token of each prompt, and every read of a
position or an attention row respects the attention mask. This module runs a list of prompts in
batches (left or right padding), gives the model the attention mask (TransformerLens then derives
rotary / absolute positions from it for left padding, on ``HookedTransformer`` and on
``TransformerBridge``), and, through the metric hooks of :mod:`bayes_lens.hooks`, keeps only what
the geometry metrics of Paper A §4.2 / §5.1 need:

* final-token ``hook_v`` per key/value head (value manifold, METHODS.md §1),
* final-token ``hook_resid_post`` (the paper script's variant),
* per-head attention entropy of the final query row over valid keys (§3),
* the full-vocabulary next-token entropy in bits at the final token (§4), and optional
  log-probabilities of chosen tokens (SULA, §6).

Everything runs under ``torch.inference_mode()``; hooks are attached with ``model.hooks(...)`` for
each forward pass only, so they are removed on exit, also on error. A :class:`Collection` is
mergeable: ``Collection.merge([a, b])`` of two shards equals one run over the concatenated prompts.

Example
-------
>>> import bayes_lens as bl                                               # doctest: +SKIP
>>> from bayes_lens.collect import collect
>>> col = collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)  # doctest: +SKIP
>>> col.final_values[model.cfg.n_layers - 1].shape   # [2, n_kv_heads * d_head]   # doctest: +SKIP
>>> col.attn_entropy_bits.shape                       # [2, n_layers, n_heads]     # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from . import adapter
from ._progress import progress as _progress
from .errors import InvalidInputError
from .hooks import _batch_context, _check_finite, attention_entropy_hooks, final_token_hooks, last_index

__all__ = ["Batch", "Collection", "forward_batches", "collect"]

_LN2 = math.log(2.0)


@dataclass(frozen=True)
class Batch:
    """One forward pass of :func:`forward_batches` (tensors on the model's device)."""

    indices: Int[Tensor, "batch"]
    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    last_index: Int[Tensor, "batch"]
    logits: Float[Tensor, "batch pos vocab"]

    def final_logits(self) -> Float[Tensor, "batch vocab"]:
        """Logits at the final real token of every row."""
        return self.logits[torch.arange(self.logits.shape[0], device=self.logits.device), self.last_index]


def _check_prompts(prompts) -> List[str]:
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings, not one string; wrap it: [prompt].")
    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("the prompt list is empty; pass at least one prompt.")
    return prompts


def forward_batches(model, prompts: Sequence[str], *, batch_size: int = 16, padding_side: str = "right",
                    fwd_hooks=(), progress: Optional[bool] = True, desc: str = "forward") -> Iterator[Batch]:
    """Run ``prompts`` through ``model`` in padded batches; yield a :class:`Batch` per forward pass.

    Every prompt is tokenized first (so a bad or over-long prompt fails before any compute). Each
    forward runs under ``torch.inference_mode()`` inside ``model.hooks(fwd_hooks=...)`` (removed
    afterwards, also on error) with the attention mask, and with
    :func:`bayes_lens.hooks.current_batch` set so metric hooks built without an explicit mask find
    the batch's mask and the prompts' global indices.
    """
    prompts = _check_prompts(prompts)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if padding_side not in ("left", "right"):
        raise InvalidInputError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    fwd_hooks = list(fwd_hooks)
    # tokenize every batch up front: a bad or over-long prompt fails before any compute
    starts = list(range(0, len(prompts), batch_size))
    batches = []
    for s in starts:
        try:
            batches.append(adapter.tokenize(model, prompts[s:s + batch_size], padding_side=padding_side))
        except InvalidInputError as err:  # name the global prompt index, not the in-batch one
            raise type(err)(f"{err} (prompt numbers count from {s}, the start of this batch)") from err
    for start, (tokens, mask) in _progress(list(zip(starts, batches)), desc=desc, total=len(starts),
                                           enabled=progress, unit="batch"):
        indices = torch.arange(start, start + tokens.shape[0])
        with torch.inference_mode(), _batch_context(mask, indices):
            with model.hooks(fwd_hooks=fwd_hooks):
                logits = model(tokens, attention_mask=mask, return_type="logits")
        yield Batch(indices=indices, tokens=tokens, attention_mask=mask, last_index=last_index(mask),
                    logits=logits.float())


@dataclass(frozen=True)
class Collection:
    """What :func:`collect` kept of a run over ``n`` prompts (CPU tensors, prompt order)."""

    final_values: Dict[int, Float[Tensor, "n kv_dim"]]
    final_resid: Dict[int, Float[Tensor, "n d_model"]]
    attn_entropy_bits: Optional[Float[Tensor, "n n_layers n_heads"]]
    next_token_entropy_bits: Float[Tensor, "n"]
    token_logprobs: Optional[Float[Tensor, "n n_tokens"]]
    n_tokens: Int[Tensor, "n"]
    attention_positions: str = "last"

    @property
    def n_prompts(self) -> int:
        return int(self.n_tokens.shape[0])

    @classmethod
    def merge(cls, parts: Sequence["Collection"]) -> "Collection":
        """Concatenate shards in order (all must hold the same layers and fields)."""
        parts = list(parts)
        if not parts:
            raise InvalidInputError("Collection.merge needs at least one collection.")
        first = parts[0]
        for p in parts[1:]:
            if (set(p.final_values) != set(first.final_values) or set(p.final_resid) != set(first.final_resid)
                    or (p.attn_entropy_bits is None) != (first.attn_entropy_bits is None)
                    or (p.token_logprobs is None) != (first.token_logprobs is None)
                    or p.attention_positions != first.attention_positions):
                raise InvalidInputError("cannot merge collections made with different layers, fields or "
                                        "attention_positions; collect every shard with the same arguments.")

        def cat(get):
            return torch.cat([get(p) for p in parts], dim=0)

        return cls(
            final_values={k: cat(lambda p, k=k: p.final_values[k]) for k in first.final_values},
            final_resid={k: cat(lambda p, k=k: p.final_resid[k]) for k in first.final_resid},
            attn_entropy_bits=None if first.attn_entropy_bits is None else cat(lambda p: p.attn_entropy_bits),
            next_token_entropy_bits=cat(lambda p: p.next_token_entropy_bits),
            token_logprobs=None if first.token_logprobs is None else cat(lambda p: p.token_logprobs),
            n_tokens=cat(lambda p: p.n_tokens),
            attention_positions=first.attention_positions,
        )


def _next_token_stats(final_logits: Tensor, token_ids: Optional[Tensor]):
    logp = torch.log_softmax(final_logits.double(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1) / _LN2
    lp = None if token_ids is None else logp[:, token_ids].float()
    return ent.cpu(), (None if lp is None else lp.cpu())


def collect(model, prompts: Sequence[str], *, value_layers=(), resid_layers=(), attention: bool = False,
            attention_positions: str = "last", token_ids=None, batch_size: int = 16,
            padding_side: str = "right", fwd_hooks=(), progress: Optional[bool] = True) -> Collection:
    """Run ``prompts`` once and keep the final-token statistics the metrics need.

    Parameters
    ----------
    value_layers, resid_layers:
        Layers (int, list, or ``"all"``; negative counts from the end) at which to keep the
        final-token ``hook_v`` (flattened over KV heads) / ``hook_resid_post``.
    attention:
        Keep the per-head attention entropy (bits) of every layer: of the final query row
        (``attention_positions="last"``) or the mean over real query rows (``"all"``).
    token_ids:
        Token ids whose full-vocabulary log-probabilities at the final token to keep.
    fwd_hooks:
        Extra ``[(hook_name, fn)]`` run before the metric hooks (e.g. patches: metrics then read the
        patched activations).
    """
    prompts = _check_prompts(prompts)
    info = adapter.model_info(model)

    def layers_of(spec):
        if isinstance(spec, str) or isinstance(spec, int):
            return adapter.resolve_layers(model, spec)
        spec = list(spec)
        return adapter.resolve_layers(model, spec) if spec else []

    v_layers, r_layers = layers_of(value_layers), layers_of(resid_layers)
    if attention_positions not in ("last", "all"):
        raise InvalidInputError(f"attention_positions must be 'last' or 'all', got {attention_positions!r}.")
    tok_ids = None
    if token_ids is not None:
        tok_ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, Tensor) else token_ids,
                                  dtype=torch.long).flatten()
        if tok_ids.numel() and (int(tok_ids.min()) < 0 or (info.d_vocab and int(tok_ids.max()) >= info.d_vocab)):
            raise InvalidInputError(f"token_ids must lie in [0, {info.d_vocab}), got {tok_ids.tolist()}.")

    v_store: Dict[int, List[Tensor]] = {}
    r_store: Dict[int, List[Tensor]] = {}
    a_store: Dict[int, List[Tensor]] = {}
    hooks = list(fwd_hooks)
    if v_layers:
        hooks += final_token_hooks(model, v_layers, "v", out=v_store)
    if r_layers:
        hooks += final_token_hooks(model, r_layers, "resid_post", out=r_store)
    if attention:
        hooks += attention_entropy_hooks(model, "all", out=a_store, positions=attention_positions)

    ents, lps, ntoks = [], [], []
    for batch in forward_batches(model, prompts, batch_size=batch_size, padding_side=padding_side,
                                 fwd_hooks=hooks, progress=progress, desc="collect"):
        fl = batch.final_logits()
        _check_finite(fl, "the final-token logits", batch.indices)
        ent, lp = _next_token_stats(fl, None if tok_ids is None else tok_ids.to(fl.device))
        ents.append(ent)
        if lp is not None:
            lps.append(lp)
        ntoks.append(batch.attention_mask.sum(1).long().cpu())

    def stacked(store, layers):
        out = {}
        for layer in layers:
            rows = torch.cat(store.get(layer, []), dim=0) if store.get(layer) else None
            if rows is None or rows.shape[0] != len(prompts):
                raise InvalidInputError(f"layer {layer}'s hook did not fire once per prompt; is the model "
                                        "stopping early (stop_at_layer) or caching keys/values?")
            out[layer] = rows
        return out

    attn = None
    if attention:
        per_layer = stacked(a_store, list(range(info.n_layers)))
        attn = torch.stack([per_layer[layer] for layer in range(info.n_layers)], dim=1)  # [n, L, H]
    return Collection(
        final_values=stacked(v_store, v_layers),
        final_resid=stacked(r_store, r_layers),
        attn_entropy_bits=attn,
        next_token_entropy_bits=torch.cat(ents).double(),
        token_logprobs=torch.cat(lps) if tok_ids is not None else None,
        n_tokens=torch.cat(ntoks),
        attention_positions=attention_positions,
    )
