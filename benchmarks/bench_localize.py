"""Benchmark: wall time of the readout-or-mediator table (``bl.localize``) on the default model.

Targets: (1) the quick table — the report's quick sizes: one middle layer, ranks (1, 4), 5 Haar
subspaces per rank, 5 folds, 30 SULA prompts — finishes in a few minutes on 2 CPU cores; (2) with
``--compare-resume``, interventions at ``resid_post`` of layer L that resume from the clean stream
kept after L (``start_at_layer``) cost about 1 + k·(1 − (L + 1)/n_layers) passes instead of 1 + k: the
script times ``resume=True`` and ``resume=False`` on the same table and prints the measured ratio
beside that prediction. Prints the machine, the load average before and after, the seconds and the
number of interventions (each is a removal and a swap: two passes' worth).

Usage::

    python benchmarks/bench_localize.py [--kind hooked|bridge] [--n-per-k 6] [--n-random 5] [--layers 1]
    python benchmarks/bench_localize.py --compare-resume --ranks 1 --n-random 3
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
    ap.add_argument("--compare-resume", action="store_true", help="also time resume=False (whole passes)")
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
    slow = None
    if args.compare_resume:
        t1 = time.perf_counter()
        bl.localize(model, items, layers=layers, ranks=ranks, n_random=args.n_random, n_boot=300, n_null=50,
                    resume=False)
        slow = time.perf_counter() - t1
    load1 = os.getloadavg()[0]
    n_int = len(loc.table)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), model {type(model).__name__} ({args.model}), "
          f"TransformerLens {__import__('importlib.metadata').metadata.version('transformer-lens')}")
    print(f"load average before {load0:.1f}, after {load1:.1f}")
    print(f"{len(items)} prompts, layers {layers}, ranks {ranks}, {args.n_random} random per rank: "
          f"{n_int} interventions (removal + swap each: {2 * n_int} passes' worth) + the clean pass")
    print(f"localize (resume where the kind can): {secs:.1f} s total")
    if slow is not None:
        k = 2 * n_int
        n_layers = model.cfg.n_layers
        pred = sum((1 + k / len(layers) * (1 - (L + 1) / n_layers)) / (1 + k / len(layers)) for L in layers) / len(layers)
        print(f"localize resume=False (whole passes): {slow:.1f} s; measured ratio {secs / slow:.3f}, "
              f"predicted from the layer count {pred:.3f} (the resume keeps one extra clean pass per layer)")
    print(loc.layers_table.to_string())


if __name__ == "__main__":
    main()
