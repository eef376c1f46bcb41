"""The adapter's token facet: tokenizing a batch, its padding and mask, and reading users' caches.

Part of :mod:`bayes_lens.adapter` (METHODS.md §0 "Padding"): a padded batch with its attention mask
(:func:`tokenize`, :func:`encode_prompts`, :func:`pad_batch`), the mask TransformerLens would build
from tokens alone (:func:`mask_from_tokens`, :func:`masks_left_padding_from_tokens`), and what a
user's ``ActivationCache`` holds (:func:`is_activation_cache`, :func:`cache_model`, :func:`cache_has`).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from jaxtyping import Int
from torch import Tensor

from .._validate import check_choice
from ..errors import InvalidInputError, TokenizationError
from ._models import is_bridge
from ._runtime import input_device

__all__ = [
    "tokenize",
    "encode_prompts",
    "pad_batch",
    "mask_from_tokens",
    "is_activation_cache",
    "cache_model",
    "cache_has",
    "cache_contents",
    "masks_left_padding_from_tokens",
]


def _tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise InvalidInputError(
            "the model has no tokenizer; pass token ids instead of strings, or attach a tokenizer "
            "(model.set_tokenizer(...))."
        )
    return tok


def tokenize(
    model,
    prompts: Sequence[str],
    *,
    padding_side: str = "right",
    prepend_bos: Optional[bool] = None,
) -> Tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Tokenize ``prompts`` into a padded batch: ``(tokens, attention_mask)`` on :func:`input_device`.

    ``prepend_bos`` defaults to the model's own setting (``cfg.default_prepend_bos``; False for the
    GGUF models, whose tokenizer adds no BOS). Raises for an empty list, a non-string, an empty
    prompt, or a prompt longer than the model's context. The same as
    ``pad_batch(model, encode_prompts(model, prompts), padding_side=...)``.
    """
    check_choice(padding_side, "padding_side", ("left", "right"))
    return pad_batch(model, encode_prompts(model, prompts, prepend_bos=prepend_bos), padding_side=padding_side)


