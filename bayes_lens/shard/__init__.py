"""Sharded runs beyond one process: shard files as the contract, local and torch.distributed engines.

(docs/METHODS.md §0 says what the runner keeps.) A job's prompts are split into shards on
batch boundaries (:func:`plan`); each worker runs the one runner, :func:`bayes_lens.collect.collect`,
on its shard with global prompt indices and commits ``shard-XXXXX.safetensors`` + ``shard-XXXXX.json``
(:func:`run_shard`); :func:`merge` checks coverage, settings, model fingerprints and file hashes and
returns a :class:`~bayes_lens.reduced.ReducedCache` equal to one process. Workers build their model
from a :class:`ModelSpec`. :func:`collect_sharded` does all three with an engine (``"local"``,
``"torchrun"``, or a :class:`RayEngine` with the ``ray`` extra); the CLI is
``bayes-lens shard plan|run|merge|status``. Any analysis runs sharded inside
``with bl.shard.sharded(model, engine=..., shard_dir=...)``: the runner, not the analysis, does it.

A shard folder is data: a worker imports and calls only the model loaders and read classes its
launcher allowed (bayes_lens's and TransformerLens's own, the specs built in Python in this process,
:func:`allow_loader` / :func:`allow_read`, ``bayes-lens shard run --allow-loader/--allow-read``, the
``BAYES_LENS_ALLOW_LOADERS`` / ``BAYES_LENS_ALLOW_READS`` variables), checked before any import; with
``BAYES_LENS_SHARD_KEY`` set, plans are signed (HMAC-SHA256) and a worker runs only a plan signed with it.

Example
-------
>>> import bayes_lens.shard as shard                                                   # doctest: +SKIP
>>> spec = shard.ModelSpec("bayes_lens.models.tiny:tiny_model", {"kind": "hooked"})   # doctest: +SKIP
>>> rc = shard.collect_sharded(spec, prompts, "out/", value_layers="all", batch_size=8)  # doctest: +SKIP
>>> bl.value_manifold(rc, layer=1)                                                    # doctest: +SKIP
>>> with shard.sharded(spec, engine="torchrun", shard_dir="study/") as model:          # doctest: +SKIP
...     bl.geometry(model, prompts)
"""

from __future__ import annotations

import importlib

from .._namespace import package_dir

# public name -> submodule. Loaded on first use: importing bayes_lens.shard (e.g. for the command
# line's parser, bayes_lens.shard.cli) must not import torch.
_LAZY = {
    "LocalEngine": "_engines",
    "TorchrunEngine": "_engines",
    "collect_sharded": "_engines",
    "dist_rank_world": "_engines",
    "ShardCoverageError": "_errors",
    "ShardEngineError": "_errors",
    "ShardError": "_errors",
    "ShardIntegrityError": "_errors",
    "ShardMismatchError": "_errors",
    "Job": "_job",
    "read_plan": "_job",
    "write_plan": "_job",
    "MixedShardsWarning": "_merge",
    "ShardSet": "_merge",
    "merge": "_merge",
    "open_shards": "_merge",
    "status": "_merge",
    "Shard": "_plan",
    "plan": "_plan",
    "shards_for_rank": "_plan",
    "RayEngine": "_ray",
    "collect_settings": "_run",
    "commit_shard": "_run",
    "read_manifest": "_run",
    "run_shard": "_run",
    "run_shards": "_run",
    "settings_hash": "_run",
    "ModelSpec": "_spec",
    "allow_loader": "_spec",
    "allow_read": "_spec",
    "model_fingerprint": "_spec",
    "sharded": "_sharded",
}

__all__ = [
    "Shard", "plan", "shards_for_rank",
    "ModelSpec", "model_fingerprint", "allow_loader", "allow_read",
    "run_shard", "run_shards", "commit_shard", "collect_settings", "settings_hash", "read_manifest",
    "merge", "open_shards", "ShardSet", "status", "MixedShardsWarning",
    "sharded",
    "Job", "write_plan", "read_plan",
    "collect_sharded", "LocalEngine", "TorchrunEngine", "RayEngine", "dist_rank_world",
    "ShardError", "ShardCoverageError", "ShardMismatchError", "ShardIntegrityError", "ShardEngineError",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bayes_lens.shard' has no attribute {name!r}")


__dir__ = package_dir(globals())
