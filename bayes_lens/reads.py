"""Reads: what the runner keeps of a forward pass, one small class per quantity (METHODS.md §0).

Every analysis needs a few reductions of each prompt's forward pass — final-token rows of a site
(§1), attention entropies (§3), the next-token entropy (§4), label log-probabilities (§6), tail
logits (§8) — and must get the same numbers whether bayes_lens runs the model
(:func:`bayes_lens.collect.collect`) or reduces a cache the user made
(:func:`bayes_lens.collect.reduce_cache`). A :class:`Read` says what to keep; bound to a model
(:meth:`Read.bind`, where its hook names are resolved, once per run) it carries side by side

* its **in-pass reduction**: the ``[(hook_name, fn)]`` hooks that reduce the activation inside the
  forward pass for one batch (:meth:`BoundRead.hooks`), and the work on the batch's logits after the
  pass (:meth:`BoundRead.after_pass`);
* its **cache reduction**: the same reduction read from a user's cache (:meth:`BoundRead.from_cache`);
* the **rows it adds** to the :class:`~bayes_lens.reduced.ReducedCache` (:meth:`BoundRead.finish`).

The runner and the cache reducer are generic over a list of reads; the keyword spellings of
``collect`` (``value_layers=``, ``attention=``, ``token_ids=`` ...) are translated into reads by
:func:`reads_for`. Adding a quantity is one subclass of :class:`Read` (and its :class:`BoundRead`)
passed as ``collect(model, prompts, reads=[...])`` — see ``tests/test_reads.py`` for one written there.

==============================  ===============================================  ======================
read                            keys it adds (``{l}`` a layer)                   shape
==============================  ===============================================  ======================
``FinalRows(l, "v")``           ``final_rows.v.{l}``                             ``[n, n_kv·d_head]``
``FinalRows(l, "resid_post")``  ``final_rows.resid_post.{l}``                    ``[n, d_model]``
``FinalRows(l, "z")``           ``final_rows.z.{l}``                             ``[n, n_heads·d_head]``
``AttentionEntropy(pos)``       ``attention_entropy.{pos}.{l}``, every l         ``[n, n_heads]``
``NextTokenEntropy()``          ``next_token_entropy``                           ``[n]``
``TokenLogprobs(ids)``          ``token_logprobs``                               ``[n, k]``
``TailLogits(ids, T)``          ``tail_logits``, ``tail_logsumexp``              ``[n, T, k]``, ``[n, T]``
==============================  ===============================================  ======================

The keys name the read (:mod:`bayes_lens.reduced`), so two reads never write one key: an
``AttentionEntropy("last")`` and an ``AttentionEntropy("all")`` can be kept in one run.

Example
-------
>>> from bayes_lens.reads import FinalRows, NextTokenEntropy
>>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], reads=[FinalRows(-1, "v"), NextTokenEntropy()])
>>> sorted(rc)
['final_rows.v.1', 'next_token_entropy']
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import adapter
from ._allow import allow_read, check_read
from ._validate import check_choice, check_nonneg_int
from .errors import BayesLensError, InvalidInputError, MissingHookError
from .hooks import (
    HOOK_POINTS,
    check_finite,
    final_query_rows,
    final_rows,
    key_entropy_bits,
    last_index,
    mean_over_real_rows,
    pattern_entropy_bits,
)
from .metrics.stats import entropy_bits
from .reduced import NEXT_TOKEN_ENTROPY, TAIL_LOGITS, TAIL_LOGSUMEXP, TOKEN_LOGPROBS, entropy_name, row_name

__all__ = ["Read", "BoundRead", "CacheView", "FinalRows", "AttentionEntropy", "NextTokenEntropy", "TokenLogprobs",
           "TailLogits", "reads_for", "read_from_spec", "allow_read"]

HookList = List[Tuple[str, object]]


@dataclass(frozen=True, eq=False)
class CacheView:
    """What a read sees of a user's cache: the cache, its model, the ``[n, pos]`` mask and the logits
    (``[n, pos, vocab]`` or None). :meth:`read` fetches one activation, refusing a missing hook or a
    cache made without its batch dimension."""

    cache: object
    model: object
    mask: Tensor
    logits: Optional[Tensor] = None

    def has(self, name: str) -> bool:
        return adapter.cache_has(self.cache, name)

    def read(self, name: str, ndim: int) -> Tensor:
        if not self.has(name):
            raise missing_hook(name, self.cache)
        t = self.cache[name].detach()
        if t.ndim != ndim:
            raise InvalidInputError(f"{name} in the cache has shape {list(t.shape)}; expected {ndim} dimensions "
                                    "with a batch dimension (was it made with remove_batch_dim=True?).")
        return t


def missing_hook(name: str, cache) -> MissingHookError:
    """The error for a hook a read needs and the cache lacks, naming what the cache does hold."""
    return MissingHookError(
        f"the cache has no {name!r} (it holds {adapter.cache_contents(cache)}); make it with "
        "model.run_with_cache(tokens, names_filter=bl.hook_filter(...)) "
        "including that hook (e.g. sites=('v', 'pattern', 'resid_post'); bayes_lens's own hook points such as "
        "'pattern_entropy' need bl.attach(model)).")


class BoundRead:
    """A read bound to one model for one run: hook names resolved, a store for the rows of each batch.

    Subclasses override what applies: :meth:`hooks` (in-pass reductions for one batch),
    :meth:`after_pass` (work on the batch's final-token logits, or on ``batch.logits`` at every
    position when the read asked for ``logits = "all"``), :meth:`finish` (the rows it adds, in run
    order) and :meth:`from_cache`.
    """

    #: the TransformerLens hook names this read's in-pass hooks use (checked once per run)
    hook_names: Tuple[str, ...] = ()

    def __init__(self, read: "Read", model):
        self.read, self.model = read, model
        self.parts: Dict[str, List[Tensor]] = {}

    def keep(self, key: str, rows: Tensor) -> None:
        self.parts.setdefault(key, []).append(rows)

    def hooks(self, batch) -> HookList:
        return []

    def after_pass(self, batch, final_logits: Tensor) -> None:
        return None

    def finish(self, n: int) -> Dict[str, Tensor]:
        """The kept rows, concatenated over batches; a key with other than ``n`` rows is refused."""
        out = {}
        for key, parts in self.parts.items():
            rows = torch.cat(parts, dim=0)
            if rows.shape[0] != n:
                raise InvalidInputError(f"{key}: the hook did not fire once per prompt ({rows.shape[0]} rows for "
                                        f"{n} prompts); is the model stopping early (stop_at_layer) or caching "
                                        "keys/values?")
            out[key] = rows
        return out

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        raise InvalidInputError(f"{type(self.read).__name__} cannot be read from a cache.")


class Read:
    """What to keep of every prompt's forward pass (see the module doc). Subclasses are frozen
    dataclasses (so equal reads compare equal and a list of them can be de-duplicated) and define
    :meth:`bind`; ``logits`` says what they need of the unembedding: ``None``, ``"final"`` (the final
    real token's logits, the runner's default) or ``"all"`` (every position)."""

    logits: Optional[str] = None

    def __init_subclass__(cls, **kwargs):
        """A subclass defined in this process may be rebuilt from its spec here (:func:`read_from_spec`)."""
        super().__init_subclass__(**kwargs)
        allow_read(f"{cls.__module__}:{cls.__qualname__}")

    def bind(self, model) -> BoundRead:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def spec(self) -> dict:
        """The read as JSON (its class's import path and its dataclass fields): what a sharded run records in its
        settings (and hashes), and what :func:`read_from_spec` rebuilds in a worker."""
        import dataclasses
        import json

        if not dataclasses.is_dataclass(self):
            raise InvalidInputError(f"{type(self).__name__} is not a dataclass; a read needs dataclass fields to be "
                                    "recorded in a sharded run's settings.")
        cls = type(self)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
        out = {"read": f"{cls.__module__}:{cls.__qualname__}", **fields}
        try:
            json.dumps(out)
        except TypeError as err:
            raise InvalidInputError(f"{cls.__name__}'s fields are not JSON ({err}); a read in a sharded run must hold "
                                    "numbers, strings and lists of them.") from None
        return out


# ------------------------------------------------------------------------------- final-token rows
@dataclass(frozen=True)
class FinalRows(Read):
    """``act[b, last_b]`` of ``site`` at ``layer`` (``"v"``: ``hook_v`` flattened over key/value heads;
    ``"resid_post"``; ``"z"``: ``attn.hook_z``, each query head's attention output before W_O, flattened
    over the heads: ``n_heads·d_head``, head h at columns ``h·d_head … (h+1)·d_head − 1``), float32 on the
    CPU (METHODS.md §1, §13). A negative ``layer`` counts from the end."""

    layer: int
    site: str = "v"

    def __post_init__(self):
        check_choice(self.site, "site", ("v", "resid_post", "z"))

    def bind(self, model) -> BoundRead:
        return _BoundFinalRows(self, model)


class _BoundFinalRows(BoundRead):
    def __init__(self, read: FinalRows, model):
        super().__init__(read, model)
        self.layer = adapter.resolve_layers(model, read.layer)[0]
        self.name = adapter.hook_name(model, self.layer, read.site)
        self.key = row_name(self.layer, read.site)
        self.hook_names = (self.name,)

    def hooks(self, batch) -> HookList:
        mask, idx = batch.attention_mask, batch.indices

        def fn(act, hook=None):
            self.keep(self.key, final_rows(act, mask, what=self.name, indices=idx))

        return [(self.name, fn)]

    def finish(self, n: int) -> Dict[str, Tensor]:
        if self.key not in self.parts:
            self.parts[self.key] = [torch.zeros(0)]
        return super().finish(n)

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        ndim = 3 if self.read.site == "resid_post" else 4
        return {self.key: final_rows(view.read(self.name, ndim), view.mask, what=self.name)}


# ------------------------------------------------------------------------------- attention entropy
@dataclass(frozen=True)
class AttentionEntropy(Read):
    """Per-head attention entropy (bits) of every layer, over real keys: of the final real query row
    (``positions="last"``) or the mean over real query rows (``"all"``) (METHODS.md §3)."""

    positions: str = "last"

    def __post_init__(self):
        check_choice(self.positions, "attention_positions", ("last", "all"))

    def bind(self, model) -> BoundRead:
        return _BoundAttentionEntropy(self, model)


class _BoundAttentionEntropy(BoundRead):
    def __init__(self, read: AttentionEntropy, model):
        super().__init__(read, model)
        self.n_layers = int(adapter.model_info(model).n_layers)
        self.names = [adapter.hook_name(model, layer, "pattern") for layer in range(self.n_layers)]
        self.hook_names = tuple(self.names)
        self.rows: Dict[int, Tensor] = {}
        self.by_layer: Dict[int, List[Tensor]] = {}

    def hooks(self, batch) -> HookList:
        mask, last, idx = batch.attention_mask, batch.last_index, batch.indices
        if self.read.positions == "last":  # rows kept per layer, reduced once per batch in after_pass
            self.rows.clear()

            def keep_rows(pattern, hook=None, _layer=0, _name=""):
                self.rows[_layer] = final_query_rows(pattern, mask, what=_name, last=last)

            fn = keep_rows
        else:
            def fn(pattern, hook=None, _layer=0, _name=""):
                self.by_layer.setdefault(_layer, []).append(
                    pattern_entropy_bits(pattern, mask, positions="all", what=_name, indices=idx))

        return [(name, partial(fn, _layer=layer, _name=name)) for layer, name in enumerate(self.names)]

    def after_pass(self, batch, final_logits: Tensor) -> None:
        if self.read.positions != "last" or len(self.rows) != self.n_layers:
            return  # "all" reduced in the hooks; a layer that did not fire is named by finish
        dev = batch.attention_mask.device  # a model split across devices: one device first
        stacked = torch.stack([self.rows[layer].to(dev, non_blocking=True) for layer in range(self.n_layers)], dim=1)
        if stacked.device.type != "meta" and not bool(torch.isfinite(stacked).all()):  # name the first bad layer
            bad = next(layer for layer in range(self.n_layers) if not bool(torch.isfinite(self.rows[layer]).all()))
            check_finite(self.rows[bad], self.names[bad], batch.indices)
        keys = batch.attention_mask.to(stacked.device).bool()[:, None, None, :]
        ent = key_entropy_bits(stacked, keys, indices=batch.indices).cpu()  # [b, L, h]
        for layer in range(self.n_layers):
            self.by_layer.setdefault(layer, []).append(ent[:, layer])
        self.rows.clear()

    def finish(self, n: int) -> Dict[str, Tensor]:
        for layer in range(self.n_layers):
            self.parts[entropy_name(layer, self.read.positions)] = self.by_layer.get(layer) or [torch.zeros(0)]
        return super().finish(n)

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        out = {}
        for layer in range(self.n_layers):
            point = HOOK_POINTS["pattern_entropy"].format(layer=layer)
            if view.has(point):  # bl.attach's entropy point: [b, q, h] entropies of every row
                ent = _reduce_row_entropy(view.read(point, 3).transpose(1, 2), view.mask, self.read.positions)
            else:
                ent = pattern_entropy_bits(view.read(self.names[layer], 4), view.mask, positions=self.read.positions,
                                           what=self.names[layer])
            out[entropy_name(layer, self.read.positions)] = ent
        return out


def _reduce_row_entropy(ent: Tensor, mask: Tensor, positions: str) -> Tensor:
    """[b, h] from ``hook_pattern_entropy`` (transposed to [b, h, q]): the final real query row, or the mean over real rows."""
    ent = ent.double().cpu()
    mask = mask.bool().cpu()
    if ent.shape[-1] != mask.shape[1] or ent.shape[0] != mask.shape[0]:
        raise InvalidInputError(f"hook_pattern_entropy has shape {list(ent.shape)} but the mask is {list(mask.shape)}.")
    out = ent[torch.arange(ent.shape[0]), :, last_index(mask)] if positions == "last" else mean_over_real_rows(ent, mask)
    check_finite(out, "hook_pattern_entropy")
    return out


# ------------------------------------------------------------------------------- logits at the final token
def _final_logits(view: CacheView) -> Tensor:
    n = view.logits.shape[0]
    last = last_index(view.mask)
    fl = view.logits[torch.arange(n, device=view.logits.device), last.to(view.logits.device)]
    check_finite(fl, "the final-token logits")
    return fl


@dataclass(frozen=True)
class NextTokenEntropy(Read):
    """The full-vocabulary next-token entropy (bits) at the final real token, float64 (METHODS.md §4).
    From a cache: from the logits, else from ``hook_next_token_entropy`` (inside ``bl.attach``) when cached."""

    logits = "final"

    def bind(self, model) -> BoundRead:
        return _BoundNextTokenEntropy(self, model)


class _BoundNextTokenEntropy(BoundRead):
    def after_pass(self, batch, final_logits: Tensor) -> None:
        self.keep(NEXT_TOKEN_ENTROPY, entropy_bits(final_logits, from_logits=True).cpu().double())

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        if view.logits is not None:
            return {NEXT_TOKEN_ENTROPY: entropy_bits(_final_logits(view), from_logits=True).cpu().double()}
        name = HOOK_POINTS["next_token_entropy"]
        if not view.has(name):
            return {}  # optional from a cache: ReducedCache.next_token_entropy_bits says how to get it
        h = view.read(name, 3)[..., 0]
        last = last_index(view.mask)
        return {NEXT_TOKEN_ENTROPY: h[torch.arange(h.shape[0], device=h.device), last.to(h.device)].double().cpu()}


def _check_token_ids(model, token_ids) -> Tensor:
    ids = torch.as_tensor(list(token_ids) if not isinstance(token_ids, Tensor) else token_ids,
                          dtype=torch.long).flatten()
    d_vocab = int(getattr(model.cfg, "d_vocab", 0) or 0)
    if ids.numel() and (int(ids.min()) < 0 or (d_vocab and int(ids.max()) >= d_vocab)):
        raise InvalidInputError(f"token_ids must lie in [0, {d_vocab}), got {ids.tolist()}.")
    return ids


@dataclass(frozen=True)
class TokenLogprobs(Read):
    """Full-vocabulary log-probabilities (float64) of ``token_ids`` at the final real token (the SULA
    labels, METHODS.md §6). From a cache it needs the logits."""

    token_ids: Tuple[int, ...]
    logits = "final"

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(i) for i in torch.as_tensor(self.token_ids).flatten().tolist()))

    def bind(self, model) -> BoundRead:
        return _BoundTokenLogprobs(self, model)


class _BoundTokenLogprobs(BoundRead):
    def __init__(self, read: TokenLogprobs, model):
        super().__init__(read, model)
        self.ids = _check_token_ids(model, read.token_ids)

    def _logprobs(self, final_logits: Tensor) -> Tensor:
        logp = torch.log_softmax(final_logits.double(), dim=-1)
        return logp[:, self.ids.to(logp.device)].cpu()

    def after_pass(self, batch, final_logits: Tensor) -> None:
        self.keep(TOKEN_LOGPROBS, self._logprobs(final_logits))

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        if view.logits is None:
            raise MissingHookError("token log-probabilities need the logits: pass the (logits, cache) pair "
                                   "run_with_cache returns, or logits=.")
        return {TOKEN_LOGPROBS: self._logprobs(_final_logits(view))}


@dataclass(frozen=True)
class TailLogits(Read):
    """The logits of ``token_ids`` (float32) and the full-vocabulary log-sum-exp (float64) at each of the
    last ``positions`` real positions of every prompt, NaN before a prompt's first token (the martingale
    predictive, METHODS.md §8). The unembedding then runs at every position."""

    token_ids: Tuple[int, ...]
    positions: int
    logits = "all"

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(i) for i in torch.as_tensor(self.token_ids).flatten().tolist()))
        check_nonneg_int(self.positions, "tail_positions")
        if not self.positions or not self.token_ids:
            raise InvalidInputError("tail_positions needs token_ids: the tokens whose logits to keep at those positions.")

    def bind(self, model) -> BoundRead:
        return _BoundTailLogits(self, model)


class _BoundTailLogits(BoundRead):
    def __init__(self, read: TailLogits, model):
        super().__init__(read, model)
        self.ids = _check_token_ids(model, read.token_ids)

    def _stats(self, logits: Tensor, mask: Tensor) -> None:
        """One row at a time, as ``logits[row, positions].double()`` then ``logsumexp`` over the vocabulary:
        a float64 copy of one row's tail, never of the whole batch."""
        tail, b = self.read.positions, logits.shape[0]
        last, n_real = last_index(mask), mask.sum(1).long()
        out_l = torch.full((b, tail, int(self.ids.numel())), float("nan"), dtype=torch.float32)
        out_s = torch.full((b, tail), float("nan"), dtype=torch.float64)
        ids = self.ids.to(logits.device)
        for row in range(b):
            k = min(tail, int(n_real[row]))  # the row's real positions among the last `tail`
            pos = torch.arange(int(last[row]) - k + 1, int(last[row]) + 1, device=logits.device)
            lg = logits[row, pos].double()
            out_l[row, tail - k:] = lg[:, ids].float().cpu()
            out_s[row, tail - k:] = torch.logsumexp(lg, dim=-1).cpu()
        self.keep(TAIL_LOGITS, out_l)
        self.keep(TAIL_LOGSUMEXP, out_s)

    def after_pass(self, batch, final_logits: Tensor) -> None:
        self._stats(batch.logits, batch.attention_mask)

    def from_cache(self, view: CacheView) -> Dict[str, Tensor]:
        if view.logits is None:
            raise MissingHookError("tail logits need the logits: pass the (logits, cache) pair run_with_cache "
                                   "returns, or logits=.")
        self.parts.clear()
        self._stats(view.logits, view.mask)
        return {k: v[0] for k, v in self.parts.items()}


