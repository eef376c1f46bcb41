"""SULA: an in-context task with an exact Bayesian posterior, its controls, and calibration.

METHODS.md §6 (Paper A, "Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752,
§4.3 and §5.2). A prompt holds ``k`` labelled examples and a query; the model must say which of two
nonsense labels L1, L2 the query has. The generative model of one prompt:

* hidden label y ∈ {L1, L2}, P(y = L1) = ``prior`` (default ½);
* each of the k example labels equals y with probability ``p`` (default 0.9), else the other label;
* example words (and, optionally, the query word) are drawn from a fixed list of *carrier* words,
  independently of y, so they carry no evidence.

With n₁ examples labelled L1 and n₂ = k − n₁ labelled L2 the posterior is exact:

    logit P(y = L1 | D) = logit(prior) + (n₁ − n₂) · log(p / (1 − p)),

which under a uniform prior is Paper A's P(y | D) = 1 / (1 + ((1 − p)/p)^(2m − k)) (m = examples
labelled y). For p = 0.9 the expected posterior entropy by k = 0, 1, 2, 4, 8 is 1.000, 0.469, 0.258,
0.078, 0.008 bits (:func:`expected_bayes_entropy_bits`, a binomial sum).

The model's posterior is its next-token distribution at the final position restricted to the two
label tokens (each label must be ONE token with its leading space) and renormalized; the raw mass
on the two labels is reported too (a model that ignores the task shows up there). :func:`evaluate`
reports per k and overall: MAE(H_model, H_Bayes) in bits, Pearson and Spearman of the entropies,
KL(Bayes ‖ model) in bits, ECE and Brier score of P(L1) against the hidden label, all with 95%
percentile bootstrap intervals over prompts; and the geometry on the task: one shared
(standardized) PCA of the final-token values (``hook_v``, per KV head) at ``layer`` over all
prompts, with ρ(PC1, H_Bayes), ρ(PC1, H_model), ρ(k, PC1) and permutation p-values.

Controls (``control=``), each with its own exact posterior:

* ``"lexical_remap"`` — another label pair, same generative model (should behave like the main task);
* ``"shuffled_labels"`` — each example label an independent fair coin, unrelated to y: the posterior
  is the prior (1 bit under a uniform prior) for every k;
* ``"evidence_removed"`` — example labels replaced by a neutral placeholder (``"?"``), keeping the
  structure: posterior = prior (1 bit);
* ``"carriers_masked"`` — Paper A's own variant: the carrier words are masked (``"___"``) and the
  labels kept. Under the stated generative model carriers carry no evidence, so its exact posterior
  is the *main task's* posterior; it tests whether the model needs the words, not the evidence.

Every condition draws the same random numbers in the same order, so with one seed the conditions are
*paired*: the same hidden labels, carrier words and noise draws (``.example_labels`` always holds the
labels the generator drew; in ``evidence_removed`` they are hidden behind the placeholder and in
``shuffled_labels`` they are the coin flips shown).

Example
-------
>>> import bayes_lens as bl
>>> from bayes_lens.models.tiny import tiny_tokenizer
>>> prompts = bl.sula.make_prompts(tiny_tokenizer(), ks=(0, 2), n_per_k=2, seed=0)
>>> prompts.labels
('dax', 'lug')
>>> prompts[0].text, round(prompts[0].bayes_entropy_bits, 3)
('query:', 1.0)
>>> round(bl.sula.bayes_posterior([0, 0, 1], p=0.9), 4)        # one net vote for the first label
0.9
>>> res = bl.sula.evaluate(model)                                # doctest: +SKIP
>>> res.table[["k", "mae_bits", "ece", "label_mass"]]            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from . import adapter
from ._results import Result, plotly
from .errors import InvalidInputError, TokenizationError
from .metrics.calibration import (
    binary_entropy_bits,
    brier_score,
    expected_calibration_error,
    kl_bernoulli_bits,
    reliability_bins,
)

__all__ = [
    "CANDIDATE_LABELS",
    "CARRIER_WORDS",
    "CONTROLS",
    "TEMPLATES",
    "SulaTemplate",
    "SulaItem",
    "SulaPrompts",
    "SulaResult",
    "SulaControls",
    "make_prompts",
    "bayes_posterior",
    "expected_bayes_entropy_bits",
    "evaluate",
    "run_controls",
]

#: Paper A's nonsense labels, tried first (in this order) for single-token-ness.
CANDIDATE_LABELS: Tuple[str, ...] = ("dax", "lug", "mip", "zorb", "wug", "kep", "tuv", "gax")
#: Default carrier words (they carry no evidence under the generative model).
CARRIER_WORDS: Tuple[str, ...] = ("cat", "dog", "tree", "house", "river", "stone", "bird", "moon",
                                  "apple", "chair", "cloud", "lamp")
#: The control conditions :func:`make_prompts` accepts (``None`` or ``"main"`` is the task itself).
CONTROLS: Tuple[str, ...] = ("lexical_remap", "shuffled_labels", "evidence_removed", "carriers_masked")

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


# --------------------------------------------------------------------------------------------------
# templates


@dataclass(frozen=True)
class SulaTemplate:
    """How a prompt is written: ``example`` per labelled example joined by ``sep``, then ``end``, then
    ``query``. With k = 0 the prompt is ``query`` alone.

    ``example`` must contain ``{word}`` and ``" {label}"`` (the label follows a space, so the label
    token is the one with a leading space); ``query`` must contain ``{query}`` and must not end in
    whitespace (the model predicts the label, with its leading space, right after it).
    """

    example: str = "{word}: {label}"
    sep: str = ", "
    end: str = ". "
    query: str = "{query}:"

    def __post_init__(self):
        if "{word}" not in self.example or " {label}" not in self.example:
            raise InvalidInputError(
                f"template example {self.example!r} must contain '{{word}}' and ' {{label}}' (with the "
                "space before the label), e.g. '{word}: {label}'.")
        if "{query}" not in self.query:
            raise InvalidInputError(f"template query {self.query!r} must contain '{{query}}', e.g. '{{query}}:'.")
        if self.query != self.query.rstrip():
            raise InvalidInputError(
                f"template query {self.query!r} ends in whitespace; the label token carries its own "
                "leading space, so end the query with ':' or a word (e.g. '{query} is').")

    def render(self, words: Sequence[str], labels: Sequence[str], query_word: str) -> str:
        """The prompt text for example ``words`` with ``labels`` and the ``query_word``."""
        if len(words) != len(labels):
            raise InvalidInputError(f"{len(words)} words but {len(labels)} labels.")
        q = self.query.format(query=query_word)
        if not words:
            return q
        body = self.sep.join(self.example.format(word=w, label=lab) for w, lab in zip(words, labels))
        return body + self.end + q


#: Built-in templates: Paper A's ``"w1: L, w2: L. query:"`` and ``"w1 is L. ... query is"``.
TEMPLATES: Dict[str, SulaTemplate] = {
    "colon": SulaTemplate(),
    "is": SulaTemplate(example="{word} is {label}", sep=". ", end=". ", query="{query} is"),
}


def _template(template) -> SulaTemplate:
    if isinstance(template, SulaTemplate):
        return template
    if isinstance(template, str) and template in TEMPLATES:
        return TEMPLATES[template]
    raise InvalidInputError(
        f"template must be one of {sorted(TEMPLATES)} or a bl.sula.SulaTemplate, got {template!r}.")


# --------------------------------------------------------------------------------------------------
# items and prompt sets


class SulaItem(str):
    """One SULA prompt: a ``str`` (its text, so a list of items is a list of prompts) that also
    carries ``.text``, ``.k``, ``.example_labels`` (0 = first label, 1 = second), ``.hidden_label``,
    ``.bayes_p_first`` (exact posterior of the first label), ``.bayes_entropy_bits``, ``.words``,
    ``.query_word``, ``.labels`` (the label pair) and ``.condition``. Immutable."""

    _FIELDS = ("k", "example_labels", "hidden_label", "bayes_p_first", "bayes_entropy_bits", "words",
               "query_word", "labels", "condition")

    def __new__(cls, text: str, **fields):
        missing = [f for f in cls._FIELDS if f not in fields]
        if missing:
            raise InvalidInputError(f"SulaItem needs the fields {missing}.")
        obj = super().__new__(cls, text)
        obj.__dict__.update({f: fields[f] for f in cls._FIELDS})
        return obj

    def __setattr__(self, name, value):
        raise AttributeError("SulaItem is immutable")

    @property
    def text(self) -> str:
        """The prompt text (a plain ``str``)."""
        return str.__str__(self)

    def as_dict(self) -> dict:
        """The item's fields (and its text) as plain Python data."""
        return {"text": self.text, **{f: getattr(self, f) for f in self._FIELDS}}

    def __reduce__(self):
        return (_rebuild_item, (self.text, {f: getattr(self, f) for f in self._FIELDS}))

    def __repr__(self) -> str:
        return (f"SulaItem({self.text!r}, k={self.k}, hidden_label={self.hidden_label}, "
                f"bayes_p_first={self.bayes_p_first:.4f}, condition={self.condition!r})")


