"""The SULA task: templates, prompt items, the exact posterior, and the prompt generator.

METHODS.md §6 (Paper A, "Geometric Scaling of Bayesian Inference in LLMs", arXiv 2512.23752, §4.3,
§5.2): k labelled examples and a query; two single-token nonsense labels; hidden label y with
P(y = L1) = prior; each example label equals y with probability p; carrier words carry no evidence.
logit P(y = L1 | D) = logit(prior) + (n₁ − n₂) · log(p / (1 − p)). See :mod:`bayes_lens.sula`.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
from torch import Tensor

from .._validate import check_choice, check_count, check_nonneg_int, check_seed
from ..errors import InvalidInputError, TokenizationError
from ..metrics.calibration import binary_entropy_bits
from ..tasks import PromptTuple, get_tokenizer, register_task, single_token_id

__all__ = [
    "CANDIDATE_LABELS",
    "CARRIER_WORDS",
    "CONTROLS",
    "TEMPLATES",
    "SulaTemplate",
    "SulaItem",
    "SulaPrompts",
    "make_prompts",
    "bayes_posterior",
    "expected_bayes_entropy_bits",
    "get_tokenizer",
    "check_labels",
    "choose_labels",
]

#: Paper A's nonsense labels, tried first (in this order) for single-token-ness.
CANDIDATE_LABELS: Tuple[str, ...] = ("dax", "lug", "mip", "zorb", "wug", "kep", "tuv", "gax")
#: Default carrier words (they carry no evidence under the generative model).
CARRIER_WORDS: Tuple[str, ...] = ("cat", "dog", "tree", "house", "river", "stone", "bird", "moon",
                                  "apple", "chair", "cloud", "lamp")
#: The control conditions :func:`make_prompts` accepts (``None`` or ``"main"`` is the task itself).
CONTROLS: Tuple[str, ...] = ("lexical_remap", "shuffled_labels", "evidence_removed", "carriers_masked")

#: Bumped whenever the same arguments would generate different items (exported in a file's card).
SULA_VERSION = "sula-1"
_DEFINITION = ("y ~ Bernoulli(prior) over (L1, L2); each of the k example labels equals y with probability p; "
               "posterior = (P(L1 | D), 1 - P(L1 | D)) with logit P(L1 | D) = logit(prior) + (n1 - n2) log(p / (1 - p)); "
               "controls shuffled_labels and evidence_removed: posterior = prior; outcome = y.")

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
    return TEMPLATES[check_choice(template, "template (or a bl.sula.SulaTemplate)", sorted(TEMPLATES))]


# --------------------------------------------------------------------------------------------------
# items and prompt sets


class SulaItem(str):
    """One SULA prompt: a ``str`` (its text, so a list of items is a list of prompts) that also
    carries ``.text``, ``.k``, ``.example_labels`` (0 = first label, 1 = second), ``.hidden_label``,
    ``.bayes_p_first`` (exact posterior of the first label), ``.bayes_entropy_bits``, ``.words``,
    ``.query_word``, ``.labels`` (the label pair), ``.condition``, and the generative model's ``.p``
    and ``.prior`` (so a plain list of items keeps everything the evaluation needs). Immutable."""

    _FIELDS = ("k", "example_labels", "hidden_label", "bayes_p_first", "bayes_entropy_bits", "words",
               "query_word", "labels", "condition", "p", "prior")

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

    # the task protocol (bayes_lens.tasks, METHODS.md §6a): SULA is one task among others
    task = "sula"

    @property
    def answers(self) -> Tuple[str, str]:
        """The two label tokens as continuations: ``(" " + L1, " " + L2)``."""
        return (" " + self.labels[0], " " + self.labels[1])

    @property
    def posterior(self) -> Tuple[float, float]:
        """The exact posterior over ``answers``: (P(L1 | D), 1 − P(L1 | D))."""
        return (self.bayes_p_first, 1.0 - self.bayes_p_first)

    @property
    def entropy_bits(self) -> float:
        """The exact posterior's entropy in bits (``bayes_entropy_bits``)."""
        return self.bayes_entropy_bits

    @property
    def outcome(self) -> int:
        """Index of the hidden label in ``answers`` (``hidden_label``)."""
        return self.hidden_label

    @property
    def prior_posterior(self) -> Tuple[float, float]:
        """The posterior with no evidence: (prior, 1 − prior)."""
        return (self.prior, 1.0 - self.prior)

    def __reduce__(self):
        return (_rebuild_item, (self.text, {f: getattr(self, f) for f in self._FIELDS}))

    def __repr__(self) -> str:
        return (f"SulaItem({self.text!r}, k={self.k}, hidden_label={self.hidden_label}, "
                f"bayes_p_first={self.bayes_p_first:.4f}, condition={self.condition!r})")


