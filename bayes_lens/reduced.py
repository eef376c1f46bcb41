"""The reduced cache: the one currency of bayes_lens's analyses, keyed by read.

A TransformerLens ``ActivationCache`` maps a hook name to ``[batch, pos, ...]``. The analyses of
Paper A (METHODS.md §1–§6), the martingale predictive (§8) and the readout-or-mediator tests (§13) read
only a few positions of a few hooks, so the runner (:func:`bayes_lens.collect.collect`) and the cache
reducer (:func:`bayes_lens.collect.reduce_cache`) keep each quantity *reduced over positions*, with the
same reducers (one :mod:`bayes_lens.reads` class per quantity), under the key of the read that made it
(not a hook name: a reduced row has another shape than the hook's activation):

==========================================  ======================  ==========================================
key (read)                                  shape                   what (METHODS.md)
==========================================  ======================  ==========================================
``final_rows.v.{l}`` (``FinalRows``)        ``[n, n_kv_heads·d]``   ``hook_v`` at the final real token (§1)
``final_rows.resid_post.{l}``               ``[n, d_model]``        ``hook_resid_post`` at the final real token
``final_rows.z.{l}``                        ``[n, n_heads·d]``      ``attn.hook_z`` at the final real token (§13)
``attention_entropy.{p}.{l}``               ``[n, n_heads]``        attention entropy (bits) over real keys of
(``AttentionEntropy``)                                              the final real query row (``p = last``) or
                                                                    its mean over real rows (``p = all``) (§3)
``next_token_entropy``                      ``[n]``                 full-vocabulary next-token entropy (bits) at
                                                                    the final real token (§4)
``token_logprobs``                          ``[n, k]``              log-probabilities of ``token_ids`` there (§6)
``tail_logits``                             ``[n, T, k]``           logits of ``token_ids`` at the last ``T`` real
                                                                    positions (NaN before a prompt's start) (§8)
``tail_logsumexp``                          ``[n, T]``              full-vocabulary log-sum-exp there (§8)
==========================================  ======================  ==========================================

Row ``i`` is prompt ``indices[i]`` (global numbers, so shards merge in order) with ``n_tokens[i]`` real
tokens. A reduced cache is a read-only ``Mapping``: ``rc["final_rows.v.3"]``, ``dict(rc)``, ``rc.keys()``;
:meth:`ReducedCache.value_rows` and the other accessors spell the keys for you;
:meth:`ReducedCache.merge` concatenates shards, :meth:`~ReducedCache.save` / :meth:`~ReducedCache.load`
keep it in one checksummed ``.safetensors`` file. Every analysis accepts one wherever it accepts a model
or a cache. The keys of earlier releases (TL hook names such as ``"blocks.3.attn.hook_v"``) still
read, with a ``DeprecationWarning`` (:func:`canonical_key`); files and shard folders written with them
load unchanged.

Example
-------
>>> rc = bl.collect.collect(model, ["The cat sat on the", "2 + 2 ="], value_layers=[-1], attention=True)
>>> sorted(rc)[:2]
['attention_entropy.last.0', 'attention_entropy.last.1']
>>> rc["final_rows.v.1"].shape        # [prompts, n_kv_heads * d_head]
torch.Size([2, 32])
>>> rc.value_rows(-1).shape == rc["final_rows.v.1"].shape
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ._validate import check_choice, check_positions
from .errors import CheckpointError, InvalidInputError, MissingHookError

__all__ = ["ReducedCache", "VALUE_NAME", "RESID_NAME", "HEADS_NAME", "ENTROPY_NAME", "NEXT_TOKEN_ENTROPY",
           "TOKEN_LOGPROBS", "TAIL_LOGITS", "TAIL_LOGSUMEXP", "row_name", "entropy_name", "canonical_key"]

#: the keys of a reduced cache (``{layer}`` and ``{positions}`` filled in)
VALUE_NAME = "final_rows.v.{layer}"
RESID_NAME = "final_rows.resid_post.{layer}"
HEADS_NAME = "final_rows.z.{layer}"
ENTROPY_NAME = "attention_entropy.{positions}.{layer}"
NEXT_TOKEN_ENTROPY = "next_token_entropy"
TOKEN_LOGPROBS = "token_logprobs"
TAIL_LOGITS = "tail_logits"
TAIL_LOGSUMEXP = "tail_logsumexp"

_ROW_SITES = {"v": VALUE_NAME, "resid_post": RESID_NAME, "z": HEADS_NAME}
_KEY = re.compile(r"^(final_rows\.(v|resid_post|z)|attention_entropy\.(last|all))\.(\d+)$")
#: the keys of earlier releases (TL hook names reused for reduced rows), read with a DeprecationWarning
_LEGACY_ROWS = re.compile(r"^blocks\.(\d+)\.(attn\.hook_v|hook_resid_post|attn\.hook_z|hook_pattern_entropy)$")
_LEGACY_SITE = {"attn.hook_v": "v", "hook_resid_post": "resid_post", "attn.hook_z": "z"}
_SITE_LEGACY = {site: hook for hook, site in _LEGACY_SITE.items()}
_LEGACY_MODEL = {"hook_next_token_entropy": NEXT_TOKEN_ENTROPY, "hook_token_logprobs": TOKEN_LOGPROBS,
                 "hook_tail_logits": TAIL_LOGITS, "hook_tail_logsumexp": TAIL_LOGSUMEXP}
#: the ``format`` entry of a saved reduced cache (1: the legacy hook-name keys; 2: read keys)
FORMAT = "bayes-lens-reduced-cache/2"


def row_name(layer: int, site: str = "v") -> str:
    """The key of the final-token rows of ``site`` (``"v"``, ``"resid_post"`` or ``"z"``) at ``layer``."""
    check_choice(site, "site", sorted(_ROW_SITES))
    return _ROW_SITES[site].format(layer=int(layer))


def entropy_name(layer: int, positions: str = "last") -> str:
    """The key of the per-head attention entropies at ``layer`` over ``positions`` (``"last"`` or ``"all"``)."""
    check_positions(positions, "attention_positions")
    return ENTROPY_NAME.format(layer=int(layer), positions=positions)


def legacy_row_name(layer: int, site: str = "v") -> str:
    """An earlier release's key of :func:`row_name`'s rows (the TL hook name), as shard folders of then hold it."""
    check_choice(site, "site", sorted(_ROW_SITES))
    return f"blocks.{int(layer)}.{_SITE_LEGACY[site]}"


def canonical_key(name: str, attention_positions: str = "last") -> str:
    """``name`` as a read key: an earlier release's hook-name key (``"blocks.3.attn.hook_v"``,
    ``"blocks.3.hook_pattern_entropy"`` — then at ``attention_positions`` —, ``"hook_token_logprobs"`` ...)
    becomes today's (``"final_rows.v.3"``, ``"attention_entropy.last.3"``, ``"token_logprobs"``); any other
    name is returned as it is."""
    m = _LEGACY_ROWS.match(name)
    if m is not None:
        layer, what = int(m.group(1)), m.group(2)
        return entropy_name(layer, attention_positions) if what == "hook_pattern_entropy" else row_name(
            layer, _LEGACY_SITE[what])
    return _LEGACY_MODEL.get(name, name)


def layer_of(name: str) -> Optional[int]:
    """The layer of a per-layer key (``final_rows.v.3`` → 3, or an earlier release's ``blocks.3.…``), else None."""
    m = _KEY.match(canonical_key(name))
    return None if m is None else int(m.group(4))


def site_of(name: str) -> Optional[str]:
    """``"v"`` / ``"resid_post"`` / ``"z"`` for a row key, ``"pattern_entropy"`` for an entropy key, else None."""
    m = _KEY.match(canonical_key(name))
    if m is None:
        return None
    return m.group(2) or "pattern_entropy"


def positions_of(name: str) -> Optional[str]:
    """``"last"`` / ``"all"`` for an attention-entropy key, else None."""
    m = _KEY.match(name)
    return None if m is None else m.group(3)


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"reduced-cache key {old!r} is now {new!r} (keys name the read that made the rows, not a "
                  "TransformerLens hook with another shape); the old spelling will be removed.",
                  DeprecationWarning, stacklevel=3)