def _rebuild_item(text, fields):
    return SulaItem(text, **fields)


class SulaPrompts(tuple):
    """The prompt set :func:`make_prompts` returns: a tuple of :class:`SulaItem` (so a list of
    prompt strings too) with the generation settings as attributes: ``.labels``, ``.p``, ``.prior``,
    ``.control``, ``.ks``, ``.n_per_k``, ``.template``, ``.seed``."""

    def __new__(cls, items: Iterable[SulaItem], *, labels, p, prior, control, ks, n_per_k, template, seed):
        obj = super().__new__(cls, tuple(items))
        obj.__dict__.update(labels=tuple(labels), p=p, prior=prior, control=control, ks=tuple(ks),
                            n_per_k=n_per_k, template=template, seed=seed)
        return obj

    def _meta(self) -> dict:
        return {k: self.__dict__[k] for k in ("labels", "p", "prior", "control", "ks", "n_per_k",
                                              "template", "seed")}

    def __getitem__(self, index):
        out = tuple.__getitem__(self, index)
        if isinstance(index, slice):
            return SulaPrompts(out, **self._meta())
        return out

    def __reduce__(self):
        return (_rebuild_prompts, (tuple(self), self._meta()))

    @property
    def texts(self) -> List[str]:
        """The prompt texts as plain strings."""
        return [it.text for it in self]

    @property
    def k(self) -> np.ndarray:
        return np.array([it.k for it in self], dtype=np.int64)

    @property
    def hidden_label(self) -> np.ndarray:
        return np.array([it.hidden_label for it in self], dtype=np.int64)

    @property
    def bayes_p_first(self) -> np.ndarray:
        return np.array([it.bayes_p_first for it in self], dtype=np.float64)

    @property
    def bayes_entropy_bits(self) -> np.ndarray:
        return np.array([it.bayes_entropy_bits for it in self], dtype=np.float64)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per prompt: text, k, condition, labels shown, hidden label, exact posterior."""
        return pd.DataFrame([{
            "text": it.text, "k": it.k, "condition": it.condition,
            "example_labels": list(it.example_labels), "hidden_label": it.hidden_label,
            "bayes_p_first": it.bayes_p_first, "bayes_entropy_bits": it.bayes_entropy_bits,
        } for it in self])

    def __repr__(self) -> str:
        return (f"SulaPrompts(n={len(self)}, labels={self.labels}, control={self.control!r}, "
                f"ks={self.ks}, p={self.p}, prior={self.prior}, seed={self.seed})")


def _rebuild_prompts(items, meta):
    return SulaPrompts(items, **meta)


# --------------------------------------------------------------------------------------------------
# exact posterior


def _check_p(p) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.5 < float(p) < 1.0):
        raise InvalidInputError(
            f"p (the probability that an example's label equals the hidden label) must be a number in "
            f"(0.5, 1), got {p!r}; the paper uses p = 0.9.")
    return float(p)


def _check_prior(prior) -> float:
    if isinstance(prior, bool) or not isinstance(prior, numbers.Real) or not (0.0 < float(prior) < 1.0):
        raise InvalidInputError(
            f"prior (the prior probability of the first label) must be a number in (0, 1), got "
            f"{prior!r}; 0.5 is the uniform prior.")
    return float(prior)


def _logit(x: float) -> float:
    return math.log(x) - math.log1p(-x)


def bayes_posterior(example_labels, *, p: float = 0.9, prior: float = 0.5):
    """Exact posterior probability of the FIRST label given the example labels.

    ``example_labels`` holds label indices (0 = first label, 1 = second), as in an item's
    ``.example_labels``; a 2-D array ``[n_prompts, k]`` gives one posterior per row. ``prior`` is the
    prior probability of the first label. logit P(L1 | D) = logit(prior) + (n₁ − n₂)·log(p/(1−p)).
    """
    p, prior = _check_p(p), _check_prior(prior)
    if isinstance(example_labels, Tensor):
        arr = example_labels.detach().cpu().numpy()
    elif isinstance(example_labels, (str, bytes)):
        raise InvalidInputError("example_labels must be label indices (0 = first label, 1 = second), not a string.")
    else:
        arr = np.asarray(example_labels if isinstance(example_labels, np.ndarray) else list(example_labels))
    if arr.size and not np.all((arr == 0) | (arr == 1)):
        raise InvalidInputError(
            "example_labels must be label indices 0 (first label) or 1 (second label); got "
            f"{sorted(set(np.asarray(arr).ravel().tolist()))[:6]}.")
    arr = arr.astype(np.int64)
    if arr.ndim > 2:
        raise InvalidInputError(f"example_labels must be 1-D (one prompt) or 2-D [n, k], got shape {arr.shape}.")
    n_second = arr.sum(-1)
    n_first = arr.shape[-1] - n_second
    z = _logit(prior) + (n_first - n_second) * _logit(p)
    post = 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))
    return float(post) if arr.ndim <= 1 else post


def expected_bayes_entropy_bits(k: int, *, p: float = 0.9, prior: float = 0.5) -> float:
    """E[H(P(y | D))] in bits over the generative model, by exact enumeration (a binomial sum).

    For p = 0.9 and a uniform prior: k = 0, 1, 2, 4, 8 give 1.000, 0.469, 0.258, 0.078, 0.008 bits.
    """
    k = _check_k(k)
    p, prior = _check_p(p), _check_prior(prior)
    total = 0.0
    for y, py in ((0, prior), (1, 1.0 - prior)):
        for m in range(k + 1):  # m examples carry the hidden label y
            pm = math.comb(k, m) * p ** m * (1 - p) ** (k - m)
            n_first = m if y == 0 else k - m
            z = _logit(prior) + (2 * n_first - k) * _logit(p)
            post = 1.0 / (1.0 + math.exp(-z))
            total += py * pm * float(binary_entropy_bits(post))
    return total


# --------------------------------------------------------------------------------------------------
# labels and tokenizers


def _get_tokenizer(model_or_tokenizer):
    tok = getattr(model_or_tokenizer, "tokenizer", None)
    if tok is not None:
        return tok
    if hasattr(model_or_tokenizer, "encode") and callable(model_or_tokenizer):
        return model_or_tokenizer
    raise InvalidInputError(
        f"expected a TransformerLens model with a tokenizer, or a tokenizer, got "
        f"{type(model_or_tokenizer).__name__}; SULA needs the tokenizer to choose single-token labels.")


def _token_ids(tok, text: str) -> List[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _single_token_id(tok, label: str) -> Optional[int]:
    ids = _token_ids(tok, " " + label)
    if len(ids) != 1:
        return None
    if tok.decode(ids) != " " + label:  # e.g. an unknown-token id that decodes to something else
        return None
    return int(ids[0])


def _check_labels(tok, labels) -> Tuple[Tuple[str, str], Tuple[int, int]]:
    if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) != 2:
        raise InvalidInputError(f"labels must be a pair of strings such as ('dax', 'lug'), got {labels!r}.")
    labels = tuple(labels)
    for lab in labels:
        if not isinstance(lab, str) or not lab or lab != lab.strip() or " " in lab:
            raise InvalidInputError(
                f"each label must be a non-empty word without spaces (the leading space is added), got {lab!r}.")
    if labels[0] == labels[1]:
        raise InvalidInputError(f"the two labels must differ, got {labels!r}.")
    ids = []
    for lab in labels:
        tid = _single_token_id(tok, lab)
        if tid is None:
            pieces = tok.convert_ids_to_tokens(_token_ids(tok, " " + lab))
            raise TokenizationError(
                f"label {lab!r} is not a single token with its leading space for this tokenizer "
                f"({' ' + lab!r} -> {pieces}); SULA reads the model's next-token probability of each "
                "label, so each must be one token. Pass other labels=, or labels=None to choose "
                "automatically.")
        ids.append(tid)
    return labels, (ids[0], ids[1])


def _cvc_words(seed: int) -> List[str]:
    words = ["".join(t) for t in itertools.product(_CONSONANTS, _VOWELS, _CONSONANTS)]
    order = np.random.default_rng(seed).permutation(len(words))
    return [words[i] for i in order]


def _choose_labels(tok, n: int, *, exclude: Iterable[str] = (), label_seed: int = 0) -> Tuple[str, ...]:
    """The first ``n`` candidates (Paper A's list, then seeded CVC words) that are one token each."""
    exclude = {e.lower() for e in exclude}
    chosen: List[str] = []
    seen_ids = set()
    for word in itertools.chain(CANDIDATE_LABELS, _cvc_words(label_seed)):
        if word in exclude or word in chosen:
            continue
        tid = _single_token_id(tok, word)
        if tid is None or tid in seen_ids:
            continue
        chosen.append(word)
        seen_ids.add(tid)
        if len(chosen) == n:
            return tuple(chosen)
    raise TokenizationError(
        f"found only {len(chosen)} of the {n} single-token labels needed among Paper A's candidates "
        f"{CANDIDATE_LABELS} and all consonant-vowel-consonant words; pass labels= explicitly "
        "(two words that are single tokens with a leading space).")


# --------------------------------------------------------------------------------------------------
# prompt generation


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise InvalidInputError(f"k must be a non-negative integer, got {k!r}.")
    if int(k) < 0:
        raise InvalidInputError(f"k (the number of labelled examples) must be >= 0, got {k}.")
    return int(k)


def _check_ks(ks) -> Tuple[int, ...]:
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise InvalidInputError(f"ks must be a sequence of non-negative integers such as (0, 1, 2, 4, 8), got {ks!r}.")
    out = tuple(_check_k(k) for k in ks)
    if not out:
        raise InvalidInputError("ks is empty; give at least one number of examples, e.g. ks=(0, 1, 2, 4, 8).")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"ks has repeated values {out}; give each k once (use n_per_k for more prompts).")
    return out


