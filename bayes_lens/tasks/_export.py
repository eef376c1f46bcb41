"""Task data as files: a prompt set as JSONL plus a dataset card, loaded back bit for bit.

METHODS.md §6a. :func:`export` writes ``<name>.jsonl`` (one record per item: the protocol fields
``text, task, answers, posterior, entropy_bits, k, outcome, prior_posterior`` and the task's own
fields; keys sorted, one JSON object per line) and ``<name>.card.json`` (the dataset card: task,
seed, generator version, parameters, the posterior's definition, a description of every field, the
number of items, the SHA-256 of the JSONL file, and the SHA-256 of the card itself). Both are
written atomically. ``datasets.load_dataset("json", data_files=...)`` reads the JSONL as it is;
:func:`from_records` rebuilds the items from such records (checking them against the card's
checksum by writing them out again), :func:`load` from the files (checking both checksums).
Only data JSON and ``datasets`` read back unchanged are written: a NaN or infinite number, or a
surrogate code point in a string (not Unicode text), is refused on export with the item and field
that hold it. A card that is not a JSON object, lacks an entry the loader reads, or names a task
whose records these are not (its own SHA-256 recomputed after an edit) is a
:class:`~bayes_lens.errors.CheckpointError`.

Example
-------
>>> import tempfile, pathlib
>>> from bayes_lens.models.tiny import tiny_tokenizer
>>> from bayes_lens.tasks import categorical_prompts
>>> items = categorical_prompts(tiny_tokenizer(), ks=(0, 2), n_per_k=2, seed=0)
>>> path = export(items, pathlib.Path(tempfile.mkdtemp()) / "categorical.jsonl")
>>> back = load(path)
>>> [it.as_dict() for it in back] == [it.as_dict() for it in items], back.seed
(True, 0)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, List, Mapping, Union

from .._files import make_dir, sha256_file, sha256_json, write_text
from ..errors import BayesLensError, CheckpointError, InvalidInputError
from ._protocol import STANDARD_FIELDS, TaskItem, TaskPrompts, is_task_item, task_loader

__all__ = ["export", "load", "from_records", "read_card", "card_path", "CARD_FORMAT"]

#: The card's format name and version.
CARD_FORMAT = "bayes_lens.tasks/1"

_FIELD_DOC = {
    "text": "the prompt (the model predicts the answer token right after it)",
    "task": "the task's name",
    "answers": "the K candidate continuations, each one token as written (leading space included)",
    "posterior": "the exact posterior over the answers (K floats summing to 1)",
    "entropy_bits": "entropy of the posterior in bits",
    "k": "amount of evidence in context (examples or observations)",
    "outcome": "index into answers of the answer the generative model drew (null: none)",
    "prior_posterior": "the posterior with no evidence (the evidence-blind baseline)",
}


def card_path(path: Union[str, Path]) -> Path:
    """The card next to a JSONL file: ``x.jsonl`` -> ``x.card.json``."""
    path = Path(path)
    return path.with_name(path.name[:-len(".jsonl")] + ".card.json" if path.name.endswith(".jsonl")
                          else path.name + ".card.json")


def _record(item) -> dict:
    rec = dict(item.as_dict())
    for f in STANDARD_FIELDS:  # SULA's as_dict lacks some protocol fields: add them from the item
        if f not in rec:
            v = getattr(item, f)
            rec[f] = list(v) if isinstance(v, tuple) else v
    return rec


def _line(rec: Mapping[str, Any]) -> str:
    return json.dumps(_plain(rec), sort_keys=True, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))


def _plain(value):
    """JSON-able data with tuples as lists and NumPy scalars as Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        return value.item()
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
#: the card entries the loaders read, and the types they must have
_CARD_ENTRIES = {"task": str, "seed": (int, type(None)), "generator_version": str, "params": dict, "n_items": int,
                 "sha256": str}


