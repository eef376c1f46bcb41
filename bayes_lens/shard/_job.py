"""A job folder: ``plan.json`` + ``prompts.jsonl`` say what every worker of a sharded run must do.

:func:`write_plan` records the model spec, the prompts (one JSON string per line, so prompts may
hold newlines), the collect settings, an optional task label and the shard ranges; a worker started
by ``bayes-lens shard run DIR`` (torchrun, ``srun``, a SLURM array task, any job runner) needs
nothing else. Writing a plan into a folder that holds a different plan is refused
(:class:`~bayes_lens.shard.ShardMismatchError`) unless ``overwrite=True``: two jobs never share a
folder by accident.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from .._files import make_dir
from ..collect import check_prompts, run_order
from ._errors import ShardIntegrityError, ShardMismatchError
from ._plan import Shard
from ._run import collect_settings, settings_hash
from ._spec import ModelSpec
from ._store import prompt_hashes, sha256_text, write_atomic, write_json_atomic

__all__ = ["Job", "write_plan", "read_plan", "read_plan_shards", "read_plan_order", "PLAN_FORMAT"]

PLAN_FORMAT = "bayes-lens-shard-plan/2"  # /2: prompts.jsonl in run order, with the plan's "order"


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


def _prompts_digest(prompts: Sequence[str]) -> str:
    return sha256_text("\n".join(prompt_hashes(prompts)))


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
        "prompts_sha256": _prompts_digest(prompts),
        "n_prompts": len(prompts),
        "settings": settings,
        "settings_sha256": settings_hash(settings),
        "shards": [[s.index, s.start, s.stop] for s in shards],
        "order": order,
    }
    path = out / "plan.json"
    if path.exists() and not overwrite:
        old = json.loads(path.read_text(encoding="utf-8"))
        if old == doc:
            return path
        keys = [k for k in doc if old.get(k) != doc[k]]
        hint = ("" if any(out.glob("shard-*.json")) else
                " No shard of that plan has finished (a run that failed at its start?), so nothing is lost by "
                "replacing it.")
        raise ShardMismatchError(f"{str(path)!r} holds another plan ({', '.join(keys)} differ); use another folder or "
                                 f"overwrite=True (CLI: --overwrite).{hint}")
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts)
    write_atomic(out / "prompts.jsonl", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    write_json_atomic(path, doc)
    return path


def read_plan(out_dir: Union[str, Path]) -> Job:
    """The :class:`Job` in ``out_dir`` (prompts checked against the plan's digest)."""
    out = Path(out_dir)
    path = out / "plan.json"
    if not path.is_file():
        raise ShardIntegrityError(f"{str(out)!r} has no plan.json; make one with `bayes-lens shard plan` (or "
                                  "bl.shard.write_plan).")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        prompts = [json.loads(line) for line in (out / doc["prompts_file"]).read_text(encoding="utf-8").splitlines()
                   if line.strip()]
    except (OSError, ValueError, KeyError) as err:
        raise ShardIntegrityError(f"cannot read the plan in {str(out)!r} ({err}); make it again.") from err
    if doc.get("format") != PLAN_FORMAT:
        raise ShardIntegrityError(f"{str(path)!r} is not a plan this bayes_lens reads (format {doc.get('format')!r}, "
                                  f"expected {PLAN_FORMAT!r}; plans of older versions ran the prompts in another "
                                  "order): make the plan again.")
    if _prompts_digest(prompts) != doc["prompts_sha256"]:
        raise ShardIntegrityError(f"{str(out / doc['prompts_file'])!r} does not match plan.json (edited after "
                                  "planning?); make the plan again.")
    settings = dict(doc["settings"])
    task = settings.pop("task", None)
    order = _checked_order(doc.get("order"), len(prompts), path)
    return Job(spec=None if doc["model"] is None else ModelSpec.from_dict(doc["model"]), prompts=prompts,
               shards=[Shard(i, a, b) for i, a, b in doc["shards"]], collect_kwargs=settings, task=task,
               order=order)


def read_plan_shards(out_dir: Union[str, Path]) -> Optional[List[Shard]]:
    """The planned shards in ``out_dir``, or None when there is no plan."""
    path = Path(out_dir) / "plan.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return [Shard(i, a, b) for i, a, b in doc["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ShardIntegrityError(f"cannot read {str(path)!r} ({err}).") from err


def read_plan_order(out_dir: Union[str, Path]) -> Optional[List[int]]:
    """``plan.json``'s ``"order"`` in ``out_dir`` (each line of ``prompts.jsonl``'s number in the prompts the
    plan was made for), or None when there is no plan (shards run by hand on a list as it was given)."""
    path = Path(out_dir) / "plan.json"
    if not path.is_file():
        return None
    try:
        order = json.loads(path.read_text(encoding="utf-8")).get("order")
    except (OSError, ValueError) as err:
        raise ShardIntegrityError(f"cannot read {str(path)!r} ({err}).") from err
    return None if order is None else _checked_order(order, len(order) if isinstance(order, list) else -1, path)


def _checked_order(order, n: int, path: Path) -> Optional[List[int]]:
    """``plan.json``'s ``"order"`` as a list, or the ShardIntegrityError of one that is not a permutation of ``n``."""
    if order is None:
        return None
    if not isinstance(order, list) or sorted(order) != list(range(n)):
        raise ShardIntegrityError(f"{str(path)!r} has a damaged 'order' (not a permutation of its prompts); make the "
                                  "plan again.")
    return [int(i) for i in order]
