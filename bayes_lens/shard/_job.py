"""A job folder: ``plan.json`` + ``prompts.jsonl`` say what every worker of a sharded run must do.

:func:`write_plan` records the model spec, the prompts (one JSON string per line, so prompts may
hold newlines; U+2028, U+2029 and U+0085 are written escaped, and lines are split on ``"\\n"`` only,
so files written before that still read), the collect settings, an optional task label, the shard
ranges and the run ``"order"``; a worker started by ``bayes-lens shard run DIR`` (torchrun, ``srun``,
a SLURM array task, any job runner) needs nothing else. ``plan.json`` carries a SHA-256 of itself
(``"plan_sha256"``, over every other entry, the order included) and one of the prompts, so an edited
order, shard range or setting is refused (:class:`~bayes_lens.shard.ShardIntegrityError`), never
used. Writing a plan into a folder that holds a different plan is refused
(:class:`~bayes_lens.shard.ShardMismatchError`) unless ``overwrite=True``: two jobs never share a
folder by accident.

The SHA-256 catches damage and accidents, not intent: anyone who can write the folder can recompute
it. What a plan may make a worker run is therefore bounded by the worker, not the plan: the model
loader and the read classes it names must be allowed in the worker (:mod:`bayes_lens._allow`; a
``subprocess:getoutput`` loader is refused before anything is imported). For more, set
``BAYES_LENS_SHARD_KEY`` (a secret) where plans are written and where workers run: the plan then carries
``"plan_hmac"``, an HMAC-SHA256 of its entries under that key, and a worker with the key set runs only
a plan signed with it (:class:`~bayes_lens.shard.ShardIntegrityError` otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from .._files import make_dir, sha256_json
from ..collect import check_prompts, run_order
from ._errors import ShardIntegrityError, ShardMismatchError
from ._plan import Shard
from ._run import collect_settings, settings_hash
from ._spec import ModelSpec
from ._store import prompts_digest, write_atomic, write_json_atomic

__all__ = ["Job", "write_plan", "read_plan", "read_plan_shards", "PLAN_FORMAT", "KEY_ENV"]

PLAN_FORMAT = "bayes-lens-shard-plan/2"  # /2: prompts.jsonl in run order, with the plan's "order"
_PLAN_SHA = "plan_sha256"  # SHA-256 of plan.json's other entries (sha256_json)
_PLAN_HMAC = "plan_hmac"  # HMAC-SHA256 (key: BAYES_LENS_SHARD_KEY) of the entries but the two checksums
KEY_ENV = "BAYES_LENS_SHARD_KEY"
# str.splitlines() also splits on these (and json.dumps(ensure_ascii=False) writes them raw): escaped in
# prompts.jsonl so that any line splitter reads one prompt a line
_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


@dataclass
class Job:
    """A planned sharded run (see the module doc); ``collect_kwargs`` go to :func:`bayes_lens.collect.collect`."""

    spec: Optional[ModelSpec]
    prompts: List[str]
    shards: List[Shard]
    collect_kwargs: Dict[str, Any] = field(default_factory=dict)
    task: Optional[str] = None
    #: ``prompts[j]`` is prompt ``order[j]`` of the list the plan was made for (None: that list itself)
    order: Optional[List[int]] = None

    def given_prompts(self) -> List[str]:
        """The prompts in the order the plan was made for (``prompts`` is the order the shards run them in)."""
        if self.order is None:
            return list(self.prompts)
        out: List[str] = [""] * len(self.prompts)
        for j, i in enumerate(self.order):
            out[i] = self.prompts[j]
        return out


def _shard_key() -> Optional[bytes]:
    key = os.environ.get(KEY_ENV, "")
    return key.encode("utf-8") if key else None


def _signature(key: bytes, doc: dict) -> str:
    """HMAC-SHA256 of ``doc``'s entries but its checksums, in canonical JSON (as sha256_json)."""
    body = {k: v for k, v in doc.items() if k not in (_PLAN_SHA, _PLAN_HMAC)}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True, ensure_ascii=True)
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def _jsonl_line(prompt: str) -> str:
    text = json.dumps(prompt, ensure_ascii=False)
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text + "\n"