def make_prompts(
    model,
    *,
    ks: Sequence[int] = (0, 1, 2, 4, 8),
    n_per_k: int = 50,
    p: float = 0.9,
    prior: float = 0.5,
    control: Optional[str] = None,
    seed: int = 0,
    labels: Optional[Sequence[str]] = None,
    template: Union[str, SulaTemplate] = "colon",
    carriers: Sequence[str] = CARRIER_WORDS,
    query_word: Optional[str] = "query",
    placeholder: str = "?",
    mask_word: str = "___",
    label_seed: int = 0,
) -> SulaPrompts:
    """Generate SULA prompts with their exact posteriors (METHODS.md §6).

    Parameters
    ----------
    model:
        A TransformerLens model (its tokenizer is used) or a tokenizer: labels must be single tokens.
    ks, n_per_k:
        Numbers of labelled examples, and prompts per k (default 5 × 50 = 250 prompts).
    p, prior:
        P(example label = hidden label) in (0.5, 1); prior probability of the first label in (0, 1).
    control:
        ``None`` (the task), or one of :data:`CONTROLS` (see the module docstring).
    seed:
        Seeds every draw. Conditions draw the same numbers in the same order (paired designs).
    labels:
        The two label words shown (validated: each must be ONE token with its leading space). Default:
        the first single-token words of Paper A's candidates, then seeded consonant-vowel-consonant
        words (``label_seed``); for ``control="lexical_remap"`` the next pair in that order.
    template:
        ``"colon"`` (Paper A: ``"w1: L, w2: L. query:"``), ``"is"`` (``"w1 is L. w2 is L. query is"``) or
        a :class:`SulaTemplate`.
    carriers, query_word:
        Example words are drawn from ``carriers`` (without replacement while k ≤ len(carriers)). The
        query word is the literal ``"query"`` (Paper A's form); ``None`` draws it from ``carriers``.
    placeholder, mask_word:
        What replaces the labels (``evidence_removed``) / the carrier words (``carriers_masked``).
    """
    tok = _get_tokenizer(model)
    ks = _check_ks(ks)
    if isinstance(n_per_k, bool) or not isinstance(n_per_k, numbers.Integral) or n_per_k < 1:
        raise InvalidInputError(f"n_per_k must be a positive integer, got {n_per_k!r}.")
    n_per_k = int(n_per_k)
    p, prior = _check_p(p), _check_prior(prior)
    cond = "main" if control in (None, "main") else control
    if cond != "main" and cond not in CONTROLS:
        raise InvalidInputError(f"control must be None or one of {CONTROLS}, got {control!r}.")
    tmpl = _template(template)
    if isinstance(carriers, str) or not carriers or not all(isinstance(c, str) and c.strip() for c in carriers):
        raise InvalidInputError(f"carriers must be a non-empty list of words, got {carriers!r}.")
    carriers = tuple(carriers)
    if query_word is not None and (not isinstance(query_word, str) or not query_word.strip()):
        raise InvalidInputError(f"query_word must be a non-empty string or None, got {query_word!r}.")
    for name, val in (("placeholder", placeholder), ("mask_word", mask_word)):
        if not isinstance(val, str) or not val.strip():
            raise InvalidInputError(f"{name} must be a non-empty string, got {val!r}.")

    if labels is None:
        exclude = set(carriers) | ({query_word} if query_word else set())
        chosen = _choose_labels(tok, 4 if cond == "lexical_remap" else 2, exclude=exclude, label_seed=label_seed)
        labels = chosen[2:4] if cond == "lexical_remap" else chosen[:2]
    labels, _ = _check_labels(tok, labels)

    rng = np.random.default_rng(seed)
    no_evidence = cond in ("shuffled_labels", "evidence_removed")
    items: List[SulaItem] = []
    for k in ks:
        for _ in range(n_per_k):
            # the same draws, in the same order, for every condition (paired designs)
            y = 0 if rng.random() < prior else 1
            words = [carriers[i] for i in rng.choice(len(carriers), size=k, replace=k > len(carriers))]
            noise = rng.random(k)
            coins = rng.integers(0, 2, size=k)
            qw = query_word if query_word is not None else carriers[int(rng.integers(len(carriers)))]
            drawn = [y if u < p else 1 - y for u in noise]
            if cond == "shuffled_labels":
                drawn = [int(c) for c in coins]
            shown_words = list(words)
            if cond == "carriers_masked":
                shown_words = [mask_word] * k
                if query_word is None:
                    qw = mask_word
            shown = [placeholder] * k if cond == "evidence_removed" else [labels[i] for i in drawn]
            post = prior if no_evidence else bayes_posterior(drawn, p=p, prior=prior)
            items.append(SulaItem(
                tmpl.render(shown_words, shown, qw), k=k, example_labels=tuple(int(i) for i in drawn),
                hidden_label=int(y), bayes_p_first=float(post),
                bayes_entropy_bits=float(binary_entropy_bits(post)), words=tuple(words), query_word=qw,
                labels=labels, condition=cond,
            ))
    return SulaPrompts(items, labels=labels, p=p, prior=prior, control=cond, ks=ks, n_per_k=n_per_k,
                       template=tmpl, seed=seed)


