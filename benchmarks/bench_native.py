"""Benchmark: the TransformerLens-native layer (``bl.attach``, ``bl.hook_filter``) against the user's plain forward passes.

On SmolLM2-135M (``bl.load_model()``), the same SULA prompts (``--n-prompts``, batch 16, right
padding), "bare" is the user's plain ``model(tokens, attention_mask=mask)`` with full logits:

* ``attached`` — the same passes inside ``bl.attach(model, axis=axis)`` with nothing hooked on the
  bayes_lens hook points (target ≤ 1.02 × bare);
* ``compare_patched`` — ``bl.compare_patched(model, prompts, {"axis removed": axis.removal()},
  n_random_seeds=3)``: 1 clean + 1 patched + 3 random-control passes and the statistics, against the
  five bare passes it needs (target ≤ 1.1 ×).

The variants run interleaved (``--repeats`` rounds after a warm-up), so drifting machine load hits
them alike; best (minimum) and median wall times are reported.

``--kind all`` (the default) runs every kind of every venv found (the TL 3 HookedTransformer and bridge,
the TL 4 bridge), each in a subprocess, as :mod:`bench_geometry` does, then prints a summary.
``--seq-len N`` times ``bare`` and ``attached`` on ``--n-prompts`` prompts of exactly ``N`` random tokens
(the axis is still fitted on SULA prompts; ``compare_patched`` needs SULA prompts, so it is not run).

Usage::

    python benchmarks/bench_native.py [--n-prompts 100] [--repeats 5] [--kind all|auto|hooked|bridge]
        [--seq-len N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402

BATCH = 16


def run_all(args) -> None:
    """``--kind all``: each kind of each venv in a subprocess, then a summary table."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_geometry import _child_env, venv_pythons

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for py in venv_pythons(args.python):
            probe = subprocess.run([py, "-c", "import bayes_lens.adapter as a, importlib.metadata as m; "
                                    "print(a.has_hooked_transformer(), m.version('transformer-lens'))"],
                                   capture_output=True, text=True, env=_child_env())
            if probe.returncode != 0:
                print(f"skipping {py}: cannot import bayes_lens there", file=sys.stderr)
                continue
            hooked, tl = probe.stdout.split()
            for kind in (["hooked", "bridge"] if hooked == "True" else ["bridge"]):
                out = Path(tmp) / f"{len(rows)}.json"
                print(f"\n### {kind}, transformer-lens {tl} ({py})\n", flush=True)
                cmd = [py, __file__, "--kind", kind, "--n-prompts", str(args.n_prompts), "--repeats",
                       str(args.repeats), "--json", str(out)] + (["--seq-len", str(args.seq_len)] if args.seq_len else [])
                ok = subprocess.run(cmd, env=_child_env()).returncode == 0
                rows.append(dict(kind=kind, tl=tl, **(json.loads(out.read_text()) if ok else {"failed": True})))
    print("\n### summary\n")
    print("| kind | transformer-lens | prompts (mean tokens) | attached / bare, best | median | median of round ratios | "
          "compare_patched / 5 bare, best | median |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("failed"):
            print(f"| {r['kind']} | {r['tl']} | FAILED | | | | | |")
            continue
        w, m = r["wall_s"], r["meta"]
        best = {k: min(v) for k, v in w.items()}
        med = {k: statistics.median(v) for k, v in w.items()}
        a = "attached, nothing hooked (1 pass)"
        c, b5 = "compare_patched (1 + 1 + 3 passes)", "bare (5 passes)"
        cp = (f"{best[c] / best[b5]:.3f}× | {med[c] / med[b5]:.3f}×" if c in w else "n/a | n/a")
        print(f"| {m['kind']} | {r['tl']} | {m['n_prompts']} ({m['mean_tokens']:.0f}) | "
              f"{best[a] / best['bare (1 pass)']:.3f}× | {med[a] / med['bare (1 pass)']:.3f}× | "
              f"{round_ratio(w, a, 'bare (1 pass)'):.3f}× | {cp} |")
    print(f"\nload average at the end: {os.getloadavg()}")


def round_ratio(walls: dict, variant: str, base: str) -> float:
    """Median over rounds of ``variant``'s wall over ``base``'s in the same round (they run back to back
    in every round, so a slow spell of the machine hits both)."""
    return statistics.median(v / b for v, b in zip(walls[variant], walls[base]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kind", default="all", choices=["all", "auto", "hooked", "bridge"])
    ap.add_argument("--python", action="append", default=None,
                    help="with --kind all: an interpreter to run (repeatable; default: .venv and .venv-tl4)")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="time bare/attached on prompts of exactly this many random tokens (no compare_patched)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.seq_len is not None and args.seq_len < 1:
        ap.error(f"--seq-len must be a positive integer, got {args.seq_len}.")
    if args.kind == "all":
        run_all(args)
        return

    model = bl.load_model(kind=args.kind)
    prompts = bl.sula.make_prompts(model, n_per_k=-(-args.n_prompts // 5), seed=0)[: args.n_prompts]
    texts = prompts.texts
    if args.seq_len:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_geometry import random_token_prompts

        texts = random_token_prompts(model, args.n_prompts, args.seq_len)
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

    variants = {"bare (1 pass)": lambda: bare(1), "attached, nothing hooked (1 pass)": attached}
    if not args.seq_len:
        variants.update({"bare (5 passes)": lambda: bare(5), "compare_patched (1 + 1 + 3 passes)": compare})
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
    n_tok = [int(bl.adapter.tokenize(model, [t])[1].sum()) for t in texts]
    meta = {"model": info.name, "kind": info.kind, "n_prompts": len(texts), "mean_tokens": sum(n_tok) / len(n_tok),
            "seq_len": args.seq_len, "batch": BATCH, "repeats": args.repeats,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "load_avg_at_end": os.getloadavg()}
    print(json.dumps(meta))
    print("| variant | best wall (s) | median wall (s) |")
    print("|---|---:|---:|")
    for k in variants:
        print(f"| {k} | {best[k]:.2f} | {med[k]:.2f} |")
    a = best["attached, nothing hooked (1 pass)"] / best["bare (1 pass)"]
    am = med["attached, nothing hooked (1 pass)"] / med["bare (1 pass)"]
    ar = round_ratio(walls, "attached, nothing hooked (1 pass)", "bare (1 pass)")
    print()
    print(f"attached / bare: {a:.3f}× best, {am:.3f}× median, {ar:.3f}× median of the per-round ratios (target ≤ 1.02): "
          f"{'PASS' if max(a, ar) <= 1.02 else 'FAIL'} (best and per-round; the ratio of medians mixes rounds)")
    if not args.seq_len:
        c = best["compare_patched (1 + 1 + 3 passes)"] / best["bare (5 passes)"]
        cm = med["compare_patched (1 + 1 + 3 passes)"] / med["bare (5 passes)"]
        print(f"compare_patched / 5 bare passes: {c:.3f}× best, {cm:.3f}× median (target ≤ 1.1): "
              f"{'PASS' if max(c, cm) <= 1.1 else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "wall_s": walls}, f, indent=1)


if __name__ == "__main__":
    main()
