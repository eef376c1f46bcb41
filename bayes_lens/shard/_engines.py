"""Engines that run the shards of a job, and :func:`collect_sharded`, the sharded ``collect``.

No home-made scheduler or RPC: torchrun, Ray or a batch system already start and place processes, so
an engine only decides which process runs which shard and who merges.

* :class:`LocalEngine` (``engine="local"``) - every shard in this process, one after another
  (resumable: finished shards are skipped on a rerun).
* :class:`TorchrunEngine` (``engine="torchrun"``) - inside a ``torch.distributed`` process group
  (started by ``torchrun`` or ``srun``; the group is created from ``RANK``/``WORLD_SIZE`` if it does
  not exist yet, with gloo on CPU and NCCL on CUDA). Rank ``r`` runs shards ``r, r+W, ...``; the
  ranks then exchange their outcome (so a failing rank stops the others with its error instead of a
  hang), and rank 0 merges and returns the ReducedCache; other ranks return ``None``.

Both run the worker code in this process (``runs_here = True``): a job with ``fwd_hooks`` (patches,
Python callables) runs on them, each torchrun rank using the hooks its own copy of the script built.
An engine whose workers are other processes fed from this one (Ray) gets only the ModelSpec and
JSON settings, so such a job is refused there with :class:`~bayes_lens.shard.ShardEngineError`.

Example (``torchrun --nproc_per_node 2 job.py``)
-------
>>> spec = bl.shard.ModelSpec("default")                                            # doctest: +SKIP
>>> col = bl.shard.collect_sharded(spec, prompts, "shards/", engine="torchrun",      # doctest: +SKIP
...                                value_layers="all", attention=True)
>>> if col is not None: print(bl.value_manifold(col, layer=12).pc12)                # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import datetime
import os
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ..collect import check_prompts, run_order
from ..reduced import ReducedCache
from .._validate import check_count
from ..errors import InvalidInputError
from ._errors import ShardEngineError, ShardError
from ._job import write_plan
from ._merge import in_prompt_order, merge
from ._plan import plan, shards_for_rank
from ._run import run_shards
from ._spec import ModelSpec, as_data

__all__ = ["LocalEngine", "TorchrunEngine", "collect_sharded", "dist_rank_world", "resolve_engine", "check_layers"]


def dist_rank_world() -> tuple:
    """(rank, world size) from torch.distributed, else RANK/WORLD_SIZE (torchrun) or SLURM_PROCID/SLURM_NTASKS
    (srun), else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


class LocalEngine:
    """Run every shard in this process (see the module doc); ``n_shards``: how many shards a job is cut
    into when the caller does not say (default: one per 8 batches)."""

    name = "local"
    runs_here = True

    def __init__(self, n_shards: Optional[int] = None):
        self.n_shards = _n_shards(n_shards)

    def run(self, model, prompts, shards, out_dir, *, task, overwrite, merge_layers, collect_kwargs,
            prepare=None):
        if prepare is not None:
            prepare()
        run_shards(model, prompts, shards, out_dir, task=task, overwrite=overwrite, **collect_kwargs)
        return merge(out_dir, prompts, layers=merge_layers)

    def world_size(self) -> int:
        return 1