# --------------------------------------------------------------------------------------------------
# statistics (vectorized over bootstrap resamples)


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xc = x - x.mean(-1, keepdims=True)
    yc = y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    num = (xc * yc).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a (numerically) constant input has no correlation
        scale = np.sqrt((x * x).sum(-1) * (y * y).sum(-1)) + 1e-300
        return np.where(den > 1e-12 * scale, num / np.where(den > 0, den, 1.0), np.nan)


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return _pearson_rows(rankdata(x, axis=-1), rankdata(y, axis=-1))


def _ci(reps: np.ndarray, level: float = 0.95) -> Tuple[float, float]:
    reps = np.asarray(reps, dtype=np.float64)
    fin = reps[np.isfinite(reps)]
    if fin.size < reps.size / 2 or fin.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(fin, [a, 1 - a])
    return float(lo), float(hi)


def _perm_pvalue(x: np.ndarray, y: np.ndarray, observed: float, n_perm: int, seed: int) -> float:
    if not np.isfinite(observed) or len(x) < 3:
        return float("nan")
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_perm, len(y))), axis=1)
    reps = _pearson_rows(np.broadcast_to(x, perms.shape), y[perms])
    reps = np.where(np.isfinite(reps), reps, 0.0)
    return float((np.sum(np.abs(reps) >= abs(observed) - 1e-12) + 1) / (n_perm + 1))


