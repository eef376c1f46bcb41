"""Tiny random TransformerLens models and an in-memory tokenizer, built without any download.

For unit tests, tutorials and quick experiments: :func:`tiny_model` returns a 2-layer model of
either kind (``"hooked"`` = TL 3.x ``HookedTransformer``, ``"bridge"`` = ``TransformerBridge``),
with or without grouped-query attention and rotary embeddings; :func:`tiny_pair` returns the *same*
random llama weights as both kinds, so results can be compared across model kinds.

Architecture families: ``tiny_model(kind, family="gpt2")`` builds a random-weight model of one of
:data:`FAMILIES` (GPT-2; Pythia = GPT-NeoX with parallel attention and partial rotary; Phi; Llama-3
with GQA; Mistral with a sliding window; Mixtral (MoE); Qwen2 with q/k/v biases; Gemma-2 with
softcaps and alternating local/global layers; Gemma-3) from a ``transformers`` config, with
non-trivial norm gains and biases so that weight processing matters, in each of :data:`FAMILY_KINDS`:
``"hooked"`` (HookedTransformer, raw weights, as ``from_pretrained_no_processing``),
``"hooked_processed"`` (as ``HookedTransformer.from_pretrained``: fold_ln, center_writing_weights,
center_unembed (not with a logit softcap), fold_value_biases), ``"bridge"`` (TransformerBridge over
the transformers model) and ``"bridge_compat"`` (the bridge after ``enable_compatibility_mode()``).
:func:`tiny_hf_model` returns the transformers twin (same seed, same weights), for checking a
TransformerLens model against the model it came from. Where TransformerLens cannot convert a family
:class:`~bayes_lens.errors.UnsupportedModelError` says why (:func:`family_support`).

Ground truth: :func:`planted_model` builds a tiny llama of either kind whose weights are set by hand
so that its SULA posterior (METHODS.md §6) is the exact Bayesian one, computed through one planted
residual direction that the unembedding reads (a *mediator*) beside one that carries a copy of the
same signal and that nothing reads (*readout only*): the known answer a readout-versus-mediator
analysis (METHODS.md §7) must recover. :func:`confidence_model` builds a tiny random llama whose final MLP
holds two neurons set by hand: one writing into the unembedding's exact null space (an *entropy neuron*:
it moves the entropy only through the final norm's scale) and one writing along the unembedding's top
singular direction (a *logit neuron*: its effect is direct), the known answer of ``bl.confidence``
(METHODS.md §15).

The tokenizer is byte-level BPE (every byte is a token, so any text encodes) with merges for a short
list of words: " 0"/" 1" (Bernoulli prompts), SULA's nonsense labels and carrier words, ":" etc.

Example
-------
>>> from bayes_lens.models.tiny import planted_model, tiny_model
>>> model = tiny_model("bridge", gqa=True, rotary=True)     # "hooked" too on TransformerLens 3.x
>>> model.cfg.n_key_value_heads, model.cfg.n_layers
(2, 2)
>>> planted_model_, planted = planted_model("bridge")          # the ground-truth model
>>> planted.hook_name, planted.labels
('blocks.0.hook_resid_post', ('dax', 'lug'))
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._validate import check_choice
from ..errors import InvalidInputError, UnsupportedModelError
from .gguf import LlamaSpec, from_weights

__all__ = ["tiny_tokenizer", "tiny_model", "tiny_pair", "tiny_hf_model", "family_support", "TINY_WORDS",
           "FAMILIES", "FAMILY_KINDS", "planted_model", "PlantedDirections", "steering_model", "SteeringTruth",
           "PLANTED_RMS_EPS", "confidence_model", "PlantedNeurons", "redundant_model",
           "RedundantCopies"]

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
               d_model: Optional[int] = None, n_heads: int = 4, d_head: int = 16, n_ctx: Optional[int] = None,
               seed: int = 0, family: Optional[str] = None):
    """A tiny random model (raw weights, eval mode) of ``kind`` ``"hooked"`` or ``"bridge"``.

    With ``family=`` (one of :data:`FAMILIES`) a model of that architecture family in ``kind`` (one
    of :data:`FAMILY_KINDS`); ``gqa``/``rotary``/``d_head`` are then the family's own, ``n_layers``,
    ``d_model`` (default 64, or 32 for a family), ``n_heads``, ``n_ctx`` (default 256, or 128 for a
    family) and ``seed`` apply. The same seed
    gives the same weights in every kind and in :func:`tiny_hf_model`.

    ``gqa=True`` uses half as many key/value heads as query heads. ``rotary=False`` gives learned
    absolute positions: a HookedTransformer with ``positional_embedding_type="standard"`` or a
    GPT-2 bridge (GPT-2 has no grouped-query attention, so ``kind="bridge", rotary=False`` needs
    ``gqa=False``).
    """
    if family is not None:
        return _family_model(family, kind, n_layers=n_layers, d_model=d_model or 32, n_heads=n_heads,
                             n_ctx=n_ctx or 128, seed=seed)
    check_choice(kind, "kind", ("hooked", "bridge"))
    d_model, n_ctx = d_model or 64, n_ctx or 256
    tok = tiny_tokenizer()
    d_vocab = len(tok)
    n_kv = n_heads // 2 if gqa else n_heads
    if rotary:
        spec = _spec(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head,
                     d_mlp=4 * d_model, d_vocab=d_vocab, n_ctx=n_ctx)
        weights = _random_llama_weights(spec, seed)
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
    raise AssertionError(f"unreachable: kind={kind!r} was checked above")


def tiny_pair(*, gqa: bool = True, seed: int = 0, **kw) -> Tuple[object, object]:
    """The same random llama weights as ``(HookedTransformer, TransformerBridge)``."""
    return tiny_model("hooked", gqa=gqa, seed=seed, **kw), tiny_model("bridge", gqa=gqa, seed=seed, **kw)


# ---------------------------------------------------------------------------------------------
# Architecture families
# ---------------------------------------------------------------------------------------------

#: the families :func:`tiny_model` builds with ``family=``
FAMILIES = ("gpt2", "pythia", "phi", "llama", "mistral", "mixtral", "qwen2", "gemma2", "gemma3")
#: the kinds a family model comes in
FAMILY_KINDS = ("hooked", "hooked_processed", "bridge", "bridge_compat")

_HF_CLASS = {
    "gpt2": "GPT2LMHeadModel", "pythia": "GPTNeoXForCausalLM", "phi": "PhiForCausalLM",
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM",
}
#: sliding window of the tiny models' local layers (short, so that prompts of ~10 tokens exceed it)
TINY_WINDOW = 4


def _check_family(family: str, kind: str) -> None:
    check_choice(family, "family", list(FAMILIES))
    check_choice(kind, "kind", list(FAMILY_KINDS))


def family_support(family: str, kind: str) -> Optional[str]:
    """None when the installed TransformerLens can build ``family`` as ``kind``, else the reason it cannot."""
    from ..adapter import has_hooked_transformer

    _check_family(family, kind)
    if kind.startswith("hooked") and not has_hooked_transformer():
        return "TransformerLens 4.x has no HookedTransformer (removed in 4.0); use a TransformerBridge"
    if kind == "bridge_compat":
        from transformer_lens.model_bridge import TransformerBridge

        if not hasattr(TransformerBridge, "enable_compatibility_mode"):
            return "this TransformerBridge has no enable_compatibility_mode()"
    return None


def _hf_config(family: str, *, n_layers: int, d_model: int, n_heads: int, n_ctx: int, d_vocab: int):
    import transformers as tf

    kv = max(1, n_heads // 2)
    common = dict(vocab_size=d_vocab, hidden_size=d_model, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                  intermediate_size=2 * d_model, max_position_embeddings=n_ctx, tie_word_embeddings=False)
    if family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=d_vocab, n_positions=n_ctx, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
                            bos_token_id=0, eos_token_id=0)
    elif family == "pythia":
        cfg = tf.GPTNeoXConfig(rotary_pct=0.5, use_parallel_residual=True, **common)
    elif family == "phi":
        cfg = tf.PhiConfig(partial_rotary_factor=0.5, **common)
    elif family == "llama":
        cfg = tf.LlamaConfig(num_key_value_heads=kv, **common)
    elif family == "mistral":
        cfg = tf.MistralConfig(num_key_value_heads=kv, sliding_window=TINY_WINDOW, **common)
    elif family == "mixtral":
        cfg = tf.MixtralConfig(num_key_value_heads=kv, num_local_experts=4, num_experts_per_tok=2, **common)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(num_key_value_heads=kv, **common)
    elif family == "gemma2":
        common["tie_word_embeddings"] = True
        cfg = tf.Gemma2Config(num_key_value_heads=kv, head_dim=d_model // n_heads, sliding_window=TINY_WINDOW,
                              query_pre_attn_scalar=d_model // n_heads, final_logit_softcapping=5.0,
                              attn_logit_softcapping=10.0, **common)
    else:  # gemma3
        common["tie_word_embeddings"] = True
        cfg = tf.Gemma3TextConfig(num_key_value_heads=kv, head_dim=d_model // n_heads, sliding_window=TINY_WINDOW,
                                  query_pre_attn_scalar=d_model // n_heads, sliding_window_pattern=2,
                                  layer_types=["sliding_attention", "full_attention"] * (n_layers // 2)
                                  + ["sliding_attention"] * (n_layers % 2), **common)
    cfg.architectures = [_HF_CLASS[family]]
    cfg.bos_token_id = cfg.eos_token_id = 0  # the tiny tokenizer's <|endoftext|>
    cfg.pad_token_id = 1
    return cfg


def _randomize(hf, seed: int) -> None:
    """Random weights of a size that makes attention and next-token distributions non-trivial, norm
    gains around 1 (around 0 for Gemma's ``1 + w`` norms) and non-zero biases wherever there are biases."""
    g = torch.Generator().manual_seed(seed)
    gemma = type(hf).__name__.startswith("Gemma")
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name or ".ln_" in name or name.endswith(("ln_f.weight", "ln_f.bias")):
                if name.endswith("bias"):
                    p.copy_(0.1 * noise)
                else:
                    p.copy_((0.0 if gemma else 1.0) + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(noise * (0.3 if gemma else 1.0))
            else:
                fan_in = p.shape[-1] if p.ndim >= 2 else p.shape[0]
                p.copy_(noise * 1.5 * fan_in ** -0.5)


def tiny_hf_model(family: str, *, n_layers: int = 2, d_model: int = 32, n_heads: int = 4, n_ctx: int = 128,
                  seed: int = 0):
    """The transformers model (eager attention, eval mode) that ``tiny_model(kind, family=..., seed=...)`` wraps
    or converts: the independent reference for checking a TransformerLens model of that family."""
    from transformers import AutoModelForCausalLM

    _check_family(family, "bridge")
    cfg = _hf_config(family, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_ctx=n_ctx,
                     d_vocab=len(tiny_tokenizer()))
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    _randomize(hf, seed)
    return hf.eval()


class _PhiConfigShim:
    """TL 3.9 reads ``PhiConfig.partial_rotary_factor``; transformers 5 keeps it in ``rope_parameters``.

    Within the block, TransformerLens's ``AutoConfig.from_pretrained`` returns a config with the old
    attribute restored (the value transformers itself uses), so TL's own Phi conversion runs.
    """

    def __enter__(self):
        import transformer_lens.loading_from_pretrained as loading

        self._loading, self._orig = loading, loading.AutoConfig
        orig = self._orig

        class _Auto:
            @staticmethod
            def from_pretrained(*a, **kw):
                cfg = orig.from_pretrained(*a, **kw)
                rope = getattr(cfg, "rope_parameters", None) or {}
                if not hasattr(cfg, "partial_rotary_factor") and "partial_rotary_factor" in rope:
                    cfg.partial_rotary_factor = rope["partial_rotary_factor"]
                return cfg

        loading.AutoConfig = _Auto
        return self

    def __exit__(self, *exc):
        self._loading.AutoConfig = self._orig


def _gemma_hooked_config(family: str, hf_cfg, n_ctx: int):
    """TL 3.9 converts Gemma 2/3 configs only by official model name (hard-coded shapes); this mirrors
    its ``google/gemma-2-2b`` / ``google/gemma-3-270m`` entries with the tiny model's shapes."""
    from transformer_lens import HookedTransformerConfig

    types = ["local" if t == "sliding_attention" else "global" for t in hf_cfg.layer_types]
    d = dict(d_model=hf_cfg.hidden_size, d_head=hf_cfg.head_dim, n_heads=hf_cfg.num_attention_heads,
             d_mlp=hf_cfg.intermediate_size, n_layers=hf_cfg.num_hidden_layers, n_ctx=n_ctx, eps=hf_cfg.rms_norm_eps,
             d_vocab=hf_cfg.vocab_size, act_fn="gelu_pytorch_tanh", normalization_type="RMS",
             positional_embedding_type="rotary", use_attn_scale=True, n_key_value_heads=hf_cfg.num_key_value_heads,
             window_size=hf_cfg.sliding_window, use_local_attn=True, attn_types=types, gated_mlp=True, final_rms=True,
             use_normalization_before_and_after=True, original_architecture=_HF_CLASS[family],
             model_name=f"tiny-{family}", default_prepend_bos=False, init_weights=False,
             attn_scale=float(hf_cfg.query_pre_attn_scalar) ** 0.5, rotary_dim=hf_cfg.head_dim)
    rope = hf_cfg.rope_parameters
    if family == "gemma2":
        d.update(rotary_base=float(rope["rope_theta"]), attn_scores_soft_cap=float(hf_cfg.attn_logit_softcapping),
                 output_logits_soft_cap=float(hf_cfg.final_logit_softcapping))
    else:
        d.update(rotary_base=float(rope["full_attention"]["rope_theta"]),
                 rotary_base_local=float(rope["sliding_attention"]["rope_theta"]), use_qk_norm=True)
    return HookedTransformerConfig(**d)


def _hooked(family: str, hf, tok, n_ctx: int):
    """A raw-weight HookedTransformer converted by TransformerLens from ``hf`` (no hub access)."""
    import json
    import tempfile

    import transformer_lens.loading_from_pretrained as loading
    from transformer_lens import HookedTransformer

    if family in ("gemma2", "gemma3"):
        from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights

        cfg = _gemma_hooked_config(family, hf.config, n_ctx)
        state = convert_gemma_weights(hf, cfg)
    else:
        with tempfile.TemporaryDirectory(prefix="bl_tiny_") as tmp:
            # a local folder: TL reads its config.json (a name with "llama"/"gemma" in it would send TL
            # down its name-based branches)
            folder = Path(tmp) / "model"
            hf.config.save_pretrained(folder)
            if family == "gpt2":  # TL reads GPT-2's context from n_ctx
                j = json.loads((folder / "config.json").read_text())
                j["n_ctx"] = n_ctx
                (folder / "config.json").write_text(json.dumps(j))
            shim = _PhiConfigShim() if family == "phi" else contextlib.nullcontext()
            with shim:
                cfg = loading.get_pretrained_model_config(str(folder), device="cpu", default_prepend_bos=False)
                state = loading.get_pretrained_state_dict(str(folder), cfg, hf)
        cfg.model_name = f"tiny-{family}"
    model = HookedTransformer(cfg, tok, move_to_device=False, default_padding_side="right")
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False)
    return model.eval()


def _process_like_from_pretrained(model) -> None:
    """Process a HookedTransformer's weights in place as ``HookedTransformer.from_pretrained`` does by default."""
    softcap = (getattr(model.cfg, "output_logits_soft_cap", None) or -1.0) > 0
    model.load_and_process_state_dict(model.state_dict(), fold_ln=True, center_writing_weights=True,
                                      center_unembed=not softcap, fold_value_biases=True)


def _family_model(family: str, kind: str, *, n_layers: int, d_model: int, n_heads: int, n_ctx: int, seed: int):
    _check_family(family, kind)
    why = family_support(family, kind)
    if why is not None:
        raise UnsupportedModelError(f"cannot build a tiny {family} as {kind!r}: {why}.")
    tok = tiny_tokenizer()
    hf = tiny_hf_model(family, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_ctx=n_ctx, seed=seed)
    if kind.startswith("hooked"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _hooked(family, hf, tok, n_ctx)
            if kind == "hooked_processed":
                _process_like_from_pretrained(model)
        return model.eval()
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(f"tiny-{family}", hf_model=hf, tokenizer=tok)
        bridge.cfg.default_prepend_bos = False
        if kind == "bridge_compat":
            bridge.enable_compatibility_mode()
    return bridge.eval()


# ---------------------------------------------------------------------------------------------
# A model with planted directions (ground truth for readout-versus-mediator localisation)
# ---------------------------------------------------------------------------------------------

#: RMSNorm ε of the planted model: far above any mean square the residual reaches, so every norm
#: is linear (x·w/√ε) to float32 precision and the residual's length feeds no logit
PLANTED_RMS_EPS = 1e10
#: attention score of the sink (BOS) key in the planted head: the other keys each get
#: e^-score of the sink's weight, so the head sums (not averages) the label coordinate
_SINK_SCORE = 10.0
#: logit the labels have above every other token at no evidence (through the constant coordinate), so
#: that they hold the next-token mass
_LABEL_LOGIT = 10.0


@dataclass(frozen=True, eq=False)
class PlantedDirections:
    """The ground truth :func:`planted_model` returns with its model.

    At ``hook_name`` (``blocks.{layer}.hook_resid_post``) the final-token residual is
    ``c·mediator + c·readout_only + (orthogonal rest)`` with ``c = evidence_scale·(n₁ − n₂)`` (up to
    the sink's weight, ≤ 0.2% on SULA prompts): the unembedding of the two labels reads ``mediator``
    (logit(L1) − logit(L2) = ``log_odds_per_example``·c/``evidence_scale`` + logit(prior)) and no
    weight anywhere reads ``readout_only``. ``v_hook_name`` (``blocks.{layer}.attn.hook_v``, flattened
    over the key/value heads as :data:`bayes_lens.adapter.VECTOR_SITES` ``"v"``) holds
    ``±v_scale·(v_mediator + v_readout_only)`` at each label token (+ for L1, − for L2) and 0 along
    both at every other token (the final one included): the planted head sums them into the two
    residual directions. All four are float32 unit vectors.
    """

    layer: int
    site: str
    hook_name: str
    mediator: Tensor
    readout_only: Tensor
    v_hook_name: str
    v_mediator: Tensor
    v_readout_only: Tensor
    labels: Tuple[str, str]
    label_ids: Tuple[int, int]
    evidence_scale: float
    log_odds_per_example: float
    prior: float
    v_scale: float


def _orthonormal(n: int, g: torch.Generator, exact: Tuple[int, ...]) -> Tensor:
    """An orthogonal n × n matrix (float64): column i is the unit vector e_exact[i] for each i, and the
    other columns are a Haar-random basis of the remaining coordinates (exact zeros on ``exact``)."""
    m = n - len(exact)
    q, r = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    rest = torch.tensor([i for i in range(n) if i not in exact])
    out = torch.zeros(n, n, dtype=torch.float64)
    for col, i in enumerate(exact):
        out[i, col] = 1.0
    out[rest[:, None], torch.arange(len(exact), n)[None, :]] = q
    return out


def _planted_weights(spec: LlamaSpec, *, layer: int, label_ids, bos_id: int, p: float, prior: float,
                     evidence_scale: float, seed: int, sink_score: float = _SINK_SCORE, amplifier=None,
                     redundant: bool = False):
    """``(weights, planted)``: the planted model's HF-named weights (float64) and the directions they plant
    (mediator, readout_only, their value roles in KV head 0, the value gain, and - with ``amplifier`` =
    (bias G, gain a, κ) - the amplifier direction, else None; see :func:`steering_model`). With
    ``redundant`` the two written directions are both read, each enough alone (:func:`redundant_model`):
    the unembedding reads a sixth role, ``used``, that the MLPs of layers ``layer + 1`` and ``layer + 2``
    write from the two copies."""
    weights = {}
    g = torch.Generator().manual_seed(seed)
    d, dh, nh, nkv, dm, vocab = (spec.d_model, spec.d_head, spec.n_heads, spec.n_kv_heads, spec.d_mlp,
                                 spec.d_vocab)
    f64 = dict(dtype=torch.float64)

    def rnd(*shape, scale):
        return torch.randn(*shape, generator=g, **f64) * scale

    # residual roles as columns of a random rotation, except readout_only and the label coordinate: the
    # last two coordinates, so that every other weight's entries on them are exact zeros (removing
    # readout_only leaves every logit bit for bit; no rounding of another token's value is summed
    # into the planted head's output and amplified by its gain e^score)
    basis = _orthonormal(d, g, exact=(d - 1, d - 2))
    ro, label, med, const, bos = (basis[:, i] for i in range(5))
    first = 5 if amplifier is None else 6   # with an amplifier, column 5 is its direction (nothing else reads it)
    amp = None if amplifier is None else basis[:, 5]
    if redundant:  # columns 5..9: the role the unembedding reads and four scratch roles (nothing else touches them)
        first = 10
        used, scratch = basis[:, 5], basis[:, 6:10]
    n_tok = (d - first) // 2
    tok_sub = basis[:, first:first + n_tok]      # token identity (junk the distractors read)
    junk = basis[:, first + n_tok:]              # where distractors write; nothing that matters reads it
    read = torch.stack([const, bos, label], 1)
    read = torch.cat([read, tok_sub, junk], 1)  # what distractors may read: all but med, ro

    def reads(rows, scale=1.0):   # [rows, d]: random reads of the allowed subspace
        return rnd(rows, read.shape[1], scale=scale * read.shape[1] ** -0.5) @ read.T

    def writes(cols, scale):      # [d, cols]: random writes into the junk subspace
        return junk @ rnd(junk.shape[1], cols, scale=scale * cols ** -0.5)

    gain = math.sqrt(spec.rms_eps)  # RMSNorm(x)·gain = x to float32 precision (ε ≫ mean x²)
    emb = const[None, :] + rnd(vocab, n_tok, scale=0.3 * n_tok ** -0.5) @ tok_sub.T
    emb[bos_id] += bos
    emb[label_ids[0]] += label
    emb[label_ids[1]] -= label
    weights["model.embed_tokens.weight"] = emb
    weights["model.norm.weight"] = torch.full((d,), gain, **f64)
    log_odds = math.log(p / (1 - p))
    unembed = rnd(vocab, junk.shape[1] + n_tok, scale=0.3 * d ** -0.5) @ torch.cat([tok_sub, junk], 1).T
    unembed -= _LABEL_LOGIT * const[None, :]   # every other token 10 nats below the labels
    bias = math.log(prior / (1 - prior))
    # with an amplifier the mediator coordinate reaches the unembedding multiplied by 1 + κ·silu(G) (the neuron
    # below, at α = 0): the read is divided by it, so the clean posterior stays the exact one
    amp_gain = 1.0 if amplifier is None else 1.0 + amplifier[2] * float(torch.nn.functional.silu(
        torch.tensor(float(amplifier[0]), **f64)))
    for sign, tid in ((1.0, label_ids[0]), (-1.0, label_ids[1])):
        unembed[tid] = (sign * (0.5 * log_odds / evidence_scale / amp_gain) * (used if redundant else med)
                        + (sign * 0.5 * bias) * const)
    weights["lm_head.weight"] = unembed

    half = dh // 2
    sink = half - 1                       # the slowest rotary pair (sink, sink + half): ~no rotation
    sigma = math.sqrt(sink_score * math.sqrt(dh))
    v_basis = _orthonormal(dh, g, exact=(0, 1))  # value roles 0, 1 (planted) are coordinates 0, 1
    v_scale = math.sqrt(evidence_scale * math.exp(sink_score))
    group = nh // nkv
    for li in range(spec.n_layers):
        pre = f"model.layers.{li}."
        weights[pre + "input_layernorm.weight"] = torch.full((d,), gain, **f64)
        weights[pre + "post_attention_layernorm.weight"] = torch.full((d,), gain, **f64)
        q = reads(nh * dh).view(nh, dh, d)
        k = reads(nkv * dh).view(nkv, dh, d)
        v = reads(nkv * dh).view(nkv, dh, d)
        o = writes(nh * dh, 0.5).view(d, nh, dh)
        if li == layer:
            q[0] = 0.0
            q[0, sink] = sigma * const                   # every query of head 0 asks for the sink ...
            k[0, [sink, sink + half]] = 0.0
            k[0, sink] = sigma * bos                     # ... which only BOS answers
            roles = v[0].clone()                         # value roles: 0 and 1 planted, 2.. junk
            roles[0] = roles[1] = v_scale * label
            v[0] = v_basis @ roles
            o[:, 0] = v_scale * (med[:, None] @ v_basis[:, 0][None, :] + ro[:, None] @ v_basis[:, 1][None, :])
            for h in range(1, group):                    # heads sharing the planted values ignore roles 0, 1
                o[:, h] = o[:, h] @ (v_basis[:, 2:] @ v_basis[:, 2:].T)
        weights[pre + "self_attn.q_proj.weight"] = q.reshape(nh * dh, d)
        weights[pre + "self_attn.k_proj.weight"] = k.reshape(nkv * dh, d)
        weights[pre + "self_attn.v_proj.weight"] = v.reshape(nkv * dh, d)
        weights[pre + "self_attn.o_proj.weight"] = o.reshape(d, nh * dh)
        gate, up, down = reads(dm, 2.0), reads(dm), writes(dm, 0.5)
        if amplifier is not None and li == layer + 1:
            # neuron 0: silu(G + a·(x·amp))·(x·med) written back along med, κ-scaled: the mediator times
            # 1 + κ·silu(G + a·α) - multiplicative in the evidence (silu(z) = z to 1e-8 for z ≥ 20)
            big, a, kappa = amplifier
            gate[0] = big * const + a * amp
            up[0] = med
            down[:, 0] = kappa * med
        if redundant and li in (layer + 1, layer + 2):
            _redundant_neurons(li - layer, gate, up, down, copies=(med, ro), used=used, scratch=scratch,
                               const=const, sharp=_RELU_SHARPNESS / evidence_scale)
        weights[pre + "mlp.gate_proj.weight"] = gate
        weights[pre + "mlp.up_proj.weight"] = up
        weights[pre + "mlp.down_proj.weight"] = down
    return weights, (med, ro, v_basis[:, 0], v_basis[:, 1], v_scale, amp)


#: K in relu(z) ≈ silu(K·z)/K for the redundant model's neurons: the smallest non-zero |z| is one example's
#: evidence_scale, where the error z·e^(-K·z) is below 1e-10 of z
_RELU_SHARPNESS = 25.0


def _redundant_neurons(step: int, gate, up, down, *, copies, used, scratch, const, sharp: float) -> None:
    """Set neurons 0..3 (``step`` 1) or 0..1 (``step`` 2) of a SwiGLU MLP (rows of ``gate``/``up``, columns of
    ``down``, in place) so that, with a₁ = x·copy₁ and a₂ = x·copy₂ at the block's input, the two MLPs write
    f(a₁, a₂) = max(a₁⁺, a₂⁺) − max(a₁⁻, a₂⁻) along ``used`` (t⁺ = relu(t), t⁻ = relu(−t)). Each neuron is a
    ReLU: silu(K·z)·(x·const/K) with x·const = 1 (every token's constant coordinate). Step 1: a₁⁺, a₂⁺, a₁⁻, a₂⁻
    into the four ``scratch`` roles, and a₂⁺ − a₂⁻ = a₂ along ``used``; step 2: relu(s₁ − s₂) − relu(s₃ − s₄)
    along ``used`` (max(p, q) = q + relu(p − q)). So f(a, a) = f(a, 0) = f(0, a) = a: either copy alone
    carries the signal, and a swap of one copy moves f toward the donor's when the donor's |a| is larger."""
    s1, s2, s3, s4 = (scratch[:, i] for i in range(4))
    m1, m2 = copies
    if step == 1:
        reads, outs = (m1, m2, -m1, -m2), ((s1,), (s2, used), (s3,), (s4, -used))
    else:
        reads, outs = (s1 - s2, s3 - s4), ((used,), (-used,))
    for j, (r, out) in enumerate(zip(reads, outs)):
        gate[j] = sharp * r
        up[j] = const / sharp
        down[:, j] = 0.0
        for o in out:
            down[:, j] += o
        # the other neurons (distractors) read only the allowed subspace and write into junk: nothing to clear


def planted_model(kind: str = "hooked", *, layer: int = 0, n_layers: int = 2, d_model: int = 64,
                  n_heads: int = 4, gqa: bool = True, d_head: int = 16, labels=("dax", "lug"), p: float = 0.9,
                  prior: float = 0.5, evidence_scale: float = 1.0, seed: int = 0):
    """A tiny llama of ``kind`` whose weights are set by hand so that its SULA posterior is the exact
    Bayesian one, computed through one planted direction that the unembedding reads (the *mediator*)
    beside one that carries the same signal and that no weight reads (*readout only*).

    Returns ``(model, PlantedDirections)``. The ground truth for readout-versus-mediator tests
    (METHODS.md §6, §7; "The Readout–Mediator Angle", arXiv 2605.29126; the wind tunnel's
    "probe-readable is not causally used", github vishalmisra/bayesian-wind-tunnel): removing
    ``mediator`` at ``blocks.{layer}.hook_resid_post`` sets the label posterior to the prior;
    removing ``readout_only`` leaves every logit unchanged (bit for bit).

    Construction (the residual roles are columns of a seeded random rotation, so the mediator is no
    coordinate axis): each token's embedding has a constant coordinate; BOS (always prepended:
    ``cfg.default_prepend_bos`` is True) a sink coordinate; the labels ``+1``/``-1`` on a label
    coordinate. Head 0 of ``layer`` attends from every position to BOS with score 10 (in the slowest
    rotary pair) and with score 0 to every other token, so each other token gets ``e⁻¹⁰`` of BOS's
    weight: the head *sums* the label coordinate over the prompt, c ∝ n₁ − n₂ (an average would
    depend on the prompt's length), and writes it through two value roles into ``mediator`` and
    ``readout_only``. The unembedding of the labels reads ``mediator`` only: logit(L1) − logit(L2)
    = (n₁ − n₂)·log(p/(1−p)) + logit(prior), the SULA posterior with ``p`` and ``prior``. Every other
    head, MLP and layer is a random *distractor* that reads everything but the two planted directions
    and writes into a subspace nothing downstream reads. RMSNorm ε is :data:`PLANTED_RMS_EPS` with
    gains √ε: the norms are linear, so the residual's length - to which ``readout_only`` contributes
    like any direction - feeds no logit. Every other token's logit is 10 below the labels' (through the
    constant coordinate), so the labels hold most of the next-token mass. Two roles are coordinate
    axes, so that float32 rounding cannot blur the ground truth: ``readout_only`` is the last residual
    coordinate (every weight's entries on it are exact zeros, so removing it leaves every logit the
    same bit for bit; a rotated one leaves ~1e-5 of rounding) and the label coordinate the one before
    (no other token's rounding error reaches the planted head, whose gain is e¹⁰); in the values, the
    two planted roles are the first two coordinates of KV head 0.

    ``labels`` must be single tokens of the tiny tokenizer (:func:`bayes_lens.sula.label_token_ids`); the
    default is the pair :func:`bayes_lens.sula.make_prompts` chooses. The same ``seed`` gives the same
    weights in both kinds.

    >>> import bayes_lens as bl
    >>> model, planted = planted_model("bridge")
    >>> planted.hook_name, tuple(planted.mediator.shape)
    ('blocks.0.hook_resid_post', (64,))
    >>> res = bl.sula.evaluate(model, bl.sula.make_prompts(model, ks=(0, 1, 2), n_per_k=8), n_boot=50)
    >>> res.mae_bits.value < 0.01
    True
    """
    return _build_planted(kind, layer=layer, n_layers=n_layers, d_model=d_model, n_heads=n_heads, gqa=gqa, d_head=d_head,
                          labels=labels, p=p, prior=prior, evidence_scale=evidence_scale, seed=seed)[:2]


def _build_planted(kind, *, layer, n_layers, d_model, n_heads, gqa, d_head, labels, p, prior, evidence_scale, seed,
                   sink_score: float = _SINK_SCORE, amplifier=None, rope_base: float = 10000.0, redundant: bool = False):
    """(model, PlantedDirections, amplifier direction or None): :func:`planted_model`'s construction, checked."""
    from .._validate import check_float, check_int, check_probability, check_seed
    from ..sula import label_token_ids

    check_choice(kind, "kind", ("hooked", "bridge"))
    n_layers = check_int(n_layers, "n_layers", min=1)
    layer = check_int(layer, "layer", min=0, max=n_layers - 1)
    d_model = check_int(d_model, "d_model", min=16)
    n_heads = check_int(n_heads, "n_heads", min=2 if gqa else 1)
    d_head = check_int(d_head, "d_head", min=4)
    if d_head % 2:
        raise InvalidInputError(f"d_head must be even (rotary pairs), got {d_head}.")
    if gqa and n_heads % 2:
        raise InvalidInputError(f"gqa=True shares each key/value head between two query heads: n_heads must be "
                                f"even, got {n_heads}.")
    p = check_float(p, "p", min=0.5, max=1.0, min_inclusive=False, max_inclusive=False)
    prior = check_probability(prior, "prior", open_interval=True)
    evidence_scale = check_float(evidence_scale, "evidence_scale", min=0.0, min_inclusive=False)
    seed = check_seed(seed)
    tok = tiny_tokenizer()
    label_ids = label_token_ids(tok, labels)  # each a single token with its leading space, or an error
    labels = (labels[0], labels[1])
    spec = _spec(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_heads // 2 if gqa else n_heads,
                 d_head=d_head, d_mlp=4 * d_model, d_vocab=len(tok), n_ctx=256)
    spec = dataclasses.replace(spec, name="tiny-planted", path=Path("tiny-planted"), rms_eps=PLANTED_RMS_EPS,
                               rope_base=float(rope_base), metadata={"tokenizer.ggml.add_bos_token": True})
    weights, (med, ro, v_med, v_ro, v_scale, amp) = _planted_weights(
        spec, layer=layer, label_ids=label_ids, bos_id=int(tok.bos_token_id), p=p, prior=prior,
        evidence_scale=evidence_scale, seed=seed, sink_score=sink_score, amplifier=amplifier, redundant=redundant)
    model = from_weights(spec, ((k, w.float()) for k, w in weights.items()), tok, kind)
    n_kv = spec.n_kv_heads

    def flat_v(u):  # a direction of KV head 0, flattened over the key/value heads as the "v" site is
        out = torch.zeros(n_kv * d_head, dtype=torch.float64)
        out[:d_head] = u
        return out.float()

    planted = PlantedDirections(
        layer=layer, site="resid_post", hook_name=f"blocks.{layer}.hook_resid_post", mediator=med.float(),
        readout_only=ro.float(), v_hook_name=f"blocks.{layer}.attn.hook_v", v_mediator=flat_v(v_med),
        v_readout_only=flat_v(v_ro), labels=labels, label_ids=label_ids, evidence_scale=evidence_scale,
        log_odds_per_example=math.log(p / (1 - p)), prior=prior, v_scale=v_scale)
    return model, planted, (None if amp is None else amp.float())


@dataclass(frozen=True, eq=False)
class RedundantCopies:
    """The ground truth :func:`redundant_model` returns with its model: at ``hook_name``
    (``blocks.{layer}.hook_resid_post``) the residual holds the evidence c = evidence_scale·(n₁ − n₂) on both
    ``copies`` (float32 unit vectors ``[d]``, orthogonal); the output reads f(a₁, a₂) = max(a₁⁺, a₂⁺) −
    max(a₁⁻, a₂⁻) of their coordinates, so removing either copy changes no answer (f(0, a) = f(a, 0) = a) and
    removing both sets the posterior to the prior; ``span`` is the ``[d, 2]`` basis of the two."""

    layer: int
    site: str
    hook_name: str
    copies: Tuple[Tensor, Tensor]
    span: Tensor
    labels: Tuple[str, str]
    label_ids: Tuple[int, int]
    log_odds_per_example: float


def redundant_model(kind: str = "hooked", *, d_model: int = 64, seed: int = 0):
    """A tiny llama of ``kind`` that carries its SULA evidence redundantly on two residual directions: the
    ground truth for a mediator test on a redundantly carried signal (METHODS.md §13).

    Returns ``(model, RedundantCopies)``. Built as :func:`planted_model` with 3 layers (layer 0's head sums the
    labels into two directions at ``blocks.0.hook_resid_post``; linear norms; every other weight a distractor
    that reads neither), except that no weight reads either copy linearly: four neurons of layer 1's MLP and
    two of layer 2's (ReLUs made of SwiGLU neurons, silu(K·z)·(1/K)) compute f(a₁, a₂) = max(a₁⁺, a₂⁺) −
    max(a₁⁻, a₂⁻) into a role the unembedding reads, so that the clean posterior is the exact one and
    f(a, 0) = f(0, a) = f(a, a) = a. Removing one copy leaves every answer (to float32 rounding); removing the
    span of both sets the posterior to the prior; swapping one copy with a donor's b gives f(b, a), the donor's
    answer where |b| > |a| with the same sign.

    >>> model, truth = redundant_model("bridge")
    >>> truth.hook_name, tuple(truth.span.shape)
    ('blocks.0.hook_resid_post', (64, 2))
    """
    model, planted, _ = _build_planted(kind, layer=0, n_layers=3, d_model=d_model, n_heads=4, gqa=True, d_head=16,
                                       labels=("dax", "lug"), p=0.9, prior=0.5, evidence_scale=1.0, seed=seed,
                                       redundant=True)
    copies = (planted.mediator, planted.readout_only)
    return model, RedundantCopies(layer=0, site="resid_post", hook_name=planted.hook_name, copies=copies,
                                  span=torch.stack(copies, 1), labels=planted.labels, label_ids=planted.label_ids,
                                  log_odds_per_example=planted.log_odds_per_example)


# ---------------------------------------------------------------------------------------------- confidence
@dataclass(frozen=True, eq=False)
class PlantedNeurons:
    """The ground truth :func:`confidence_model` returns with its model: at the final MLP layer ``layer``,
    neuron ``entropy_neuron`` writes ``out_norm``·``null_direction`` (W_Uᵀ·diag(g)·null_direction = 0
    exactly, g the final norm's gain: no logit reads it, but it changes the residual's RMS, the final norm's
    scale, so the entropy) and neuron ``logit_neuron`` writes ``out_norm``·``logit_direction`` (the top right
    singular vector of W_Uᵀ·diag(g): the direction the logits read most). Both unit float64 vectors ``[d]``."""

    layer: int
    entropy_neuron: int
    logit_neuron: int
    null_direction: Tensor
    logit_direction: Tensor
    out_norm: float


def confidence_model(kind: str = "hooked", *, n_layers: int = 2, d_model: int = 64, entropy_neuron: int = 7,
                     logit_neuron: int = 11, out_norm: float = 6.0, read_scale: float = 2.0, seed: int = 0):
    """A tiny random llama of ``kind`` with a planted entropy neuron and a planted logit neuron in its last MLP.

    Returns ``(model, PlantedNeurons)``. Weights are :func:`tiny_model`'s random llama (same seed, raw,
    untied), then: (1) the unembedding loses one direction: with m a seeded random unit vector, every row of
    ``lm_head`` becomes W_v − (W_v·m)m, so n = m ⊘ g (normalized; g the final norm's gain) is an exact null
    direction of W_Uᵀ·diag(g); (2) the entropy neuron's output column is ``out_norm``·n and the logit
    neuron's ``out_norm``·t, t the top right singular vector of the new W_Uᵀ·diag(g) (about 12 times the
    norm of a random column); (3) each of the two reads its own random unit direction r of the MLP's input
    with gate and up rows ``read_scale``·r, so its activation silu(βc)·βc (c = r·h) varies from prompt to
    prompt. Mean-ablating the entropy neuron moves the residual along n only: the logits change only through
    the final norm's scale (total effect ≠ 0, direct effect 0 up to float32 rounding); the logit neuron's
    effect is mostly direct.

    >>> model, planted = confidence_model("bridge")
    >>> planted.layer, planted.entropy_neuron, planted.logit_neuron
    (1, 7, 11)
    """
    from .._validate import check_float, check_int, check_seed

    check_choice(kind, "kind", ("hooked", "bridge"))
    n_layers = check_int(n_layers, "n_layers", min=1)
    d_model = check_int(d_model, "d_model", min=8)
    d_mlp = 4 * d_model
    entropy_neuron = check_int(entropy_neuron, "entropy_neuron", min=0, max=d_mlp - 1)
    logit_neuron = check_int(logit_neuron, "logit_neuron", min=0, max=d_mlp - 1)
    if entropy_neuron == logit_neuron:
        raise InvalidInputError(f"entropy_neuron and logit_neuron must be two neurons, got {entropy_neuron} twice.")
    out_norm = check_float(out_norm, "out_norm", min=0.0, min_inclusive=False)
    read_scale = check_float(read_scale, "read_scale", min=0.0, min_inclusive=False)
    seed = check_seed(seed)
    tok = tiny_tokenizer()
    spec = _spec(n_layers=n_layers, d_model=d_model, n_heads=4, n_kv_heads=2, d_head=16, d_mlp=d_mlp,
                 d_vocab=len(tok), n_ctx=256)
    spec = dataclasses.replace(spec, name="tiny-confidence", path=Path("tiny-confidence"))
    w = {k: v.double() for k, v in _random_llama_weights(spec, seed)}
    g = torch.Generator().manual_seed(seed + 1)
    m = torch.randn(d_model, generator=g, dtype=torch.float64)
    m /= m.norm()
    lm = w["lm_head.weight"]
    lm -= (lm @ m)[:, None] * m[None, :]
    gain = w["model.norm.weight"]
    null = m / gain
    null /= null.norm()
    top = torch.linalg.svd(lm * gain[None, :], full_matrices=False)[2][0]
    last = f"model.layers.{n_layers - 1}.mlp."
    down, gate, up = w[last + "down_proj.weight"], w[last + "gate_proj.weight"], w[last + "up_proj.weight"]
    for j, direction in ((entropy_neuron, null), (logit_neuron, top)):
        down[:, j] = out_norm * direction
        r = torch.randn(d_model, generator=g, dtype=torch.float64)
        r /= r.norm()
        gate[j] = read_scale * r
        up[j] = read_scale * r
    model = from_weights(spec, ((k, v.float()) for k, v in w.items()), tok, kind)
    return model, PlantedNeurons(layer=n_layers - 1, entropy_neuron=entropy_neuron, logit_neuron=logit_neuron,
                                 null_direction=null, logit_direction=top, out_norm=out_norm)


@dataclass(frozen=True, eq=False)
class SteeringTruth:
    """The ground truth :func:`steering_model` returns with its model (METHODS.md §16).

    Steering by α (raw units: the length of the added vector) along a unit direction at ``hook_name``
    (``blocks.{layer}.hook_resid_post``), at every position or the final one, moves the label log-odds
    (nats) by exactly: ``prior_direction`` → ``beta_alpha_prior``·α (β_int = 0: a prior shift);
    ``evidence_direction`` → ``beta_int_evidence``·α·LLR_Bayes (β_α = 0: the evidence reweighted). The
    unsteered model's log-odds are the exact Bayes log-odds (β_e = 1, β_0 = logit(prior)). ``planted``
    is the :class:`PlantedDirections` of the underlying planted model (its mediator is
    ``prior_direction``).
    """

    layer: int
    site: str
    hook_name: str
    prior_direction: Tensor
    evidence_direction: Tensor
    beta_alpha_prior: float
    beta_int_evidence: float
    planted: PlantedDirections


def steering_model(kind: str = "hooked", *, d_model: int = 64, seed: int = 0, bias: float = 30.0,
                   gain: float = 5.0, kappa: float = 1.0):
    """A tiny llama of ``kind`` with two planted steering directions of known effect: one adds exactly to the
    prior log-odds, one multiplies the evidence (METHODS.md §16; the test of ``bl.steering``).

    Returns ``(model, SteeringTruth)``. Built as :func:`planted_model` (2 layers, the evidence summed by
    layer 0's head into the mediator m at ``blocks.0.hook_resid_post``, linear norms, every other weight
    a distractor that reads neither planted direction), with two changes:

    * an *amplifier*: neuron 0 of layer 1's MLP computes silu(G + a·(x·e))·(x·m) and writes it back along m
      times κ (G = ``bias``, a = ``gain``, κ = ``kappa``; e = ``evidence_direction``, a residual role that no
      other weight reads). The unembedding reads m divided by 1 + κ·silu(G), so the clean log-odds are the
      exact Bayes ones. Steering by α along e makes the mediator (1 + κ·silu(G + aα))/(1 + κ·silu(G)) times
      the evidence: log-odds = LLR_Bayes·(1 + β_int·α) with β_int = κa/(1 + κG) (silu(z) = z to within
      z·e^-z ≤ 4e-8 while G + aα ≥ 20, i.e. |α| ≤ 2 with the defaults);
    * the attention sink's score is 20 (planted_model: 10) and the rotary base 10⁷ (planted_model: 10⁴), so
      the head's sum of the labels is exact in float32: each token's share of the sink is e⁻²⁰, and the
      sink pair turns by < 10⁻⁵ rad over a prompt (at base 10⁴ its score drifts by ~0.1% of the sum).

    Steering along m by α adds log(p/(1−p))·α to the log-odds whatever the evidence (the amplifier
    multiplies m, steering included, and the read divides it back out): β_α = log(p/(1−p)) = 2.197 nats per
    unit α, β_int = 0.

    >>> model, truth = steering_model("bridge")
    >>> truth.hook_name, round(truth.beta_alpha_prior, 4), round(truth.beta_int_evidence, 4)
    ('blocks.0.hook_resid_post', 2.1972, 0.1613)
    """
    from .._validate import check_float

    bias = check_float(bias, "bias", min=20.0)
    gain = check_float(gain, "gain", min=0.0, min_inclusive=False)
    kappa = check_float(kappa, "kappa", min=0.0, min_inclusive=False)
    model, planted, amp = _build_planted(kind, layer=0, n_layers=2, d_model=d_model, n_heads=4, gqa=True, d_head=16,
                                         labels=("dax", "lug"), p=0.9, prior=0.5, evidence_scale=1.0, seed=seed,
                                         sink_score=20.0, amplifier=(bias, gain, kappa), rope_base=1e7)
    truth = SteeringTruth(layer=0, site="resid_post", hook_name=planted.hook_name, prior_direction=planted.mediator,
                          evidence_direction=amp, beta_alpha_prior=planted.log_odds_per_example,
                          beta_int_evidence=kappa * gain / (1.0 + kappa * bias), planted=planted)
    return model, truth