# ------------------------------------------------------------------------------- keywords → reads
def reads_for(model, *, value_layers: Sequence[int] = (), resid_layers: Sequence[int] = (), attention: bool = False,
              attention_positions: str = "last", token_ids=None, tail_positions: int = 0) -> List[Read]:
    """The reads that ``collect``'s keywords spell (layers resolved against ``model``), next-token entropy
    always included: ``value_layers`` / ``resid_layers`` → :class:`FinalRows`, ``attention`` →
    :class:`AttentionEntropy`, ``token_ids`` → :class:`TokenLogprobs` (and :class:`TailLogits` with
    ``tail_positions > 0``)."""
    check_choice(attention_positions, "attention_positions", ("last", "all"))
    check_nonneg_int(tail_positions, "tail_positions")
    reads: List[Read] = [FinalRows(layer, "v") for layer in value_layers]
    reads += [FinalRows(layer, "resid_post") for layer in resid_layers]
    if attention:
        reads.append(AttentionEntropy(attention_positions))
    reads.append(NextTokenEntropy())
    if token_ids is not None:
        ids = _check_token_ids(model, token_ids)
        reads.append(TokenLogprobs(tuple(ids.tolist())))
        if tail_positions:
            reads.append(TailLogits(tuple(ids.tolist()), int(tail_positions)))
    elif tail_positions:
        raise InvalidInputError("tail_positions needs token_ids: the tokens whose logits to keep at those positions.")
    return reads