_METRICS = ("mae_bits", "pearson", "spearman", "kl_bits", "ece", "brier", "label_mass",
            "h_model_mean_bits")


def _group_stats(h_m, h_b, p_m, p_b, outcome, mass, *, n_boot: int, seed: int, n_bins: int) -> dict:
    """Point estimates and percentile bootstrap CIs (resampling prompts) of every SULA metric."""
    n = len(h_m)
    kl = kl_bernoulli_bits(p_b, p_m)

    def stats(idx):
        hm, hb = h_m[idx], h_b[idx]
        return {
            "mae_bits": np.abs(hm - hb).mean(-1),
            "pearson": _pearson_rows(hm, hb),
            "spearman": _spearman_rows(hm, hb),
            "kl_bits": kl[idx].mean(-1),
            "ece": expected_calibration_error(p_m[idx], outcome[idx], n_bins=n_bins),
            "brier": brier_score(p_m[idx], outcome[idx]),
            "label_mass": mass[idx].mean(-1),
            "h_model_mean_bits": hm.mean(-1),
        }

    point = {key: float(np.asarray(v).ravel()[0]) for key, v in stats(np.arange(n)[None, :]).items()}
    out = {"n": n, "h_bayes_mean_bits": float(h_b.mean())}
    if n >= 2:
        idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
        reps = stats(idx)
    else:
        reps = {key: np.full(1, np.nan) for key in point}
    for key in _METRICS:
        lo, hi = _ci(reps[key])
        out[key] = point[key]
        out[key + "_ci_low"] = lo
        out[key + "_ci_high"] = hi
    return out


def _slope_with_ci(x: np.ndarray, y: np.ndarray, *, n_boot: int, seed: int) -> Tuple[float, Tuple[float, float]]:
    """Least-squares slope of y on x (model entropy per extra example) and its bootstrap CI."""
    def slope(xs, ys):
        xc = xs - xs.mean(-1, keepdims=True)
        den = (xc * xc).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, (xc * (ys - ys.mean(-1, keepdims=True))).sum(-1) / np.where(den > 0, den, 1), np.nan)

    point = float(slope(x[None], y[None])[0])
    if len(x) < 2 or not np.isfinite(point):
        return point, (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    return point, _ci(slope(x[idx], y[idx]))


def _pc1(x: np.ndarray) -> Tuple[np.ndarray, float]:
    """PC1 scores of the z-scored features and PC1's explained-variance ratio (the shared float64
    PCA of :mod:`bayes_lens.metrics.pca`; sign: largest-|loading| feature positive, so deterministic
    but arbitrary). NaN when PCA is undefined (fewer than 3 prompts, or identical values)."""
    from .metrics.pca import pca

    x = np.asarray(x, dtype=np.float64)
    try:
        fit = pca(x, n_components=1)
    except InvalidInputError:
        return np.full(x.shape[0], np.nan), float("nan")
    return fit.coords[:, 0], float(fit.explained_variance_ratio[0])


def _geometry_table(pc1, h_b, h_m, k, *, n_boot: int, seed: int) -> pd.DataFrame:
    rows = []
    n = len(pc1)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n)) if n >= 2 else None
    def within_k(a):  # subtract each k's mean: what is left cannot be explained by k (or length)
        out = np.asarray(a, dtype=np.float64).copy()
        for kv in np.unique(k):
            out[k == kv] -= out[k == kv].mean()
        return out

    pairs = (("pc1_vs_bayes_entropy", pc1, h_b), ("pc1_vs_model_entropy", pc1, h_m),
             ("k_vs_pc1", k.astype(np.float64), pc1),
             ("pc1_vs_bayes_entropy_within_k", within_k(pc1), within_k(h_b)),
             ("pc1_vs_model_entropy_within_k", within_k(pc1), within_k(h_m)))
    for name, a, b in pairs:
        r = float(_pearson_rows(a[None], b[None])[0])
        rs = float(_spearman_rows(a[None], b[None])[0])
        if idx is not None:
            lo, hi = _ci(_pearson_rows(a[idx], b[idx]))
            slo, shi = _ci(_spearman_rows(a[idx], b[idx]))
        else:
            lo = hi = slo = shi = float("nan")
        rows.append({"pair": name, "pearson": r, "pearson_ci_low": lo, "pearson_ci_high": hi,
                     "abs_pearson": abs(r) if np.isfinite(r) else float("nan"),
                     "spearman": rs, "spearman_ci_low": slo, "spearman_ci_high": shi,
                     "perm_pvalue": _perm_pvalue(a, b, r, n_boot, seed + 1), "n": n})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, eq=False)