class ReducedCache(Mapping):
    """Read key → ``Tensor[n, …]``: every quantity the analyses read, reduced over positions (see the module doc).

    Parameters
    ----------
    tensors:
        The reduced tensors by key (CPU tensors, first dimension the prompts).
    n_tokens:
        Real tokens of each prompt, ``[n]``.
    indices:
        Global prompt numbers, ``[n]`` (default ``arange(n)``).
    attention_positions:
        ``"last"`` (the final query row's) or ``"all"`` (the mean over real query rows): the positions of the
        attention entropies the analyses read. Default: those of the ``attention_entropy.{p}.{l}`` keys held
        (``"last"`` when none, or when both are held). Keys of earlier releases
        (``blocks.{l}.hook_pattern_entropy``) are taken to be at these positions.
    """

    __slots__ = ("_tensors", "n_tokens", "indices", "attention_positions")

    def __init__(self, tensors: Mapping, *, n_tokens: Int[Tensor, "n"], indices: Optional[Int[Tensor, "n"]] = None,
                 attention_positions: Optional[str] = None):
        if attention_positions is not None:
            check_positions(attention_positions, "attention_positions")
        n_tokens = _counts(n_tokens, "n_tokens")
        n = int(n_tokens.shape[0])
        if indices is not None:
            indices = _counts(indices, "indices")
            if int(indices.shape[0]) != n:
                raise InvalidInputError(f"indices has {int(indices.shape[0])} entries but n_tokens {n}; pass one "
                                        "global prompt number per row.")
        out = {}
        for name, t in tensors.items():
            key = canonical_key(str(name), attention_positions or "last")
            if key != name:
                _deprecated(str(name), key)
            name = key
            if not isinstance(t, Tensor):
                raise InvalidInputError(f"{name!r} must be a tensor, got {type(t).__name__}.")
            if t.ndim == 0 or int(t.shape[0]) != n:
                raise InvalidInputError(f"{name!r} has shape {list(t.shape)}; every tensor of a reduced cache has one "
                                        f"row per prompt ({n}).")
            out[str(name)] = t
        object.__setattr__(self, "_tensors", dict(sorted(out.items(), key=lambda kv: _sort_key(kv[0]))))
        object.__setattr__(self, "n_tokens", n_tokens)
        object.__setattr__(self, "indices", torch.arange(n) if indices is None else indices)
        held = {positions_of(k) for k in out} - {None}
        if attention_positions is not None and held and attention_positions not in held:
            raise InvalidInputError(f"attention_positions={attention_positions!r} but the attention entropies held are "
                                    f"at {sorted(held)} (their keys say so); drop attention_positions= or collect them "
                                    f"at {attention_positions!r}.")
        if attention_positions is None:
            attention_positions = held.pop() if len(held) == 1 else "last"
        object.__setattr__(self, "attention_positions", attention_positions)

    def __setattr__(self, name, value):
        raise AttributeError("a ReducedCache is read-only; build a new one (e.g. ReducedCache.merge).")

    # ---- Mapping ---------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except (KeyError, TypeError):
            key = canonical_key(name, self.attention_positions) if isinstance(name, str) else name
            if key != name and key in self._tensors:
                _deprecated(name, key)
                return self._tensors[key]
            raise KeyError(f"{name!r} is not in this reduced cache; it holds {list(self._tensors)}") from None

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and canonical_key(name, self.attention_positions) in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __reduce__(self):
        return (_rebuild, (self._tensors, self.n_tokens, self.indices, self.attention_positions))

    @property
    def n_prompts(self) -> int:
        return int(self.n_tokens.shape[0])

    def layers(self, site: str = "v") -> List[int]:
        """The layers whose final-token rows of ``site`` this cache holds."""
        return sorted(layer_of(k) for k in self._tensors if site_of(k) == site)

    def __repr__(self) -> str:  # shapes, never the tensors
        most = int(self.n_tokens.max()) if self.n_prompts else 0
        lines = [f"ReducedCache: {self.n_prompts} prompts, {most} tokens at most, attention at "
                 f"{self.attention_positions!r} positions"]
        for k, t in self._tensors.items():
            lines.append(f"  {k}: {tuple(int(d) for d in t.shape)} {str(t.dtype).replace('torch.', '')}")
        return "\n".join(lines)

    # ---- reading, with errors that say what to collect -------------------------------------------
    def require(self, name: str, how: str) -> Tensor:
        """``self[name]``, or a MissingHookError that says ``how`` to get it."""
        name = canonical_key(name, self.attention_positions)
        if name not in self._tensors:
            raise MissingHookError(f"this reduced cache holds no {name!r} (it holds {list(self._tensors) or 'nothing'}); "
                                   f"{how}")
        return self._tensors[name]

    def value_rows(self, layer: int, site: str = "v") -> Float[Tensor, "n dim"]:
        """Final-token rows of ``site`` at ``layer`` (a negative ``layer`` counts the held layers from the end only
        when this cache holds exactly one layer of ``site``)."""
        held = self.layers(site)
        if layer < 0 and len(held) == 1:
            layer = held[0]
        return self.require(row_name(layer, site),
                            f"collect with {'value_layers' if site == 'v' else 'resid_layers'}=[{layer}].")

    def attention_entropy_bits(self, n_layers: Optional[int] = None,
                               positions: Optional[str] = None) -> Float[Tensor, "n n_layers n_heads"]:
        """Per-layer, per-head attention entropies at ``positions`` (default :attr:`attention_positions`)
        stacked to ``[n, n_layers, n_heads]``."""
        positions = self.attention_positions if positions is None else check_positions(positions, "positions")
        layers = sorted(layer_of(k) for k in self._tensors if positions_of(k) == positions)
        n_layers = (max(layers) + 1 if layers else 0) if n_layers is None else n_layers
        if not layers or layers != list(range(n_layers)):
            other = sorted({positions_of(k) for k in self._tensors} - {None, positions})
            hint = (f" (it holds them at positions={other[0]!r}: collect again with attention_positions={positions!r})"
                    if other else "")
            raise MissingHookError(f"this reduced cache holds attention entropies at positions={positions!r} at layers "
                                   f"{layers}, not all {n_layers}{hint}; collect with attention=True (or cache "
                                   "hook_pattern of every layer).")
        return torch.stack([self._tensors[entropy_name(layer, positions)] for layer in layers], dim=1)

    def next_token_entropy_bits(self) -> Float[Tensor, "n"]:
        return self.require(
            NEXT_TOKEN_ENTROPY, "from a cache pass the logits too - the (logits, cache) pair run_with_cache returns, "
            "or logits= - or cache 'hook_next_token_entropy' inside bl.attach(model).")

    def token_logprobs(self) -> Float[Tensor, "n k"]:
        return self.require(TOKEN_LOGPROBS, "collect with token_ids= (from a cache: pass the logits too).")

    # ---- combining and storing --------------------------------------------------------------------
    @classmethod
    def merge(cls, parts: Sequence["ReducedCache"]) -> "ReducedCache":
        """Concatenate shards in order (all must hold the same keys, trailing shapes and attention positions)."""
        parts = list(parts)
        if not parts:
            raise InvalidInputError("ReducedCache.merge needs at least one reduced cache.")
        first = parts[0]
        for p in parts[1:]:
            if not isinstance(p, ReducedCache):
                raise InvalidInputError(f"ReducedCache.merge takes reduced caches, got {type(p).__name__}.")
            if (list(p) != list(first) or p.attention_positions != first.attention_positions
                    or any(p[k].shape[1:] != first[k].shape[1:] or p[k].dtype != first[k].dtype for k in first)):
                raise InvalidInputError("cannot merge reduced caches made with different layers, fields or "
                                        "attention_positions; collect every shard with the same arguments.")
        return cls({k: torch.cat([p[k] for p in parts], dim=0) for k in first},
                   n_tokens=torch.cat([p.n_tokens for p in parts]), indices=torch.cat([p.indices for p in parts]),
                   attention_positions=first.attention_positions)

    def file_tensors(self) -> Dict[str, Tensor]:
        """Every tensor to store: the keys, ``n_tokens`` and ``indices``."""
        return {**self._tensors, "n_tokens": self.n_tokens, "indices": self.indices}

    @classmethod
    def from_file_tensors(cls, tensors: Mapping, attention_positions: str = "last") -> "ReducedCache":
        """Inverse of :meth:`file_tensors` (keys of earlier releases' files read as today's, silently)."""
        tensors = {canonical_key(str(k), attention_positions): v for k, v in dict(tensors).items()}
        if "n_tokens" not in tensors:
            raise InvalidInputError("these tensors hold no 'n_tokens': not a bayes_lens reduced cache.")
        n_tokens, indices = tensors.pop("n_tokens"), tensors.pop("indices", None)
        return cls(tensors, n_tokens=n_tokens, indices=indices, attention_positions=attention_positions)

    def save(self, path: Union[str, Path], metadata: Optional[Dict[str, str]] = None) -> Path:
        """Write to one ``.safetensors`` file, atomically, with a SHA-256 of every tensor and of the metadata
        (read it back with :meth:`load`, which verifies them)."""
        from ._files import save_checked_safetensors

        if metadata is None:
            metadata = {}
        if not isinstance(metadata, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in metadata.items()):
            raise InvalidInputError(f"metadata must be a dict of strings to strings (safetensors stores text), got "
                                    f"{metadata!r:.200}; convert the values with str() or json.dumps().")
        reserved = sorted(set(metadata) & set(_RESERVED_META))
        if reserved:
            raise InvalidInputError(f"metadata may not set {reserved}: the file records them itself "
                                    f"({', '.join(_RESERVED_META)}); use other keys.")
        meta = {"attention_positions": self.attention_positions, "format": FORMAT, **metadata}
        return save_checked_safetensors(path, self.file_tensors(), meta)

    @classmethod
    def load(cls, path: Union[str, Path], *, names: Optional[Iterable[str]] = None, error=None) -> "ReducedCache":
        """Read a file written by :meth:`save` (or a shard's tensor file), verifying every checksum it carries;
        ``names`` keeps only those keys. Damage raises ``error`` (default
        :class:`~bayes_lens.errors.CheckpointError`)."""
        from ._files import read_checked_safetensors

        keep = None
        if names is not None:  # today's or earlier releases' spellings, of the names asked for and of the file's
            wanted = {canonical_key(n, p) for n in names for p in ("last", "all")} | {"n_tokens", "indices"}

            def keep(stored: str) -> bool:
                return any(canonical_key(stored, p) in wanted for p in ("last", "all"))

        tensors, meta = read_checked_safetensors(path, keep=keep, error=error,
                                                 fix="write it again (ReducedCache.save, or bayes-lens shard merge).")
        if "n_tokens" not in tensors:
            raise (error or CheckpointError)(f"{str(path)!r} holds no 'n_tokens': not a bayes_lens reduced cache.")
        return cls.from_file_tensors(tensors, meta.get("attention_positions", "last"))


