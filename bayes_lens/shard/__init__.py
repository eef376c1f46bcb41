"""Sharded runs beyond one process: shard files as the contract, local and torch.distributed engines.

Issue 13 (docs/METHODS.md §0 for what the runner keeps): a job's prompts are split into shards on
batch boundaries (:func:`plan`); each worker runs the one runner, :func:`bayes_lens.collect.collect`,
on its shard with global prompt indices and commits ``shard-XXXXX.safetensors`` + ``shard-XXXXX.json``
(:func:`run_shard`); :func:`merge` checks coverage, settings, model fingerprints and file hashes and
returns a :class:`~bayes_lens.collect.Collection` equal to one process. Workers build their model
from a :class:`ModelSpec`. :func:`collect_sharded` does all three with an engine (``"local"``,
``"torchrun"``, or a :class:`RayEngine` with the ``ray`` extra); the CLI is ``bayes-lens shard plan|run|merge|status``.
The analyses that run the model (``bl.geometry``, ``bl.sula.evaluate``, ``EntropyAxis.fit``,
``bl.compare_patched``, ``bl.martingale.gap``) take the same ``engine=`` plus ``shard_dir=`` and
collect through :func:`collect_sharded` (:mod:`bayes_lens.shard._analysis`).

Example
-------
>>> import bayes_lens.shard as shard                                                   # doctest: +SKIP
>>> spec = shard.ModelSpec("bayes_lens.models.tiny:tiny_model", {"kind": "hooked"})   # doctest: +SKIP
>>> col = shard.collect_sharded(spec, prompts, "out/", value_layers="all", batch_size=8)  # doctest: +SKIP
>>> bl.value_manifold(col, layer=1)                                                   # doctest: +SKIP
"""

from __future__ import annotations

from ._engines import LocalEngine, TorchrunEngine, collect_sharded, dist_rank_world
from ._errors import ShardCoverageError, ShardEngineError, ShardError, ShardIntegrityError, ShardMismatchError
from ._job import Job, read_plan, write_plan
from ._merge import MixedShardsWarning, ShardSet, merge, open_shards, status
from ._plan import Shard, plan, shards_for_rank
from ._ray import RayEngine
from ._run import collect_settings, commit_shard, read_manifest, run_shard, run_shards, settings_hash
from ._spec import ModelSpec, model_fingerprint
from ._store import load_collection, save_collection

__all__ = [
    "Shard", "plan", "shards_for_rank",
    "ModelSpec", "model_fingerprint",
    "run_shard", "run_shards", "commit_shard", "collect_settings", "settings_hash", "read_manifest",
    "merge", "open_shards", "ShardSet", "status", "MixedShardsWarning",
    "save_collection", "load_collection",
    "Job", "write_plan", "read_plan",
    "collect_sharded", "LocalEngine", "TorchrunEngine", "RayEngine", "dist_rank_world",
    "ShardError", "ShardCoverageError", "ShardMismatchError", "ShardIntegrityError", "ShardEngineError",
]
