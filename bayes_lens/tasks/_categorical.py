"""K-way categorical symbols with a symmetric Dirichlet prior: an in-context task with an exact posterior.

METHODS.md §6b. Generative model per prompt: θ ~ Dirichlet(α, …, α) over K symbols; k symbols
x₁ … x_k ~ Categorical(θ) are shown (``"Sequence: A C A B"``); the query is the next symbol. With
n_j the count of symbol j among the k shown, the posterior predictive is exact (Dirichlet–multinomial
conjugacy):

    P(x_{k+1} = j | x_{1:k}) = (n_j + α) / (k + K·α).

The outcome (for ECE and Brier) is x_{k+1} ~ Categorical(θ) with the same θ. Each symbol must be one
token with its leading space; by default the first K single-token words of A, B, C, … and Paper A's
nonsense labels are used.

Example
-------
>>> from bayes_lens.models.tiny import tiny_tokenizer
>>> items = categorical_prompts(tiny_tokenizer(), n_symbols=3, ks=(0, 4), n_per_k=2, seed=0)
>>> items.answers
(' dax', ' lug', ' mip')
>>> items[0].text, [round(p, 3) for p in items[0].posterior]
('Sequence:', [0.333, 0.333, 0.333])
>>> dirichlet_predictive([2, 1, 1], alpha=1.0)
array([0.42857143, 0.28571429, 0.28571429])
"""

from __future__ import annotations

import string
from typing import Optional, Sequence

import numpy as np

from .._validate import check_count, check_float, check_int, check_nonneg_int, check_seed
from ..errors import InvalidInputError
from ._protocol import TaskItem, TaskPrompts, answer_token_ids, choose_answers, get_tokenizer

__all__ = ["categorical_prompts", "dirichlet_predictive", "CATEGORICAL_VERSION"]

#: Bumped whenever the same arguments would generate different items.
CATEGORICAL_VERSION = "categorical-1"

_CANDIDATES = tuple(string.ascii_uppercase) + ("dax", "lug", "mip", "zorb", "wug", "kep", "tuv", "gax")
_DEFINITION = ("theta ~ Dirichlet(alpha * 1_K); x_1..x_k, x_{k+1} ~ Categorical(theta) iid; "
               "posterior[j] = P(x_{k+1} = j | x_1..x_k) = (n_j + alpha) / (k + K * alpha), n_j = count of "
               "symbol j among the k shown; outcome = index of x_{k+1}.")


def dirichlet_predictive(counts, *, alpha: float = 1.0) -> np.ndarray:
    """The Dirichlet–multinomial posterior predictive (n_j + α) / (n + K·α) for ``counts`` (``[..., K]``)."""
    alpha = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim < 1 or c.shape[-1] < 2 or np.any(c < 0) or np.any(c != np.round(c)):
        raise InvalidInputError(f"counts must be non-negative integer counts over K ≥ 2 symbols, got {counts!r}.")
    return (c + alpha) / (c.sum(-1, keepdims=True) + c.shape[-1] * alpha)


def check_ks(ks) -> tuple:
    """Numbers of observations: a non-empty sequence of distinct non-negative ints."""
    if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
        raise InvalidInputError(f"ks must be a sequence of numbers of observations such as (0, 2, 4, 8), got {ks!r}.")
    out = tuple(int(check_nonneg_int(k, "k")) for k in ks)
    if not out or len(set(out)) != len(out):
        raise InvalidInputError(f"ks must be a non-empty sequence of distinct counts, got {ks!r}.")
    return out


def categorical_prompts(model, *, n_symbols: int = 4, alpha: float = 1.0, ks: Sequence[int] = (0, 1, 2, 4, 8, 16),
                        n_per_k: int = 40, seed: int = 0, symbols: Optional[Sequence[str]] = None,
                        prefix: str = "Sequence:") -> TaskPrompts:
    """Prompts of the Dirichlet–categorical task with their exact posterior predictives (METHODS.md §6b).

    Parameters
    ----------
    model:
        A TransformerLens model or a tokenizer (each ``" " + symbol`` must be one token).
    n_symbols, alpha:
        K (≥ 2) and the symmetric Dirichlet concentration α > 0 (α = 1: uniform over θ).
    ks, n_per_k:
        Numbers of symbols shown, and prompts per k.
    seed:
        Seeds every draw (θ, the shown symbols, the outcome), in that order per prompt.
    symbols:
        The K symbol words (default: the first K single-token words of A–Z, then dax, lug, …).
    prefix:
        Text before the symbols; each symbol follows a space (``"Sequence: A C A"``).
    """
    seed = check_seed(seed)
    tok = get_tokenizer(model)
    n_symbols = int(check_int(n_symbols, "n_symbols", min=2))
    alpha = check_float(alpha, "alpha", min=0.0, min_inclusive=False)
    ks = check_ks(ks)
    n_per_k = check_count(n_per_k, "n_per_k")
    if not isinstance(prefix, str) or prefix != prefix.rstrip():
        raise InvalidInputError(f"prefix must be a string not ending in whitespace (each symbol brings its own "
                                f"leading space), got {prefix!r}.")
    if symbols is None:
        symbols = choose_answers(tok, n_symbols, _CANDIDATES)
    symbols = tuple(symbols)
    if len(symbols) != n_symbols:
        raise InvalidInputError(f"symbols has {len(symbols)} entries but n_symbols = {n_symbols}; give one per symbol.")
    answers = tuple(" " + s for s in symbols)
    answer_token_ids(tok, answers)
    rng = np.random.default_rng(seed)
    prior = tuple(1.0 / n_symbols for _ in range(n_symbols))
    items = []
    for k in ks:
        for _ in range(n_per_k):
            theta = rng.dirichlet(np.full(n_symbols, alpha))
            seq = rng.choice(n_symbols, size=k + 1, p=theta)
            shown, nxt = seq[:k], int(seq[k])
            counts = np.bincount(shown, minlength=n_symbols)
            post = dirichlet_predictive(counts, alpha=alpha)
            text = prefix + "".join(answers[int(s)] for s in shown)
            if not text:
                raise InvalidInputError("with k = 0 and an empty prefix the prompt is empty; give a prefix.")
            items.append(TaskItem(text, task="categorical", answers=answers, posterior=tuple(float(p) for p in post),
                                  k=k, outcome=nxt, prior_posterior=prior, sequence=[int(s) for s in shown],
                                  counts=[int(c) for c in counts], theta=[float(t) for t in theta]))
    params = {"n_symbols": n_symbols, "alpha": alpha, "ks": list(ks), "n_per_k": n_per_k, "symbols": list(symbols),
              "prefix": prefix}
    return TaskPrompts(items, task="categorical", seed=seed, generator_version=CATEGORICAL_VERSION, params=params,
                       posterior_definition=_DEFINITION)