class SulaResult(Result):
    """SULA evaluation of one condition (METHODS.md §6).

    ``table`` has one row per k and a final row ``k == "all"``: n, mean Bayes / model entropy (bits),
    ``mae_bits``, ``pearson``, ``spearman`` (of H_model and H_Bayes), ``kl_bits`` (mean KL(Bayes ‖
    model)), ``ece`` and ``brier`` (P(first label) vs the hidden label), ``label_mass`` (raw
    next-token probability on the two labels), each with ``_ci_low``/``_ci_high`` (95% percentile
    bootstrap over prompts), and ``mae_ignore_evidence_bits``: the MAE of a model that always
    answers with the prior (the evidence-blind baseline). ``geometry`` has ρ(PC1, H_Bayes),
    ρ(PC1, H_model), ρ(k, PC1) (Pearson and Spearman, CIs, permutation p-values), and the same two
    entropy correlations *within k* (each variable minus its per-k mean). H_Bayes falls with k and
    prompt length grows with k, so PC1 can track H_Bayes through length alone (even a random model
    does); the within-k rows remove that confound. The sign of PC1 is arbitrary (``abs_pearson``).
    ``entropy_slope_bits_per_example`` (with ``entropy_slope_ci``) is the least-squares slope of the
    model's entropy on k: negative when the model uses the evidence.
    """

    condition: str
    labels: Tuple[str, str]
    layer: int
    table: pd.DataFrame
    geometry: pd.DataFrame
    reliability: pd.DataFrame
    mae_bits: float
    mae_bits_ci: Tuple[float, float]
    pearson: float
    pearson_ci: Tuple[float, float]
    spearman: float
    kl_bits: float
    ece: float
    brier: float
    label_mass: float
    rho_pc1_bayes: float
    rho_pc1_model: float
    rho_k_pc1: float
    pc1_explained_variance: float
    entropy_slope_bits_per_example: float
    entropy_slope_ci: Tuple[float, float]
    model_p_first: Tensor
    model_entropy_bits: Tensor
    model_label_mass: Tensor
    bayes_p_first: Tensor
    bayes_entropy_bits: Tensor
    k: Tensor
    hidden_label: Tensor
    pc1: Tensor
    prompts: SulaPrompts
    n_boot: int
    seed: int

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: condition, k, metric, value, ci_low, ci_high (geometry rows have k = "all")."""
        rows = []
        for _, r in self.table.iterrows():
            for m in _METRICS + ("h_bayes_mean_bits", "mae_ignore_evidence_bits"):
                rows.append({"condition": self.condition, "k": r["k"], "metric": m, "value": r[m],
                             "ci_low": r.get(m + "_ci_low", np.nan), "ci_high": r.get(m + "_ci_high", np.nan)})
        for _, g in self.geometry.iterrows():
            rows.append({"condition": self.condition, "k": "all", "metric": "rho_" + g["pair"],
                         "value": g["pearson"], "ci_low": g["pearson_ci_low"], "ci_high": g["pearson_ci_high"]})
        return pd.DataFrame(rows)

    def per_prompt(self) -> pd.DataFrame:
        """One row per prompt: k, hidden label, Bayes and model P(first label) and entropies, PC1."""
        return pd.DataFrame({
            "condition": self.condition, "text": self.prompts.texts, "k": self.k.numpy(),
            "hidden_label": self.hidden_label.numpy(), "bayes_p_first": self.bayes_p_first.numpy(),
            "model_p_first": self.model_p_first.numpy(), "bayes_entropy_bits": self.bayes_entropy_bits.numpy(),
            "model_entropy_bits": self.model_entropy_bits.numpy(), "label_mass": self.model_label_mass.numpy(),
            "pc1": self.pc1.numpy(),
        })

    def plot(self):
        """Entropy vs k (model vs Bayes), PC1 vs k, and the reliability diagram."""
        return _plot({self.condition: self})


@dataclass(frozen=True, eq=False)
class SulaControls(Result):
    """The main task and every control (:func:`run_controls`): ``table`` and ``geometry`` stack the
    conditions' tables with a ``condition`` column; ``results`` maps condition -> :class:`SulaResult`."""

    table: pd.DataFrame
    geometry: pd.DataFrame
    results: Dict[str, SulaResult]
    labels: Dict[str, Tuple[str, str]]
    layer: int

    def __getitem__(self, condition: str) -> SulaResult:
        return self.results[condition]

    def to_dataframe(self) -> pd.DataFrame:
        """Long format over all conditions (see :meth:`SulaResult.to_dataframe`)."""
        return pd.concat([r.to_dataframe() for r in self.results.values()], ignore_index=True)

    def plot(self):
        """Entropy vs k per condition (model solid, Bayes dashed), PC1 vs k, reliability diagrams."""
        return _plot(self.results)