def read_from_spec(spec: dict) -> Read:
    """The :class:`Read` that :meth:`Read.spec` describes (lists back to tuples), its class imported by path.

    A spec is data (a shard plan's settings): its class is imported only if this process allows it
    (the :class:`Read` subclasses defined here, :func:`allow_read`, ``--allow-read``,
    ``BAYES_LENS_ALLOW_READS``; :mod:`bayes_lens._allow`), checked on the string before the import."""
    import dataclasses
    import importlib

    if not isinstance(spec, dict) or not isinstance(spec.get("read"), str) or ":" not in spec["read"]:
        raise InvalidInputError(f"a read spec is a dict with 'read': 'module:Class' (Read.spec()), got {spec!r}.")
    name = spec["read"]
    if name == f"{Read.__module__}:{Read.__qualname__}":
        raise InvalidInputError(f"the read spec names {name!r}, the base class of the reads, which keeps nothing; name "
                                "a subclass (bayes_lens.reads:FinalRows, ... or your own Read subclass).")
    check_read(name)  # before anything of it is imported
    module, _, qualname = name.partition(":")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError) as err:
        raise InvalidInputError(f"cannot import the read class {name!r} ({err}); define it in a module every "
                                "worker imports.") from None
    if not (isinstance(cls, type) and issubclass(cls, Read)) or cls is Read:
        raise InvalidInputError(f"{name!r} is not a bayes_lens.reads.Read subclass.")
    if not dataclasses.is_dataclass(cls):
        raise InvalidInputError(f"{name!r} is not a dataclass, so a read spec cannot rebuild it; make it a "
                                "@dataclass(frozen=True).")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items() if k != "read"}
    params = [f for f in dataclasses.fields(cls) if f.init]
    known = [f.name for f in params]
    unknown = sorted(set(fields) - set(known))
    missing = [f.name for f in params if f.name not in fields and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        what = (f"unknown field(s) {unknown}" if unknown else "") + ("; " if unknown and missing else "") + \
            (f"missing field(s) {missing}" if missing else "")
        raise InvalidInputError(f"the read spec of {name!r} has {what}; {cls.__name__} takes {known} (make the spec "
                                f"with Read.spec(), e.g. {cls.__name__}(...).spec()).")
    try:
        return cls(**fields)
    except BayesLensError:
        raise
    except (TypeError, ValueError) as err:
        raise InvalidInputError(f"the read spec {spec!r} does not build a {cls.__name__} ({err}); make the spec with "
                                "Read.spec().") from None


def unique(reads: Sequence[Read]) -> List[Read]:
    """``reads`` without repeats (equal reads keep the first), refusing anything that is not a :class:`Read`."""
    out: List[Read] = []
    for r in reads:
        if not isinstance(r, Read):
            raise InvalidInputError(f"reads must be bayes_lens.reads.Read objects (FinalRows, AttentionEntropy, ...), "
                                    f"got {type(r).__name__}.")
        if r not in out:
            out.append(r)
    return out
