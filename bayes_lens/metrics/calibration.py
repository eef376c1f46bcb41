"""Calibration metrics for binary predictions: MAE of entropies, Bernoulli KL, ECE, Brier score.

Pure functions on arrays or tensors (no model in here). They compare a model's probability of a
binary event with a reference: an exact Bayesian posterior (SULA, METHODS.md §6, Paper A §4.3/§5.2)
or the observed outcome.

* ``mae_bits(h_model, h_ref)`` = mean |H_model − H_ref| over the last axis (entropies in bits; this is
  Paper A's "calibration" number: 0.44 / 0.36 / 0.31 bits for Pythia-410M / Llama-3.2-1B / Phi-2).
* ``binary_entropy_bits(p)`` = −p log₂ p − (1−p) log₂ (1−p), with 0 log 0 = 0.
* ``kl_bernoulli_bits(p, q)`` = p log₂(p/q) + (1−p) log₂((1−p)/(1−q)), elementwise, KL(Bern(p) ‖
  Bern(q)) with 0 log 0 = 0; ``q`` is clipped to [eps, 1−eps] so that a model that puts zero mass on
  an outcome the reference allows gives a large finite number instead of infinity.
* ``expected_calibration_error(probs, outcomes, n_bins=10)`` = Σ_b (n_b / n) |mean(p | b) − mean(y | b)|
  over ``n_bins`` equal-width bins of [0, 1] (bin b = [b/B, (b+1)/B), the last bin closed); empty bins
  contribute nothing (Guo et al. 2017, "On Calibration of Modern Neural Networks").
* ``brier_score(probs, outcomes)`` = mean (p − y)² (Brier 1950).
* ``reliability_bins(probs, outcomes, n_bins=10)`` = per-bin counts, mean prediction and observed
  frequency: the data of a reliability diagram.

Over K ≥ 2 classes (any task of :mod:`bayes_lens.tasks`, METHODS.md §6a), the last axis holding the
classes and the one before it the predictions:

* ``kl_categorical_bits(p, q)`` = Σ_j p_j log₂(p_j / q_j) (0 log 0 = 0; ``q`` clipped below at eps);
* ``multiclass_brier_score(probs, outcomes)`` = mean over predictions of Σ_j (p_j − 1[j = y])²
  (Brier 1950's original multi-class form; for K = 2 it is twice the binary score);
* ``top_label(probs, outcomes)`` = (confidence max_j p_j, correct 1[argmax_j p_j = y]): the inputs of
  the top-label ECE (Guo et al. 2017), ``expected_calibration_error(*top_label(probs, y))``.

Every reduction is over the **last axis**, so a stack of bootstrap resamples ``[n_boot, n]`` is
evaluated in one vectorized call.

Example
-------
>>> import numpy as np
>>> from bayes_lens.metrics.calibration import brier_score, expected_calibration_error, kl_bernoulli_bits
>>> p = np.array([0.9, 0.8, 0.3, 0.1]); y = np.array([1, 1, 0, 0])
>>> round(float(brier_score(p, y)), 4)
0.0375
>>> round(float(expected_calibration_error(p, y, n_bins=10)), 4)
0.175
>>> float(kl_bernoulli_bits(0.5, 0.5))
0.0
"""

from __future__ import annotations

from typing import Dict, Union

import numpy as np
import torch
from jaxtyping import Float

from .._validate import check_count
from ..errors import InvalidInputError
from .stats import entropy_bits

_Array = Union[np.ndarray, torch.Tensor]  # what the shape annotations below accept (also nested sequences)

__all__ = [
    "binary_entropy_bits",
    "mae_bits",
    "kl_bernoulli_bits",
    "expected_calibration_error",
    "brier_score",
    "reliability_bins",
    "kl_categorical_bits",
    "multiclass_brier_score",
    "top_label",
]