def _plot(results: Dict[str, SulaResult]):
    go = plotly()
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "entropy vs k (model solid, Bayes dashed)", "PC1 of final-token values vs k", "reliability diagram"))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for i, (cond, res) in enumerate(results.items()):
        color = palette[i % len(palette)]
        t = res.table[res.table["k"] != "all"]
        ks = t["k"].astype(int).to_numpy()
        fig.add_trace(go.Scatter(
            x=ks, y=t["h_model_mean_bits"], mode="lines+markers", name=f"{cond}: model", line=dict(color=color),
            error_y=dict(type="data", symmetric=False,
                         array=t["h_model_mean_bits_ci_high"] - t["h_model_mean_bits"],
                         arrayminus=t["h_model_mean_bits"] - t["h_model_mean_bits_ci_low"])), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=t["h_bayes_mean_bits"], mode="lines+markers", name=f"{cond}: Bayes",
                                 line=dict(color=color, dash="dash")), row=1, col=1)
        kk = res.k.numpy().astype(float)
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, size=kk.shape)
        fig.add_trace(go.Scatter(x=kk + jitter, y=res.pc1.numpy(), mode="markers", name=f"{cond}: PC1",
                                 marker=dict(color=color, size=4, opacity=0.5)), row=1, col=2)
        rel = res.reliability
        fig.add_trace(go.Scatter(x=rel["mean_predicted"], y=rel["observed_frequency"], mode="lines+markers",
                                 name=f"{cond}: reliability", line=dict(color=color),
                                 text=[f"n={c}" for c in rel["count"]]), row=1, col=3)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line=dict(color="gray", dash="dot")), row=1, col=3)
    fig.update_xaxes(title_text="k (examples)", row=1, col=1)
    fig.update_yaxes(title_text="entropy (bits)", row=1, col=1)
    fig.update_xaxes(title_text="k (examples)", row=1, col=2)
    fig.update_yaxes(title_text="PC1 score", row=1, col=2)
    fig.update_xaxes(title_text="mean predicted P(first label)", range=[0, 1], row=1, col=3)
    fig.update_yaxes(title_text="observed frequency", range=[0, 1], row=1, col=3)
    fig.update_layout(title="SULA: model vs exact Bayesian posterior", height=420, width=1300)
    return fig


# --------------------------------------------------------------------------------------------------
# evaluation


def _as_prompts(prompts) -> SulaPrompts:
    if isinstance(prompts, SulaPrompts):
        items = prompts
    else:
        if isinstance(prompts, str) or not isinstance(prompts, Iterable):
            raise InvalidInputError("prompts must be the output of bl.sula.make_prompts (or a list of its items).")
        items = list(prompts)
    if not len(items):
        raise InvalidInputError("the prompt list is empty; make prompts with bl.sula.make_prompts(model).")
    bad = [i for i, it in enumerate(items) if not isinstance(it, SulaItem)]
    if bad:
        raise InvalidInputError(
            f"prompt {bad[0]} is a {type(items[bad[0]]).__name__}, not a SULA item: evaluate needs the exact "
            "posterior each item carries. Make prompts with bl.sula.make_prompts(model).")
    pairs = {it.labels for it in items}
    if len(pairs) != 1:
        raise InvalidInputError(f"all items must share one label pair, got {sorted(pairs)}; evaluate each set separately.")
    conds = {it.condition for it in items}
    if isinstance(items, SulaPrompts):
        return items
    ks = tuple(dict.fromkeys(it.k for it in items))
    return SulaPrompts(items, labels=items[0].labels, p=None, prior=None,
                       control=conds.pop() if len(conds) == 1 else "mixed", ks=ks, n_per_k=None,
                       template=None, seed=None)


