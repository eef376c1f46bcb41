"""Benchmark: the Jacobian-lens subspace on a real model, fitted and tested as a ``bl.localize`` basis.

METHODS.md §13 ("Jacobian-lens subspace"). Fits TransformerLens's ``JacobianLens`` at one layer of the
default model (SmolLM2-135M, a raw ``TransformerBridge``: TransformerLens fits bridges only) on a few SULA
prompts (:func:`bayes_lens.ablation.jacobian_basis`, rank r), then runs ``bl.localize`` at that layer on
other SULA prompts with the J-space basis beside the estimators, the frame and the random band. Prints
the machine, the load, the fit's and the table's seconds and the table. The fit costs one backward pass
per ``dim_batch`` output dimensions per prompt (d_model / dim_batch backward passes of the replicated
batch), so it dominates.

Usage::

    python benchmarks/bench_jspace.py [--layer 14] [--rank 4] [--fit-per-k 3] [--n-per-k 6] [--n-random 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import bayes_lens as bl  # noqa: E402
from bayes_lens.ablation import jacobian_basis  # noqa: E402

COLS = ["subspace", "rank", "r2", "r2_ci_low", "delta_mae_bits", "delta_mae_ci_low", "delta_mae_ci_high", "band_high",
        "swap_bits", "swap_ci_low", "swap_band_high", "verdict"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--layer", type=int, default=None, help="default: the middle layer")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--fit-per-k", type=int, default=3, help="SULA prompts per k the lens is fitted on (seed 0)")
    ap.add_argument("--n-per-k", type=int, default=6, help="SULA prompts per k of the table (seed 1)")
    ap.add_argument("--n-random", type=int, default=5)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--n-null", type=int, default=20)
    args = ap.parse_args()
    import pandas as pd
    import torch

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); load before {os.getloadavg()[0]:.1f}")
    model = bl.load_model(args.model, kind="bridge")
    layer = int(model.cfg.n_layers) // 2 if args.layer is None else args.layer
    fit_items = bl.sula.make_prompts(model, ks=(0, 2, 4, 8), n_per_k=args.fit_per_k, seed=0)
    t = time.perf_counter()
    basis = jacobian_basis(model, fit_items, [layer], rank=args.rank)
    fit_s = time.perf_counter() - t
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=args.n_per_k, seed=1)
    t = time.perf_counter()
    loc = bl.localize(model, items, layers=[layer], ranks=(args.rank,), bases={f"J-space r={args.rank}": basis},
                      n_random=args.n_random, n_boot=args.n_boot, n_null=args.n_null, progress=False)
    table_s = time.perf_counter() - t
    pd.set_option("display.width", 250)
    print(f"{type(model).__name__}, layer {layer}: J-lens fit on {len(fit_items)} prompts {fit_s:.0f} s; "
          f"table on {len(items)} prompts {table_s:.0f} s; load after {os.getloadavg()[0]:.1f}")
    print(loc.table[loc.table["kind"] != "random"][COLS].to_string(index=False))
    print(loc.layers_table.to_string(index=False))


if __name__ == "__main__":
    main()
