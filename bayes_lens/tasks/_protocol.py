"""The task protocol: items with a prompt, answer tokens and the exact posterior over the answers.

METHODS.md §6a (the protocol; SULA, §6, is one implementation, after Paper A, arXiv 2512.23752,
§4.3/§5.2). An item is a ``str`` (its prompt text) carrying ``task``, ``answers`` (the K ≥ 2
candidate continuations, each ONE token in the model's tokenizer exactly as written, leading space
included where the prompt expects one), ``posterior`` (the exact posterior over the answers, K
floats summing to 1), ``entropy_bits`` (its entropy), ``k`` (the amount of evidence: examples or
observations in context), ``outcome`` (index of the answer the generative model drew, or None) and
``prior_posterior`` (the posterior with no evidence: the evidence-blind baseline). A prompt set
(:class:`TaskPrompts`) carries the task name, seed, generator version and parameters.

Example
-------
>>> item = TaskItem("Sequence: 0 1 1", task="coin", answers=(" 0", " 1"), posterior=(0.4, 0.6), k=3,
...                 outcome=1, prior_posterior=(0.5, 0.5))
>>> item.text, round(item.entropy_bits, 4)
('Sequence: 0 1 1', 0.971)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .._validate import check_nonneg_int
from ..errors import InvalidInputError, TokenizationError
from ..metrics.stats import entropy_bits

__all__ = ["TaskItem", "TaskPrompts", "is_task_item", "as_task_prompts", "get_tokenizer", "single_token_id",
           "answer_token_ids", "choose_answers", "register_task", "task_loader", "STANDARD_FIELDS", "PromptTuple",
           "posterior_entropy_bits"]

#: The fields every exported record carries (the protocol); anything else is task-specific.
STANDARD_FIELDS = ("text", "task", "answers", "posterior", "entropy_bits", "k", "outcome", "prior_posterior")

#: absolute tolerance on Σ posterior = 1
_SUM_TOL = 1e-9


def posterior_entropy_bits(posterior) -> float:
    """Entropy in bits of one posterior (a sequence of K probabilities), 0·log 0 = 0."""
    return float(entropy_bits(np.asarray(posterior, dtype=np.float64)))


def _check_distribution(values, name: str, k: int) -> Tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInputError(f"{name} must be a sequence of {k} probabilities (one per answer), got {values!r}.")
    out = tuple(float(v) for v in values)
    if len(out) != k:
        raise InvalidInputError(f"{name} has {len(out)} probabilities but there are {k} answers; give one per answer.")
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in out):
        raise InvalidInputError(f"{name} must hold probabilities in [0, 1], got {out}.")
    if abs(math.fsum(out) - 1.0) > _SUM_TOL:
        raise InvalidInputError(f"{name} must sum to 1 (within {_SUM_TOL:g}), got Σ = {math.fsum(out)!r}; "
                                "renormalize it.")
    return out


def _check_answers(answers) -> Tuple[str, ...]:
    if isinstance(answers, str) or not isinstance(answers, Iterable):
        raise InvalidInputError(f"answers must be a sequence of K ≥ 2 strings such as (' dax', ' lug'), got {answers!r}.")
    out = tuple(answers)
    if len(out) < 2 or not all(isinstance(a, str) and a for a in out):
        raise InvalidInputError(f"answers must be K ≥ 2 non-empty strings (the continuations, leading space "
                                f"included where the prompt expects one), got {answers!r}.")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"answers must be distinct, got {out}.")
    return out


def _frozen(value):
    """JSON-like data with lists made tuples (items stay hashable-ish and compare by value)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_frozen(v) for v in value)
    return value


