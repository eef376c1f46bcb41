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

Interventions are the runner's input too: ``collect(..., interventions=[...])`` applies a list of
:class:`~bayes_lens.interventions.Intervention` in the pass (each by its TransformerLens pairs, per
batch), and a sharded run names its folders by their digests. **Resumed runs** (METHODS.md §13): an
intervention at ``resid_post`` of layer L changes nothing below it, so the clean pass can keep the
stream after L (:class:`StreamKeeper`, read-only hooks of that pass) and ``collect(...,
resume=kept)`` applies the interventions to the kept stream and runs only the later blocks
(:func:`bayes_lens.adapter.run_from_layer`: TransformerLens's ``start_at_layer`` on the HookedTransformer;
on both bridges, whose own ``start_at_layer`` still runs the earlier blocks or is absent, the forward runs
with the wrapped layers of blocks 0..L passing their input on; :meth:`KeptStream.check` compares the first
batch with the whole pass and the caller falls back to whole passes where a kind differs). So k
interventions at layer L cost about 1 + k·(1 − (L + 1)/n_layers) passes on every kind. No other module of bayes_lens calls the model's forward (the wind tunnel's training and the
CLI's generation aside).

Example
-------
>>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)
>>> rc["final_rows.v.1"].shape   # [2, n_kv_heads * d_head]
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
from ._validate import check_choice, check_count
from .errors import InvalidInputError, MissingHookError
from .hooks import check_finite, last_index
from .hookpoints import HOOK_POINTS
from .reads import AttentionEntropy, CacheView, FinalRows, Read, missing_hook, read_from_spec, reads_for, unique
from .reduced import ReducedCache

__all__ = ["Batch", "forward_batches", "collect", "collect_each", "run_order", "reduce_cache", "check_prompts", "use_runner",
           "check_runnable", "StreamKeeper", "KeptStream", "RunOptions"]

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


def runner_active() -> bool:
    """True inside :func:`bayes_lens.shard.sharded` (where :func:`collect` hands its calls to the block's runner)."""
    return _RUNNER.get() is not None


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
    batch_size = check_count(batch_size, "batch_size")
    check_choice(padding_side, "padding_side", ("left", "right"))
    check_choice(logits, "logits", ("final", "all"))
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
            with final, adapter.added_hooks(model, hooks, resolver):
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
                 token_ids=None, tail_positions: int = 0, reads: Optional[Sequence[Read]] = None) -> ReducedCache:
    """The :class:`~bayes_lens.reduced.ReducedCache` :func:`collect` makes, read from a cache the user made.

    ``cache`` is what ``model.run_with_cache(...)`` returns - the ``(logits, cache)`` pair or the
    ``ActivationCache`` alone (then pass ``logits=`` for next-token statistics) - or a plain dict
    of tensors (``dict(cache.items())``; then pass ``model=``). Padding: pass the
    ``attention_mask`` the tokens were run with, or the ``tokens`` themselves (pad positions are
    read from the tokenizer's pad token and padding side, as TransformerLens does); a cache of
    one prompt needs neither. A cache of several prompts with neither is refused: reading pad
    positions as real tokens silently changes every number. The reducers are the runner's
    (:func:`bayes_lens.hooks.final_rows`, :func:`bayes_lens.hooks.pattern_entropy_bits`, the
    next-token statistics and the tail statistics), so both give the same numbers. What to keep is
    spelled by the keywords or, for any quantity, as ``reads=[...]`` (:mod:`bayes_lens.reads`; the
    keywords add theirs to those).

    >>> tokens, mask = bl.adapter.tokenize(model, ["The cat sat on the", "2 + 2 ="])
    >>> logits, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    >>> rc = bl.collect.reduce_cache((logits, cache), attention_mask=mask, value_layers=[-1], attention=True)
    >>> torch.allclose(rc["final_rows.v.1"], bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="],
    ...                value_layers=[-1])["final_rows.v.1"], atol=1e-5)
    True
    """
    logits, cache = _split_pair(cache, logits)
    model = _model_of(cache, model)
    _check_batch_dim(cache)
    bound = _bind(model, value_layers, resid_layers, attention, attention_positions, token_ids, tail_positions, reads)
    if logits is not None:
        logits = torch.as_tensor(logits).detach()
        if logits.ndim != 3:
            raise InvalidInputError(f"logits must be [batch, pos, vocab], got shape {list(logits.shape)}.")
    n, pos = _batch_shape(cache, logits, bound)
    _check_cache_fits(cache, model, bound)
    rows = [r.name for r in bound if isinstance(r.read, FinalRows)]
    mask = _cache_mask(model, n, pos, attention_mask, tokens, cache, rows, _pattern_names(model, cache, bound))
    view = CacheView(cache, model, mask, logits)
    out: Dict[str, Tensor] = {}
    for r in bound:
        out.update(r.from_cache(view))
    return ReducedCache(out, n_tokens=mask.sum(1).long().cpu(), indices=torch.arange(n),
                        attention_positions=_attention_positions(bound, attention_positions))


