"""``bl.shard.sharded``: every analysis's forward passes in checked shards, through the runner.

Scaling belongs to the runner, not to the analyses: inside ``with bl.shard.sharded(model, engine=...,
shard_dir=...)`` each call of :func:`bayes_lens.collect.collect` - and so every analysis that runs the
model (``bl.geometry`` and its parts, ``bl.compare_domains``, ``bl.sula.evaluate`` and the SULA
controls, ``EntropyAxis.fit``, ``bl.compare_patched``, every martingale function of a model,
``bl.prompts.mixed``'s scoring) - goes through :func:`bayes_lens.shard.collect_sharded` (plan, atomic
shard files, checked merge) and returns the merged :class:`~bayes_lens.reduced.ReducedCache`, which
the analysis reads exactly as one from ``collect``. No analysis imports this module.

* ``engine="local"``: the shards run in this process and stay on disk, so an interrupted analysis
  resumes where it stopped.
* ``engine="torchrun"`` or an engine object (:class:`~bayes_lens.shard.RayEngine`): ``shard_dir`` is a
  folder every worker reaches. Under torchrun every rank runs the script; when the shards are done
  every rank reads the merged rows, so every rank gets the same result.

Each collection gets its own subfolder ``shard_dir/<analysis>-<12 hex>``, named by a hash of its
prompts, its collect settings and, for a patched run, its patch's
:meth:`~bayes_lens.ablation.Patch.digest` or its interventions' :meth:`~bayes_lens.interventions.Intervention.digest`
(``interventions=``: per-prompt sources are renumbered into the shards' run order, so each prompt gets its own
donor row and fold): the same call resumes, another call gets another folder
(the same collection asked for by another analysis is read from the folder that holds it), and one
``shard_dir`` holds a whole study. A collection that was started keeps its plan (its number of
shards), whichever engine resumes it.

``model`` may be a model object or a :class:`~bayes_lens.shard.ModelSpec`; the block gets the model
to use (a spec is built once here: the analyses read its tokenizer, config and weights). Engines
that run here (local, torchrun) use that model; engines with workers elsewhere (Ray) hand the spec to
their workers, and refuse patches (Python callables) with :class:`~bayes_lens.shard.ShardEngineError`.

Example
-------
>>> with bl.shard.sharded(spec, engine="torchrun", shard_dir="study/") as model:   # doctest: +SKIP
...     geo = bl.geometry(model, prompts)
...     axis = bl.EntropyAxis(layer=-1).fit(model, items)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Sequence

from .. import adapter
from ..collect import check_prompts, use_runner
from ..errors import InvalidInputError
from ..reduced import ReducedCache
from ._engines import check_layers, collect_sharded, resolve_engine
from ._errors import ShardEngineError, ShardMismatchError
from ._job import read_plan_shards
from ._merge import merge
from ._run import collect_settings, settings_hash
from ._spec import ModelSpec
from ._store import prompt_hashes, sha256_text

__all__ = ["sharded", "hooks_digest", "interventions_digest"]


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


def interventions_digest(interventions) -> str:
    """16 hex digits of SHA-256 naming a list of :class:`~bayes_lens.interventions.Intervention` (their digests, in
    order: layer, site, operation, positions, strength and the bytes of basis, source and prompt set), for a task
    label: another intervention, another shard folder."""
    h = hashlib.sha256()
    for iv in interventions:
        h.update(f"{iv.digest()}\n".encode())
    return h.hexdigest()[:16]


def _pairs(hooks) -> list:
    return [(None, hooks)] if callable(hooks) and not isinstance(hooks, (list, tuple)) and \
        not hasattr(hooks, "__iter__") else list(hooks)


def _undigested(hooks) -> list:
    """Names of hooks whose function has no ``digest()`` owner (their shard folder cannot tell them apart)."""
    return [str(name) for name, fn in _pairs(hooks)
            if not callable(getattr(getattr(fn, "__self__", None), "digest", None))]


def _label(desc: str) -> str:
    """The analysis name a collection's folder starts with: the runner's ``desc`` up to its first colon."""
    name = re.sub(r"[^a-z0-9_.]+", "_", str(desc).split(":", 1)[0].strip().lower()).strip("_")
    return name or "collect"


class ShardedRunner:
    """The runner :func:`sharded` installs: ``collect(model, prompts, **kwargs)`` through an engine."""

    def __init__(self, engine, shard_dir: Path, model, spec: Optional[ModelSpec] = None):
        self.engine = engine
        self.shard_dir = shard_dir
        self.model = model
        self.spec = spec

    def _check_hooks(self, hooks, what: str) -> None:
        if hooks and not getattr(self.engine, "runs_here", False):
            name = getattr(self.engine, "name", type(self.engine).__name__)
            raise ShardEngineError(
                f"{what} with patches cannot run on the {name!r} engine: its workers are other processes that get "
                "only a ModelSpec and JSON settings, and patches are Python callables. Use engine='local' or "
                "'torchrun' (every rank builds the same patches), or put the patch into the ModelSpec's loader.")
        plain = _undigested(hooks) if hooks else []
        if plain:  # a resumed run must never reuse shards that another closure of the same function wrote
            raise ShardEngineError(
                f"{what} in bl.shard.sharded names its shard folder by what the patches do, but the hook(s) on "
                f"{plain[:3]} are plain functions: two closures of one function (other layers, strengths, "
                "directions) would share a folder and a rerun would silently reuse the wrong shards. Use "
                "bl.ablation patches (bl.EntropyAxis(...).removal(), bl.ablation.Patch) or run it outside "
                "bl.shard.sharded.")

    def folder(self, analysis: str, prompts: Sequence[str], task: Optional[str], collect_kwargs) -> Path:
        """``shard_dir/<analysis>-<12 hex>``: a hash of the prompts, the collect settings and the task."""
        settings = collect_settings(dict(collect_kwargs), task)
        key = json.dumps({"prompts": sha256_text("\n".join(prompt_hashes(prompts))),
                          "settings": settings_hash(settings)}, sort_keys=True)
        digest = sha256_text(key)[:12]
        # the same collection asked for by another analysis (an axis fitted on the items sula.evaluate ran) is
        # read from the folder that already holds it
        same = sorted(self.shard_dir.glob(f"*-{digest}")) if self.shard_dir.is_dir() else []
        return same[0] if same else self.shard_dir / f"{analysis}-{digest}"

    def check_hooks(self, fwd_hooks, desc: str = "collect") -> list:
        """``fwd_hooks`` as a list, or the ShardEngineError a collection with them would raise
        (:func:`bayes_lens.collect.check_runnable` asks it before an analysis's first forward pass)."""
        analysis = _label(desc)
        if callable(fwd_hooks) and not isinstance(fwd_hooks, (list, tuple)):
            raise ShardEngineError(f"{analysis}: a per-batch hook factory cannot run in bl.shard.sharded; pass a "
                                   "[(hook_name, fn)] list of bl.ablation patches.")
        hooks = list(fwd_hooks)
        self._check_hooks(hooks, analysis)
        return hooks

    def collect(self, model, prompts: Sequence[str], *, desc: str = "collect", fwd_hooks=(),
                **collect_kwargs) -> ReducedCache:
        """The reduced cache of ``prompts``: the sharded, merged equal of :func:`bayes_lens.collect.collect`."""
        prompts = check_prompts(prompts)
        analysis = _label(desc)
        hooks = self.check_hooks(fwd_hooks, desc)
        attached = adapter.hooked_points(model)
        if attached:  # their effect is in no folder name: a patched run would silently read the clean shards
            raise ShardEngineError(
                f"{analysis} in bl.shard.sharded found hooks attached to the model at {attached[:3]} (bl.patched, "
                "model.hooks or add_hook around the call); the shard folder is named by the collect settings and "
                "the fwd_hooks passed, not by hooks already on the model, so a rerun would reuse shards made "
                "without them. Pass the patch as fwd_hooks (bl.compare_patched, bl.sula.evaluate(fwd_hooks=...)) "
                "or run it outside bl.shard.sharded.")
        runs_here = getattr(self.engine, "runs_here", False)
        if self.spec is not None and not runs_here and model is not self.model:
            raise ShardEngineError(
                f"{analysis} was given another model than the one bl.shard.sharded loaded from its ModelSpec; the "
                f"{getattr(self.engine, 'name', type(self.engine).__name__)!r} engine's workers build only that spec. "
                "Use the model the with-block gives you.")
        ivs = tuple(collect_kwargs.get("interventions") or ())
        named = ([f"fwd_hooks {hooks_digest(hooks)}"] if hooks else []) + \
            ([f"interventions {interventions_digest(ivs)}"] if ivs else [])
        task = "; ".join(named) or None
        kw = dict(collect_kwargs, desc=desc)
        if hooks:
            kw["fwd_hooks"] = hooks
        check_layers(model, kw)  # before plan.json is written, also when the workers get the spec
        out = self.folder(analysis, prompts, task, kw)
        target = model if self.spec is None or runs_here else self.spec
        planned = read_plan_shards(out)  # a started collection keeps its plan, whichever engine resumes it
        n_shards = None if planned is None else len(planned)
        try:
            rc = collect_sharded(target, prompts, out, engine=self.engine, task=task, n_shards=n_shards, **kw)
        except ShardMismatchError as err:
            raise ShardMismatchError(f"{err} ({analysis} keeps this collection in {str(out)!r}: delete that folder "
                                     "to start it over, or pass another shard_dir.)") from err
        if rc is None:  # a torchrun rank other than 0: every shard is committed (the ranks synced); read them too
            rc = merge(out, prompts)
        return rc


@contextmanager
def sharded(model, *, engine="local", shard_dir):
    """Inside the block, every analysis runs its forward passes in checked shards (see the module doc).

    ``model``: a model object or a :class:`ModelSpec` (built here once; the block gets the model to
    use). ``engine``: ``"local"`` (shards in this process, resumable), ``"torchrun"`` or an engine
    object such as ``bl.shard.RayEngine(...)``. ``shard_dir``: the folder of the shard files (created
    if missing; every worker must reach it); a rerun of the same analysis resumes from it.

    >>> import tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> with bl.shard.sharded(model, shard_dir=tmp) as m:
    ...     rc = bl.collect.collect(m, ["a b c", "d e", "f"], value_layers=[-1])
    >>> rc.n_prompts, sorted(p.name.split("-")[0] for p in Path(tmp).iterdir())
    (3, ['collect'])
    >>> torch.equal(rc["final_rows.v.1"], bl.collect.collect(model, ["a b c", "d e", "f"],
    ...             value_layers=[-1])["final_rows.v.1"])
    True
    """
    if shard_dir is None or isinstance(shard_dir, bool) or not isinstance(shard_dir, (str, os.PathLike)):
        raise InvalidInputError(f"shard_dir must be a folder path (str or Path) every worker can reach, got "
                                f"{shard_dir!r}.")
    if Path(shard_dir).exists() and not Path(shard_dir).is_dir():
        raise InvalidInputError(f"shard_dir {str(shard_dir)!r} is a file; pass a folder (it is created if missing).")
    if not isinstance(model, ModelSpec) and not (isinstance(model, adapter.TLModel) and hasattr(model, "cfg")):
        # before anything is made: the block must hand out a model (None yielded None before)
        raise InvalidInputError(f"bl.shard.sharded needs a TransformerLens model (HookedTransformer or "
                                f"TransformerBridge) or a bl.shard.ModelSpec, got {type(model).__name__}; load one "
                                "with bl.load_model(), or describe it with bl.shard.ModelSpec(...).")
    eng = resolve_engine(engine)
    spec = model if isinstance(model, ModelSpec) else None
    if spec is not None:  # under torchrun, device="cuda" means this rank's GPU
        model = (eng.rank_spec(spec) if hasattr(eng, "rank_spec") else spec).load()
    runner = ShardedRunner(eng, Path(shard_dir), model, spec)
    with use_runner(runner):
        yield model