def encode_prompts(model, prompts: Sequence[str], *, prepend_bos: Optional[bool] = None) -> List[List[int]]:
    """The token ids of each prompt (BOS first when ``prepend_bos``, default the model's setting), checked
    as :func:`tokenize` checks them; errors name the prompt by its position in ``prompts``."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings, not one string; wrap it: [prompt].")
    prompts = list(prompts)
    if not prompts:
        raise InvalidInputError("the prompt list is empty; pass at least one prompt.")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise InvalidInputError(f"prompt {i} is a {type(p).__name__}, expected a string.")
        if not p:
            raise InvalidInputError(f"prompt {i} is the empty string; every prompt needs at least one token.")
    tok = _tokenizer(model)
    if prepend_bos is None:
        prepend_bos = bool(getattr(model.cfg, "default_prepend_bos", False))
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    if prepend_bos:
        bos = tok.bos_token_id
        if bos is None:
            raise TokenizationError("prepend_bos=True but the tokenizer has no BOS token.")
        ids = [[bos] + i for i in ids]
    n_ctx = int(getattr(model.cfg, "n_ctx", 0) or 0)
    for i, seq in enumerate(ids):
        if not seq:
            raise TokenizationError(f"prompt {i} ({prompts[i]!r}) tokenizes to no tokens.")
        if n_ctx and len(seq) > n_ctx:
            raise TokenizationError(
                f"prompt {i} has {len(seq)} tokens but the model's context is {n_ctx}; shorten it."
            )
    return ids


def pad_batch(model, ids: Sequence[Sequence[int]], *, padding_side: str = "right"
              ) -> Tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Token id lists (from :func:`encode_prompts`) as a padded ``(tokens, attention_mask)`` batch on
    :func:`input_device`, padded with the tokenizer's pad token (else EOS) on ``padding_side``."""
    check_choice(padding_side, "padding_side", ("left", "right"))
    tok = _tokenizer(model)
    width = max(len(s) for s in ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    tokens = torch.full((len(ids), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, seq in enumerate(ids):
        if padding_side == "right":
            tokens[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
        else:
            tokens[i, width - len(seq):] = torch.tensor(seq)
            mask[i, width - len(seq):] = 1
    device = input_device(model)
    return tokens.to(device), mask.to(device)


def mask_from_tokens(model, tokens: Int[Tensor, "batch pos"],
                     padding_side: Optional[str] = None) -> Int[Tensor, "batch pos"]:
    """The attention mask of padded ``tokens``: 0 on the run of pad tokens at the padded end, else 1.

    The padded end is the tokenizer's ``padding_side`` (``model.to_tokens`` pads on the right), as
    TransformerLens decides it; a leading BOS that shares the pad id stays real. Only the trailing
    (right) or leading (left) run of pad ids counts as padding, so a pad id inside a prompt is kept.
    """
    tok = _tokenizer(model)
    side = padding_side or getattr(tok, "padding_side", "right") or "right"
    check_choice(side, "padding_side", ("left", "right"))
    pad = tok.pad_token_id
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2:
        raise InvalidInputError(f"tokens must be [batch, pos], got shape {list(tokens.shape)}.")
    mask = torch.ones_like(tokens, dtype=torch.long)
    if pad is None:
        return mask
    real = tokens.ne(int(pad)).long()
    if side == "right":
        pad_run = real.flip(-1).cumsum(-1).flip(-1) == 0
    else:
        pad_run = real.cumsum(-1) == 0
        bos = getattr(tok, "bos_token_id", None)
        if bos is not None and int(bos) == int(pad) and bool(getattr(model.cfg, "default_prepend_bos", False)):
            first_real = pad_run.sum(-1) - 1
            rows = (first_real >= 0).nonzero().flatten()
            pad_run[rows, first_real[rows]] = False
    mask[pad_run] = 0
    if not bool(mask.any(dim=1).all()):
        bad = (~mask.bool().any(dim=1)).nonzero().flatten().tolist()
        raise InvalidInputError(f"rows {bad} of the tokens are all pad tokens; pass attention_mask= instead.")
    return mask


def is_activation_cache(obj) -> bool:
    """True for a TransformerLens ``ActivationCache`` (what ``run_with_cache`` returns)."""
    try:
        from transformer_lens import ActivationCache
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, ActivationCache)


def cache_model(cache):
    """The model an ``ActivationCache`` was made by (for its config: layers, heads, hook names)."""
    model = getattr(cache, "model", None)
    if model is None or not hasattr(model, "cfg"):
        raise InvalidInputError(
            "this ActivationCache does not record the model that made it; make it with "
            "model.run_with_cache(...) or pass the model and prompts instead."
        )
    return model


def cache_has(cache, name: str) -> bool:
    """Whether an ``ActivationCache`` holds the activation ``name``."""
    try:
        return name in cache.cache_dict
    except AttributeError:  # pragma: no cover
        return name in dict(cache.items())


def cache_contents(cache, *, limit: int = 8) -> str:
    """What a cache holds, for an error message: ``"blocks.{15-29}.attn.hook_v, hook_embed"``.

    Hook names under ``blocks.{l}.`` are grouped by the rest of the name with their layers as ranges;
    at most ``limit`` groups are listed (then "and N more"). ``"nothing"`` for an empty cache.
    """
    try:
        names = list(cache.cache_dict)
    except AttributeError:
        names = list(dict(cache.items()) if hasattr(cache, "items") else cache)
    groups: Dict[str, List[int]] = {}
    for name in map(str, names):
        m = re.match(r"blocks\.(\d+)\.(.+)$", name)
        key, layer = (m.group(2), int(m.group(1))) if m else (name, None)
        groups.setdefault(key, [])
        if layer is not None:
            groups[key].append(layer)
    if not groups:
        return "nothing"

    def ranges(layers):
        layers, out = sorted(set(layers)), []
        for k in layers:
            if out and k == out[-1][1] + 1:
                out[-1][1] = k
            else:
                out.append([k, k])
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)

    said = [f"blocks.{{{ranges(layers)}}}.{key}" if layers else key for key, layers in groups.items()]
    more = len(said) - limit
    return ", ".join(said[:limit]) + (f" and {more} more" if more > 0 else "")


def masks_left_padding_from_tokens(model) -> bool:
    """Whether ``model(tokens)`` without ``attention_mask=`` masks left padding itself.

    A HookedTransformer builds the mask from the tokens when its tokenizer pads on the left (TL's
    ``get_attention_mask``); a TransformerBridge passes no mask to the Hugging Face model, so its
    real tokens attend to left pads.
    """
    return not is_bridge(model)