def _check_data(value, where: str) -> None:
    """Refuse what JSON or ``datasets`` cannot carry back unchanged: NaN / inf, surrogate code points."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _check_data(str(k), f"{where} (a key)")
            _check_data(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_data(v, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"{where} is {value!r}: a task file holds finite numbers only (JSON has no NaN or "
                                "infinity); fix or drop that value before exporting.")
    elif isinstance(value, str):
        bad = _SURROGATE.search(value)
        if bad:
            raise InvalidInputError(
                f"{where} holds the surrogate U+{ord(bad.group()):04X} at character {bad.start()}: not Unicode text "
                "(datasets.load_dataset cannot read it, and a pair of them would load back as another character); "
                "remove it, or join surrogate pairs with s.encode('utf-16', 'surrogatepass').decode('utf-16').")


def _check_records(records: List[dict], meta: dict) -> None:
    for i, rec in enumerate(records):
        for f, v in rec.items():
            _check_data(v, f"item {i}'s text" if f == "text" else f"item {i}'s field {f!r}")
    for f, v in meta.items():
        if f == "params" and isinstance(v, Mapping):
            for k, pv in v.items():
                _check_data(str(k), f"the prompt set's parameter name {k!r}")
                _check_data(pv, f"the prompt set's parameter {k!r}")
        else:
            _check_data(v, f"the prompt set's {f}")


def _check_card(card, where: str) -> dict:
    """``card`` if it is a card the loaders can read, else the CheckpointError saying what is wrong."""
    if not isinstance(card, Mapping):
        raise CheckpointError(f"the dataset card {where} is not a JSON object (it holds a {type(card).__name__}); "
                              "export the prompt set again.")
    for name, kind in _CARD_ENTRIES.items():
        if name not in card or not isinstance(card[name], kind) or isinstance(card[name], bool):
            what = "lacks" if name not in card else f"has a {type(card[name]).__name__} as"
            raise CheckpointError(f"the dataset card {where} {what} {name!r}, which a loader reads (an edited card "
                                  "whose SHA-256 was recomputed?); export the prompt set again.")
    return dict(card)


def _jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(_line(r) + "\n" for r in records)


def _meta(prompts) -> dict:
    for attr in ("task", "seed", "generator_version", "params"):
        if not hasattr(prompts, attr):
            raise InvalidInputError(f"the prompt set has no .{attr}; export a task generator's output (e.g. "
                                    "bl.tasks.categorical_prompts(model) or bl.sula.make_prompts(model)).")
    return {"task": prompts.task, "seed": prompts.seed, "generator_version": prompts.generator_version,
            "params": _plain(prompts.params), "posterior_definition": getattr(prompts, "posterior_definition", "")}


def export(prompts, path: Union[str, Path]) -> Path:
    """Write ``prompts`` to ``path`` (a ``.jsonl`` file) and its dataset card next to it; returns ``path``."""
    items = list(prompts)
    if not items or not all(is_task_item(it) for it in items):
        raise InvalidInputError("export needs a non-empty prompt set of task items (from a task generator).")
    meta = _meta(prompts)
    path = Path(path)
    if not path.name.endswith(".jsonl"):
        raise InvalidInputError(f"the export path must end in .jsonl, got {str(path)!r}.")
    records = [_plain(_record(it)) for it in items]
    _check_records(records, meta)  # before anything is written
    make_dir(path.parent, "output folder")
    text = _jsonl(records)
    extra = sorted(set(records[0]) - set(STANDARD_FIELDS))
    card = {"format": CARD_FORMAT, **meta, "n_items": len(records), "file": path.name,
            "sha256": hashlib.sha256(text.encode("ascii")).hexdigest(),
            "fields": {**_FIELD_DOC, **{f: "task-specific field (see the task's documentation)" for f in extra}},
            "load_with": ["datasets.load_dataset('json', data_files=<file>, split='train')",
                          "bayes_lens.tasks.load(<file>)"]}
    card["card_sha256"] = sha256_json(card)
    write_text(path, text)
    write_text(card_path(path), json.dumps(card, indent=1, sort_keys=True, ensure_ascii=True) + "\n")
    return path


def read_card(path: Union[str, Path]) -> dict:
    """The dataset card of a JSONL file (or the card file itself), its own checksum verified."""
    path = Path(path)
    cpath = path if path.name.endswith(".card.json") else card_path(path)
    if not cpath.is_file():
        raise CheckpointError(f"no dataset card at {str(cpath)!r}; export the prompt set with bl.tasks.export, "
                              "which writes the card next to the JSONL file.")
    try:
        card = json.loads(cpath.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{str(cpath)!r} is not a JSON dataset card ({err}); export the prompt set again.") from None
    if not isinstance(card, dict):
        raise CheckpointError(f"the dataset card {str(cpath)!r} is not a JSON object (it holds "
                              f"{json.dumps(card)[:40]}); export the prompt set again.")
    body = {k: v for k, v in card.items() if k != "card_sha256"}
    if card.get("format") != CARD_FORMAT or card.get("card_sha256") != sha256_json(body):
        raise CheckpointError(f"the dataset card {str(cpath)!r} does not match its own SHA-256 (or is not a "
                              f"{CARD_FORMAT} card): it was edited or damaged. Export the prompt set again.")
    return _check_card(card, repr(str(cpath)))


def _tuples(value):
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _generic(records: List[dict], card: dict) -> TaskPrompts:
    items = []
    for rec in records:
        extra = {f: v for f, v in rec.items() if f not in STANDARD_FIELDS}
        item = TaskItem(rec["text"], task=rec["task"], answers=tuple(rec["answers"]), posterior=tuple(rec["posterior"]),
                        k=rec["k"], outcome=rec["outcome"], prior_posterior=tuple(rec["prior_posterior"]), **extra)
        items.append(item)
    return TaskPrompts(items, task=card["task"], seed=card["seed"], generator_version=card["generator_version"],
                       params=card["params"], posterior_definition=card.get("posterior_definition", ""))


def from_records(records: Iterable[Mapping[str, Any]], card) -> Any:
    """Rebuild a prompt set from exported records (e.g. the rows of ``datasets.load_dataset("json", ...)``)
    and its card (a dict from :func:`read_card`, or a path). The records are written out again and
    their SHA-256 compared with the card's: any change (an edited posterior, a lost row, a float that
    did not survive a conversion) raises :class:`~bayes_lens.errors.CheckpointError`."""
    card = _check_card(card, "given") if isinstance(card, Mapping) else read_card(card)
    records = [dict(r) for r in records]
    digest = hashlib.sha256(_jsonl(records).encode("ascii")).hexdigest()
    if digest != card.get("sha256") or len(records) != card.get("n_items"):
        raise CheckpointError(f"the {len(records)} records do not match the dataset card's checksum "
                              f"({card.get('n_items')} items, sha256 {str(card.get('sha256'))[:12]}…): the data were "
                              "edited, reordered, truncated or converted lossily. Use the exported file as written.")
    return _rebuild(records, card)


def _rebuild(records: List[dict], card: dict):
    """The prompt set of ``records``: the card's task's rebuild, or the generic one; records that do not fit
    that task (a card re-hashed with another task, an edited record) are a CheckpointError, never a KeyError."""
    rebuild = task_loader(card["task"]) or _generic
    try:
        return rebuild(records, card)
    except BayesLensError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        what = f"a record has no {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise CheckpointError(f"the records do not fit task {card['task']!r}, which their dataset card names ({what}): "
                              "the card or the records were edited; export the prompt set again.") from None


def load(path: Union[str, Path]) -> Any:
    """Load an exported prompt set (``.jsonl`` with its card), verifying both checksums; returns the same
    items, bit for bit (SULA files give SULA items)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"no task file at {str(path)!r}; export one with bl.tasks.export(prompts, path).")
    card = read_card(path)
    if sha256_file(path) != card["sha256"]:
        raise CheckpointError(f"{str(path)!r} does not match the SHA-256 in its dataset card: the file was edited or "
                              "damaged. Export the prompt set again.")
    records = [json.loads(line) for line in path.read_text(encoding="ascii").splitlines() if line]
    if len(records) != card["n_items"]:  # pragma: no cover - the checksum catches this first
        raise CheckpointError(f"{str(path)!r} holds {len(records)} records, its card says {card['n_items']}.")
    return _rebuild(records, card)
