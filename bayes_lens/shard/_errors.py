"""Errors of sharded runs: a shard set that does not add up to one run is refused, never guessed at.

All are :class:`bayes_lens.errors.BayesLensError` subclasses (the project rule: say what was wrong
and how to fix it). :class:`ShardCoverageError` - the shards' index ranges leave a gap, overlap, or
do not match the prompt count; :class:`ShardMismatchError` - shards (or a shard and this run) differ
in settings, model fingerprint or prompts; :class:`ShardIntegrityError` - a shard file is missing,
unreadable, or its hash or contents disagree with its manifest; :class:`ShardEngineError` - the
engine cannot run the job as asked (patches, which are Python callables, on an engine whose workers
are other processes that get only a ModelSpec and JSON settings).
"""

from __future__ import annotations

from ..errors import BayesLensError

__all__ = ["ShardError", "ShardCoverageError", "ShardMismatchError", "ShardIntegrityError", "ShardEngineError"]


class ShardError(BayesLensError):
    """Base class of the errors of :mod:`bayes_lens.shard`."""


class ShardCoverageError(ShardError):
    """The shards do not cover the prompts exactly once (a gap, an overlap, a wrong total)."""


class ShardMismatchError(ShardError):
    """Shards were made with different settings, models or prompts than each other or this run."""


class ShardIntegrityError(ShardError):
    """A shard's files are missing, unreadable, or disagree with its manifest (hash, rows, indices)."""


class ShardEngineError(ShardError):
    """The engine cannot run this job as asked (e.g. patches on an engine whose workers are other processes)."""
