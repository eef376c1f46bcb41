"""Tiny random TransformerLens models and an in-memory tokenizer, built without any download.

For unit tests, tutorials and quick experiments: :func:`tiny_model` returns a 2-layer model of
either kind (``"hooked"`` = TL 3.x ``HookedTransformer``, ``"bridge"`` = ``TransformerBridge``),
with or without grouped-query attention and rotary embeddings; :func:`tiny_pair` returns the *same*
random llama weights as both kinds, so results can be compared across model kinds.

The tokenizer is byte-level BPE (every byte is a token, so any text encodes) with merges for a short
list of words: " 0"/" 1" (Bernoulli prompts), SULA's nonsense labels and carrier words, ":" etc.

Example
-------
>>> from bayes_lens.models.tiny import tiny_model
>>> model = tiny_model("hooked", gqa=True, rotary=True)     # doctest: +SKIP
>>> model.cfg.n_key_value_heads                            # doctest: +SKIP
2
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Tuple

import torch

from ..errors import InvalidInputError
from .gguf import LlamaSpec, from_weights

__all__ = ["tiny_tokenizer", "tiny_model", "tiny_pair", "TINY_WORDS"]

# Words the tiny tokenizer keeps whole (with a leading space).
TINY_WORDS = (
    "0", "1", "dax", "lug", "mip", "zorb", "wug", "kep", "query", "is", "the", "a", "cat", "dog",
    "tree", "house", "river", "stone", "bird", "moon", "apple", "chair", "cloud", "lamp",
)


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    vocab = {"<|endoftext|>": 0, "<|pad|>": 1}
    for ch in alphabet:
        vocab.setdefault(ch, len(vocab))
    merges = []
    for word in TINY_WORDS:
        piece = "Ġ"
        for ch in word:
            merged = piece + ch
            if merged not in vocab:
                merges.append((piece, ch))
                vocab[merged] = len(vocab)
            piece = merged
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def tiny_tokenizer():
    """A byte-level BPE ``PreTrainedTokenizerFast`` made in memory (vocabulary ~300 tokens)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
    )
    tok.init_kwargs["name_or_path"] = "bayes-lens-tiny"
    tok.init_kwargs["add_bos_token"] = True  # see gguf._tokenizer: skips TL's re-load by name
    return tok


def _spec(*, n_layers, d_model, n_heads, n_kv_heads, d_head, d_mlp, d_vocab, n_ctx) -> LlamaSpec:
    return LlamaSpec(
        path=Path("tiny-llama"), name="tiny-llama", n_layers=n_layers, d_model=d_model, d_mlp=d_mlp,
        n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head, n_ctx=n_ctx, d_vocab=d_vocab,
        rope_base=10000.0, rms_eps=1e-5, tied_embeddings=False, metadata={}, reader=None,
    )


def _random_llama_weights(spec: LlamaSpec, seed: int):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.02):
        return torch.randn(*shape, generator=g) * scale

    yield "model.embed_tokens.weight", rnd(spec.d_vocab, spec.d_model, scale=1.0)
    yield "model.norm.weight", 1 + rnd(spec.d_model, scale=0.1)
    yield "lm_head.weight", rnd(spec.d_vocab, spec.d_model, scale=spec.d_model ** -0.5)
    s = spec.d_model ** -0.5
    for layer in range(spec.n_layers):
        p = f"model.layers.{layer}."
        yield p + "input_layernorm.weight", 1 + rnd(spec.d_model, scale=0.1)
        yield p + "post_attention_layernorm.weight", 1 + rnd(spec.d_model, scale=0.1)
        yield p + "self_attn.q_proj.weight", rnd(spec.n_heads * spec.d_head, spec.d_model, scale=s)
        yield p + "self_attn.k_proj.weight", rnd(spec.n_kv_heads * spec.d_head, spec.d_model, scale=s)
        yield p + "self_attn.v_proj.weight", rnd(spec.n_kv_heads * spec.d_head, spec.d_model, scale=s)
        yield p + "self_attn.o_proj.weight", rnd(spec.d_model, spec.n_heads * spec.d_head, scale=s)
        yield p + "mlp.gate_proj.weight", rnd(spec.d_mlp, spec.d_model, scale=s)
        yield p + "mlp.up_proj.weight", rnd(spec.d_mlp, spec.d_model, scale=s)
        yield p + "mlp.down_proj.weight", rnd(spec.d_model, spec.d_mlp, scale=spec.d_mlp ** -0.5)


def tiny_model(kind: str = "hooked", *, gqa: bool = True, rotary: bool = True, n_layers: int = 2,
               d_model: int = 64, n_heads: int = 4, d_head: int = 16, n_ctx: int = 256, seed: int = 0):
    """A tiny random model (raw weights, eval mode) of ``kind`` ``"hooked"`` or ``"bridge"``.

    ``gqa=True`` uses half as many key/value heads as query heads. ``rotary=False`` gives learned
    absolute positions: a HookedTransformer with ``positional_embedding_type="standard"`` or a
    GPT-2 bridge (GPT-2 has no grouped-query attention, so ``kind="bridge", rotary=False`` needs
    ``gqa=False``).
    """
    tok = tiny_tokenizer()
    d_vocab = len(tok)
    n_kv = n_heads // 2 if gqa else n_heads
    if rotary:
        spec = _spec(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head,
                     d_mlp=4 * d_model, d_vocab=d_vocab, n_ctx=n_ctx)
        weights = _random_llama_weights(spec, seed)
        if kind not in ("hooked", "bridge"):
            raise InvalidInputError(f"kind must be 'hooked' or 'bridge', got {kind!r}.")
        return from_weights(spec, weights, tok, kind)
    if kind == "hooked":
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        cfg = HookedTransformerConfig(
            model_name="tiny-standard", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head,
            d_mlp=4 * d_model, n_ctx=n_ctx, d_vocab=d_vocab, act_fn="gelu", normalization_type="LN",
            positional_embedding_type="standard", n_key_value_heads=n_kv if gqa else None, seed=seed,
            default_prepend_bos=False,
        )
        model = HookedTransformer(cfg, tokenizer=tok, default_padding_side="right")
        return model.eval()
    if kind == "bridge":
        if gqa:
            raise InvalidInputError("a GPT-2 bridge has no grouped-query attention; pass gqa=False.")
        from transformer_lens.model_bridge import TransformerBridge
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=d_vocab, n_positions=n_ctx, n_embd=d_model, n_layer=n_layers,
                                        n_head=n_heads, attn_implementation="eager"))
        hf.eval()
        bridge = TransformerBridge.boot_transformers("tiny-gpt2", hf_model=hf, tokenizer=tok)
        bridge.cfg.default_prepend_bos = False
        return bridge.eval()
    raise InvalidInputError(f"kind must be 'hooked' or 'bridge', got {kind!r}.")


def tiny_pair(*, gqa: bool = True, seed: int = 0, **kw) -> Tuple[object, object]:
    """The same random llama weights as ``(HookedTransformer, TransformerBridge)``."""
    return tiny_model("hooked", gqa=gqa, seed=seed, **kw), tiny_model("bridge", gqa=gqa, seed=seed, **kw)