def _arr(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise InvalidInputError(f"{name} contains NaN or infinity; calibration metrics need finite numbers.")
    return a


def _prob(x, name: str) -> np.ndarray:
    a = _arr(x, name)
    if a.size and (a.min() < 0 or a.max() > 1):
        raise InvalidInputError(
            f"{name} must be probabilities in [0, 1]; got values in [{a.min():.4g}, {a.max():.4g}]."
        )
    return a


def _same_shape(a: np.ndarray, b: np.ndarray, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise InvalidInputError(f"{na} and {nb} must have the same shape, got {a.shape} and {b.shape}.")
    if a.ndim and a.shape[-1] == 0:
        raise InvalidInputError(f"{na} is empty; calibration metrics need at least one prediction.")


def binary_entropy_bits(p: Float[_Array, "*shape"]) -> Float[np.ndarray, "*shape"]:
    """Entropy in bits of Bernoulli(p), elementwise (0 log 0 = 0)."""
    p = _prob(p, "p")
    return entropy_bits(np.stack([p, 1.0 - p], axis=-1))


def mae_bits(h_model: Float[_Array, "*batch n"], h_ref: Float[_Array, "*batch n"]) -> Float[np.ndarray, "*batch"]:
    """Mean absolute difference of two entropy arrays (bits) over the last axis."""
    a, b = _arr(h_model, "h_model"), _arr(h_ref, "h_ref")
    _same_shape(a, b, "h_model", "h_ref")
    return np.abs(a - b).mean(-1)


def kl_bernoulli_bits(p: Float[_Array, "*shape"], q: Float[_Array, "*shape"], *,
                      eps: float = 1e-12) -> Float[np.ndarray, "*shape"]:
    """KL(Bernoulli(p) ‖ Bernoulli(q)) in bits, elementwise; ``q`` clipped to [eps, 1 − eps]."""
    p, q = _prob(p, "p"), _prob(q, "q")
    if p.shape != q.shape:
        p, q = np.broadcast_arrays(p, q)
    q = np.clip(q, eps, 1 - eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0) / q), 0.0)
        b = np.where(p < 1, (1 - p) * np.log2(np.where(p < 1, 1 - p, 1.0) / (1 - q)), 0.0)
    return a + b


def _outcomes(y, probs: np.ndarray) -> np.ndarray:
    y = _arr(y, "outcomes")
    _same_shape(probs, y, "probs", "outcomes")
    if not np.all((y == 0) | (y == 1)):
        raise InvalidInputError("outcomes must be 0 or 1 (1 = the event whose probability is given).")
    return y


def _bin_index(p: np.ndarray, n_bins: int) -> np.ndarray:
    n_bins = check_count(n_bins, "n_bins")
    return np.minimum((p * n_bins).astype(np.int64), n_bins - 1)


def expected_calibration_error(probs: Float[_Array, "*batch n"], outcomes: Float[_Array, "*batch n"], *,
                               n_bins: int = 10) -> Float[np.ndarray, "*batch"]:
    """Expected calibration error with ``n_bins`` equal-width bins, over the last axis."""
    p = _prob(probs, "probs")
    y = _outcomes(outcomes, p)
    idx = _bin_index(p, n_bins)
    lead = p.shape[:-1]
    n = p.shape[-1]
    flat_p = p.reshape(-1, n)
    flat_y = y.reshape(-1, n)
    flat_i = idx.reshape(-1, n)
    rows = flat_p.shape[0]
    offs = (np.arange(rows)[:, None] * n_bins + flat_i).ravel()
    size = rows * n_bins
    sum_p = np.bincount(offs, weights=flat_p.ravel(), minlength=size).reshape(rows, n_bins)
    sum_y = np.bincount(offs, weights=flat_y.ravel(), minlength=size).reshape(rows, n_bins)
    # Σ_b (n_b/n)|mean_p − mean_y| = Σ_b |sum_p − sum_y| / n
    ece = np.abs(sum_p - sum_y).sum(-1) / n
    return ece.reshape(lead) if lead else ece[0]


