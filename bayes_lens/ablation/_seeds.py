"""Seed variance apart from sampling variance: the spread of localize's verdict-bearing numbers over reseeded runs.

METHODS.md §13. A localize table's bootstrap intervals describe sampling variance over prompts for one draw
of everything seeded (``RunOptions.seed``: the folds, the bootstrap resamples, the shuffled-target nulls,
the Haar and covariance-matched null subspaces, the swap and resample donors). ``Design(reseeds=R)`` reruns
the whole call with the seeds ``seed + 1 … seed + R`` and :func:`seed_columns` puts beside each candidate row,
over the 1 + R seeds, the SD (ddof 1; 0 for one seed), minimum and maximum of each verdict-bearing number
(:data:`SEEDED`: Δ MAE, the swap's bits, the held-out R², the removal's and the swap's p-values, unadjusted
and Holm-adjusted) and how many seeds give the same verdict, the same mediator call and the same readable
call as the reported seed.

>>> import pandas as pd
>>> t = pd.DataFrame({"layer": [0], "subspace": ["a"], "kind": ["user"], "delta_mae_bits": [0.5], "verdict": ["x"],
...                   "mediator": [True], "readable": [False]})
>>> u = t.assign(delta_mae_bits=[0.7])
>>> out = seed_columns(t, [u])
>>> round(float(out["delta_mae_bits_seed_sd"][0]), 4), int(out["verdict_seeds_agree"][0]), int(out["n_seeds"][0])
(0.1414, 2, 2)
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

__all__ = ["SEEDED", "seed_columns", "layer_seed_columns"]

#: the verdict-bearing numbers whose spread over seeds is reported
SEEDED = ("delta_mae_bits", "swap_bits", "r2", "removal_p", "removal_p_holm", "swap_p", "swap_p_holm")
_CALLS = (("verdict", "verdict_seeds_agree"), ("mediator", "mediator_seeds_agree"),
          ("readable", "readable_seeds_agree"))


def seed_columns(table, others: Sequence):
    """``table`` (the reported seed's) with the spread columns over it and ``others`` (the reseeded tables, same
    layers and candidates): ``{col}_seed_sd``, ``{col}_seed_min``, ``{col}_seed_max`` for each of :data:`SEEDED`
    present, ``n_seeds``, and ``verdict_seeds_agree`` / ``mediator_seeds_agree`` / ``readable_seeds_agree`` (how
    many of the seeds, the reported one included, give the reported call). Null-draw rows (a different draw under
    each seed) get NaN."""
    key = ["layer", "subspace"]
    real = (table["kind"] != "random").to_numpy()
    aligned: List = [table.set_index(key)]
    for o in others:
        aligned.append(o.set_index(key).reindex(aligned[0].index))
    table = table.copy()
    table["n_seeds"] = len(aligned)
    for col in SEEDED:
        if col not in table:
            continue
        vals = np.stack([a[col].to_numpy(dtype=np.float64) for a in aligned])  # [seeds, rows]
        sd = vals.std(0, ddof=1) if len(aligned) > 1 else np.zeros(vals.shape[1])
        for name, v in (("sd", sd), ("min", vals.min(0)), ("max", vals.max(0))):
            table[f"{col}_seed_{name}"] = np.where(real, v, np.nan)
    for col, out in _CALLS:
        if col not in table:
            continue
        agree = sum((a[col].to_numpy() == aligned[0][col].to_numpy()).astype(np.int64) for a in aligned)
        table[out] = np.where(real, agree, np.nan)
    return table


def layer_seed_columns(layers_table, others: Sequence):
    """``layers_table`` with ``n_seeds`` and ``verdict_seeds_agree``: how many seeds give each layer's verdict."""
    out = layers_table.copy()
    base = out.set_index("layer")["verdict"]
    agree = np.ones(len(out), dtype=np.int64)
    for o in others:
        agree += (o.set_index("layer")["verdict"].reindex(base.index).to_numpy() == base.to_numpy()).astype(np.int64)
    out["n_seeds"] = 1 + len(others)
    out["verdict_seeds_agree"] = agree
    return out