def _extra_reads(reads) -> List[Read]:
    """``reads=`` as a list of :class:`Read` objects: a spec dict (:meth:`Read.spec`, as a sharded run's plan
    records it) is rebuilt; anything else that is not a read is refused."""
    if reads is None:
        return []
    if isinstance(reads, (str, Read, dict)) or not isinstance(reads, Sequence):
        raise InvalidInputError(f"reads must be a list of bayes_lens.reads.Read objects, got {type(reads).__name__}.")
    return unique([read_from_spec(r) if isinstance(r, dict) else r for r in reads])


def _bind(model, value_layers, resid_layers, attention, attention_positions, token_ids, tail_positions, reads):
    """The reads the keywords spell plus ``reads``, without repeats, bound to ``model`` (hook names resolved once)."""
    spelled = reads_for(model, value_layers=_layers_of(model, value_layers), resid_layers=_layers_of(model, resid_layers),
                        attention=attention, attention_positions=attention_positions, token_ids=token_ids,
                        tail_positions=tail_positions)
    return [r.bind(model) for r in unique(spelled + _extra_reads(reads))]


def _attention_positions(bound, default: str) -> str:
    """The reduced cache's :attr:`~bayes_lens.reduced.ReducedCache.attention_positions`: those of its entropy
    reads (``default`` when it has none, or both)."""
    pos = {r.read.positions for r in bound if isinstance(r.read, AttentionEntropy)}
    return pos.pop() if len(pos) == 1 else default


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


def _check_cache_fits(cache, model, bound) -> None:
    """Refuse a cache made by another model than ``model`` (a dict cache records none): its layer
    indices past the model's layers, or value / residual widths that are not the model's."""
    info = adapter.model_info(model)
    why = (f"the cache was made by another model than {info.name!r} ({info.n_layers} layers, {info.n_heads} "
           f"heads / {info.n_kv_heads} key-value heads of d_head {info.d_head}, d_model {info.d_model}); pass the "
           "model that made it as model=.")
    layers = {int(m.group(1)) for m in (re.match(r"blocks\.(\d+)\.", str(k)) for k in cache.keys()) if m}
    if layers and max(layers) >= info.n_layers:
        raise InvalidInputError(f"the cache holds layer {max(layers)}: {why}")
    for r in bound:
        if not isinstance(r.read, FinalRows):
            continue
        shape = list(cache[r.name].shape)
        if r.read.site == "v" and len(shape) == 4 and (shape[-1] != info.d_head
                                                       or shape[-2] not in (info.n_kv_heads, info.n_heads)):
            raise InvalidInputError(f"{r.name} in the cache is {shape} ([batch, pos, heads, d_head]): {why}")
        if r.read.site == "resid_post" and len(shape) == 3 and shape[-1] != info.d_model:
            raise InvalidInputError(f"{r.name} in the cache is {shape} ([batch, pos, d_model]): {why}")


def _batch_shape(cache, logits, bound):
    """(n prompts, n positions) of the cache; a requested hook that is missing is named in the error."""
    needed = [r.name for r in bound if isinstance(r.read, FinalRows)]
    for r in bound:
        if isinstance(r.read, AttentionEntropy):
            ent0 = HOOK_POINTS["pattern_entropy"].format(layer=0)
            needed.append(ent0 if adapter.cache_has(cache, ent0) else r.names[0])
    for name in needed:
        if not adapter.cache_has(cache, name):
            raise missing_hook(name, cache)
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