def _rebuild_item(text, fields):
    return SulaItem(text, **fields)


class SulaPrompts(PromptTuple):
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

    # the prompt-set side of the task protocol (what an exported file's card records)
    task = "sula"
    generator_version = SULA_VERSION
    posterior_definition = _DEFINITION

    @property
    def params(self) -> dict:
        """The generation settings as JSON-able data (the template as its four strings)."""
        meta = self._meta()
        meta.pop("seed")
        t = meta["template"]
        meta["template"] = None if t is None else {f: getattr(t, f) for f in ("example", "sep", "end", "query")}
        meta["labels"] = list(meta["labels"])
        meta["ks"] = list(meta["ks"])
        return meta

    def __reduce__(self):
        return (_rebuild_prompts, (tuple(self), self._meta()))

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


def _token_ids(tok, text: str) -> List[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _single_token_id(tok, label: str) -> Optional[int]:
    return single_token_id(tok, " " + label)


def check_labels(tok, labels) -> Tuple[Tuple[str, str], Tuple[int, int]]:
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


def choose_labels(tok, n: int, *, exclude: Iterable[str] = (), label_seed: int = 0) -> Tuple[str, ...]:
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
    k = check_nonneg_int(k, "k")  # the number of labelled examples
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
    seed = check_seed(seed)  # None would silently make the prompt set non-reproducible
    tok = get_tokenizer(model)
    ks = _check_ks(ks)
    n_per_k = check_count(n_per_k, "n_per_k")
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
        chosen = choose_labels(tok, 4 if cond == "lexical_remap" else 2, exclude=exclude, label_seed=label_seed)
        labels = chosen[2:4] if cond == "lexical_remap" else chosen[:2]
    labels, _ = check_labels(tok, labels)

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
                labels=labels, condition=cond, p=p, prior=prior,
            ))
    return SulaPrompts(items, labels=labels, p=p, prior=prior, control=cond, ks=ks, n_per_k=n_per_k,
                       template=tmpl, seed=seed)




# --------------------------------------------------------------------------------------------------
# loading exported files back (bayes_lens.tasks.load / from_records)


def _tuple(value):
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _from_records(records, card) -> SulaPrompts:
    """SULA items and their prompt set from exported records (the protocol fields are checked against
    the ones the rebuilt items derive)."""
    items = []
    for rec in records:
        item = SulaItem(rec["text"], **{f: _tuple(rec[f]) for f in SulaItem._FIELDS})
        for f in ("answers", "posterior", "entropy_bits", "outcome", "prior_posterior"):
            if _tuple(rec[f]) != getattr(item, f):
                raise InvalidInputError(f"record {len(items)}: its {f} {rec[f]!r} is not the one its SULA fields "
                                        f"imply ({getattr(item, f)!r}); the file was not written by bl.tasks.export.")
        items.append(item)
    params = dict(card["params"])
    t = params.get("template")
    params["template"] = None if t is None else SulaTemplate(**t)
    return SulaPrompts(items, seed=card["seed"], **{k: _tuple(v) if k in ("labels", "ks") else v
                                                    for k, v in params.items()})


register_task("sula", _from_records, module=__name__.rsplit(".", 1)[0])
