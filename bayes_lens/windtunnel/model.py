"""Wind-tunnel models: a small Llama trained with plain torch, served as either TransformerLens kind.

The network is a Hugging Face ``LlamaForCausalLM`` (RMS norms, rotary positions, gated SiLU MLP,
untied embeddings), trained with pure torch/transformers so that it trains identically under
TransformerLens 3.x and 4.x. Its weights (Hugging Face names) are converted with the same code that
loads GGUF files (:mod:`bayes_lens.models.gguf`) into a TL 3.x ``HookedTransformer`` (raw weights:
no folded layer norm, no centring) or a ``TransformerBridge``. The tokenizer is word-level, built
in memory from the task's vocabulary (whitespace splits words), so prompts are plain strings like
``"x3 y7 x1 y2"``; no BOS token is prepended.

Example
-------
>>> from bayes_lens.windtunnel import BijectionTask, ModelConfig
>>> from bayes_lens.windtunnel.model import word_tokenizer
>>> tok = word_tokenizer(BijectionTask(V=4).vocab)
>>> tok("x1 y3", add_special_tokens=False)["input_ids"]
[3, 9]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Tuple

import torch

from .._validate import check_choice, check_positive_int
from ..errors import InvalidInputError

__all__ = ["ModelConfig", "word_tokenizer", "build_hf", "to_tl", "random_weights", "hypothesis_frame"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a wind-tunnel Llama. ``n_kv_heads=None`` means ordinary multi-head attention."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_head: int = 16
    d_mlp: int = 256
    n_kv_heads: int | None = None
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    n_ctx: int = 128

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx"):
            v = getattr(self, f)
            object.__setattr__(self, f, check_positive_int(v, f"ModelConfig.{f}"))  # frozen: normalize once
        if self.d_head % 2:
            raise InvalidInputError(f"d_head must be even for rotary embeddings, got {self.d_head}.")
        kv = self.kv_heads
        if kv < 1 or self.n_heads % kv:
            raise InvalidInputError(f"n_kv_heads ({kv}) must divide n_heads ({self.n_heads}).")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else int(self.n_kv_heads)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InvalidInputError(f"unknown ModelConfig field(s) {sorted(unknown)}; expected {sorted(names)}.")
        return cls(**d)


def word_tokenizer(vocab):
    """A word-level ``PreTrainedTokenizerFast`` over ``vocab`` (whitespace-separated words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = list(vocab)
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<bos>",
                                  pad_token="<pad>", unk_token="<unk>")
    tok.init_kwargs["name_or_path"] = "bayes-lens-windtunnel"
    tok.init_kwargs["add_bos_token"] = True  # skips TL 3.x's re-load of the tokenizer by name (see models.gguf)
    tok.add_bos_token = False
    return tok


def _llama_config(cfg: ModelConfig, d_vocab: int, attn: str = "eager"):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=d_vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, max_position_embeddings=cfg.n_ctx,
        rms_norm_eps=cfg.rms_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
        tie_word_embeddings=False, bos_token_id=2, eos_token_id=2, pad_token_id=0,
        attn_implementation=attn,
    )


