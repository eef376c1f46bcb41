"""Benchmark: how much do entropy-axis patches add to the forward time? (target: ≤ 5%)

Runs SmolLM2-135M (``bl.load_model()``) over ``--n-prompts`` SULA prompts in pre-tokenized batches,
clean and with patches (single-layer removal, 5-layer removal, optionally keep-only), interleaving the
conditions in every repeat so that machine-load drift hits all of them alike. Reports per condition
the median wall time of a full pass, the overhead vs clean (median of the per-repeat ratios, with a
bootstrap CI over repeats), and — a load-independent check — the time spent inside the patch
functions themselves, measured by timing the hook calls during a pass.

Usage::

    python benchmarks/bench_ablation.py --n-prompts 64 --repeats 5 [--keep-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402
from bayes_lens.adapter import tokenize  # noqa: E402


def _timed_pairs(patch, acc):
    """The patch's (hook_name, fn) pairs, each fn wrapped to add its own run time to acc[0]."""
    out = []
    for name, fn in patch:
        def wrapped(act, hook=None, _fn=fn):
            t0 = time.perf_counter()
            r = _fn(act, hook)
            acc[0] += time.perf_counter() - t0
            return r
        out.append((name, wrapped))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep-only", action="store_true", help="also time a keep-only patch")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    model = bl.load_model()
    n_layers = model.cfg.n_layers
    per_k = -(-args.n_prompts // 5)
    prompts = bl.sula.make_prompts(model, n_per_k=per_k, seed=0)[: args.n_prompts]
    multi = sorted({n_layers // 3, n_layers // 2, (2 * n_layers) // 3, (5 * n_layers) // 6, n_layers - 1})
    # The cost of a patch does not depend on which direction it removes: seeded random unit vectors
    # stand in for a fitted axis (saves a pass over the prompts).
    kv_dim = bl.adapter.model_info(model).kv_dim
    g = torch.Generator().manual_seed(0)
    axis = bl.EntropyAxis.from_directions(model, {k: torch.randn(kv_dim, generator=g) for k in multi}, sigma=1.0)
    mid = multi[1]
    conditions = {
        "clean": [],
        f"removal L{mid}": axis.removal(layers=mid),
        f"removal L{','.join(map(str, multi))}": axis.removal(),
    }
    if args.keep_only:
        conditions[f"keep-only L{mid}"] = axis.keep_only(layers=mid)
    texts = [p.text for p in prompts]
    batches = [tokenize(model, texts[i:i + args.batch_size]) for i in range(0, len(texts), args.batch_size)]

    def one_pass(pairs, todo=batches):
        # the timing wrappers hide which axis a removal acts through, so its coordinate hook points
        # are attached explicitly (bl.patched attaches them by itself for unwrapped patches)
        t0 = time.perf_counter()
        att = bl.attach(model, axis=axis, entropies=False) if pairs else contextlib.nullcontext()
        with att, bl.patched(model, pairs), torch.inference_mode():
            for toks, mask in todo:
                model(toks, attention_mask=mask)
        return time.perf_counter() - t0

    one_pass([], batches[:1])  # warm-up
    times = {k: [] for k in conditions}
    hook_time = {k: [] for k in conditions}
    for rep in range(args.repeats):
        order = list(conditions) if rep % 2 == 0 else list(reversed(list(conditions)))
        for name in order:
            acc = [0.0]
            pairs = _timed_pairs(conditions[name], acc) if conditions[name] else []
            times[name].append(one_pass(pairs))
            hook_time[name].append(acc[0])

    clean = np.array(times["clean"])
    rng = np.random.default_rng(0)
    results = {}
    for name, ts in times.items():
        ts = np.array(ts)
        ratio = ts / clean
        boots = [np.median(ratio[rng.integers(0, len(ratio), len(ratio))]) for _ in range(1000)]
        results[name] = {
            "median_s": float(np.median(ts)), "min_s": float(ts.min()),
            "overhead_pct_median": float(100 * (np.median(ratio) - 1)),
            "overhead_pct_ci": [float(100 * (np.quantile(boots, q) - 1)) for q in (0.025, 0.975)],
            "overhead_pct_min_vs_min": float(100 * (ts.min() / clean.min() - 1)),
            "hook_time_pct_of_pass": float(100 * np.median(np.array(hook_time[name]) / ts)),
        }
    meta = {"model": bl.adapter.model_info(model).name, "kind": bl.adapter.model_info(model).kind,
            "n_prompts": len(texts), "batch_size": args.batch_size, "repeats": args.repeats,
            "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
            "load_avg": os.getloadavg()}
    print(json.dumps(meta))
    print("| condition | median pass (s) | overhead vs clean (median, 95% CI) | min/min | time inside patch fns |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        lo, hi = r["overhead_pct_ci"]
        print(f"| {name} | {r['median_s']:.2f} | {r['overhead_pct_median']:+.1f}% [{lo:+.1f}, {hi:+.1f}] | "
              f"{r['overhead_pct_min_vs_min']:+.1f}% | {r['hook_time_pct_of_pass']:.2f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
