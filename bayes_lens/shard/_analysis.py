"""``engine=`` on the analyses: an analysis's collections, run in this process or in checked shards.

Issue 13, point 2 (and docs/DESIGN.md, "every forward pass through collect"): ``bl.geometry``,
``bl.sula.evaluate``, ``EntropyAxis.fit``, ``bl.compare_patched`` and ``bl.martingale.gap`` take
``engine=`` and ``shard_dir=``. They run no shards themselves: each collection they need goes through
:func:`bayes_lens.shard.collect_sharded` (plan, atomic shard files, checked merge), and the analysis
reads the merged :class:`~bayes_lens.collect.Collection` exactly as it reads one from ``collect``.

* ``engine="local"``, ``shard_dir=None`` (the default): :func:`bayes_lens.collect.collect` in this
  process, no files - the behaviour from before engines existed.
* ``engine="local"`` with a ``shard_dir``: the shards run in this process and stay on disk, so an
  interrupted analysis resumes where it stopped.
* ``engine="torchrun"`` or an engine object (:class:`~bayes_lens.shard.RayEngine`): ``shard_dir`` is
  required - a folder every worker reaches (a temporary folder of one process is not). Under
  torchrun every rank calls the analysis; when the shards are done every rank reads the merged rows,
  so every rank returns the same result (and later steps of the script agree: an axis fitted on
  every rank gives the same patches on every rank).

Each collection gets its own subfolder ``shard_dir/<analysis>-<12 hex>``, named by a hash of its
prompts, its collect settings and its task label: the same call resumes, another call gets another
folder, and one ``shard_dir`` can hold a whole study. A collection that was started keeps its plan
(its number of shards), whichever engine resumes it. A patched collection's task label carries the
patch's :meth:`~bayes_lens.ablation.Patch.digest`, so the settings hash covers what the patch does.

``model`` may be a model object or a :class:`~bayes_lens.shard.ModelSpec`. A spec is built once in
this process too (the analysis reads the tokenizer, the config and, for geometry, the key weights);
engines that run here (local, torchrun) use that model, engines with workers elsewhere (Ray) hand the
spec to their workers. Patches are Python callables: they run on engines that run here, and are
refused on the others with :class:`~bayes_lens.shard.ShardEngineError`.

Example
-------
>>> run_model, run = analysis_run(model, "torchrun", "shards/", analysis="sula")   # doctest: +SKIP
>>> col = run.collect(run_model, texts, value_layers=[5], token_ids=[17, 42])       # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple

from ..collect import Collection, check_prompts, collect
from ..errors import InvalidInputError
from ._engines import check_layers, collect_sharded, resolve_engine
from ._errors import ShardEngineError, ShardMismatchError
from ._job import read_plan_shards
from ._merge import merge
from ._run import collect_settings, settings_hash
from ._spec import ModelSpec
from ._store import prompt_hashes, sha256_text

__all__ = ["AnalysisRun", "analysis_run", "hooks_digest"]


def hooks_digest(hooks) -> str:
    """16 hex digits of SHA-256 naming what a ``[(hook_name, fn)]`` list does, for a task label.

    A patch's hook (a bound ``hook_fn`` of an object with ``digest()``, e.g. a
    :class:`~bayes_lens.ablation.PatchPart`) contributes its digest - layer, hook, operation, λ, shift
    and direction bytes; any other function only its module and qualified name (so two different
    closures of one function need different labels). A per-batch hook factory is named the same way.
    """
    h = hashlib.sha256()
    for name, fn in _pairs(hooks):
        owner = getattr(fn, "__self__", None)
        if callable(getattr(owner, "digest", None)):
            what = owner.digest()
        else:
            what = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        h.update(f"{name}\0{what}\n".encode())
    return h.hexdigest()[:16]


def _pairs(hooks) -> list:
    return [(None, hooks)] if callable(hooks) and not isinstance(hooks, (list, tuple)) and \
        not hasattr(hooks, "__iter__") else list(hooks)


def _undigested(hooks) -> list:
    """Names of hooks whose function has no ``digest()`` owner (their shard folder cannot tell them apart)."""
    return [str(name) for name, fn in _pairs(hooks)
            if not callable(getattr(getattr(fn, "__self__", None), "digest", None))]


class AnalysisRun:
    """How one analysis call collects: in this process (``sharded`` False) or through an engine."""

    def __init__(self, analysis: str, engine=None, shard_dir: Optional[Path] = None,
                 spec: Optional[ModelSpec] = None):
        self.analysis = analysis
        self.engine = engine
        self.shard_dir = shard_dir
        self.spec = spec

    @property
    def sharded(self) -> bool:
        return self.engine is not None

    def refuse_source(self, what: str) -> None:
        """A cache or Collection is already collected: ``engine=`` has nothing to run."""
        if self.sharded:
            raise InvalidInputError(f"engine= and shard_dir= run the model in shards, but {self.analysis} was given "
                                    f"{what}; pass the model (or a bl.shard.ModelSpec) and prompts, or drop engine= "
                                    "and shard_dir=.")

    def check_hooks(self, hooks, what: str = "patches") -> None:
        """Refuse, before any compute, ``hooks`` on an engine that cannot hand callables to its workers."""
        if self.sharded and hooks and not getattr(self.engine, "runs_here", False):
            name = getattr(self.engine, "name", type(self.engine).__name__)
            raise ShardEngineError(
                f"{self.analysis} with {what} cannot run on the {name!r} engine: its workers are other processes that "
                "get only a ModelSpec and JSON settings, and patches are Python callables. Use engine='local' or "
                "'torchrun' (every rank builds the same patches), or put the patch into the ModelSpec's loader.")

    def folder(self, prompts: Sequence[str], task: Optional[str], collect_kwargs) -> Path:
        """``shard_dir/<analysis>-<12 hex>``: a hash of the prompts, the collect settings and the task."""
        settings = collect_settings(dict(collect_kwargs), task)
        key = json.dumps({"prompts": sha256_text("\n".join(prompt_hashes(prompts))),
                          "settings": settings_hash(settings)}, sort_keys=True)
        return self.shard_dir / f"{self.analysis}-{sha256_text(key)[:12]}"

    def collect(self, model, prompts: Sequence[str], *, task: Optional[str] = None, **collect_kwargs) -> Collection:
        """The Collection of ``prompts``: :func:`bayes_lens.collect.collect`, or its sharded, merged equal."""
        if not self.sharded:
            return collect(model, prompts, **collect_kwargs)
        prompts = check_prompts(prompts)
        hooks = collect_kwargs.get("fwd_hooks")
        self.check_hooks(hooks)
        plain = _undigested(hooks) if hooks else []
        if plain:  # a resumed run must never reuse shards that another closure of the same function wrote
            raise ShardEngineError(
                f"{self.analysis} with engine=/shard_dir= names its shard folder by what the patches do, but the "
                f"hook(s) on {plain[:3]} are plain functions: two closures of one function (other layers, "
                "strengths, directions) would share a folder and a rerun would silently reuse the wrong shards. "
                "Use bl.ablation patches (bl.EntropyAxis(...).removal(), bl.ablation.Patch) or run this analysis "
                "without engine= / shard_dir=.")
        check_layers(model, collect_kwargs)  # also when the workers get the spec: before plan.json is written
        out = self.folder(prompts, task, collect_kwargs)
        target = model if self.spec is None or getattr(self.engine, "runs_here", False) else self.spec
        planned = read_plan_shards(out)  # a started collection keeps its plan, whichever engine resumes it
        n_shards = None if planned is None else len(planned)
        try:
            col = collect_sharded(target, prompts, out, engine=self.engine, task=task, n_shards=n_shards,
                                  **collect_kwargs)
        except ShardMismatchError as err:
            raise ShardMismatchError(f"{err} ({self.analysis} keeps this collection in {str(out)!r}: delete that "
                                     "folder to start it over, or pass another shard_dir.)") from err
        if col is None:  # a torchrun rank other than 0: every shard is committed (the ranks synced); read them too
            col = merge(out, prompts)
        return col


def analysis_run(model, engine="local", shard_dir=None, *, analysis: str) -> Tuple[Any, AnalysisRun]:
    """Check ``engine`` / ``shard_dir`` at an analysis's entry; ``(model to use here, AnalysisRun)``.

    A :class:`ModelSpec` is built here (once); anything else (a model, a cache, a predictor) is returned
    as given.
    """
    spec = model if isinstance(model, ModelSpec) else None
    if shard_dir is not None and (isinstance(shard_dir, bool) or not isinstance(shard_dir, (str, os.PathLike))):
        raise InvalidInputError(f"shard_dir must be a folder path (str or Path), got {shard_dir!r}.")
    if shard_dir is not None and Path(shard_dir).exists() and not Path(shard_dir).is_dir():
        raise InvalidInputError(f"shard_dir {str(shard_dir)!r} is a file; pass a folder (it is created if missing).")
    if isinstance(engine, str) and engine == "local" and shard_dir is None:
        return (spec.load() if spec is not None else model), AnalysisRun(analysis)
    eng = resolve_engine(engine)
    if shard_dir is None:
        raise InvalidInputError(
            f"engine={getattr(eng, 'name', engine)!r} needs shard_dir=: a folder every worker can reach, where "
            f"{analysis} keeps its shard files (a rerun resumes from them). engine='local' without shard_dir runs "
            "in this process with no files.")
    run = AnalysisRun(analysis, eng, Path(shard_dir), spec)
    if spec is not None:  # under torchrun, device="cuda" means this rank's GPU
        model = (eng.rank_spec(spec) if hasattr(eng, "rank_spec") else spec).load()
    return model, run