class TaskItem(str):
    """One prompt of an in-context task with an exact posterior: a ``str`` (its text) carrying the
    protocol fields (``task``, ``answers``, ``posterior``, ``entropy_bits``, ``k``, ``outcome``,
    ``prior_posterior``) and any task-specific fields given as keywords (JSON-like values; lists
    become tuples), listed in ``.extra_fields``. Immutable.

    ``entropy_bits`` is computed from ``posterior``. ``prior_posterior`` defaults to the uniform
    distribution over the answers. ``outcome`` is the index of the answer the generative model drew
    (for ECE and Brier score), or None.
    """

    def __new__(cls, text: str, *, task: str, answers: Sequence[str], posterior: Sequence[float], k: int,
                outcome: Optional[int] = None, prior_posterior: Optional[Sequence[float]] = None, **extra):
        if not isinstance(text, str) or not text:
            raise InvalidInputError(f"an item's text must be a non-empty string, got {text!r}.")
        if not isinstance(task, str) or not task:
            raise InvalidInputError(f"task must be a non-empty name such as 'categorical', got {task!r}.")
        answers = _check_answers(answers)
        n = len(answers)
        post = _check_distribution(posterior, "posterior", n)
        prior = (tuple(1.0 / n for _ in range(n)) if prior_posterior is None
                 else _check_distribution(prior_posterior, "prior_posterior", n))
        k = int(check_nonneg_int(k, "k"))
        if outcome is not None:
            outcome = int(check_nonneg_int(outcome, "outcome", max=n - 1))
        clash = sorted(set(extra) & (set(STANDARD_FIELDS) | {"extra_fields"}))
        if clash:
            raise InvalidInputError(f"task-specific fields {clash} clash with the protocol's field names; rename them.")
        obj = super().__new__(cls, text)
        obj.__dict__.update(task=task, answers=answers, posterior=post, entropy_bits=posterior_entropy_bits(post),
                            k=k, outcome=outcome, prior_posterior=prior,
                            extra_fields=tuple(sorted(extra)), **{f: _frozen(v) for f, v in extra.items()})
        return obj

    def __setattr__(self, name, value):
        raise AttributeError("TaskItem is immutable")

    @property
    def text(self) -> str:
        """The prompt text (a plain ``str``)."""
        return str.__str__(self)

    def as_dict(self) -> dict:
        """The item as one JSON-able record: the protocol fields, then the task-specific ones."""
        out = {"text": self.text, "task": self.task, "answers": list(self.answers), "posterior": list(self.posterior),
               "entropy_bits": self.entropy_bits, "k": self.k, "outcome": self.outcome,
               "prior_posterior": list(self.prior_posterior)}
        out.update({f: _jsonable(getattr(self, f)) for f in self.extra_fields})
        return out

    def __reduce__(self):
        return (_rebuild_item, (self.text, self._kwargs()))

    def _kwargs(self) -> dict:
        return {"task": self.task, "answers": self.answers, "posterior": self.posterior, "k": self.k,
                "outcome": self.outcome, "prior_posterior": self.prior_posterior,
                **{f: getattr(self, f) for f in self.extra_fields}}

    def __repr__(self) -> str:
        post = ", ".join(f"{p:.3f}" for p in self.posterior)
        return f"TaskItem({self.text!r}, task={self.task!r}, k={self.k}, posterior=({post}), outcome={self.outcome})"


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _rebuild_item(text, kwargs):
    return TaskItem(text, **kwargs)


def is_task_item(obj) -> bool:
    """Whether ``obj`` satisfies the protocol (a :class:`TaskItem`, a SULA item, or any object with the
    protocol's attributes)."""
    return all(hasattr(obj, f) for f in ("text", "answers", "posterior", "entropy_bits", "k", "outcome",
                                         "prior_posterior"))


class PromptTuple(tuple):
    """What every prompt set shares (SULA's and :class:`TaskPrompts`): a tuple of items whose slices keep the
    set's settings (``_meta()``, rebuilt with ``type(self)(items, **meta)``), ``.texts`` and ``.k``."""

    def _meta(self) -> dict:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def __getitem__(self, index):
        out = tuple.__getitem__(self, index)
        if isinstance(index, slice):
            return type(self)(out, **self._meta())
        return out

    @property
    def texts(self) -> List[str]:
        """The prompt texts as plain strings."""
        return [it.text for it in self]

    @property
    def k(self) -> np.ndarray:
        """``[n]`` the amount of evidence of each item."""
        return np.array([it.k for it in self], dtype=np.int64)


