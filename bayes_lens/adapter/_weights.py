"""The adapter's weights facet: the unembedding, the final norm, an MLP's output weights, TL's projection kernel.

Part of :mod:`bayes_lens.adapter` (METHODS.md §15, the confidence mechanism). What the logits read of the
residual stream x (the input of the final norm) at one token is, with the norm's scale s frozen,

    logits = W_Uᵀ · diag(g) · C · x / s + b_U,

g the final norm's gain (Gemma's ``(1 + w)`` on a bridge, which holds Hugging Face's raw ``w``; TL's own
Gemma conversion already adds 1), C = I − 11ᵀ/d for a LayerNorm (it centres x) and I for an RMSNorm, s the
RMS (or the standard deviation) of x plus ε (:func:`final_norm`). On a HookedTransformer whose layer norms
were folded (``fold_ln``, normalization type ``LNPre``/``RMSPre``) g is already inside W_U and is 1 here.
A final logit soft-cap (Gemma 2/3: c·tanh(logit / c)) acts after the unembedding, outside this linear map.
:func:`mlp_out_weights` is layer l's W_out ``[d_mlp, d_model]`` (row j: what neuron j writes, w_out),
the same tensor on both model kinds (``blocks.{l}.mlp.W_out``). :func:`projection_kernel` is TransformerLens
4.3's ``tools.analysis.projection_kernel`` (‖UᵀV‖²_F of two orthonormal bases, Haar moments
``random_projection_kernel_moments``) where it exists, else None (TL 3.9): callers fall back to numpy.
:func:`interchange` is TransformerLens 4.3's ``tools.analysis.interchange`` (distributed alignment search and its
controls), or :class:`~bayes_lens.errors.MissingExtraError` naming TL 4.3 where it is absent (TL 3.9);
:func:`untrained_copy` is that module's random-init control for a model: ``random_init_bridge`` for a bridge
(built from the bridge's own Hugging Face configuration), ``reinitialized`` for a ``HookedTransformer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Optional

import numpy as np

from ..errors import MissingExtraError, UnsupportedModelError
from ._models import is_bridge, resolve_layer

__all__ = ["FinalNorm", "final_norm", "unembedding", "mlp_out_weights", "projection_kernel", "parameter_counts",
           "interchange", "untrained_copy"]


def _np(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


@dataclass(frozen=True, eq=False)
class FinalNorm:
    """The final norm as a linear map with its scale frozen: ``gain`` g ``[d]`` (float64; ones when folded into
    W_U), ``centred`` (a LayerNorm subtracts the mean of x first), ``eps``, ``kind`` (``"rms"``/``"layer"``),
    ``gain_rule`` (how g was read, in words), ``softcap`` (the final logit soft-cap c, or None)."""

    gain: np.ndarray
    centred: bool
    eps: float
    kind: str
    gain_rule: str
    softcap: Optional[float]


def _is_gemma(model) -> bool:
    cfg = model.cfg
    arch = str(getattr(cfg, "original_architecture", "") or getattr(cfg, "architecture", "") or "")
    return "gemma" in arch.lower() or "gemma" in type(getattr(model.ln_final, "original_component", None)).__name__.lower()


def final_norm(model) -> FinalNorm:
    """The final norm of ``model`` (module docstring), or UnsupportedModelError when it has none bayes_lens reads."""
    cfg = model.cfg
    ln = getattr(model, "ln_final", None)
    ntype = str(getattr(cfg, "normalization_type", None) or "RMS")
    if ln is None:
        raise UnsupportedModelError("the model has no final norm (ln_final); the confidence analysis needs one.")
    d = int(cfg.d_model)
    w = getattr(ln, "w", None)
    if w is None:
        w = getattr(ln, "weight", None)
    centred = ntype.upper().startswith("LN")
    if w is None or ntype.endswith("Pre"):
        gain, rule = np.ones(d), "folded into W_U (no gain on the norm)"
    elif is_bridge(model) and _is_gemma(model):
        gain, rule = 1.0 + _np(w), "1 + w (Gemma's norm on a bridge holds Hugging Face's raw w)"
    else:
        gain, rule = _np(w), "w"
    cap = getattr(cfg, "output_logits_soft_cap", None) or getattr(cfg, "final_logit_softcapping", None)
    cap = float(cap) if cap is not None and float(cap) > 0 else None
    return FinalNorm(gain=gain.reshape(d), centred=centred, eps=float(getattr(cfg, "eps", 1e-5) or 1e-5),
                     kind="layer" if centred else "rms", gain_rule=rule, softcap=cap)


def unembedding(model) -> np.ndarray:
    """W_U ``[d_model, d_vocab]`` as float64 (both kinds' ``model.W_U``)."""
    return _np(model.W_U)


def mlp_out_weights(model, layer: int) -> np.ndarray:
    """Layer ``layer``'s MLP output weights W_out ``[d_mlp, d_model]`` (float64; row j is neuron j's w_out), or
    UnsupportedModelError for an MLP without one neuron per hidden unit (a mixture of experts)."""
    layer = resolve_layer(model, layer)
    mlp = model.blocks[layer].mlp
    w = getattr(mlp, "W_out", None)
    if w is None or w.ndim != 2:
        raise UnsupportedModelError(f"layer {layer}'s MLP has no [d_mlp, d_model] W_out ({type(mlp).__name__}; a "
                                    "mixture of experts has one per expert); the neuron screen needs a dense MLP.")
    w = _np(w)
    d = int(model.cfg.d_model)
    return w if w.shape[1] == d else w.T


def projection_kernel():
    """``(projection_kernel, orthonormal_subspace, random_projection_kernel_moments)`` of TransformerLens 4.3's
    ``tools.analysis.projection_kernel``, or None where the installed TransformerLens has none (3.9)."""
    try:
        from transformer_lens.tools.analysis.projection_kernel import (orthonormal_subspace, projection_kernel as pk,
                                                                       random_projection_kernel_moments)
    except ImportError:
        return None
    return pk, orthonormal_subspace, random_projection_kernel_moments


def interchange():
    """TransformerLens 4.3's ``transformer_lens.tools.analysis.interchange`` module (``fit_das``, ``SubspaceInterchange``,
    ``NormMatchedPlacebo``, ``arbitrary_targets``, ``reinitialized``, ``random_init_bridge``, ...), or
    :class:`~bayes_lens.errors.MissingExtraError` saying that distributed alignment search needs TransformerLens 4.3."""
    try:
        from transformer_lens.tools.analysis import interchange as module

        module.fit_das, module.NormMatchedPlacebo, module.arbitrary_targets, module.random_init_bridge  # noqa: B018
    except (ImportError, AttributeError) as err:
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version("transformer-lens")
        except PackageNotFoundError:  # pragma: no cover - depends on the environment
            have = "not installed"
        raise MissingExtraError(
            f"distributed alignment search (DAS) needs TransformerLens >= 4.3 (its "
            f"transformer_lens.tools.analysis.interchange: fit_das and its controls), and this environment's "
            f"transformer-lens {have} has none. Install it with pip install 'transformer-lens>=4.3' and load the "
            "model as a TransformerBridge (bl.load_model does), or leave DAS out of estimators=.") from err
    return module


def untrained_copy(model, seed: int):
    """An untrained copy of ``model`` (the random-init control of :func:`interchange`'s DAS): for a
    ``TransformerBridge``, TransformerLens's ``random_init_bridge`` booted from the bridge's own Hugging Face
    configuration (saved to a temporary folder; the architecture's initialisation, no weights loaded) with the
    bridge's tokenizer, dtype and device; for a ``HookedTransformer``, ``reinitialized``. In eval mode."""
    import contextlib
    import io
    import tempfile

    ic = interchange()
    if not is_bridge(model):
        try:
            return ic.reinitialized(model, seed)
        except ValueError as err:
            raise UnsupportedModelError(f"TransformerLens cannot make an untrained copy of this model: {err}") from err
    hf = getattr(model, "original_model", None)
    config = getattr(hf, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        raise UnsupportedModelError("this TransformerBridge has no Hugging Face model configuration "
                                    "(original_model.config) to build an untrained copy from.")
    param = next(iter(model.parameters()))
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        config.save_pretrained(folder)
        return ic.random_init_bridge(folder, seed=int(seed), dtype=param.dtype, device=param.device,
                                     tokenizer=model.tokenizer)


def parameter_counts(model) -> Tuple[int, int, str]:
    """``(as loaded, the checkpoint's weights, why they differ)``.

    "As loaded" is ``sum(p.numel() for p in model.parameters())``. A ``HookedTransformer`` of a model
    with tied embeddings (SmolLM2) stores the unembedding as its own copy of ``W_E.T``, and it has
    every bias (``b_Q`` ... ``b_U``) even where the checkpoint has none (all zeros); the bridge keeps
    the checkpoint's modules (TL 3.9's with one zero ``lm_head`` bias, TL 4.3's with none). So it reads
    163.0 M on the HookedTransformer, 134.6 M on TL 3.9's bridge and 134.5 M on TL 4.3's for the one
    134.5 M-weight SmolLM2-135M. The checkpoint's count drops a ``W_U`` equal to ``W_E.T``, all-zero
    bias tensors and a second name for one storage, so it is the same for both kinds and both majors.
    """
    import torch

    loaded = sum(p.numel() for p in model.parameters())
    seen, unique, copies, zero_biases = set(), 0, 0, 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen:  # one storage shared by two names (tied weights) counts once
            continue
        seen.add(p.data_ptr())
        unique += p.numel()
        last = name.split(".")[-1].lstrip("_")
        if (last.startswith("b_") or last == "bias") and p.device.type != "meta" and not torch.count_nonzero(p):
            zero_biases += p.numel()
    w_u, w_e = getattr(model, "W_U", None), getattr(model, "W_E", None)
    if isinstance(w_u, torch.Tensor) and isinstance(w_e, torch.Tensor) and w_u.shape == w_e.T.shape \
            and w_u.data_ptr() != w_e.data_ptr() and torch.equal(w_u, w_e.T) and \
            any(p is w_u for p in model.parameters()):
        copies = w_u.numel()
    parts = ([f"{loaded - unique:,} in parameters that share one storage"] if loaded != unique else []) + \
        ([f"{copies:,} in a separate copy of the tied unembedding"] if copies else []) + \
        ([f"{zero_biases:,} in all-zero biases"] if zero_biases else [])
    return loaded, unique - copies - zero_biases, "; ".join(parts)