def brier_score(probs: Float[_Array, "*batch n"], outcomes: Float[_Array, "*batch n"]) -> Float[np.ndarray, "*batch"]:
    """Brier score: mean squared difference of probabilities and 0/1 outcomes over the last axis."""
    p = _prob(probs, "probs")
    y = _outcomes(outcomes, p)
    return ((p - y) ** 2).mean(-1)


def reliability_bins(probs: Float[_Array, "n"], outcomes: Float[_Array, "n"], *,
                     n_bins: int = 10) -> Dict[str, Float[np.ndarray, "n_bins"]]:
    """Reliability-diagram data for 1-D ``probs``: per equal-width bin, its edges, the number of
    predictions, their mean and the observed frequency of the event (NaN for empty bins)."""
    p = _prob(probs, "probs").ravel()
    y = _outcomes(np.asarray(outcomes, dtype=np.float64).ravel(), p)
    idx = _bin_index(p, n_bins)
    count = np.bincount(idx, minlength=n_bins)
    sum_p = np.bincount(idx, weights=p, minlength=n_bins)
    sum_y = np.bincount(idx, weights=y, minlength=n_bins)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_p = np.where(count > 0, sum_p / np.maximum(count, 1), np.nan)
        freq = np.where(count > 0, sum_y / np.maximum(count, 1), np.nan)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return {"bin_low": edges[:-1], "bin_high": edges[1:], "count": count,
            "mean_predicted": mean_p, "observed_frequency": freq}


def _class_probs(probs, name: str) -> np.ndarray:
    p = _prob(probs, name)
    if p.ndim < 1 or p.shape[-1] < 2:
        raise InvalidInputError(f"{name} must hold K ≥ 2 class probabilities on its last axis, got shape {p.shape}.")
    return p


def _class_outcomes(outcomes, p: np.ndarray) -> np.ndarray:
    y = _arr(outcomes, "outcomes")
    if y.shape != p.shape[:-1]:
        raise InvalidInputError(f"outcomes must have shape {p.shape[:-1]} (one class index per prediction), got {y.shape}.")
    if not np.all((y == np.round(y)) & (y >= 0) & (y < p.shape[-1])):
        raise InvalidInputError(f"outcomes must be class indices 0 … {p.shape[-1] - 1}.")
    return y.astype(np.int64)


def kl_categorical_bits(p: Float[_Array, "*shape K"], q: Float[_Array, "*shape K"], *,
                        eps: float = 1e-12) -> Float[np.ndarray, "*shape"]:
    """KL(p ‖ q) in bits over the last axis (0 log 0 = 0); ``q`` clipped below at ``eps``."""
    p, q = _class_probs(p, "p"), _class_probs(q, "q")
    _same_shape(p, q, "p", "q")
    q = np.maximum(q, eps)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0) / q), 0.0)
    return terms.sum(-1)


def multiclass_brier_score(probs: Float[_Array, "*batch n K"], outcomes: Float[_Array, "*batch n"]) -> Float[np.ndarray, "*batch"]:
    """Mean over the predictions (axis −2) of Σ_j (p_j − 1[j = outcome])²."""
    p = _class_probs(probs, "probs")
    y = _class_outcomes(outcomes, p)
    onehot = (np.arange(p.shape[-1]) == y[..., None]).astype(np.float64)
    return ((p - onehot) ** 2).sum(-1).mean(-1)


def top_label(probs: Float[_Array, "*batch K"], outcomes: Float[_Array, "*batch"]):
    """(confidence, correct): the largest class probability, and 1.0 where its class is the outcome
    (ties go to the first class, as ``argmax`` does)."""
    p = _class_probs(probs, "probs")
    y = _class_outcomes(outcomes, p)
    return p.max(-1), (p.argmax(-1) == y).astype(np.float64)