def evaluate(
    model,
    prompts: Optional[Sequence[SulaItem]] = None,
    *,
    layer: int = -1,
    fwd_hooks=(),
    batch_size: int = 16,
    seed: int = 0,
    n_boot: int = 1000,
    n_bins: int = 10,
    progress: Optional[bool] = None,
) -> SulaResult:
    """Compare the model's posterior over the two labels with the exact Bayesian posterior.

    Parameters
    ----------
    prompts:
        Output of :func:`make_prompts` (default: ``make_prompts(model, seed=seed)``, 250 prompts).
    layer:
        Layer whose final-token ``hook_v`` (per KV head) enters the shared PCA (negative from the end).
    fwd_hooks:
        ``[(hook_name, fn)]`` patches active during the forward passes (e.g. an entropy-axis removal);
        always removed afterwards.
    seed, n_boot, n_bins:
        Bootstrap seed and resamples (95% percentile CIs over prompts); ECE bins.
    """
    if prompts is None:
        prompts = make_prompts(model, seed=seed)
    items = _as_prompts(prompts)
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < 1:
        raise InvalidInputError(f"n_boot must be a positive integer, got {n_boot!r}.")
    info = adapter.model_info(model)
    layer = adapter.resolve_layer(info.n_layers, layer)
    tok = _get_tokenizer(model)
    labels, ids = _check_labels(tok, items.labels)

    from .collect import collect

    col = collect(model, items.texts, value_layers=(layer,), token_ids=list(ids), batch_size=batch_size,
                  fwd_hooks=fwd_hooks, progress=progress)
    lp = col.token_logprobs.double().numpy()  # [n, 2] full-vocabulary log-probabilities
    mass = np.exp(lp).sum(1)
    p_m = np.exp(lp[:, 0] - np.logaddexp(lp[:, 0], lp[:, 1]))
    h_m = binary_entropy_bits(np.clip(p_m, 0.0, 1.0))
    p_b = items.bayes_p_first
    h_b = items.bayes_entropy_bits
    k = items.k
    hidden = items.hidden_label
    outcome = (hidden == 0).astype(np.float64)
    prior_value = np.array([getattr(items, "prior", None) or 0.5])

    rows = []
    groups = [(int(kv), k == kv) for kv in dict.fromkeys(k.tolist())] + [("all", np.ones_like(k, dtype=bool))]
    for gi, (name, sel) in enumerate(groups):
        st = _group_stats(h_m[sel], h_b[sel], p_m[sel], p_b[sel], outcome[sel], mass[sel],
                          n_boot=n_boot, seed=seed + gi, n_bins=n_bins)
        h_prior = float(binary_entropy_bits(prior_value)[0])
        rows.append({"k": name, **st, "mae_ignore_evidence_bits": float(np.abs(h_prior - h_b[sel]).mean())})
    table = pd.DataFrame(rows)
    table["k"] = table["k"].astype(object)
    overall = rows[-1]

    values = col.final_values[layer].double().numpy()
    pc1, evr = _pc1(values)
    geometry = _geometry_table(pc1, h_b, h_m, k, n_boot=n_boot, seed=seed)
    rel = pd.DataFrame(reliability_bins(p_m, outcome, n_bins=n_bins))
    g = geometry.set_index("pair")["pearson"]
    slope, slope_ci = _slope_with_ci(k.astype(np.float64), h_m, n_boot=n_boot, seed=seed)

    def t(a, dtype=torch.float64):
        return torch.as_tensor(np.asarray(a), dtype=dtype)

    return SulaResult(
        condition=items.control if isinstance(items.control, str) else "main",
        labels=labels, layer=layer, table=table, geometry=geometry, reliability=rel,
        mae_bits=overall["mae_bits"], mae_bits_ci=(overall["mae_bits_ci_low"], overall["mae_bits_ci_high"]),
        pearson=overall["pearson"], pearson_ci=(overall["pearson_ci_low"], overall["pearson_ci_high"]),
        spearman=overall["spearman"], kl_bits=overall["kl_bits"], ece=overall["ece"], brier=overall["brier"],
        label_mass=overall["label_mass"], rho_pc1_bayes=float(g["pc1_vs_bayes_entropy"]),
        rho_pc1_model=float(g["pc1_vs_model_entropy"]), rho_k_pc1=float(g["k_vs_pc1"]),
        pc1_explained_variance=evr, entropy_slope_bits_per_example=slope, entropy_slope_ci=slope_ci,
        model_p_first=t(p_m), model_entropy_bits=t(h_m), model_label_mass=t(mass), bayes_p_first=t(p_b),
        bayes_entropy_bits=t(h_b), k=t(k, torch.long), hidden_label=t(hidden, torch.long), pc1=t(pc1),
        prompts=items, n_boot=int(n_boot), seed=int(seed),
    )


def run_controls(
    model,
    *,
    controls: Sequence[str] = CONTROLS,
    ks: Sequence[int] = (0, 1, 2, 4, 8),
    n_per_k: int = 50,
    p: float = 0.9,
    prior: float = 0.5,
    seed: int = 0,
    labels: Optional[Sequence[str]] = None,
    remap_labels: Optional[Sequence[str]] = None,
    layer: int = -1,
    fwd_hooks=(),
    batch_size: int = 16,
    n_boot: int = 1000,
    n_bins: int = 10,
    progress: Optional[bool] = None,
    **prompt_kwargs,
) -> SulaControls:
    """Evaluate the main task and every control (paired: one seed for all) into one table.

    ``labels`` is the main pair (default: chosen automatically); ``remap_labels`` the pair of the
    lexical-remap control (default: the next single-token pair, never overlapping the main pair).
    Other keyword arguments (``template``, ``carriers``, ``query_word``, ...) go to :func:`make_prompts`.
    """
    controls = tuple(controls)
    bad = [c for c in controls if c not in CONTROLS]
    if bad:
        raise InvalidInputError(f"unknown control(s) {bad}; choose from {CONTROLS}.")
    tok = _get_tokenizer(model)
    common = dict(ks=ks, n_per_k=n_per_k, p=p, prior=prior, seed=seed, **prompt_kwargs)
    main = make_prompts(model, labels=labels, **common)
    if "lexical_remap" in controls and remap_labels is None:
        carriers = prompt_kwargs.get("carriers", CARRIER_WORDS)
        qw = prompt_kwargs.get("query_word", "query")
        remap_labels = _choose_labels(tok, 2, exclude=set(main.labels) | set(carriers) | ({qw} if qw else set()),
                                      label_seed=prompt_kwargs.get("label_seed", 0))
    results: Dict[str, SulaResult] = {}
    for cond in ("main",) + controls:
        if cond == "main":
            prompts = main
        else:
            prompts = make_prompts(model, control=cond,
                                   labels=remap_labels if cond == "lexical_remap" else main.labels, **common)
        results[cond] = evaluate(model, prompts, layer=layer, fwd_hooks=fwd_hooks, batch_size=batch_size,
                                 seed=seed, n_boot=n_boot, n_bins=n_bins, progress=progress)
    table = pd.concat([r.table.assign(condition=c) for c, r in results.items()], ignore_index=True)
    table = table[["condition"] + [col for col in table.columns if col != "condition"]]
    geometry = pd.concat([r.geometry.assign(condition=c) for c, r in results.items()], ignore_index=True)
    geometry = geometry[["condition"] + [col for col in geometry.columns if col != "condition"]]
    first = next(iter(results.values()))
    return SulaControls(table=table, geometry=geometry, results=results,
                        labels={c: r.labels for c, r in results.items()}, layer=first.layer)