class TaskPrompts(PromptTuple):
    """A prompt set: a tuple of items (so a list of prompt strings too) with the generation settings
    ``.task``, ``.seed``, ``.generator_version``, ``.params`` (JSON-able) and ``.posterior_definition``
    (one sentence: what the exact posterior is). All items share one answer tuple (``.answers``)."""

    def __new__(cls, items: Iterable, *, task: str, seed: Optional[int], generator_version: str,
                params: Optional[dict] = None, posterior_definition: str = ""):
        items = tuple(items)
        bad = [i for i, it in enumerate(items) if not is_task_item(it)]
        if bad:
            raise InvalidInputError(f"item {bad[0]} is a {type(items[bad[0]]).__name__}, not a task item (it needs "
                                    "text, answers, posterior, entropy_bits, k, outcome, prior_posterior).")
        answers = {tuple(it.answers) for it in items}
        if len(answers) > 1:
            raise InvalidInputError(f"all items of a prompt set must share one answer tuple, got {sorted(answers)}.")
        obj = super().__new__(cls, items)
        obj.__dict__.update(task=task, seed=seed, generator_version=str(generator_version),
                            params=dict(params or {}), posterior_definition=str(posterior_definition),
                            answers=answers.pop() if answers else ())
        return obj

    def _meta(self) -> dict:
        return {k: self.__dict__[k] for k in ("task", "seed", "generator_version", "params", "posterior_definition")}

    def __reduce__(self):
        return (_rebuild_prompts, (tuple(self), self._meta()))

    @property
    def posterior(self) -> np.ndarray:
        """``[n, K]`` exact posteriors."""
        return np.array([it.posterior for it in self], dtype=np.float64).reshape(len(self), -1)

    @property
    def prior_posterior(self) -> np.ndarray:
        """``[n, K]`` posteriors with no evidence (the evidence-blind baseline)."""
        return np.array([it.prior_posterior for it in self], dtype=np.float64).reshape(len(self), -1)

    @property
    def entropy_bits(self) -> np.ndarray:
        return np.array([it.entropy_bits for it in self], dtype=np.float64)

    @property
    def outcome(self) -> np.ndarray:
        """Outcome index per item (-1 where an item has none)."""
        return np.array([-1 if it.outcome is None else it.outcome for it in self], dtype=np.int64)

    def __repr__(self) -> str:
        return (f"TaskPrompts(task={self.task!r}, n={len(self)}, answers={self.answers}, seed={self.seed}, "
                f"generator_version={self.generator_version!r})")


def _rebuild_prompts(items, meta):
    return TaskPrompts(items, **meta)


def as_task_prompts(prompts) -> TaskPrompts:
    """Items of any task (a :class:`TaskPrompts`, or a list of protocol items) as a :class:`TaskPrompts`."""
    if isinstance(prompts, TaskPrompts):
        return prompts
    if prompts is None or isinstance(prompts, str) or not isinstance(prompts, Iterable):
        raise InvalidInputError("prompts must be a task's prompt set (e.g. bl.tasks.categorical_prompts(model)) "
                                "or a list of its items.")
    items = list(prompts)
    if not items:
        raise InvalidInputError("the prompt list is empty; make prompts with a task generator first.")
    tasks = {getattr(it, "task", None) for it in items}
    meta = getattr(prompts, "_meta", None)
    if callable(meta) and hasattr(prompts, "generator_version"):
        return TaskPrompts(items, task=prompts.task, seed=prompts.seed, generator_version=prompts.generator_version,
                           params=prompts.params, posterior_definition=getattr(prompts, "posterior_definition", ""))
    return TaskPrompts(items, task=tasks.pop() if len(tasks) == 1 else "mixed", seed=None, generator_version="",
                       params={})


