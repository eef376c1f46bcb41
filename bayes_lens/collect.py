"""The one runner: batched, padded, mask-aware runs of prompts — the streaming ``run_with_cache``.

METHODS.md §0: "final token" is the last *real* token of each prompt, and every read of a
position or an attention row respects the attention mask. Every analysis of bayes_lens that runs
the model goes through :func:`forward_batches` (one forward pass per batch, with the attention
mask, under ``torch.inference_mode()``, hooks attached only for that pass and removed afterwards,
also on error, while the model's lock is held so two threads never mix hooks). :func:`collect`
keeps only what the metrics need, as a reduced cache keyed by hook name:

* final-token ``hook_v`` per key/value head (value manifold, METHODS.md §1; Paper A §4.2),
* final-token ``hook_resid_post`` (the paper script's variant),
* per-head attention entropy of the final query row over valid keys (§3), or its mean over rows,
* the full-vocabulary next-token entropy in bits at the final token (§4), and log-probabilities of
  chosen tokens there (the SULA labels, §6),
* with ``tail_positions=T``, the logits of the chosen tokens and the full-vocabulary log-sum-exp at
  each of the last ``T`` real positions (the martingale predictive of METHODS.md §8 reads the two
  symbol tokens at every symbol position; a fixed ``T`` gives every shard the same row shape).

The unembedding is computed only where it is read: a forward pre-hook on ``model.unembed`` hands it
the final real token's residual of every row (``logits="final"``, the default), so on a 262k-token
vocabulary the runner does not pay for logits at every position; ``logits="all"`` keeps the full
``[batch, pos, vocab]`` (the martingale predictive reads every position).

Devices and dtypes. Token ids and masks go to the embedding's device
(:func:`bayes_lens.adapter.input_device`), which on a bridge split across GPUs is not the first
parameter's; every per-batch index is moved to the device of the tensor it indexes, and each layer's
kept rows are brought to one device before the per-batch reduction. Logits are yielded in the model's
dtype and sliced to the final positions before any cast (a 128k vocabulary at every position in
float32 is gigabytes). Statistics (entropies, label log-probabilities) are float64 on the CPU,
final-token rows float32 on the CPU, whatever the model's dtype. A ``HookedTransformer`` with
``cfg.n_devices > 1`` is refused (:class:`bayes_lens.errors.UnsupportedModelError`): split a model
with ``TransformerBridge.boot_transformers(..., n_devices=N)`` or ``device_map=`` instead.

What the runner keeps is a :class:`~bayes_lens.reduced.ReducedCache`, the one currency of the
analyses: :func:`collect` makes one from a model and prompts, :func:`reduce_cache` from what a user
made with ``run_with_cache`` (an ``ActivationCache``, a plain dict of tensors, or the
``(logits, cache)`` pair) with the same reducers, and ``ReducedCache.merge`` concatenates shards, so
a run split into pieces equals one run.

Scaling is the runner's too: inside ``with bl.shard.sharded(...)`` every :func:`collect` call - so
every analysis - runs in checked shards on that engine (:func:`use_runner` is the hook it sets).

Example
-------
>>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)
>>> rc["blocks.1.attn.hook_v"].shape   # [2, n_kv_heads * d_head]
torch.Size([2, 32])
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from . import adapter
from ._progress import progress as progress_bar
from ._validate import check_prompts as validate_prompts
from .errors import InvalidInputError, MissingHookError
from .hooks import (
    attention_entropy_hooks,
    check_finite,
    final_query_row_hooks,
    final_rows,
    final_token_hooks,
    key_entropy_bits,
    last_index,
    pattern_entropy_bits,
)
from .hookpoints import HOOK_POINTS, attached_for
from .metrics.stats import entropy_bits
from .reduced import (ENTROPY_NAME, NEXT_TOKEN_ENTROPY, TAIL_LOGITS, TAIL_LOGSUMEXP, TOKEN_LOGPROBS, ReducedCache,
                      row_name)

__all__ = ["Batch", "forward_batches", "collect", "run_order", "reduce_cache", "check_prompts", "use_runner",
           "check_runnable"]

#: the runner of ``bl.shard.sharded(...)`` (an object with ``collect(model, prompts, **kw)``), or None
_RUNNER: ContextVar = ContextVar("bayes_lens_runner", default=None)


@contextmanager
def use_runner(runner):
    """Inside the block, :func:`collect` hands every call to ``runner.collect(model, prompts, **kwargs)``
    (``None``: collect in this process). :func:`bayes_lens.shard.sharded` sets it; a shard's own run
    resets it to ``None``."""
    token = _RUNNER.set(runner)
    try:
        yield runner
    finally:
        _RUNNER.reset(token)


def check_runnable(fwd_hooks, desc: str = "collect") -> None:
    """Refuse now, before any forward pass, ``fwd_hooks`` that the current runner cannot run (inside
    :func:`bayes_lens.shard.sharded`: patches on an engine whose workers are other processes, plain
    functions). An analysis that collects several conditions calls it for each before the first."""
    runner = _RUNNER.get()
    if runner is not None and hasattr(runner, "check_hooks"):
        runner.check_hooks(fwd_hooks, desc)


HookSource = Union[Sequence, Callable[["Batch"], Sequence]]


@dataclass(frozen=True, eq=False)
class Batch:
    """One forward pass of :func:`forward_batches` (tokens and mask on the embedding's device).

    ``logits`` is ``[batch, vocab]`` at the final real token (``logits="final"``) or
    ``[batch, pos, vocab]`` (``logits="all"``), in the model's dtype on the unembedding's device
    (slice before casting: :meth:`final_logits` does); it is ``None`` in the :class:`Batch` handed to a
    per-batch hook factory (the pass has not run yet).
    """

    indices: Int[Tensor, "batch"]
    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    last_index: Int[Tensor, "batch"]
    logits: Optional[Tensor] = None

    def final_logits(self) -> Float[Tensor, "batch vocab"]:
        """Logits at the final real token of every row, float32 (sliced first, then cast)."""
        if self.logits is None:
            raise InvalidInputError("this batch has not been run yet.")
        if self.logits.ndim == 2:
            return self.logits.float()
        return self.logits[torch.arange(self.logits.shape[0], device=self.logits.device),
                           self.last_index.to(self.logits.device)].float()


def check_prompts(prompts) -> List[str]:
    """The prompts as a list of strings (a generator is read once), or a clear error for one string, an
    empty list, a non-string or a lone surrogate (:func:`bayes_lens._validate.check_prompts`)."""
    if prompts is None:
        raise InvalidInputError("prompts are required with a model (a list of strings).")
    return validate_prompts(prompts)


def forward_batches(model, prompts: Sequence[str], *, batch_size: int = 16, padding_side: str = "right",
                    fwd_hooks: HookSource = (), logits: str = "final", progress: Optional[bool] = None,
                    desc: str = "forward", start_index: int = 0, order: Optional[Sequence[int]] = None
                    ) -> Iterator[Batch]:
    """Run ``prompts`` through ``model`` in padded batches; yield a :class:`Batch` per forward pass.

    ``fwd_hooks`` is a ``[(hook_name, fn)]`` list active in every pass, or a callable
    ``batch -> [(hook_name, fn)]`` called once per batch (the mask, final positions and global
    prompt indices of that batch are bound into the hooks it builds). Every prompt is tokenized first
    (a bad or over-long prompt fails before any compute). ``logits``: ``"final"`` computes the
    unembedding at the final real token only; ``"all"`` at every position. ``start_index`` is the
    global index of the first prompt (for shards).

    ``order`` (a permutation of ``range(len(prompts))``, e.g. :func:`run_order`) runs the prompts in that
    order: batch ``k`` holds ``prompts[order[k·batch_size : (k+1)·batch_size]]`` and its ``indices`` are
    those prompts' global numbers (no longer consecutive). ``None``: the given order.
    """
    adapter.check_model(model)  # refuses a HookedTransformer split over several devices
    prompts = check_prompts(prompts)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if padding_side not in ("left", "right"):
        raise InvalidInputError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    if logits not in ("final", "all"):
        raise InvalidInputError(f"logits must be 'final' or 'all', got {logits!r}.")
    static = None if callable(fwd_hooks) else list(fwd_hooks)
    try:
        ids = adapter.encode_prompts(model, prompts)
    except InvalidInputError as err:  # name the global prompt index
        if not start_index:
            raise
        raise type(err)(f"{err} (prompt numbers count from {start_index}, the first prompt of this run)") from err
    order = _check_order(order, len(ids))
    groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    batches = [adapter.pad_batch(model, [ids[i] for i in g], padding_side=padding_side) for g in groups]
    resolver = adapter.HookResolver(model)  # names resolved once per call, not per batch and hook
    for group, (tokens, mask) in progress_bar(list(zip(groups, batches)), desc=desc, total=len(groups),
                                              enabled=progress, unit="batch"):
        indices = start_index + torch.tensor(group, dtype=torch.long)
        batch = Batch(indices=indices, tokens=tokens, attention_mask=mask, last_index=last_index(mask))
        hooks = static if static is not None else list(fwd_hooks(batch))
        with adapter.model_lock(model), torch.inference_mode():
            final = adapter.final_token_unembedding(model, batch.last_index) if logits == "final" else nullcontext()
            with final, attached_for(model, hooks), adapter.added_hooks(model, hooks, resolver):
                out = model(tokens, attention_mask=mask, return_type="logits")
        yield dataclasses.replace(batch, logits=out[:, 0] if logits == "final" else out)


def run_order(prompts: Sequence[str]) -> List[int]:
    """The order in which :func:`collect` runs ``prompts``: a stable sort by length in characters.

    Prompts of similar length share a batch, so far fewer pad positions are computed when lengths
    vary (64 prompts of the shipped pool, batch 16: 1,152 instead of 1,472 positions for 882 real
    tokens). Characters, not tokens, so that a sharded run can order its prompts without a tokenizer
    (:func:`bayes_lens.shard.collect_sharded` plans on this order, and each shard of that plan, already
    in order, runs the very batches one process runs). Stable: equal lengths keep their order, and a
    list already in this order is left as it is.

    >>> bl.collect.run_order(["a longer prompt", "hi", "mid size", "yo"])
    [1, 3, 2, 0]
    """
    return sorted(range(len(prompts)), key=lambda i: len(prompts[i]))


def inverse_order(order: Sequence[int]) -> Optional[Tensor]:
    """The indices that put rows run in ``order`` (row j is prompt ``order[j]``) back in the prompts'
    order, or None when ``order`` is already that order."""
    order = [int(i) for i in order]
    return None if order == sorted(order) else torch.argsort(torch.tensor(order))


def _check_order(order, n: int) -> List[int]:
    if order is None:
        return list(range(n))
    out = [int(i) for i in order]
    if sorted(out) != list(range(n)):
        raise InvalidInputError(f"order must be a permutation of range({n}) (each prompt once), got {list(order)[:10]}"
                                f"{' ...' if len(out) > 10 else ''}.")
    return out


# --------------------------------------------------------------------------------------------
# A user's cache, reduced by the same reducers as the runner
# --------------------------------------------------------------------------------------------


def reduce_cache(cache, *, model=None, logits=None, attention_mask=None, tokens=None, value_layers=(),
                 resid_layers=(), attention: bool = False, attention_positions: str = "last",
                 token_ids=None, tail_positions: int = 0) -> ReducedCache:
    """The :class:`~bayes_lens.reduced.ReducedCache` :func:`collect` makes, read from a cache the user made.

    ``cache`` is what ``model.run_with_cache(...)`` returns - the ``(logits, cache)`` pair or the
    ``ActivationCache`` alone (then pass ``logits=`` for next-token statistics) - or a plain dict
    of tensors (``dict(cache.items())``; then pass ``model=``). Padding: pass the
    ``attention_mask`` the tokens were run with, or the ``tokens`` themselves (pad positions are
    read from the tokenizer's pad token and padding side, as TransformerLens does); a cache of
    one prompt needs neither. A cache of several prompts with neither is refused: reading pad
    positions as real tokens silently changes every number. The reducers are the runner's
    (:func:`bayes_lens.hooks.final_rows`, :func:`bayes_lens.hooks.pattern_entropy_bits`, the
    next-token statistics and the tail statistics), so both give the same numbers.

    >>> tokens, mask = bl.adapter.tokenize(model, ["The cat sat on the", "2 + 2 ="])
    >>> logits, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    >>> rc = bl.collect.reduce_cache((logits, cache), attention_mask=mask, value_layers=[-1], attention=True)
    >>> torch.allclose(rc["blocks.1.attn.hook_v"], bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="],
    ...                value_layers=[-1])["blocks.1.attn.hook_v"], atol=1e-5)
    True
    """
    logits, cache = _split_pair(cache, logits)
    model = _model_of(cache, model)
    _check_batch_dim(cache)
    if attention_positions not in ("last", "all"):
        raise InvalidInputError(f"attention_positions must be 'last' or 'all', got {attention_positions!r}.")
    v_layers, r_layers = _layers_of(model, value_layers), _layers_of(model, resid_layers)
    tok_ids = _token_ids(model, token_ids)
    tail = _check_tail(tail_positions, tok_ids)
    if logits is not None:
        logits = torch.as_tensor(logits).detach()
        if logits.ndim != 3:
            raise InvalidInputError(f"logits must be [batch, pos, vocab], got shape {list(logits.shape)}.")
    n, pos = _batch_shape(cache, model, logits, v_layers, r_layers, attention)
    _check_cache_fits(cache, model, v_layers, r_layers)
    mask = _cache_mask(model, n, pos, attention_mask, tokens, cache)

    def read(name: str, ndim: int) -> Tensor:
        if not adapter.cache_has(cache, name):
            raise _missing_hook(name, cache)
        t = cache[name].detach()
        if t.ndim != ndim:
            raise InvalidInputError(f"{name} in the cache has shape {list(t.shape)}; expected {ndim} dimensions "
                                    "with a batch dimension (was it made with remove_batch_dim=True?).")
        return t

    out: Dict[str, Tensor] = {}
    for site, layers, ndim in (("v", v_layers, 4), ("resid_post", r_layers, 3)):
        for layer in layers:
            name = adapter.hook_name(model, layer, site)
            out[row_name(layer, site)] = final_rows(read(name, ndim), mask, what=name)
    if attention:
        for layer in range(int(model.cfg.n_layers)):
            ent_name = HOOK_POINTS["pattern_entropy"].format(layer=layer)
            if adapter.cache_has(cache, ent_name):
                ent = _reduce_row_entropy(read(ent_name, 3).transpose(1, 2), mask, attention_positions)
            else:
                name = adapter.hook_name(model, layer, "pattern")
                ent = pattern_entropy_bits(read(name, 4), mask, positions=attention_positions, what=name)
            out[ENTROPY_NAME.format(layer=layer)] = ent
    last = last_index(mask)
    if logits is not None:
        fl = logits[torch.arange(n, device=logits.device), last.to(logits.device)]
        check_finite(fl, "the final-token logits")
        ent, lps = _next_token_stats(fl, tok_ids)
        out[NEXT_TOKEN_ENTROPY] = ent.double()
        if lps is not None:
            out[TOKEN_LOGPROBS] = lps
        if tail:
            batch = Batch(indices=torch.arange(n), tokens=torch.zeros(n, pos, dtype=torch.long), attention_mask=mask,
                          last_index=last, logits=logits)
            out[TAIL_LOGITS], out[TAIL_LOGSUMEXP] = _tail_stats(batch, tok_ids, tail)
    else:
        name = HOOK_POINTS["next_token_entropy"]
        if adapter.cache_has(cache, name):
            h = read(name, 3)[..., 0]
            out[NEXT_TOKEN_ENTROPY] = h[torch.arange(n, device=h.device), last.to(h.device)].double().cpu()
        if tok_ids is not None:
            raise MissingHookError("token log-probabilities need the logits: pass the (logits, cache) pair "
                                   "run_with_cache returns, or logits=.")
    return ReducedCache(out, n_tokens=mask.sum(1).long().cpu(), indices=torch.arange(n),
                        attention_positions=attention_positions)


def _split_pair(cache, logits):
    if isinstance(cache, tuple) and len(cache) == 2 and isinstance(cache[0], Tensor):
        if logits is not None:
            raise InvalidInputError("pass the (logits, cache) pair or a cache with logits=, not both.")
        return cache[0], cache[1]
    if not (adapter.is_activation_cache(cache) or isinstance(cache, Mapping)):
        raise InvalidInputError(
            f"expected a TransformerLens cache (what model.run_with_cache returns), got {type(cache).__name__}.")
    return logits, cache


def _model_of(cache, model):
    if model is not None:
        adapter.check_model(model)
        return model
    if adapter.is_activation_cache(cache):
        return adapter.cache_model(cache)
    raise InvalidInputError("a plain dict of tensors does not record the model that made it; pass model=.")


def _check_batch_dim(cache) -> None:
    if adapter.is_activation_cache(cache) and not getattr(cache, "has_batch_dim", True):
        raise InvalidInputError(
            "this cache was made with remove_batch_dim=True, so positions would be read as prompts; make it "
            "again without remove_batch_dim (the default keeps the batch dimension).")


def _layers_of(model, spec) -> List[int]:
    if isinstance(spec, (str, int)):
        return adapter.resolve_layers(model, spec)
    spec = list(spec)
    return adapter.resolve_layers(model, spec) if spec else []


def _token_ids(model, token_ids) -> Optional[Tensor]:
    if token_ids is None:
        return None
    ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, Tensor) else token_ids,
                          dtype=torch.long).flatten()
    d_vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if ids.numel() and (int(ids.min()) < 0 or (d_vocab and int(ids.max()) >= d_vocab)):
        raise InvalidInputError(f"token_ids must lie in [0, {d_vocab}), got {ids.tolist()}.")
    return ids


def _check_cache_fits(cache, model, v_layers, r_layers) -> None:
    """Refuse a cache made by another model than ``model`` (a dict cache records none): its layer
    indices past the model's layers, or value / residual widths that are not the model's."""
    info = adapter.model_info(model)
    why = (f"the cache was made by another model than {info.name!r} ({info.n_layers} layers, {info.n_heads} "
           f"heads / {info.n_kv_heads} key-value heads of d_head {info.d_head}, d_model {info.d_model}); pass the "
           "model that made it as model=.")
    layers = {int(m.group(1)) for m in (re.match(r"blocks\.(\d+)\.", str(k)) for k in cache.keys()) if m}
    if layers and max(layers) >= info.n_layers:
        raise InvalidInputError(f"the cache holds layer {max(layers)}: {why}")
    for layer in v_layers:
        name = adapter.hook_name(model, layer, "v")
        shape = list(cache[name].shape)
        if len(shape) == 4 and (shape[-1] != info.d_head or shape[-2] not in (info.n_kv_heads, info.n_heads)):
            raise InvalidInputError(f"{name} in the cache is {shape} ([batch, pos, heads, d_head]): {why}")
    for layer in r_layers:
        name = adapter.hook_name(model, layer, "resid_post")
        shape = list(cache[name].shape)
        if len(shape) == 3 and shape[-1] != info.d_model:
            raise InvalidInputError(f"{name} in the cache is {shape} ([batch, pos, d_model]): {why}")


def _missing_hook(name: str, cache) -> MissingHookError:
    return MissingHookError(
        f"the cache has no {name!r} (it holds {adapter.cache_contents(cache)}); make it with "
        "model.run_with_cache(tokens, names_filter=bl.hook_filter(...)) "
        "including that hook (e.g. sites=('v', 'pattern', 'resid_post'); bayes_lens's own hook points such as "
        "'pattern_entropy' need bl.attach(model)).")


def _batch_shape(cache, model, logits, v_layers, r_layers, attention):
    """(n prompts, n positions) of the cache; a requested hook that is missing is named in the error."""
    needed = ([adapter.hook_name(model, layer, "v") for layer in v_layers]
              + [adapter.hook_name(model, layer, "resid_post") for layer in r_layers])
    if attention:
        ent0 = HOOK_POINTS["pattern_entropy"].format(layer=0)
        needed.append(ent0 if adapter.cache_has(cache, ent0) else adapter.hook_name(model, 0, "pattern"))
    for name in needed:
        if not adapter.cache_has(cache, name):
            raise _missing_hook(name, cache)
    if logits is not None:
        return int(logits.shape[0]), int(logits.shape[1])
    for name in needed + [HOOK_POINTS["next_token_entropy"]]:
        if adapter.cache_has(cache, name):
            t = cache[name]
            if t.ndim < 2:
                raise InvalidInputError(f"{name} in the cache has shape {list(t.shape)}: no batch dimension (was "
                                        "it made with remove_batch_dim=True?). Make the cache without it.")
            return int(t.shape[0]), int(t.shape[-1] if name.endswith("hook_pattern") else t.shape[1])
    raise MissingHookError(f"the cache holds none of the activations asked for (it holds "
                           f"{adapter.cache_contents(cache)}); make it with names_filter=bl.hook_filter(...) "
                           "covering them.")


def _cache_mask(model, n: int, pos: int, attention_mask, tokens, cache=None) -> Tensor:
    """The mask of the cache's tokens, refusing a cache whose activations attended to pads.

    Refused (each silently wrong otherwise): ``tokens=`` contradicting ``attention_mask=``; tokens
    padded on the left while the tokenizer pads on the right (TransformerLens then builds its mask
    for right padding and reads the pads as tokens, and so would bayes_lens); left-padded tokens of
    a model that does not mask left padding by itself (a TransformerBridge) unless the cached
    attention patterns show that the run was masked; and, whenever the cache holds attention
    patterns, attention from real tokens to positions the mask calls padding.
    """
    mask = None
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask).long().cpu()
        if tuple(mask.shape) != (n, pos):
            raise InvalidInputError(f"attention_mask has shape {list(mask.shape)} but the cache holds "
                                    f"[batch={n}, pos={pos}]; pass the mask of the tokens that produced it.")
    if tokens is not None:
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tuple(tokens.shape) != (n, pos):
            raise InvalidInputError(f"tokens have shape {list(tokens.shape)} but the cache holds [batch={n}, "
                                    f"pos={pos}]; pass the tokens that produced it.")
        tokens = tokens.cpu()
        if mask is not None:
            _check_tokens_match_mask(model, tokens, mask)
        else:
            mask = adapter.mask_from_tokens(model, tokens).cpu()
            _check_token_padding(model, tokens, mask, cache)
    if mask is None:
        if n > 1:
            raise InvalidInputError(
                f"the cache holds {n} prompts but no attention_mask or tokens were given, so pad positions cannot "
                "be told from real tokens (model.to_tokens pads on the right; reading pads as tokens silently "
                "changes every number). Pass tokens=<the tokens you ran> or attention_mask=<their mask>.")
        return torch.ones(n, pos, dtype=torch.long)
    if cache is not None:
        _check_pads_unattended(model, cache, mask)
    return mask


_RUN_FIX = ("pass attention_mask= to run_with_cache (e.g. tokens, mask = bl.adapter.tokenize(model, prompts, "
            "padding_side='left'); model.run_with_cache(tokens, attention_mask=mask)) and the same attention_mask= "
            "here")


def _pad_id(model) -> Optional[int]:
    tok = getattr(model, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    return None if pad is None else int(pad)


def _check_tokens_match_mask(model, tokens: Tensor, mask: Tensor) -> None:
    """``tokens=`` and ``attention_mask=`` together: every position the mask calls padding holds the pad token."""
    pad = _pad_id(model)
    if pad is None:
        return
    bad = mask.eq(0) & tokens.ne(pad)
    if bool(bad.any()):
        rows = bad.any(1).nonzero().flatten().tolist()
        raise InvalidInputError(
            f"tokens= and attention_mask= contradict each other: in rows {rows[:8]} the mask marks positions as "
            f"padding that hold real tokens (not the pad id {pad}), e.g. a left-padded batch given a right-padded "
            "mask. Pass the attention_mask the tokens were run with (or only one of tokens= / attention_mask=).")


def _check_token_padding(model, tokens: Tensor, mask: Tensor, cache) -> None:
    """Tokens only: refuse padding the run cannot have masked."""
    pad = _pad_id(model)
    if pad is None:
        return
    tok = model.tokenizer
    side = getattr(tok, "padding_side", "right") or "right"
    is_pad = tokens.eq(pad)
    lead = (~is_pad).long().cumsum(-1).eq(0).sum(-1)  # length of each row's leading run of pad ids
    bos = getattr(tok, "bos_token_id", None)
    if bos is not None and int(bos) == pad and bool(getattr(model.cfg, "default_prepend_bos", False)):
        lead = (lead - 1).clamp(min=0)  # a prepended BOS that shares the pad id is a real token
    if side == "right" and bool((lead > 0).any()):
        rows = (lead > 0).nonzero().flatten().tolist()
        raise InvalidInputError(
            f"the tokens look padded on the left (rows {rows[:8]} start with pad tokens, id {pad}) but the "
            "tokenizer pads on the right (tokenizer.padding_side='right'), so the pad positions cannot be read "
            "from the tokens, and TransformerLens itself built its attention mask for right padding: the run "
            "attended to the pads (e.g. model.to_tokens(..., padding_side='left')). To fix it, " + _RUN_FIX + ".")
    left_padded = side == "left" and bool(mask.eq(0).any())
    if left_padded and not adapter.masks_left_padding_from_tokens(model) and not _has_patterns(model, cache):
        raise InvalidInputError(
            f"the tokens are padded on the left and this {type(model).__name__} does not mask left padding by "
            "itself: run_with_cache(tokens) without attention_mask= lets real tokens attend to the pads, and the "
            "cache holds no attention pattern to tell whether the run was masked. " + _RUN_FIX[0].upper()
            + _RUN_FIX[1:] + " (instead of tokens=).")


def _pattern_names(model, cache) -> List[str]:
    if cache is None:
        return []
    names = []
    for layer in range(int(model.cfg.n_layers)):
        name = adapter.hook_name(model, layer, "pattern")
        if adapter.cache_has(cache, name):
            names.append(name)
    return names


def _has_patterns(model, cache) -> bool:
    return bool(_pattern_names(model, cache))


def _check_pads_unattended(model, cache, mask: Tensor, tol: float = 1e-6) -> None:
    """Refuse a cache whose attention patterns show real query rows attending to positions ``mask`` calls padding."""
    if not bool(mask.eq(0).any()):
        return
    for name in _pattern_names(model, cache):
        p = cache[name].detach()
        if p.ndim != 4 or tuple(p.shape[-2:]) != tuple(mask.shape[-1:]) * 2 or p.shape[0] != mask.shape[0]:
            continue
        m = mask.to(p.device)
        pad_keys = m.eq(0)[:, None, None, :].to(p.dtype)
        real_q = m.eq(1)[:, None, :, None].to(p.dtype)
        leak = float((p.float() * pad_keys * real_q).sum(-1).max())
        if leak > tol:
            raise InvalidInputError(
                f"the cached attention ({name}) gives up to {leak:.3g} of real tokens' attention to positions "
                "that are padding, so every activation in this cache attended to pad tokens (the run had no "
                "attention mask, or another one; a TransformerBridge does not mask left padding by itself). "
                "To fix it, " + _RUN_FIX + ".")
        return  # one layer decides: masking is the same in every layer


def _reduce_row_entropy(ent: Tensor, mask: Tensor, positions: str) -> Tensor:
    """[b, h] from ``hook_pattern_entropy`` (transposed to [b, h, q]): the final real query row, or the mean over real rows."""
    ent = ent.double().cpu()
    mask = mask.bool().cpu()
    if ent.shape[-1] != mask.shape[1] or ent.shape[0] != mask.shape[0]:
        raise InvalidInputError(f"hook_pattern_entropy has shape {list(ent.shape)} but the mask is {list(mask.shape)}.")
    if positions == "last":
        last = last_index(mask)
        out = ent[torch.arange(ent.shape[0]), :, last]
    else:
        q = mask[:, None, :].double()
        out = (torch.where(mask[:, None, :], ent, torch.zeros((), dtype=ent.dtype)) * q).sum(-1) / q.sum(-1).clamp_min(1.0)
    check_finite(out, "hook_pattern_entropy")
    return out


def _next_token_stats(final_logits: Tensor, token_ids: Optional[Tensor]):
    """Next-token entropy (bits) and the log-probabilities of ``token_ids``: float64 on the CPU."""
    ent = entropy_bits(final_logits, from_logits=True)
    if token_ids is None:  # geometry reads no label: no float64 log-softmax of [batch, vocab] for nothing
        return ent.cpu(), None
    logp = torch.log_softmax(final_logits.double(), dim=-1)
    return ent.cpu(), logp[:, token_ids.to(logp.device)].cpu()


def _reduce_final_attention(model, rows: Dict[int, Tensor], batch: Batch, out: Dict[int, List[Tensor]],
                            n_layers: int) -> None:
    """Entropies (bits) of the final query rows every layer's hook kept, in one reduction ``[b, L, h]``."""
    if len(rows) != n_layers:
        return  # a layer's hook did not fire: collect's completeness check names it
    # on a model split across devices each layer's rows live on that layer's device: one device first
    dev = batch.attention_mask.device
    stacked = torch.stack([rows[layer].to(dev, non_blocking=True) for layer in range(n_layers)], dim=1)  # [b, L, h, k]
    if stacked.device.type != "meta" and not bool(torch.isfinite(stacked).all()):  # name the first bad layer
        bad = next(layer for layer in range(n_layers) if not bool(torch.isfinite(rows[layer]).all()))
        check_finite(rows[bad], adapter.hook_name(model, bad, "pattern"), batch.indices)
    keys = batch.attention_mask.to(stacked.device).bool()[:, None, None, :]
    ent = key_entropy_bits(stacked, keys, indices=batch.indices).cpu()
    for layer in range(n_layers):
        out.setdefault(layer, []).append(ent[:, layer])
    rows.clear()


def collect(model, prompts: Sequence[str], *, value_layers=(), resid_layers=(), attention: bool = False,
            attention_positions: str = "last", token_ids=None, batch_size: int = 16,
            padding_side: str = "right", fwd_hooks=(), progress: Optional[bool] = None,
            desc: str = "collect", start_index: int = 0, tail_positions: int = 0) -> ReducedCache:
    """Run ``prompts`` once and keep the final-token statistics the metrics need, as a reduced cache.

    The result is a :class:`~bayes_lens.reduced.ReducedCache` (hook name → ``[n, ...]``; its module
    doc lists the keys). Inside :func:`bayes_lens.shard.sharded` the same call runs in checked shards on
    that context's engine and returns the merged equal of the one-process result.

    Prompts run in :func:`run_order` (similar lengths batched together: on the shipped prompt pool a
    fifth fewer positions) and every row comes back in the order of ``prompts``. A per-batch
    ``fwd_hooks`` factory therefore sees batches whose ``indices`` (the prompts' global numbers) need
    not be consecutive.

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
    tail_positions:
        With ``T > 0`` (and ``token_ids``), also keep the logits of ``token_ids`` and the
        full-vocabulary log-sum-exp at each of the last ``T`` real positions of every prompt
        (``hook_tail_logits`` / ``hook_tail_logsumexp``); the unembedding then runs at every position.
    fwd_hooks:
        Extra ``[(hook_name, fn)]`` run before the metric hooks (e.g. patches: metrics then read the
        patched activations), or a per-batch factory (see :func:`forward_batches`).
    desc, progress:
        The progress bar's label (name what runs: ``"geometry: collect 75 prompts"``) and switch.

    >>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)
    >>> rc.attention_entropy_bits().shape      # [prompts, n_layers, n_heads]
    torch.Size([2, 2, 4])
    """
    prompts = check_prompts(prompts)
    # the arguments are checked before a runner gets them: a sharded run must not write its plan first
    info = adapter.model_info(model)
    v_layers, r_layers = _layers_of(model, value_layers), _layers_of(model, resid_layers)
    if attention_positions not in ("last", "all"):
        raise InvalidInputError(f"attention_positions must be 'last' or 'all', got {attention_positions!r}.")
    tok_ids = _token_ids(model, token_ids)
    tail = _check_tail(tail_positions, tok_ids)
    runner = _RUNNER.get()
    if runner is not None:  # bl.shard.sharded(...): the same call, in shards (the context resets inside them)
        return runner.collect(model, prompts, value_layers=value_layers, resid_layers=resid_layers,
                              attention=attention, attention_positions=attention_positions, token_ids=token_ids,
                              batch_size=batch_size, padding_side=padding_side, fwd_hooks=fwd_hooks,
                              progress=progress, desc=desc, tail_positions=tail_positions)

    v_store: Dict[int, List[Tensor]] = {}
    r_store: Dict[int, List[Tensor]] = {}
    a_store: Dict[int, List[Tensor]] = {}
    rows_store: Dict[int, Tensor] = {}
    user = fwd_hooks

    # the hook names are checked once here; per batch, forward_batches's HookResolver refuses a missing one
    # (a bridge's hook_dict rebuilds its aliases on every read: checking per batch cost ~0.07 s a batch)
    names = [adapter.hook_name(model, layer, "v") for layer in v_layers]
    names += [adapter.hook_name(model, layer, "resid_post") for layer in r_layers]
    if attention:
        names += [adapter.hook_name(model, layer, "pattern") for layer in range(info.n_layers)]
    if names:
        adapter.check_hooks(model, names)

    def hooks_for(batch: Batch):
        mask, idx = batch.attention_mask, batch.indices
        hooks = list(user(batch)) if callable(user) else list(user)
        if v_layers:
            hooks += final_token_hooks(model, v_layers, "v", out=v_store, attention_mask=mask, indices=idx,
                                       check=False)
        if r_layers:
            hooks += final_token_hooks(model, r_layers, "resid_post", out=r_store, attention_mask=mask, indices=idx,
                                       check=False)
        if attention and attention_positions == "last":  # rows kept per layer, reduced once per batch below
            rows_store.clear()
            hooks += final_query_row_hooks(model, out=rows_store, attention_mask=mask, check=False)
        elif attention:
            hooks += attention_entropy_hooks(model, "all", out=a_store, positions=attention_positions,
                                             attention_mask=mask, indices=idx, check=False)
        return hooks

    ents, lps, ntoks, tails = [], [], [], []
    order = run_order(prompts)
    for batch in forward_batches(model, prompts, batch_size=batch_size, padding_side=padding_side,
                                 fwd_hooks=hooks_for, progress=progress, desc=desc, start_index=start_index,
                                 logits="all" if tail else "final", order=order):
        fl = batch.final_logits()
        check_finite(fl, "the final-token logits", batch.indices)
        if tail:
            tails.append(_tail_stats(batch, tok_ids, tail))
        ent, lp = _next_token_stats(fl, tok_ids)
        ents.append(ent)
        if lp is not None:
            lps.append(lp)
        ntoks.append(batch.attention_mask.sum(1).long().cpu())
        if attention and attention_positions == "last":
            _reduce_final_attention(model, rows_store, batch, a_store, info.n_layers)

    def stacked(store, layers):
        out = {}
        for layer in layers:
            rows = torch.cat(store.get(layer, []), dim=0) if store.get(layer) else None
            if rows is None or rows.shape[0] != len(prompts):
                raise InvalidInputError(f"layer {layer}'s hook did not fire once per prompt; is the model "
                                        "stopping early (stop_at_layer) or caching keys/values?")
            out[layer] = rows
        return out

    out: Dict[str, Tensor] = {}
    for site, store, layers in (("v", v_store, v_layers), ("resid_post", r_store, r_layers)):
        for layer, rows in stacked(store, layers).items():
            out[row_name(layer, site)] = rows
    if attention:
        for layer, ent in stacked(a_store, list(range(info.n_layers))).items():
            out[ENTROPY_NAME.format(layer=layer)] = ent
    out[NEXT_TOKEN_ENTROPY] = torch.cat(ents).double()
    if tok_ids is not None:
        out[TOKEN_LOGPROBS] = torch.cat(lps)
    if tail:
        out[TAIL_LOGITS] = torch.cat([t[0] for t in tails])
        out[TAIL_LOGSUMEXP] = torch.cat([t[1] for t in tails])
    n_tokens = torch.cat(ntoks)
    back = inverse_order(order)
    if back is not None:  # the rows ran in run_order: put them back in the order of ``prompts``
        out = {k: v[back] for k, v in out.items()}
        n_tokens = n_tokens[back]
    return ReducedCache(out, n_tokens=n_tokens, indices=torch.arange(start_index, start_index + len(prompts)),
                        attention_positions=attention_positions)


def _check_tail(tail_positions, tok_ids) -> int:
    if isinstance(tail_positions, bool) or not isinstance(tail_positions, int) or tail_positions < 0:
        raise InvalidInputError(f"tail_positions must be a non-negative integer, got {tail_positions!r}.")
    if tail_positions and (tok_ids is None or not tok_ids.numel()):
        raise InvalidInputError("tail_positions needs token_ids: the tokens whose logits to keep at those positions.")
    return int(tail_positions)


def _tail_stats(batch: Batch, tok_ids: Tensor, tail: int):
    """``([b, tail, k]`` float32 logits of ``tok_ids``, ``[b, tail]`` float64 log-sum-exp) at the last
    ``tail`` real positions of every row of ``batch`` (NaN before a row's first real token).

    One row at a time, as ``logits[row, positions].double()`` then ``logsumexp`` over the vocabulary:
    a float64 copy of one row's tail, never of the whole batch.
    """
    logits = batch.logits  # [b, pos, vocab] float32
    b = logits.shape[0]
    n_real = batch.attention_mask.sum(1).long()
    out_l = torch.full((b, tail, int(tok_ids.numel())), float("nan"), dtype=torch.float32)
    out_s = torch.full((b, tail), float("nan"), dtype=torch.float64)
    ids = tok_ids.to(logits.device)
    for row in range(b):
        last = int(batch.last_index[row])
        k = min(tail, int(n_real[row]))  # the row's real positions among the last `tail`
        pos = torch.arange(last - k + 1, last + 1, device=logits.device)
        lg = logits[row, pos].double()
        out_l[row, tail - k:] = lg[:, ids].float().cpu()
        out_s[row, tail - k:] = torch.logsumexp(lg, dim=-1).cpu()
    return out_l, out_s