def _cache_mask(model, n: int, pos: int, attention_mask, tokens, cache=None, rows: Sequence[str] = (),
                patterns: Sequence[str] = ()) -> Tensor:
    """The mask of the cache's tokens, refusing a cache whose activations attended to pads.

    Refused (each silently wrong otherwise): ``tokens=`` contradicting ``attention_mask=``; tokens
    padded on the left while the tokenizer pads on the right, unless the cached attention patterns show
    the run masked those pads (``run_with_cache(strings, padding_side="left")`` does; a run of the tokens
    alone gets TransformerLens's mask for right padding and attends to them); left-padded tokens of
    a model that does not mask left padding by itself (a TransformerBridge) unless the cached
    attention patterns show that the run was masked; whenever the cache holds attention
    patterns, attention from real tokens to positions the mask calls padding; and an
    ``attention_mask=`` padded on the right (without ``tokens=``) given for a cache padded on the left
    (:func:`_check_not_left_padded`; ``rows`` are the per-position hooks read, ``patterns`` the attention
    patterns the cache holds, :func:`_pattern_names`).
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
            mask = _check_token_padding(model, tokens, mask, cache, patterns)
    if mask is None:
        if n > 1:
            raise InvalidInputError(
                f"the cache holds {n} prompts but no attention_mask or tokens were given, so pad positions cannot "
                "be told from real tokens (model.to_tokens pads on the right; reading pads as tokens silently "
                "changes every number). Pass tokens=<the tokens you ran> or attention_mask=<their mask>.")
        return torch.ones(n, pos, dtype=torch.long)
    if cache is not None:
        _check_pads_unattended(cache, mask, patterns)
        if tokens is None:
            _check_not_left_padded(cache, mask, rows, patterns)
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


def _check_token_padding(model, tokens: Tensor, mask: Tensor, cache, patterns: Sequence[str]) -> Tensor:
    """Tokens only: the mask to read them with, refusing padding the run cannot have masked.

    Tokens padded on the left while the tokenizer pads on the right are what
    ``run_with_cache(strings, padding_side="left")`` ran (TransformerLens masked the pads, then put the
    tokenizer's side back) or what ``run_with_cache(to_tokens(..., padding_side="left"))`` ran (TL built a
    mask for right padding: the pads were attended to). The cached attention patterns tell the two apart:
    no attention from real tokens to the leading pads → the left-padding mask; otherwise, or without
    patterns to tell, an error.
    """
    pad = _pad_id(model)
    if pad is None:
        return mask
    tok = model.tokenizer
    side = getattr(tok, "padding_side", "right") or "right"
    is_pad = tokens.eq(pad)
    lead = (~is_pad).long().cumsum(-1).eq(0).sum(-1)  # length of each row's leading run of pad ids
    bos = getattr(tok, "bos_token_id", None)
    if bos is not None and int(bos) == pad and bool(getattr(model.cfg, "default_prepend_bos", False)):
        lead = (lead - 1).clamp(min=0)  # a prepended BOS that shares the pad id is a real token
    if side == "right" and bool((lead > 0).any()):
        rows = (lead > 0).nonzero().flatten().tolist()
        left = adapter.mask_from_tokens(model, tokens, padding_side="left").cpu()
        seen = _pad_attention(cache, left, patterns)
        if seen is not None and seen[1] <= _PAD_TOL:
            return left  # the run masked the left pads (run_with_cache(strings, padding_side="left"))
        head = (f"the tokens look padded on the left (rows {rows[:8]} start with pad tokens, id {pad}) but the "
                "tokenizer pads on the right (tokenizer.padding_side='right'). ")
        if seen is not None:
            raise InvalidInputError(
                head + f"The cached attention ({seen[0]}) gives up to {seen[1]:.3g} of real tokens' attention to those "
                "pads: TransformerLens built its attention mask for right padding and the run attended to them (e.g. "
                "run_with_cache(model.to_tokens(..., padding_side='left'))). To fix it, " + _RUN_FIX + ".")
        raise InvalidInputError(
            head + "A run of such tokens attended to the pads unless it was masked (run_with_cache(strings, "
            "padding_side='left') masks them; run_with_cache(tokens) does not), and the cache holds no attention "
            "pattern to tell which. If the run was masked, pass attention_mask=bl.adapter.mask_from_tokens(model, "
            "tokens, padding_side='left') instead of tokens= (or keep hook_pattern in the cache: "
            "names_filter=bl.hook_filter()); otherwise " + _RUN_FIX + ".")
    left_padded = side == "left" and bool(mask.eq(0).any())
    if left_padded and not adapter.masks_left_padding_from_tokens(model) and not patterns:
        raise InvalidInputError(
            f"the tokens are padded on the left and this {type(model).__name__} does not mask left padding by "
            "itself: run_with_cache(tokens) without attention_mask= lets real tokens attend to the pads, and the "
            "cache holds no attention pattern to tell whether the run was masked. " + _RUN_FIX[0].upper()
            + _RUN_FIX[1:] + " (instead of tokens=).")
    return mask


def _pattern_names(model, cache, bound) -> List[str]:
    """The ``hook_pattern`` names the cache holds, every layer's, in order: the names the bound
    :class:`~bayes_lens.reads.AttentionEntropy` resolved when one is among ``bound`` (hook names are
    resolved once per call), else resolved here."""
    if cache is None:
        return []
    names = next((list(r.names) for r in bound if isinstance(r.read, AttentionEntropy)), None)
    if names is None:
        names = [adapter.hook_name(model, layer, "pattern") for layer in range(int(model.cfg.n_layers))]
    return [name for name in names if adapter.cache_has(cache, name)]


_PAD_TOL = 1e-6  # attention a masked run can give pads (0 up to rounding)


def _pad_attention(cache, mask: Tensor, patterns: Sequence[str]):
    """``(hook name, the most attention a real query row gives to positions mask calls padding)`` from the
    first cached pattern of the batch's shape, or None when the cache holds none (one layer decides:
    masking is the same in every layer)."""
    for name in patterns:
        p = cache[name].detach()
        if p.ndim != 4 or tuple(p.shape[-2:]) != tuple(mask.shape[-1:]) * 2 or p.shape[0] != mask.shape[0]:
            continue
        m = mask.to(p.device)
        pad_keys = m.eq(0)[:, None, None, :].to(p.dtype)
        real_q = m.eq(1)[:, None, :, None].to(p.dtype)
        return name, float((p.float() * pad_keys * real_q).sum(-1).max())
    return None


def _check_pads_unattended(cache, mask: Tensor, patterns: Sequence[str], tol: float = _PAD_TOL) -> None:
    """Refuse a cache whose attention patterns show real query rows attending to positions ``mask`` calls padding."""
    if not bool(mask.eq(0).any()):
        return
    seen = _pad_attention(cache, mask, patterns)
    if seen is not None and seen[1] > tol:
        name, leak = seen
        raise InvalidInputError(
            f"the cached attention ({name}) gives up to {leak:.3g} of real tokens' attention to positions "
            "that are padding, so every activation in this cache attended to pad tokens (the run had no "
            "attention mask, or another one; a TransformerBridge does not mask left padding by itself). "
            "To fix it, " + _RUN_FIX + ".")


def _check_not_left_padded(cache, mask: Tensor, rows: Sequence[str], patterns: Sequence[str]) -> None:
    """Refuse an ``attention_mask`` padded on the right given for a cache that was padded on the left.

    Causal attention never reaches right pads, so :func:`_check_pads_unattended` cannot see this one,
    and the rows read would be pads and the prompts' first tokens (a value manifold's PC1 of 0.70 instead
    of 0.41 on a tiny HookedTransformer).
    But a left-padded run leaves a mark: every pad position of a masked run computes the same thing (the
    pad token, no real token to attend to; a HookedTransformer zeroes the pads' attention rows, a
    TransformerBridge spreads it over the pads), so a row of ``k`` left pads holds one vector at its
    first ``k`` positions and another after them. When every row the mask pads on the right by
    ``k >= 2`` shows exactly that at its first ``k`` positions (in the first hook read that has
    positions: ``rows``, else an attention pattern), the cache was padded on the left and the mask is
    refused. A right-padded run shows it only if each such row started with ``k`` equal tokens; then pass
    ``tokens=`` too (checked against the mask instead).
    """
    real = mask.bool()
    lens = real.sum(1)
    pos = int(mask.shape[1])
    right = real.eq(torch.arange(pos)[None, :] < lens[:, None]).all(1) & lens.gt(0)  # real tokens, then pads
    k = pos - lens
    cand = [int(r) for r in (right & k.ge(2)).nonzero().flatten()]
    if not cand:
        return
    names = [nm for nm in rows if adapter.cache_has(cache, nm)] + list(patterns)
    for name in names:
        t = cache[name].detach()
        if t.ndim < 3 or int(t.shape[0]) != int(mask.shape[0]):
            continue
        if name.endswith("hook_pattern"):  # [b, h, q, k] -> one vector per query position
            if t.ndim != 4 or int(t.shape[2]) != pos:
                continue
            t = t.transpose(1, 2)
        if int(t.shape[1]) != pos:
            continue
        t = t.reshape(t.shape[0], pos, -1).double().cpu()
        scale = float(t[cand].abs().max()) or 1.0

        def same(a, b):
            return bool(((a - b).abs() <= 1e-6 * scale).all())

        if all(same(t[r, :int(k[r])], t[r, :1]) and not same(t[r, int(k[r])], t[r, 0]) for r in cand):
            raise InvalidInputError(
                f"attention_mask= pads rows {cand[:8]} on the right, but the cache looks padded on the left: in "
                f"{name} each of those rows holds one vector at its first {sorted({int(k[r]) for r in cand})[:4]} "
                "positions (as many as the mask's pads), which is what the pads of a left-padded run compute, so "
                "the mask would read pads as the prompts' tokens. Pass the mask the cache was made with (e.g. "
                "tokens, mask = bl.adapter.tokenize(model, prompts, padding_side='left'); model.run_with_cache("
                "tokens, attention_mask=mask), and that mask here), or pass tokens= as well (they settle where "
                "the pads are).")
        return  # one tensor decides: the pads' positions are the same in every hook


def collect(model, prompts: Sequence[str], *, value_layers=(), resid_layers=(), attention: bool = False,
            attention_positions: str = "last", token_ids=None, batch_size: int = 16,
            padding_side: str = "right", fwd_hooks=(), progress: Optional[bool] = None,
            desc: str = "collect", start_index: int = 0, tail_positions: int = 0,
            reads: Optional[Sequence[Read]] = None, interventions: Sequence = (),
            resume: Optional["KeptStream"] = None) -> ReducedCache:
    """Run ``prompts`` once and keep the final-token statistics the metrics need, as a reduced cache.

    The result is a :class:`~bayes_lens.reduced.ReducedCache` (key → ``[n, ...]``; its module doc
    lists the keys). What to keep is a list of reads (:mod:`bayes_lens.reads`): the keywords below
    spell the common ones, and ``reads=[...]`` adds any other. Inside :func:`bayes_lens.shard.sharded`
    the same call runs in checked shards on that context's engine and returns the merged equal of the
    one-process result (``reads=`` included: each read's :meth:`~bayes_lens.reads.Read.spec` enters the
    shard settings and its hash, and a worker rebuilds it).

    Prompts run in :func:`run_order` (similar lengths batched together: on the shipped prompt pool a
    fifth fewer positions) and every row comes back in the order of ``prompts``. A per-batch
    ``fwd_hooks`` factory therefore sees batches whose ``indices`` (the prompts' global numbers) need
    not be consecutive.

    Parameters
    ----------
    value_layers, resid_layers:
        Layers (int, list, or ``"all"``; negative counts from the end) at which to keep the
        final-token ``hook_v`` (flattened over KV heads) / ``hook_resid_post``
        (:class:`~bayes_lens.reads.FinalRows`).
    attention:
        Keep the per-head attention entropy (bits) of every layer: of the final query row
        (``attention_positions="last"``) or the mean over real query rows (``"all"``)
        (:class:`~bayes_lens.reads.AttentionEntropy`).
    token_ids:
        Token ids whose full-vocabulary log-probabilities at the final token to keep
        (:class:`~bayes_lens.reads.TokenLogprobs`).
    tail_positions:
        With ``T > 0`` (and ``token_ids``), also keep the logits of ``token_ids`` and the
        full-vocabulary log-sum-exp at each of the last ``T`` real positions of every prompt
        (``tail_logits`` / ``tail_logsumexp``; :class:`~bayes_lens.reads.TailLogits`); the
        unembedding then runs at every position.
    reads:
        More reads (any :class:`~bayes_lens.reads.Read`); the next-token entropy is always kept.
    fwd_hooks:
        Extra ``[(hook_name, fn)]`` run before the metric hooks (e.g. patches: metrics then read the
        patched activations), or a per-batch factory (see :func:`forward_batches`).
    interventions:
        :class:`~bayes_lens.interventions.Intervention` objects applied in the pass, in order, before
        ``fwd_hooks`` and the metric hooks (one cross-fitted condition: one per fold, each on its prompts).
    resume:
        A :class:`KeptStream` (the clean stream after layer L, kept by this prompt list's clean pass with a
        :class:`StreamKeeper`): the interventions at ``resid_post`` of L are applied to it and only the later
        blocks run. Reads then must be at later layers (or of the logits).
    desc, progress:
        The progress bar's label (name what runs: ``"geometry: collect 75 prompts"``) and switch.

    >>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)
    >>> rc.attention_entropy_bits().shape      # [prompts, n_layers, n_heads]
    torch.Size([2, 2, 4])
    """
    prompts = check_prompts(prompts)
    # the arguments are checked before a runner gets them: a sharded run must not write its plan first
    adapter.model_info(model)
    bound = _bind(model, value_layers, resid_layers, attention, attention_positions, token_ids, tail_positions, reads)
    positions = _attention_positions(bound, attention_positions)
    ivs = _check_interventions(model, interventions)
    runner = _RUNNER.get()
    if runner is not None and resume is None:  # bl.shard.sharded(...): the same call, in shards
        extra = {"reads": [r.spec() for r in _extra_reads(reads)]} if reads else {}  # recorded in the settings
        if ivs:
            extra["interventions"] = ivs
        return runner.collect(model, prompts, value_layers=value_layers, resid_layers=resid_layers,
                              attention=attention, attention_positions=attention_positions, token_ids=token_ids,
                              batch_size=batch_size, padding_side=padding_side, fwd_hooks=fwd_hooks,
                              progress=progress, desc=desc, tail_positions=tail_positions, **extra)
    here = ()
    if resume is not None:  # the interventions at the kept layer act on the kept stream; the rest hook as usual
        here = tuple(iv for iv in ivs if iv.layer == resume.layer and iv.site == "resid_post")
        early = [iv for iv in ivs if iv not in here and iv.layer <= resume.layer]
        if early or resume.n_prompts != len(prompts):
            raise InvalidInputError(
                f"a run resumed after layer {resume.layer} changes nothing at or below it and needs the stream kept "
                f"for these {len(prompts)} prompts (kept: {resume.n_prompts}); "
                + (f"{early[0]!r} acts below it; " if early else "") + "run it as a whole pass (resume=None).")
        ivs = tuple(iv for iv in ivs if iv not in here)

    # the hook names are checked once here; per batch, forward_batches's HookResolver refuses a missing one
    # (a bridge's hook_dict rebuilds its aliases on every read: checking per batch cost ~0.07 s a batch)
    names = [name for r in bound for name in r.hook_names]
    if names:
        adapter.check_hooks(model, names)
    user = fwd_hooks

    def hooks_for(batch: Batch):
        hooks = [pair for iv in ivs for pair in iv.pairs(model, batch)]
        hooks += list(user(batch)) if callable(user) else list(user)
        for r in bound:
            hooks += r.hooks(batch)
        return hooks

    ntoks = []
    order = run_order(prompts)
    every = any(r.read.logits == "all" for r in bound)
    if resume is not None:
        if every:
            raise InvalidInputError("a resumed run computes the logits at the final token only; collect logits at "
                                    "every position (tail_positions) in a whole pass.")
        passes = resume.run_batches(here, hooks_for, progress=progress, desc=desc)
    else:
        passes = forward_batches(model, prompts, batch_size=batch_size, padding_side=padding_side,
                                 fwd_hooks=hooks_for, progress=progress, desc=desc, start_index=start_index,
                                 logits="all" if every else "final", order=order)
    for batch in passes:
        fl = batch.final_logits()
        check_finite(fl, "the final-token logits", batch.indices)
        for r in bound:
            r.after_pass(batch, fl)
        ntoks.append(batch.attention_mask.sum(1).long().cpu())

    out: Dict[str, Tensor] = {}
    for r in bound:
        out.update(r.finish(len(prompts)))
    n_tokens = torch.cat(ntoks)
    back = inverse_order(order)
    if back is not None:  # the rows ran in run_order: put them back in the order of ``prompts``
        out = {k: v[back] for k, v in out.items()}
        n_tokens = n_tokens[back]
    return ReducedCache(out, n_tokens=n_tokens, indices=torch.arange(start_index, start_index + len(prompts)),
                        attention_positions=positions)


def collect_each(model, prompts: Sequence[str], conditions: Sequence, *, resume: Optional["KeptStream"] = None,
                 token_ids=None, reads: Optional[Sequence[Read]] = None, batch_size: int = 16,
                 progress: Optional[bool] = None, desc: str = "collect", rows: int = 64) -> List[ReducedCache]:
    """:func:`collect` once per condition (a list of intervention lists), as a list of reduced caches equal to
    ``[collect(model, prompts, token_ids=..., reads=..., interventions=c, resume=resume) for c in conditions]``.

    Resumed from a :class:`KeptStream`, conditions share passes: up to ``rows`` rows (prompts × conditions)
    per forward (:meth:`KeptStream.run_stacked`), and conditions that act at the final position only, with no
    hook-based read, run only that position on kinds whose key-value cache allows it. Otherwise (whole passes,
    or inside ``bl.shard.sharded``: each condition is its own sharded run, named by its digests) one
    :func:`collect` per condition."""
    prompts = check_prompts(prompts)
    conditions = [_check_interventions(model, c) for c in conditions]
    if resume is None or _RUNNER.get() is not None:
        return [collect(model, prompts, token_ids=token_ids, reads=reads, interventions=c, resume=resume,
                        batch_size=batch_size, progress=progress, desc=desc) for c in conditions]
    rows = check_count(rows, "rows")
    for c in conditions:
        wrong = [iv for iv in c if iv.layer != resume.layer or iv.site != "resid_post"]
        if wrong or resume.n_prompts != len(prompts):
            raise InvalidInputError(f"a stacked run resumed after layer {resume.layer} takes interventions at that "
                                    f"layer's resid_post only, for the {resume.n_prompts} prompts kept; "
                                    + (f"{wrong[0]!r} is elsewhere." if wrong else f"got {len(prompts)} prompts."))
    bound = [_bind(model, (), (), False, "last", token_ids, 0, reads) for _ in conditions]
    if any(r.read.logits == "all" for b in bound for r in b):
        raise InvalidInputError("a resumed run computes the logits at the final token only.")
    names = [name for r in bound[0] for name in r.hook_names]
    if names:
        adapter.check_hooks(model, names)
    hooked = any(r.hook_names for r in bound[0])

    def hooks_for(j, batch):
        return [pair for r in bound[j] for pair in r.hooks(batch)]

    ntoks = []
    for batch, logits in resume.run_stacked(conditions, hooks_for if hooked else None, rows=rows,
                                            progress=progress, desc=desc):
        for j, fl in enumerate(logits):
            fl = fl.float()
            check_finite(fl, "the final-token logits", batch.indices)
            done = dataclasses.replace(batch, logits=fl)
            for r in bound[j]:
                r.after_pass(done, fl)
        ntoks.append(batch.attention_mask.sum(1).long().cpu())
    back = inverse_order(run_order(prompts))
    n_tokens = torch.cat(ntoks)
    out = []
    for b in bound:
        parts: Dict[str, Tensor] = {}
        for r in b:
            parts.update(r.finish(len(prompts)))
        if back is not None:
            parts = {k: v[back] for k, v in parts.items()}
        out.append(ReducedCache(parts, n_tokens=n_tokens[back] if back is not None else n_tokens,
                                indices=torch.arange(len(prompts)), attention_positions="last"))
    return out


def _check_interventions(model, interventions) -> tuple:
    """``interventions`` as a tuple of :class:`~bayes_lens.interventions.Intervention`, each fitting ``model``
    (layer in range, the site's width)."""
    from .interventions import Intervention

    if interventions is None:
        return ()
    if isinstance(interventions, Intervention):
        interventions = (interventions,)
    ivs = tuple(interventions)
    bad = [type(iv).__name__ for iv in ivs if not isinstance(iv, Intervention)]
    if bad:
        raise InvalidInputError(f"interventions= takes bl.interventions.Intervention objects, got {bad[:3]}; pass "
                                "hook functions as fwd_hooks=.")
    info = adapter.model_info(model)
    for iv in ivs:
        if iv.layer >= info.n_layers:
            raise InvalidInputError(f"{iv!r} acts on layer {iv.layer} but the model has {info.n_layers} layers.")
        width = {"v": info.kv_dim, "z": info.n_heads * info.d_head, "final_scale": 1,
                 "mlp_post": int(getattr(model.cfg, "d_mlp", 0) or 0)}.get(iv.site, info.d_model)
        if iv.dim != width:
            raise InvalidInputError(f"{iv!r} has dimension {iv.dim} but this model's {iv.site!r} site has {width}; "
                                    "build it for this model.")
    if ivs:
        adapter.check_hooks(model, sorted({iv.hook_name(model) for iv in ivs}))
    return ivs


class StreamKeeper:
    """A per-batch ``fwd_hooks`` factory for an analysis's clean :func:`collect`: it keeps each batch's clean
    ``hook_resid_post`` after every layer of ``layers`` (read-only hooks), so interventions there resume from it
    without a pass of their own (:meth:`stream`)."""

    def __init__(self, model, layers: Sequence[int]):
        self.model = model
        self.names = {int(layer): adapter.hook_name(model, int(layer), "resid_post") for layer in layers}
        self.kept: Dict[int, list] = {layer: [] for layer in self.names}

    def __call__(self, batch) -> List[tuple]:
        hooks = []
        for layer, name in self.names.items():
            def grab(act, hook=None, layer=layer):
                self.kept[layer].append((batch, act.detach().clone()))
            hooks.append((name, grab))
        return hooks

    def stream(self, layer: int, n: int) -> Optional["KeptStream"]:
        """The :class:`KeptStream` after ``layer``, or None when the kept batches do not hold each of the ``n``
        prompts once (a runner that ran the clean pass elsewhere, e.g. from shards on disk)."""
        batches = self.kept.get(int(layer), [])
        seen = torch.cat([b.indices for b, _ in batches]).numpy() if batches else []
        if len(seen) != n or sorted(int(i) for i in seen) != list(range(n)):
            return None
        return KeptStream(self.model, layer, batches)


class KeptStream:
    """The clean residual stream after ``layer``, kept per batch (``(Batch, resid [b, pos, d])`` pairs, as
    :class:`StreamKeeper` keeps them): what :func:`collect` resumes from (``resume=``)."""

    def __init__(self, model, layer: int, batches):
        self.model, self.layer, self.batches = model, int(layer), list(batches)
        self._prefix: Dict[int, object] = {}  # batch number -> the clean prefix's key-value cache
        self._final_ok: Optional[bool] = None
        self.final_delta = float("nan")

    @property
    def n_prompts(self) -> int:
        return int(sum(len(b.indices) for b, _ in self.batches))

    def run_batches(self, interventions=(), hooks_for=None, *, progress=None, desc: str = "resumed"
                    ) -> Iterator[Batch]:
        """One :class:`Batch` (with its final-token logits) per kept batch: ``interventions`` applied to the kept
        stream, ``hooks_for(batch)`` hooked, and only the blocks after the layer run
        (:func:`bayes_lens.adapter.run_from_layer`)."""
        model = self.model
        for batch, resid in progress_bar(self.batches, desc=desc, total=len(self.batches), enabled=progress,
                                         unit="batch"):
            x = resid
            for iv in interventions:
                x = iv.apply(x, indices=batch.indices, last_index=batch.last_index)
            hooks = [] if hooks_for is None else list(hooks_for(batch))
            with adapter.model_lock(model), torch.inference_mode(), \
                    adapter.final_token_unembedding(model, batch.last_index), adapter.added_hooks(model, hooks):
                logits = adapter.run_from_layer(model, x, self.layer, batch.tokens, batch.attention_mask)
            yield dataclasses.replace(batch, logits=logits[:, -1])

    def run_stacked(self, conditions, hooks_for=None, *, rows: int = 64, progress=None, desc: str = "resumed"
                    ) -> Iterator[tuple]:
        """Several conditions per pass: for each kept batch, ``(batch, [final logits [b, vocab] per condition])``.

        ``conditions`` is a list of intervention tuples (each at this layer's ``resid_post``); ``hooks_for(j,
        batch)`` the hooks of condition ``j``. Up to ``rows`` rows (prompts × conditions) share one forward:
        each prompt's row is repeated once per condition (consecutively), each condition's hooks see their own
        rows only (``act[j::m]``, written back when a hook returns a tensor). When every intervention acts at
        the final position only and no hook is asked for, and the kind's key-value cache reproduces the whole
        prompt (:meth:`final_position_ok`), only the final position runs the later blocks against the clean
        prefix's cached keys and values (:func:`bayes_lens.adapter.run_final_from_layer`)."""
        model, conditions = self.model, [tuple(c) for c in conditions]
        final = hooks_for is None and all(iv.positions == "final" for c in conditions for iv in c) \
            and self.final_position_ok()
        for bi, (batch, resid) in enumerate(progress_bar(self.batches, desc=desc, total=len(self.batches),
                                                         enabled=progress, unit="batch")):
            b = resid.shape[0]
            step = max(1, rows // b)
            out = []
            for s in range(0, len(conditions), step):
                chunk = conditions[s:s + step]
                out += self._stacked_pass(bi, batch, resid, chunk, None if hooks_for is None else
                                          [(lambda bt, j=s + j: hooks_for(j, bt)) for j in range(len(chunk))], final)
            yield batch, out

    def _stacked_pass(self, bi: int, batch, resid, chunk, hook_fns, final: bool) -> List[Tensor]:
        model, m, b = self.model, len(chunk), resid.shape[0]
        xs = []
        for c in chunk:
            x = resid
            for iv in c:
                x = iv.apply(x, indices=batch.indices, last_index=batch.last_index)
            xs.append(x)
        hooks = []
        for j, fn in enumerate(hook_fns or []):
            hooks += [(name, _rows_of(f, j, m)) for name, f in fn(batch)]
        with adapter.model_lock(model), torch.inference_mode():
            if final:
                return self._final_pass(bi, batch, xs)
            x = torch.stack(xs, 1).reshape(b * m, *resid.shape[1:])
            last = batch.last_index.repeat_interleave(m)
            with adapter.final_token_unembedding(model, last), adapter.added_hooks(model, hooks):
                logits = adapter.run_from_layer(model, x, self.layer, batch.tokens.repeat_interleave(m, 0),
                                                batch.attention_mask.repeat_interleave(m, 0))
        logits = logits[:, -1].reshape(b, m, -1)
        return [logits[:, j] for j in range(m)]

    def _final_pass(self, bi: int, batch, xs) -> List[Tensor]:
        """The final-position route: the batch's clean prefix cache (kept; rows of every final index together,
        each masked to its own prefix) and one stacked final-position forward for all its rows."""
        model, m, last = self.model, len(xs), batch.last_index.cpu()
        b, t = len(last), int(last.max())
        if bi not in self._prefix:
            self._prefix[bi] = adapter.prefix_cache(model, batch.tokens[:, :t], last) if t > 0 else None
        r = torch.arange(b)
        x = torch.stack([x_[r, last] for x_ in xs], 1).reshape(b * m, 1, -1)
        with adapter.final_token_unembedding(model, torch.zeros(b * m, dtype=torch.long)):
            if self._prefix[bi] is None:  # one-token prompts only: the whole prompt is the final position
                logits = adapter.run_from_layer(model, x, self.layer, batch.tokens[:, :1].repeat_interleave(m, 0),
                                                batch.attention_mask[:, :1].repeat_interleave(m, 0))
            else:
                logits = adapter.run_final_from_layer(model, x, self.layer, batch.tokens[r, last][:, None],
                                                      self._prefix[bi], repeats=m)
        logits = logits[:, -1].reshape(b, m, -1)
        return [logits[:, j] for j in range(m)]

    def final_position_ok(self, tol: float = 1e-4) -> bool:
        """Whether this kind's final-position route reproduces the whole-prompt resume (one batch's
        log-probabilities at the final token, unpatched, within ``tol``; the largest difference is kept as
        ``final_delta``): decided once, on the batch whose final indices differ most (its shorter rows attend
        past masked keys). TransformerLens's frozen key-value cache does it on the HookedTransformer, the
        transformers cache on the bridges (float32 reductions in another order: about 2e-5 in the log-probabilities
        on SmolLM2, 1.4e-5 on Gemma 3 at a 32-token spread of final indices, on all three kinds); where it does not, the whole-prompt resume runs instead (same numbers)."""
        if self._final_ok is None:
            spread = [int(b.last_index.max() - b.last_index.min()) for b, _ in self.batches]
            bi = spread.index(max(spread))
            batch, resid = self.batches[bi]
            try:
                with adapter.model_lock(self.model), torch.inference_mode():
                    self._final_pass(bi, batch, [resid, resid])  # twice, stacked: a step must leave the cache as it was
                    got = self._final_pass(bi, batch, [resid])[0]
                    with adapter.final_token_unembedding(self.model, batch.last_index):
                        ref = adapter.run_from_layer(self.model, resid, self.layer, batch.tokens,
                                                     batch.attention_mask)[:, -1]
                self.final_delta = float((torch.log_softmax(got.double(), -1)
                                          - torch.log_softmax(ref.double(), -1)).abs().max())
                self._final_ok = self.final_delta <= tol
            except Exception:  # noqa: BLE001 - a kind without the route: the whole-prompt resume instead
                self._final_ok = False
            if not self._final_ok:
                self._prefix.clear()
        return self._final_ok

    def check(self, token_ids, clean_logprobs, tol: float = 1e-3) -> Optional[str]:
        """None when the unpatched resume of the first batch reproduces the clean pass's log-probabilities of
        ``token_ids`` (``clean_logprobs`` ``[n, K]``), else why not (in words); one batch decides, so a kind that
        cannot resume costs one batch's later blocks, not a pass."""
        import numpy as np

        first = KeptStream(self.model, self.layer, self.batches[:1])
        try:
            got = [torch.log_softmax(b.final_logits().double(), -1)[:, list(token_ids)].cpu()
                   for b in first.run_batches()][0]
        except Exception as err:  # noqa: BLE001 - a kind that cannot resume: whole passes instead
            return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        idx = self.batches[0][0].indices.numpy()
        worst = float(np.max(np.abs(got.numpy() - np.asarray(clean_logprobs, dtype=np.float64)[idx])))
        return None if worst <= tol else f"the resumed log-probabilities differ from the whole pass by {worst:.3g}"


def _rows_of(fn, j: int, m: int):
    """A hook that shows ``fn`` only the rows of condition ``j`` of ``m`` stacked ones (``act[j::m]``) and writes
    back what it returns."""
    def hook(act, hook=None):
        out = fn(act[j::m], hook=hook)
        if out is not None:
            act[j::m] = out
            return act
        return None
    return hook


@dataclass(frozen=True)
class RunOptions:
    """How an analysis runs the model (not what it measures): ``batch_size`` prompts per forward pass,
    ``progress`` bars (None: automatic), ``resume`` from kept clean streams where an analysis can (METHODS.md
    §13), ``seed`` of every draw (folds, donors, null draws). One object that analyses share.

    >>> RunOptions(batch_size=8).replace(seed=3)
    RunOptions(batch_size=8, progress=None, resume=True, seed=3)
    """

    batch_size: int = 16
    progress: Optional[bool] = None
    resume: bool = True
    seed: int = 0

    def __post_init__(self):
        from ._validate import check_bool, check_seed

        object.__setattr__(self, "batch_size", check_count(self.batch_size, "batch_size"))
        object.__setattr__(self, "resume", check_bool(self.resume, "resume"))
        object.__setattr__(self, "seed", check_seed(self.seed))
        if self.progress is not None:
            object.__setattr__(self, "progress", check_bool(self.progress, "progress"))

    def replace(self, **changes) -> "RunOptions":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)
