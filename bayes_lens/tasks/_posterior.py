"""The model's posterior over a task's answers: a pure function of the answers' final-token log-probabilities.

METHODS.md §6 and §6a. Every task (SULA, the categorical and Gaussian tasks, the wind tunnel's) reads
the model's answer by renormalizing the full-vocabulary probabilities of its K answer tokens:
P(a_j) / Σ_i P(a_i); the mass Σ_i P(a_i) says how much of the model's output the answers get. Used by
:func:`bayes_lens.sula.evaluate`, :class:`bayes_lens.EntropyAxis` and the readout-or-mediator analyses.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from ..errors import InvalidInputError

__all__ = ["label_posterior", "answer_posterior"]


def label_posterior(label_logprobs) -> Tuple[np.ndarray, np.ndarray]:
    """(P(first label), raw mass on the two labels) from their full-vocabulary log-probabilities.

    ``label_logprobs`` is ``[n, 2]`` (log P(L1), log P(L2)) at the final token; the posterior is
    renormalized over the two: P(L1) / (P(L1) + P(L2)).

    >>> p, mass = label_posterior(np.log([[0.3, 0.1]]))
    >>> round(float(p[0]), 3), round(float(mass[0]), 3)
    (0.75, 0.4)
    """
    lp = np.asarray(torch.as_tensor(label_logprobs).detach().double().cpu().numpy() if isinstance(label_logprobs, Tensor)
                    else label_logprobs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[1] != 2:
        raise InvalidInputError(f"label log-probabilities must be [n, 2], got shape {list(lp.shape)}.")
    p_first = np.exp(lp[:, 0] - np.logaddexp(lp[:, 0], lp[:, 1]))
    return np.clip(p_first, 0.0, 1.0), np.exp(lp).sum(1)


def answer_posterior(answer_logprobs) -> Tuple[np.ndarray, np.ndarray]:
    """(posterior over the K answers, raw mass on them) from their full-vocabulary log-probabilities
    ``[n, K]`` at the final token: P(a_j) / Σ_i P(a_i) (any task, METHODS.md §6a).

    >>> post, mass = answer_posterior(np.log([[0.3, 0.1, 0.1]]))
    >>> [round(float(x), 3) for x in post[0]], round(float(mass[0]), 3)
    ([0.6, 0.2, 0.2], 0.5)
    """
    lp = np.asarray(torch.as_tensor(answer_logprobs).detach().double().cpu().numpy() if isinstance(answer_logprobs, Tensor)
                    else answer_logprobs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[1] < 2:
        raise InvalidInputError(f"answer log-probabilities must be [n, K] with K ≥ 2, got shape {list(lp.shape)}.")
    norm = np.logaddexp.reduce(lp, axis=1, keepdims=True)
    return np.clip(np.exp(lp - norm), 0.0, 1.0), np.exp(lp).sum(1)
