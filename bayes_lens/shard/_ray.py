"""The optional Ray engine (``pip install 'bayes-lens[ray]'``): one Ray actor per model replica.

Each actor builds the model from the job's :class:`~bayes_lens.shard.ModelSpec`
once (with ``num_cpus`` / ``num_gpus`` reserved for it), runs the shards ``r, r+R, ...`` of its
replica number ``r`` through :func:`~bayes_lens.shard.run_shards` (the same shard files, the same
resume), and the driver merges. An actor is another process: the driver hands it, with the spec, the
loaders and read classes the driver allows beyond the built-in ones (:mod:`bayes_lens._allow`), so an
actor runs exactly what the driver would. Ray only moves the call arguments (the spec, prompts and settings);
rows travel through the shard files, never through Ray's object store.

Example
-------
>>> eng = bl.shard.RayEngine(n_replicas=4, num_gpus=1)                                   # doctest: +SKIP
>>> col = bl.shard.collect_sharded(spec, prompts, "shards/", engine=eng, value_layers="all")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from .._allow import allow_loader, allow_read, allowed_reads, user_allowed_loaders
from .._validate import check_count
from ..errors import InvalidInputError, require_extra
from ._errors import ShardError
from ._merge import merge
from ._plan import Shard, shards_for_rank
from ._run import run_shards
from ._spec import ModelSpec

__all__ = ["RayEngine", "ShardWorker"]


class ShardWorker:
    """What one Ray actor does: build the model once, run the shards it is given."""

    def __init__(self, spec: Dict[str, Any], out_dir: str, loaders: Sequence[str] = (), reads: Sequence[str] = ()):
        # what the driver allows (from the driver's memory, never from the shard folder)
        allow_loader(*loaders)
        allow_read(*reads)
        self.spec = ModelSpec.from_dict(spec)
        self.out_dir = out_dir
        self.model = None

    def run(self, prompts, shards, task, overwrite, collect_kwargs) -> Dict[int, str]:
        if self.model is None:
            self.model = self.spec.load()
        return run_shards(self.model, prompts, [Shard(i, a, b) for i, a, b in shards], self.out_dir, task=task,
                          overwrite=overwrite, **collect_kwargs)


class RayEngine:
    """Run shards on ``n_replicas`` Ray actors (``num_cpus`` / ``num_gpus`` each); the driver merges.

    Connects to ``address`` (e.g. ``"auto"`` on a cluster) or starts a local Ray with ``init_kwargs``
    when Ray is not initialized yet. ``n_shards``: how many shards a job is cut into when the caller
    does not say (default: one per 8 batches, at least one per replica).
    """

    name = "ray"
    runs_here = False  # actors get the spec and JSON settings only: no fwd_hooks

    def __init__(self, n_replicas: int = 2, *, num_cpus: float = 1, num_gpus: float = 0,
                 address: Optional[str] = None, init_kwargs: Optional[Dict[str, Any]] = None,
                 n_shards: Optional[int] = None):
        n_replicas = check_count(n_replicas, "n_replicas")
        n_shards = check_count(n_shards, "n_shards", allow_none=True)
        self.n_shards = n_shards
        self.n_replicas = n_replicas
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.address = address
        self.init_kwargs = dict(init_kwargs or {})

    def world_size(self) -> int:
        return self.n_replicas

    def run(self, model, prompts, shards, out_dir, *, task, overwrite, merge_layers, collect_kwargs,
            prepare=None):
        ray = require_extra("ray", "ray")
        if not isinstance(model, ModelSpec):
            raise InvalidInputError("RayEngine needs a ModelSpec (each actor builds its own model), not a model "
                                    "object: pass bl.shard.ModelSpec(...).")
        if prepare is not None:
            prepare()
        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_kwargs)
        actor_cls = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus)(ShardWorker)
        loaders, reads = sorted(user_allowed_loaders()), sorted(allowed_reads())
        actors = [actor_cls.remote(model.to_dict(), str(out_dir), loaders, reads) for _ in range(self.n_replicas)]
        try:
            refs = [a.run.remote(list(prompts), [(s.index, s.start, s.stop)
                                                 for s in shards_for_rank(shards, r, self.n_replicas)],
                                 task, overwrite, dict(collect_kwargs))
                    for r, a in enumerate(actors)]
            errors = []
            for r, ref in enumerate(refs):
                try:
                    ray.get(ref)
                except Exception as err:  # noqa: BLE001 - every replica's failure is reported
                    errors.append(f"replica {r}: {type(err).__name__}: {err}")
            if errors:
                raise ShardError("; ".join(errors) + ". Their shards stay unfinished; rerun the job to complete them.")
        finally:
            for a in actors:
                ray.kill(a)
        return merge(out_dir, prompts, layers=merge_layers)
