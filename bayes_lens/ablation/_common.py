"""Shared pieces of the entropy-axis ablation: argument checks, model metadata, prompt kinds.

Paper A §4.5–4.6, §6.2, §7.1 (METHODS.md §7); see :mod:`bayes_lens.ablation`.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, List, Optional, Tuple

import numpy as np
from torch import Tensor

from .. import adapter
from ..errors import InvalidInputError, NonFiniteError

__all__ = ["STANDARDIZE", "SIGN_BY", "DEGENERATE_RATIO", "library_versions", "site_dim", "model_meta",
           "finite_float", "unit_vector", "is_sula_item", "prompt_data"]

STANDARDIZE = ("std", "raw")
SIGN_BY = ("model", "bayes")
#: a coordinate whose spread fell below this fraction of the clean spread is "removed"
DEGENERATE_RATIO = 1e-4


def library_versions() -> Dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("bayes-lens", "transformer-lens", "torch", "transformers", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:  # pragma: no cover - depends on the environment
            out[pkg] = "not installed"
    return out


def site_dim(info: adapter.ModelInfo, site: str) -> int:
    """Width of one final-token row of ``site``: ``v`` n_kv·d_head, ``z`` n_heads·d_head, else d_model."""
    if site == "z":
        return info.n_heads * info.d_head
    return info.kv_dim if site == "v" else info.d_model


def model_meta(model, site: str) -> dict:
    info = adapter.model_info(model)
    return {
        "model_name": info.name,
        "model_kind": info.kind,
        "n_layers": info.n_layers,
        "n_kv_heads": info.n_kv_heads,
        "d_head": info.d_head,
        "d_model": info.d_model,
        "dim": site_dim(info, site),
        "processed": bool(info.processed),
        "processing": info.processing,
        "basis": "processed" if info.processed else "raw",
        "value_bias_folded": adapter.value_biases_folded(model),
        "writing_weights_centred": adapter.writing_weights_centred(model),
    }


def finite_float(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        if isinstance(x, Tensor) and x.numel() == 1:
            x = float(x)
        else:
            raise InvalidInputError(f"{name} must be a real number, got {x!r}.")
    x = float(x)
    if not math.isfinite(x):
        raise InvalidInputError(f"{name} must be finite, got {x}; use e.g. {name}=1.0.")
    return x


def unit_vector(vec, name: str, dim: Optional[int] = None) -> np.ndarray:
    """A finite, non-zero vector as a float64 unit vector (errors name what is wrong)."""
    if isinstance(vec, Tensor):
        vec = vec.detach().cpu().double().numpy()
    u = np.asarray(vec, dtype=np.float64)
    if u.ndim != 1:
        raise InvalidInputError(f"{name} must be a 1-D vector, got shape {list(u.shape)}.")
    if dim is not None and u.shape[0] != dim:
        raise InvalidInputError(
            f"{name} has dimension {u.shape[0]} but the site has dimension {dim} (hook_v: n_kv_heads·d_head; "
            "resid_post: d_model); fit the axis on this model or pass a vector of the right size.")
    if not np.all(np.isfinite(u)):
        raise NonFiniteError(f"{name} contains NaN or infinity; refit the axis (are the activations finite?).")
    norm = float(np.linalg.norm(u))
    if norm == 0.0:
        raise InvalidInputError(f"{name} is the zero vector; an axis needs a direction.")
    return u / norm


def is_sula_item(p) -> bool:
    """An item of an in-context task with an exact posterior (SULA's or any task of :mod:`bayes_lens.tasks`)."""
    return (hasattr(p, "text") and hasattr(p, "entropy_bits") and hasattr(p, "answers")
            and hasattr(p, "posterior"))


def prompt_data(prompts) -> Tuple[List[str], Optional[np.ndarray]]:
    """(texts, Bayes entropies for SULA items or None for plain strings)."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings or SULA items, not one string; wrap it.")
    items = list(prompts)
    if not items:
        raise InvalidInputError("the prompt list is empty; pass at least one prompt.")
    if all(is_sula_item(p) for p in items):  # (SULA items are str subclasses: test them first)
        return [p.text for p in items], np.array([float(p.entropy_bits) for p in items])
    if all(isinstance(p, str) for p in items):
        return [str(p) for p in items], None
    bad = next(i for i, p in enumerate(items) if not (isinstance(p, str) or is_sula_item(p)))
    raise InvalidInputError(
        f"prompt {bad} is a {type(items[bad]).__name__}; expected all strings or all SULA items "
        "(from bl.sula.make_prompts).")


