"""Benchmark: wall time of the readout-or-mediator table (``bl.localize``) on the default model.

Target (the localisation work's "done when"): the quick table — the report's quick sizes: one middle
layer, ranks (1, 4), 5 Haar subspaces per rank, 5 folds, 30 SULA prompts — finishes in a few minutes
on 2 CPU cores. Prints the machine, the load average before and after, the seconds, the number of
interventions and forward passes over the prompt set (a cross-fitted intervention is K passes over
1/K of the prompts: one pass's worth), and the seconds per pass's worth.

Usage::

    python benchmarks/bench_localize.py [--kind hooked|bridge] [--n-per-k 6] [--n-random 5] [--layers 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402
from bayes_lens.ablation import default_layers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default=None, help="hooked or bridge (default: what bl.load_model() returns)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--n-per-k", type=int, default=6)
    ap.add_argument("--n-random", type=int, default=5)
    ap.add_argument("--layers", type=int, default=1, help="how many evenly spaced layers")
    ap.add_argument("--ranks", default="1,4")
    args = ap.parse_args()
    kw = {} if args.kind is None else {"kind": args.kind}
    model = bl.load_model(args.model, **kw)
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=args.n_per_k, seed=0)
    layers = default_layers(model.cfg.n_layers, args.layers)
    ranks = tuple(int(r) for r in args.ranks.split(","))
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    loc = bl.localize(model, items, layers=layers, ranks=ranks, n_random=args.n_random, n_boot=300, n_null=50)
    secs = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    n_int = len(loc.table)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), model {type(model).__name__} ({args.model}), "
          f"TransformerLens {__import__('importlib.metadata').metadata.version('transformer-lens')}")
    print(f"load average before {load0:.1f}, after {load1:.1f}")
    print(f"{len(items)} prompts, layers {layers}, ranks {ranks}, {args.n_random} random per rank: "
          f"{n_int} interventions + 1 clean pass = {n_int + 1} passes' worth")
    print(f"localize: {secs:.1f} s total, {secs / (n_int + 1):.2f} s per pass's worth")
    print(loc.layers_table.to_string())


if __name__ == "__main__":
    main()