# --------------------------------------------------------------------------------------------------
# tokenizers and answers


def get_tokenizer(model_or_tokenizer):
    """The tokenizer of a TransformerLens model, or the tokenizer itself."""
    tok = getattr(model_or_tokenizer, "tokenizer", None)
    if tok is not None:
        return tok
    if hasattr(model_or_tokenizer, "encode") and callable(model_or_tokenizer):
        return model_or_tokenizer
    raise InvalidInputError(
        f"expected a TransformerLens model with a tokenizer, or a tokenizer, got "
        f"{type(model_or_tokenizer).__name__}; SULA and the other tasks need the tokenizer to check that each "
        "answer is a single token.")


def single_token_id(tok, text: str) -> Optional[int]:
    """The id of ``text`` if the tokenizer encodes it as ONE token that decodes back to ``text``, else None."""
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    if len(ids) != 1:
        return None
    if tok.decode(ids) != text:  # e.g. an unknown-token id that decodes to something else
        return None
    return int(ids[0])


def answer_token_ids(model_or_tokenizer, answers: Sequence[str]) -> Tuple[int, ...]:
    """The token ids of the answers (each must be one token exactly as written, and the ids distinct)."""
    tok = get_tokenizer(model_or_tokenizer)
    answers = _check_answers(answers)
    ids = []
    for a in answers:
        tid = single_token_id(tok, a)
        if tid is None:
            pieces = tok.convert_ids_to_tokens(list(tok(a, add_special_tokens=False)["input_ids"]))
            raise TokenizationError(
                f"answer {a!r} is not a single token for this tokenizer ({a!r} -> {pieces}); the model's posterior "
                "is read from the next-token probability of each answer, so each must be one token. Choose other "
                "answers (e.g. symbols= or a different answer range).")
        ids.append(tid)
    if len(set(ids)) != len(ids):
        raise TokenizationError(f"answers {answers} map to repeated token ids {ids}; choose distinct answers.")
    return tuple(ids)


def choose_answers(model_or_tokenizer, n: int, candidates: Iterable[str], *, prefix: str = " ",
                   exclude: Iterable[str] = ()) -> Tuple[str, ...]:
    """The first ``n`` words of ``candidates`` whose ``prefix + word`` is one token (distinct ids)."""
    tok = get_tokenizer(model_or_tokenizer)
    exclude = set(exclude)
    chosen: List[str] = []
    seen = set()
    for word in candidates:
        if word in exclude or word in chosen:
            continue
        tid = single_token_id(tok, prefix + word)
        if tid is None or tid in seen:
            continue
        chosen.append(word)
        seen.add(tid)
        if len(chosen) == n:
            return tuple(chosen)
    raise TokenizationError(f"found only {len(chosen)} of the {n} single-token answers needed; pass them explicitly.")


# --------------------------------------------------------------------------------------------------
# the registry of tasks that can be loaded back from files

#: task name -> (module that registers it, for a lazy import; rebuild function or None until imported)
_REGISTRY: Dict[str, List[Any]] = {"sula": ["bayes_lens.sula", None]}


def register_task(name: str, rebuild: Callable[[List[dict], dict], Any], *, module: Optional[str] = None) -> None:
    """Register how a task's exported records are rebuilt: ``rebuild(records, card) -> prompt set``.

    Tasks built from :class:`TaskItem` need no registration (the generic rebuild is used); register
    a task whose items are another class (as SULA's are).
    """
    entry = _REGISTRY.setdefault(name, [module, None])
    entry[1] = rebuild
    if module is not None:
        entry[0] = module


def task_loader(name: str) -> Optional[Callable[[List[dict], dict], Any]]:
    """The registered rebuild function of task ``name`` (importing the module that owns it), or None."""
    import importlib

    entry = _REGISTRY.get(name)
    if entry is None:
        return None
    if entry[1] is None and entry[0] is not None:
        importlib.import_module(entry[0])
    return entry[1]
