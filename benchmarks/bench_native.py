"""Benchmark: the TransformerLens-native layer (issue 17) against the user's plain forward passes.

On SmolLM2-135M (``bl.load_model()``), the same SULA prompts (``--n-prompts``, batch 16, right
padding), "bare" is the user's plain ``model(tokens, attention_mask=mask)`` with full logits:

* ``attached`` — the same passes inside ``bl.attach(model, axis=axis)`` with nothing hooked on the
  bayes_lens hook points (target ≤ 1.02 × bare);
* ``compare_patched`` — ``bl.compare_patched(model, prompts, {"axis removed": axis.removal()},
  n_random_seeds=3)``: 1 clean + 1 patched + 3 random-control passes and the statistics, against the
  five bare passes it needs (target ≤ 1.1 ×).

The variants run interleaved (``--repeats`` rounds after a warm-up), so drifting machine load hits
them alike; best (minimum) and median wall times are reported.

Usage::

    python benchmarks/bench_native.py [--n-prompts 100] [--repeats 5] [--kind auto|hooked|bridge] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402

BATCH = 16


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    model = bl.load_model(kind=args.kind)
    prompts = bl.sula.make_prompts(model, n_per_k=-(-args.n_prompts // 5), seed=0)[: args.n_prompts]
    texts = prompts.texts
    layer = int(model.cfg.n_layers) // 2
    axis = bl.EntropyAxis(layer=layer, progress=False).fit(model, prompts)

    def bare(n_passes=1):
        with torch.inference_mode():
            for _ in range(n_passes):
                for s in range(0, len(texts), BATCH):
                    toks, mask = bl.adapter.tokenize(model, texts[s:s + BATCH])
                    model(toks, attention_mask=mask)

    def attached():
        with bl.attach(model, axis=axis):
            bare()

    def compare():
        bl.compare_patched(model, prompts, {"axis removed": axis.removal()}, axis=axis, n_random_seeds=3,
                           batch_size=BATCH, progress=False)

    variants = {"bare (1 pass)": lambda: bare(1), "attached, nothing hooked (1 pass)": attached,
                "bare (5 passes)": lambda: bare(5), "compare_patched (1 + 1 + 3 passes)": compare}
    bare(1)  # warm-up
    walls = {k: [] for k in variants}
    for rep in range(args.repeats):
        order = list(variants) if rep % 2 == 0 else list(reversed(list(variants)))
        for name in order:
            t0 = time.perf_counter()
            variants[name]()
            walls[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in walls.items()}
    med = {k: statistics.median(v) for k, v in walls.items()}
    info = bl.adapter.model_info(model)
    meta = {"model": info.name, "kind": info.kind, "n_prompts": len(texts), "batch": BATCH, "repeats": args.repeats,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "load_avg_at_end": os.getloadavg()}
    print(json.dumps(meta))
    print("| variant | best wall (s) | median wall (s) |")
    print("|---|---:|---:|")
    for k in variants:
        print(f"| {k} | {best[k]:.2f} | {med[k]:.2f} |")
    a = best["attached, nothing hooked (1 pass)"] / best["bare (1 pass)"]
    am = med["attached, nothing hooked (1 pass)"] / med["bare (1 pass)"]
    c = best["compare_patched (1 + 1 + 3 passes)"] / best["bare (5 passes)"]
    cm = med["compare_patched (1 + 1 + 3 passes)"] / med["bare (5 passes)"]
    print()
    print(f"attached / bare: {a:.3f}× best, {am:.3f}× median (target ≤ 1.02): {'PASS' if max(a, am) <= 1.02 else 'FAIL'}")
    print(f"compare_patched / 5 bare passes: {c:.3f}× best, {cm:.3f}× median (target ≤ 1.1): "
          f"{'PASS' if max(c, cm) <= 1.1 else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "wall_s": walls}, f, indent=1)


if __name__ == "__main__":
    main()