_RESERVED_META = ("format", "attention_positions", "tensors_sha256", "metadata_sha256")


def _counts(x, name: str) -> Tensor:
    """``x`` as a 1-D int64 tensor of non-negative whole numbers, or the InvalidInputError saying what is wrong."""
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InvalidInputError(f"{name} must be a 1-D tensor of non-negative integers, got {x!r:.100} ({err}).") from None
    if t.ndim != 1:
        raise InvalidInputError(f"{name} must be 1-D (one entry per prompt), got shape {list(t.shape)}.")
    if t.dtype == torch.bool or t.is_complex():
        raise InvalidInputError(f"{name} must hold integers, got dtype {t.dtype}.")
    if t.is_floating_point():
        if not bool(torch.isfinite(t).all()) or not bool(t.eq(t.round()).all()):
            raise InvalidInputError(f"{name} must hold whole numbers, got {t.tolist()[:8]}.")
    if t.numel() and int(t.min()) < 0:
        raise InvalidInputError(f"{name} must be non-negative, got {t.tolist()[:8]}.")
    return t.long().cpu()


def _rebuild(tensors, n_tokens, indices, attention_positions):
    return ReducedCache(tensors, n_tokens=n_tokens, indices=indices, attention_positions=attention_positions)


def _sort_key(name: str):
    layer = layer_of(name)
    return (0 if layer is not None else 1, layer or 0, name)