def build_hf(cfg: ModelConfig, d_vocab: int, *, seed: int = 0, attn: str = "sdpa"):
    """A freshly initialized ``LlamaForCausalLM`` (Hugging Face's init, seeded; global RNG untouched)."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(_llama_config(cfg, d_vocab, attn))
    return model


def random_weights(cfg: ModelConfig, d_vocab: int, *, seed: int = 0) -> Dict[str, torch.Tensor]:
    """The weights of an untrained model of the same shape (Hugging Face init, seeded)."""
    return {k: v.detach().clone() for k, v in build_hf(cfg, d_vocab, seed=seed).state_dict().items()}


def _spec(cfg: ModelConfig, d_vocab: int, name: str):
    from ..models.gguf import LlamaSpec

    return LlamaSpec(
        path=Path(name), name=name, n_layers=cfg.n_layers, d_model=cfg.d_model, d_mlp=cfg.d_mlp,
        n_heads=cfg.n_heads, n_kv_heads=cfg.kv_heads, d_head=cfg.d_head, n_ctx=cfg.n_ctx, d_vocab=d_vocab,
        rope_base=float(cfg.rope_base), rms_eps=float(cfg.rms_eps), tied_embeddings=False, metadata={},
        reader=None,
    )


def to_tl(weights: Dict[str, torch.Tensor] | Iterable[Tuple[str, torch.Tensor]], cfg: ModelConfig, vocab,
          kind: str = "auto", *, name: str = "windtunnel", device: str | None = None):
    """Build a TransformerLens model (``"hooked"``, ``"bridge"`` or ``"auto"``) from HF-named weights."""
    from ..adapter import has_hooked_transformer
    from ..errors import ModelLoadError
    from ..models.gguf import from_weights

    check_choice(kind, "kind", ("auto", "hooked", "bridge"))
    if kind == "auto":
        kind = "hooked" if has_hooked_transformer() else "bridge"
    items = list(weights.items()) if isinstance(weights, dict) else list(weights)
    items = [(k, v.detach().float().clone()) for k, v in items if not k.endswith("rotary_emb.inv_freq")]
    spec = _spec(cfg, len(vocab), name)
    tok = word_tokenizer(vocab)
    model = from_weights(spec, items, tok, kind, device=device)
    if getattr(model.cfg, "d_vocab", len(vocab)) != len(vocab):  # pragma: no cover - defensive
        raise ModelLoadError("the converted model's vocabulary does not match the task's.")
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def hypothesis_frame(model, task, *, side: str = "embedding"):
    """``[d_model, V]`` orthonormal basis of the wind tunnel's "hypothesis frame": the span of the answer
    symbols' directions in the residual stream, QR-orthonormalized.

    ``side="embedding"``: the answer tokens' embeddings as block 0's norm sees them, g₀ ⊙ W_E[a] (g₀ the RMS
    norm's gain; its per-token scale does not change the span). This is ``frame_subspace(mode="embedding")``
    of the wind tunnel's jlens experiment, the rank-20 frame of its result P4b (V = 20 value tokens there;
    METHODS.md §13). ``side="unembedding"``: the directions the answer logits read, g_f ⊙ W_U[:, a] (g_f the
    final norm's gain). The jlens models tie the unembedding to the embedding, so there the two are one span;
    the shipped wind-tunnel models do not tie them. For a wind-tunnel TransformerLens model with unprocessed
    weights (:func:`bayes_lens.windtunnel.load`); pass it to :func:`bayes_lens.localize` as
    ``bases={"hypothesis frame": hypothesis_frame(model, task)}``.

    >>> import bayes_lens as bl
    >>> model, task = bl.windtunnel.load("bijection")
    >>> hypothesis_frame(model, task).shape          # d_model × V
    (64, 10)
    """
    import numpy as np

    from ..adapter import check_model, processing
    from .tasks import make_task

    check_model(model)
    check_choice(side, "side", ("embedding", "unembedding"))
    task = make_task(task)
    processed, how = processing(model)
    if processed:
        raise InvalidInputError(f"the model's weights were processed ({how}): the norms' gains are folded away. "
                                "Load the wind-tunnel model unprocessed (bl.windtunnel.load).")
    answer_ids = task.sample(1, seed=0).answer_ids
    if side == "embedding":
        w, norm = model.W_E.detach(), model.blocks[0].ln1
    else:
        w, norm = model.W_U.detach().T, model.ln_final
    w = w.double().cpu().numpy()
    if w.shape[0] != task.d_vocab:
        raise InvalidInputError(f"the model's vocabulary has {w.shape[0]} tokens but the {task.name} task's has "
                                f"{task.d_vocab}; pass the task the model was trained on.")
    gain = getattr(norm, "w", None)
    if gain is None:
        gain = getattr(norm, "weight", None)
    g = np.ones(w.shape[1]) if gain is None else gain.detach().double().cpu().numpy()
    q, r = np.linalg.qr((w[answer_ids] * g).T)
    return q * np.sign(np.diag(r))
