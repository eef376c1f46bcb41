"""Plans: split ``n`` prompts into shards whose boundaries fall on batch boundaries.

A shard is a half-open range ``[start, stop)`` of global prompt indices, of the prompts in the order
the runner runs them (:func:`bayes_lens.collect.run_order`; :func:`bayes_lens.shard.write_plan` and
:func:`bayes_lens.shard.collect_sharded` put them in that order). When every boundary is a
multiple of ``batch_size``, each shard's batches are exactly the batches one process would run
(same prompts, same padding width), so a sharded run equals one run bit for bit (padding depends on
the batch, so a boundary inside one would change the rows; the runner is :func:`bayes_lens.collect.collect` with ``start_index=shard.start``). Work is spread by
whole batches: shard sizes differ by at most one batch.

Example
-------
>>> from bayes_lens.shard import plan
>>> [(s.start, s.stop) for s in plan(10, batch_size=3, n_shards=2)]
[(0, 6), (6, 10)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from .._validate import COUNT_RULES, check_count, check_int, check_nonneg_int, check_positive_int
from ..errors import InvalidInputError

__all__ = ["Shard", "plan", "shards_for_rank"]


@dataclass(frozen=True)
class Shard:
    """One shard: number ``index`` covering global prompt indices ``[start, stop)``."""

    index: int
    start: int
    stop: int

    def __post_init__(self):
        for name in ("index", "start", "stop"):
            v = getattr(self, name)
            object.__setattr__(self, name, check_nonneg_int(v, f"Shard.{name}"))
        if self.stop <= self.start:
            raise InvalidInputError(f"a shard needs stop > start, got [{self.start}, {self.stop}).")

    @property
    def name(self) -> str:
        """File stem of this shard: ``shard-00003``."""
        return f"shard-{self.index:05d}"

    def __len__(self) -> int:
        return self.stop - self.start


def _positive(name: str, value) -> int:
    return check_count(value, name) if name in COUNT_RULES else check_positive_int(value, name)


def plan(n_prompts: int, batch_size: int = 16, n_shards: int = 1) -> List[Shard]:
    """Split ``n_prompts`` into at most ``n_shards`` shards of whole batches (fewer if there are fewer
    batches than shards); sizes differ by at most one batch."""
    n = _positive("n_prompts", n_prompts)
    bs = _positive("batch_size", batch_size)
    k = _positive("n_shards", n_shards)
    n_batches = -(-n // bs)
    k = min(k, n_batches)
    base, extra = divmod(n_batches, k)
    out, b = [], 0
    for i in range(k):
        nb = base + (1 if i < extra else 0)
        out.append(Shard(i, b * bs, min((b + nb) * bs, n)))
        b += nb
    return out


def shards_for_rank(shards: Sequence[Shard], rank: int, world_size: int) -> List[Shard]:
    """The shards worker ``rank`` of ``world_size`` runs: shards ``rank, rank + W, rank + 2W, ...``."""
    w = _positive("world_size", world_size)
    rank = check_int(rank, "rank", min=0, max=w - 1)
    return list(shards)[rank::w]