def _read_jsonl(path: Path) -> List[str]:
    """The strings of a prompts.jsonl, split on "\\n" only (a raw U+2028 inside a JSON string is one line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def write_plan(out_dir: Union[str, Path], spec: Optional[ModelSpec], prompts: Sequence[str],
               shards: Sequence[Shard], collect_kwargs: Optional[Dict[str, Any]] = None,
               task: Optional[str] = None, *, overwrite: bool = False) -> Path:
    """Write ``plan.json`` and ``prompts.jsonl`` into ``out_dir``; an identical plan there is kept.

    The shards run the prompts in :func:`bayes_lens.collect.run_order` (similar lengths together), so
    that each shard, already in that order, runs the batches one process runs: ``prompts.jsonl`` holds
    them in that order, ``shards`` are ranges of it, and ``plan.json``'s ``"order"`` gives each line's
    number in ``prompts`` (:func:`bayes_lens.shard.merge` puts the rows back in the order of ``prompts``).
    """
    prompts = check_prompts(prompts)
    order = run_order(prompts)
    prompts = [prompts[i] for i in order]
    settings = collect_settings(dict(collect_kwargs or {}), task)
    out = make_dir(out_dir, "shard folder")
    doc = {
        "format": PLAN_FORMAT,
        "model": None if spec is None else spec.to_dict(),
        "prompts_file": "prompts.jsonl",
        "prompts_sha256": prompts_digest(prompts),
        "n_prompts": len(prompts),
        "settings": settings,
        "settings_sha256": settings_hash(settings),
        "shards": [[s.index, s.start, s.stop] for s in shards],
        "order": order,
    }
    key = _shard_key()
    if key is not None:
        doc[_PLAN_HMAC] = _signature(key, doc)
    doc[_PLAN_SHA] = sha256_json(doc)
    path = out / "plan.json"
    same = False
    if path.exists() and not overwrite:
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ShardIntegrityError(f"{str(path)!r} cannot be read ({err}): a damaged or truncated plan. Delete it "
                                      "(the finished shards of the same prompts and settings are kept) or pass "
                                      "overwrite=True (CLI: --overwrite).") from err
        if not isinstance(old, dict):
            old = {}
        if old == doc:
            return path
        sums = (_PLAN_SHA, _PLAN_HMAC)
        same = {k: v for k, v in old.items() if k not in sums} == {k: v for k, v in doc.items() if k not in sums}
    if path.exists() and not overwrite and not same:  # (same: a plan written without its checksums gets them)
        keys = [k for k in doc if old.get(k) != doc[k]]
        hint = ("" if any(out.glob("shard-*.json")) else
                " No shard of that plan has finished (a run that failed at its start?), so nothing is lost by "
                "replacing it.")
        raise ShardMismatchError(f"{str(path)!r} holds another plan ({', '.join(keys)} differ); use another folder or "
                                 f"overwrite=True (CLI: --overwrite).{hint}")
    text = "".join(_jsonl_line(p) for p in prompts)
    write_atomic(out / "prompts.jsonl", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_json_atomic(path, doc)
    return path


def _read_doc(path: Path) -> dict:
    """``plan.json`` as written by :func:`write_plan`: readable, of this format, its checksum matching."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ShardIntegrityError(f"cannot read the plan {str(path)!r} ({err}); make it again (bayes-lens shard plan "
                                  "--overwrite, or bl.shard.write_plan(..., overwrite=True); finished shards of the "
                                  "same prompts and settings are kept).") from err
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        fmt = doc.get("format") if isinstance(doc, dict) else None
        raise ShardIntegrityError(f"{str(path)!r} is not a plan this bayes_lens reads (format {fmt!r}, expected "
                                  f"{PLAN_FORMAT!r}; plans of older versions ran the prompts in another order): make "
                                  "the plan again.")
    if "order" not in doc or doc["order"] is None:
        raise ShardIntegrityError(f"{str(path)!r} has no 'order' (each line of its prompts.jsonl's number in the "
                                  "prompts it was made for), so its rows cannot be put back in their order; make the "
                                  "plan again.")
    _checked_order(doc["order"], doc["n_prompts"] if isinstance(doc.get("n_prompts"), int) else -1, path)
    body = {k: v for k, v in doc.items() if k != _PLAN_SHA}
    if not isinstance(doc.get(_PLAN_SHA), str) or sha256_json(body) != doc[_PLAN_SHA]:
        raise ShardIntegrityError(f"{str(path)!r} does not match its SHA-256 ('{_PLAN_SHA}'): its order, shards or "
                                  "settings were edited or damaged after planning (or a development version wrote it "
                                  "without one); make the plan again.")
    key = _shard_key()
    if key is not None:
        signed = doc.get(_PLAN_HMAC)
        if not isinstance(signed, str) or not hmac.compare_digest(signed, _signature(key, doc)):
            what = "carries no signature" if signed is None else "is not signed with this key"
            raise ShardIntegrityError(f"{str(path)!r} {what} ({KEY_ENV} is set here, so a worker runs only plans "
                                      f"signed with it): make the plan again where {KEY_ENV} holds the same key, or "
                                      f"unset {KEY_ENV} to run unsigned plans.")
    return doc


def read_plan(out_dir: Union[str, Path]) -> Job:
    """The :class:`Job` in ``out_dir`` (plan.json checked against its SHA-256, prompts against their digest)."""
    out = Path(out_dir)
    path = out / "plan.json"
    if not path.is_file():
        raise ShardIntegrityError(f"{str(out)!r} has no plan.json; make one with `bayes-lens shard plan` (or "
                                  "bl.shard.write_plan).")
    doc = _read_doc(path)
    try:
        prompts = _read_jsonl(out / doc["prompts_file"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ShardIntegrityError(f"cannot read the plan in {str(out)!r} ({err}); make it again.") from err
    if not all(isinstance(p, str) for p in prompts) or prompts_digest(prompts) != doc["prompts_sha256"]:
        raise ShardIntegrityError(f"{str(out / doc['prompts_file'])!r} does not match plan.json (edited after "
                                  "planning?); make the plan again.")
    settings = dict(doc["settings"])
    task = settings.pop("task", None)
    order = _checked_order(doc["order"], len(prompts), path)
    return Job(spec=None if doc["model"] is None else ModelSpec.from_dict(doc["model"]), prompts=prompts,
               shards=[Shard(i, a, b) for i, a, b in doc["shards"]], collect_kwargs=settings, task=task,
               order=order)


def read_plan_shards(out_dir: Union[str, Path]) -> Optional[List[Shard]]:
    """The planned shards in ``out_dir``, or None when there is no plan."""
    path = Path(out_dir) / "plan.json"
    if not path.is_file():
        return None
    doc = _read_doc(path)
    try:
        return [Shard(i, a, b) for i, a, b in doc["shards"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ShardIntegrityError(f"cannot read {str(path)!r} ({err}).") from err


def _checked_order(order, n: int, path: Path) -> List[int]:
    """``plan.json``'s ``"order"`` as a list, or the ShardIntegrityError of one that is not a permutation of ``n``."""
    if (not isinstance(order, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in order)
            or sorted(order) != list(range(n))):
        raise ShardIntegrityError(f"{str(path)!r} has a damaged 'order' (not a permutation of its prompts); make the "
                                  "plan again.")
    return [int(i) for i in order]