class TorchrunEngine:
    """Run shards on the ranks of a torch.distributed group; rank 0 merges (see the module doc).

    ``backend``: ``"gloo"`` / ``"nccl"`` when this engine creates the group (default: NCCL when the
    model spec asks for CUDA, else gloo). ``timeout_s`` bounds how long a rank waits for the others.
    A ModelSpec with ``device="cuda"`` is given ``cuda:LOCAL_RANK`` on each rank. ``n_shards``: how
    many shards a job is cut into when the caller does not say (default: one per 8 batches, at least
    one per rank).
    """

    name = "torchrun"
    runs_here = True

    def __init__(self, backend: Optional[str] = None, timeout_s: float = 24 * 3600.0,
                 n_shards: Optional[int] = None):
        self.backend = backend
        self.timeout_s = timeout_s
        self.n_shards = _n_shards(n_shards)

    def world_size(self) -> int:
        return dist_rank_world()[1]

    @staticmethod
    def rank_spec(spec: ModelSpec) -> ModelSpec:
        """``spec`` for this rank: ``device="cuda"`` (or ``"auto"`` where CUDA is present) becomes
        ``cuda:LOCAL_RANK`` (one GPU per rank)."""
        device = spec.kwargs.get("device")
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "auto"
        if device == "cuda":
            with as_data():  # the same loader: allowed here only if `spec`'s is
                return ModelSpec(spec.loader, {**spec.kwargs, "device": f"cuda:{os.environ.get('LOCAL_RANK', 0)}"})
        return spec

    def run(self, model, prompts, shards, out_dir, *, task, overwrite, merge_layers, collect_kwargs,
            prepare=None):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) and "RANK" in os.environ:
            # created once per process and kept for later calls (re-initializing a destroyed group can hang
            # in the rendezvous); destroyed when the process exits
            cuda = isinstance(model, ModelSpec) and str(self.rank_spec(model).kwargs.get("device", "")).startswith("cuda")
            dist.init_process_group(self.backend or ("nccl" if cuda else "gloo"),
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
            atexit.register(_destroy_group)
        rank, world = dist_rank_world()
        group = dist.is_available() and dist.is_initialized()
        if isinstance(model, ModelSpec):
            model = self.rank_spec(model)
        error = None
        try:
            if prepare is not None and rank == 0:
                prepare()
            run_shards(model, prompts, shards_for_rank(shards, rank, world), out_dir, task=task,
                       overwrite=overwrite, **collect_kwargs)
        except Exception as err:  # noqa: BLE001 - reported to every rank below
            error = err
        outcomes = [None] * world
        if group:
            dist.all_gather_object(outcomes, None if error is None else f"{type(error).__name__}: {error}")
        else:
            outcomes = [None if error is None else str(error)]
        if error is not None:
            raise error
        failed = [(r, msg) for r, msg in enumerate(outcomes) if msg is not None]
        if failed:
            raise ShardError("rank(s) " + "; ".join(f"{r} failed: {msg}" for r, msg in failed) +
                             ". Their shards stay unfinished; rerun the job to complete them.")
        return merge(out_dir, prompts, layers=merge_layers) if rank == 0 else None


def _n_shards(n) -> Optional[int]:
    return check_count(n, "n_shards", allow_none=True)


def _destroy_group() -> None:
    """At exit: wait for every rank, then destroy the group.

    Without the barrier a rank that finished first (rank 1, while rank 0 still merges) tore the gloo
    group down under the other one and sometimes died with "terminate called without an active
    exception" (SIGABRT) after its work was done, failing the whole torchrun job. The wait is bounded
    (gloo's monitored barrier names a rank that never arrives), so a dead rank cannot hang the exit.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=120))
            else:
                dist.barrier()
        except Exception:  # noqa: BLE001 - a peer is gone: destroy our side anyway
            pass
        dist.destroy_process_group()


def check_layers(model, collect_kwargs) -> None:
    """Refuse ``value_layers`` / ``resid_layers`` the model does not have before anything is written
    (a plan written with them would make the corrected rerun a ShardMismatchError)."""
    from .. import adapter

    for name in ("value_layers", "resid_layers"):
        layers = collect_kwargs.get(name, ())
        if layers is None:
            continue
        if not isinstance(layers, (str, int)):
            layers = collect_kwargs[name] = list(layers)  # a generator is read once, here
        if layers or isinstance(layers, int):
            try:
                adapter.resolve_layers(model, layers)
            except InvalidInputError as err:
                raise type(err)(f"{name}: {err}") from None


def resolve_engine(engine) -> Any:
    """``"local"`` / ``"torchrun"`` or an engine object: anything with ``world_size()`` and
    ``run(model, prompts, shards, out_dir, *, task, overwrite, merge_layers, collect_kwargs, prepare)``
    that runs the shards (calling ``prepare()`` once first) and returns the merged ReducedCache or None;
    ``runs_here = True`` on an engine whose workers run in this process or this script (they may get
    ``fwd_hooks``), absent or False otherwise."""
    if engine == "local":
        return LocalEngine()
    if engine == "torchrun":
        return TorchrunEngine()
    if hasattr(engine, "run") and hasattr(engine, "world_size"):
        return engine
    raise InvalidInputError(f"engine must be 'local', 'torchrun' or an engine object (e.g. "
                            f"bl.shard.TorchrunEngine(backend='gloo')), got {engine!r}.")


def collect_sharded(model, prompts: Sequence[str], out_dir: Union[str, Path], *, engine="local",
                    n_shards: Optional[int] = None, task: Optional[str] = None, overwrite: bool = False,
                    merge_layers=None, **collect_kwargs) -> Optional[ReducedCache]:
    """:func:`bayes_lens.collect.collect` split into shards under ``out_dir``, run by ``engine``, merged.

    ``model`` is a :class:`ModelSpec` (what every worker builds) or, for ``engine="local"`` or inside
    a torchrun script, a model object. ``n_shards`` defaults to the engine's ``n_shards``, else one
    shard per 8 batches (at least one per worker). The shards are ranges of the prompts in the runner's order
    (:func:`bayes_lens.collect.run_order`) with boundaries on batch boundaries, so each runs the batches one
    process runs and the result (rows in the order of ``prompts``) equals ``collect(model, prompts, ...)``
    bit for bit. Rerunning resumes: finished shards are skipped. Returns the merged
    reduced cache (``None`` on torchrun ranks other than 0); ``merge_layers`` limits the rows merged.
    """
    prompts = check_prompts(prompts)
    # the shards are ranges of the prompts in the runner's order (write_plan records it), so each shard,
    # already in that order, runs the batches one process runs; the rows are put back at the end
    order = run_order(prompts)
    run = [prompts[i] for i in order]
    eng = resolve_engine(engine)
    if not isinstance(model, ModelSpec):  # bad layers are refused before plan.json is written
        check_layers(model, collect_kwargs)
    if collect_kwargs.get("interventions") and not getattr(eng, "runs_here", False):
        raise ShardEngineError(
            f"interventions run in this process's engines only (engine='local' or 'torchrun', where every rank builds "
            f"the same ones); the {getattr(eng, 'name', type(eng).__name__)!r} engine's workers get the ModelSpec and "
            "JSON settings only.")
    if collect_kwargs.get("fwd_hooks") and not getattr(eng, "runs_here", False):
        raise ShardEngineError(
            f"fwd_hooks (patches) are Python callables, which the {getattr(eng, 'name', type(eng).__name__)!r} "
            "engine cannot hand to its workers (they get only the ModelSpec and JSON settings). Run patched "
            "collections with engine='local' or 'torchrun' (every rank builds the same patches), or put the "
            "patch into the model loader of the ModelSpec.")
    batch_size = int(collect_kwargs.get("batch_size", 16))
    n_batches = -(-len(prompts) // batch_size) if batch_size > 0 else 1
    world = max(1, int(eng.world_size()))
    if n_shards is None:
        n_shards = getattr(eng, "n_shards", None)
    k = n_shards if n_shards is not None else max(world, -(-n_batches // 8))
    shards = plan(len(prompts), batch_size, k)
    spec = model if isinstance(model, ModelSpec) else None

    def prepare():  # the job file, written once (by rank 0 under torchrun)
        write_plan(out_dir, spec, prompts, shards, collect_kwargs, task, overwrite=overwrite)

    run_kwargs = collect_kwargs
    if collect_kwargs.get("interventions"):  # per-prompt sources follow their prompts into the run order
        run_kwargs = dict(collect_kwargs, interventions=tuple(iv.renumbered(order)
                                                              for iv in collect_kwargs["interventions"]))
    rc = eng.run(model, run, shards, out_dir, task=task, overwrite=overwrite, merge_layers=merge_layers,
                 collect_kwargs=run_kwargs, prepare=prepare)
    return None if rc is None else in_prompt_order(rc, order)

