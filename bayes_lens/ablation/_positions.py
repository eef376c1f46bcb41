"""Where each demonstration's answer sits in a prompt's tokens: the positions ``localize(positions="answers")`` edits.

METHODS.md §13. An in-context prompt is demonstrations then a query; the demonstrations' answers (SULA's
example labels, the categorical task's shown symbols) are tokens of the prompt. :func:`answer_positions`
finds them in the tokenization the runner uses (:func:`bayes_lens.adapter.encode_prompts`: BOS first when the
model prepends one, right-padded, so an index is the same in the batch), one tuple per prompt:

* the strings shown, in order, come from the item: SULA ``" " + labels[i]`` for i in ``example_labels``; the
  categorical task ``answers[s]`` for s in ``sequence``; any task item with a ``demonstration_answers`` field
  (a tuple of strings, each one token with its leading space) its own;
* each shown string must be one token (its id is the one the prompt holds there); the prompt's tokens are
  matched from the end (the query, then the demonstrations backwards, so a preamble that happens to hold an
  answer's token is never taken for a demonstration) and the match is refused unless exactly the k shown
  answers are found, in order, with no other token of an answer between the first of them and the end.

A task with no demonstrations (or items that do not say what they show) is refused with a
:class:`~bayes_lens.errors.BayesLensError` naming the route (``demonstration_answers=``).

>>> import bayes_lens as bl
>>> model = bl.models.tiny.tiny_model("bridge")
>>> items = bl.sula.make_prompts(model, ks=(2,), n_per_k=1)
>>> pos = answer_positions(model, items)
>>> [model.tokenizer.decode([model.to_tokens(items[0].text)[0, p]]) for p in pos[0]] == list(
...     " " + items[0].labels[i] for i in items[0].example_labels)
True
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from .. import adapter
from ..errors import InvalidInputError, TokenizationError
from ..tasks import get_tokenizer, single_token_id

__all__ = ["answer_positions", "demonstration_answers"]


def demonstration_answers(item) -> Tuple[str, ...]:
    """The answer strings item's demonstrations show, in order (each with its leading space), or InvalidInputError
    when the item does not say (a task without demonstrations, or one whose items carry no record of them)."""
    own = getattr(item, "demonstration_answers", None)
    if own is not None:
        return tuple(str(a) for a in own)
    task = getattr(item, "task", None)
    if task == "sula":
        if getattr(item, "condition", None) == "evidence_removed":
            raise InvalidInputError("positions='answers': these SULA items are the evidence_removed control, whose "
                                    "demonstrations show a placeholder instead of a label, so there is no answer "
                                    "position to edit; use positions='all' or 'final' for the control.")
        return tuple(" " + item.labels[int(i)] for i in item.example_labels)
    if task == "categorical" and hasattr(item, "sequence"):
        return tuple(item.answers[int(s)] for s in item.sequence)
    raise InvalidInputError(f"positions='answers' needs each prompt's demonstrations and their answers; items of task "
                            f"{task!r} do not record them (SULA and the categorical task do). Give the items a "
                            "demonstration_answers=(...) field (bl.tasks.TaskItem(..., demonstration_answers=(' A', "
                            "' B'))), the answer strings shown in order, or use positions='all' or 'final'.")


def answer_positions(model, items: Sequence) -> List[Tuple[int, ...]]:
    """Per prompt, the token positions of its demonstrations' answers (the module docstring): a tuple per item, in
    the runner's tokenization of ``model`` (BOS included when the model prepends one). A prompt without
    demonstrations (k = 0) gets ``()``; items none of which shows an answer are refused."""
    items = list(items)
    shown = [demonstration_answers(it) for it in items]
    if not any(shown):
        raise InvalidInputError("positions='answers': none of these prompts has a demonstration (every k is 0), so "
                                "there is no answer position to edit; include prompts with k ≥ 1.")
    tok = get_tokenizer(model)
    ids_of = {}
    for a in sorted({a for s in shown for a in s}):
        ids_of[a] = single_token_id(tok, a)
        if ids_of[a] is None:
            raise TokenizationError(f"positions='answers': the demonstrations' answer {a!r} is not one token for this "
                                    "tokenizer, so it has no single position; choose single-token answers or use "
                                    "positions='all'.")
    token_ids = adapter.encode_prompts(model, [str(it) for it in items])
    out = []
    for i, (want, toks) in enumerate(zip(shown, token_ids)):
        want_ids = [ids_of[a] for a in want]
        found, j = [], len(toks) - 1
        for tid in reversed(want_ids):  # the last demonstration first: the query follows it, a preamble precedes all
            while j >= 0 and toks[j] != tid:
                j -= 1
            if j < 0:
                break
            found.append(j)
            j -= 1
        found = found[::-1]
        if len(found) != len(want_ids):
            raise TokenizationError(f"positions='answers': prompt {i} ({str(items[i])!r}) does not hold the tokens of "
                                    f"its {len(want)} demonstrations' answers {list(want)} as single tokens in order "
                                    "(the template merges the answer with its neighbours); use a template that puts "
                                    "each answer after a space and before punctuation, or positions='all'.")
        answer_set = set(want_ids)
        stray = [p for p in range(found[0] if found else len(toks), len(toks))
                 if toks[p] in answer_set and p not in found] if found else []
        if stray:
            raise TokenizationError(f"positions='answers': prompt {i} ({str(items[i])!r}) holds an answer's token at "
                                    f"position {stray[0]}, among its demonstrations but not one of them, so which "
                                    "positions are the demonstrations' answers is ambiguous; choose labels or "
                                    "symbols that no other word of the prompt shares.")
        out.append(tuple(found))
    return out
