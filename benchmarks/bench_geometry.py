"""Benchmark: bl.geometry against bare forward passes and a naive run_with_cache baseline (SmolLM2-135M).

Three variants on the same 64 prompts (batch size 16, right padding):

* ``bare``     — the user's plain forward passes: ``model(tokens, attention_mask=mask)`` per batch, with
  full logits at every position (tokenization included, as in the other variants);
* ``geometry`` — ``bl.geometry(model, prompts)`` with its defaults (1,000 bootstrap resamples,
  200 null simulations, 1,000 permutations): one streaming pass with metric hooks + statistics;
* ``naive``    — ``model.run_with_cache(tokens, attention_mask=mask)`` of *every* hook for every
  batch, all caches kept, then the same statistics computed from the caches.

Time: the variants run interleaved in one process (``--repeats`` rounds after a warm-up pass), so
load from other processes on a shared machine affects them alike; the best (minimum) and median
wall-clock and the best CPU (process) time are reported — on a busy machine the minimum is the
stable estimate. Peak memory: each variant runs once in its own subprocess;
after loading the model and a warm-up pass the peak-RSS counter is reset (``/proc/self/clear_refs``
"5"), and the extra peak is ``VmHWM`` after the run minus ``VmRSS`` before it. The memory target
compares what each variant adds *above the bare forward pass's own peak* (logits, activations).

Targets: geometry time ≤ 0.9 × bare (issue 17: the runner computes the unembedding at the final token
only, so it does less than a plain forward); geometry extra peak ≤ 10% of naive's extra peak (issue 3).

Usage::

    python benchmarks/bench_geometry.py [--repeats 3] [--kind auto|hooked|bridge] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

N_PROMPTS = 64
BATCH = 16

_SUBJECTS = ["The river", "A small robot", "The old library", "My neighbour", "The committee", "A hungry fox",
             "The new vaccine", "This algorithm", "The orchestra", "A distant star", "The city council",
             "Our teacher", "The mountain village", "A quiet student", "The stock market", "The ancient map"]
_TAILS = [" slowly began to", " was known for", ", according to the report,", " could not explain why",
          " decided that the best way to", " is located near", " has always been", " suddenly realized that"]
_EXTRA = ["def mean(xs):\n    return sum(xs) /", "for i in range(10):\n    print(", "What is the capital of Italy?",
          "Solve for x: 2x + 3 = 11. x =", "The derivative of sin(x) is", "SELECT * FROM orders WHERE",
          "Q: Who wrote Hamlet?\nA:", "The integral of 2x dx is"]


def make_prompts(n: int = N_PROMPTS):
    """64 varied prompts (templated sentences of different lengths, code, questions, maths)."""
    out = []
    for i in range(n):
        if i % 8 == 7:
            out.append(_EXTRA[(i // 8) % len(_EXTRA)])
        else:
            s = _SUBJECTS[i % len(_SUBJECTS)] + _TAILS[(i * 3) % len(_TAILS)]
            out.append(s + (" the people who lived there and" * (i % 4)))
    return out


def _status(field: str) -> int:
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1))  # kB


def _load(kind: str):
    import bayes_lens as bl

    return bl.load_model(kind=kind)


def run_bare(model, prompts):
    import torch

    from bayes_lens import adapter

    with torch.inference_mode():
        for s in range(0, len(prompts), BATCH):
            toks, mask = adapter.tokenize(model, prompts[s:s + BATCH])
            model(toks, attention_mask=mask)


def run_geometry(model, prompts):
    import bayes_lens as bl

    return bl.geometry(model, prompts, batch_size=BATCH, progress=False)


def run_naive(model, prompts):
    """run_with_cache of everything for every batch, keep all caches, then compute the same metrics."""
    import numpy as np
    import torch

    from bayes_lens import adapter, key_orthogonality
    from bayes_lens._geometry._alignment import alignment_from
    from bayes_lens._geometry._focusing import focusing_from_entropies, uniform_entropy_bits
    from bayes_lens._geometry._manifold import manifold_from_samples
    from bayes_lens.hooks import final_rows, pattern_entropy_bits

    caches = []
    with torch.inference_mode():
        for s in range(0, len(prompts), BATCH):
            toks, mask = adapter.tokenize(model, prompts[s:s + BATCH])
            logits, cache = model.run_with_cache(toks, attention_mask=mask)
            caches.append((logits, cache, mask))
    n_layers = int(model.cfg.n_layers)
    last = n_layers - 1
    vname = adapter.hook_name(model, last, "v")
    x = torch.cat([final_rows(c[vname], m) for _, c, m in caches]).double().numpy()
    ent = torch.cat([torch.stack([pattern_entropy_bits(c[adapter.hook_name(model, l, "pattern")], m)
                                  for l in range(n_layers)], 1) for _, c, m in caches]).numpy()
    nxt = []
    for logits, _, m in caches:
        idx = m.sum(1) - 1
        lp = torch.log_softmax(logits[torch.arange(len(idx)), idx].double(), -1)
        nxt.append(-(lp.exp() * lp).sum(-1) / np.log(2))
    nxt = torch.cat(nxt).numpy()
    n_tok = torch.cat([m.sum(1) for _, _, m in caches]).numpy()
    keys = key_orthogonality(model)
    vm = manifold_from_samples(x, layer=last, site="v", name=vname, seed=0, n_boot=1000, n_null=200, n_components=10,
                               expand_kv=False)
    foc = focusing_from_entropies(ent, uniform=uniform_entropy_bits(n_tok, "last"), positions="last", seed=0,
                                  n_boot=1000)
    al = alignment_from(vm.coords[:, 0].numpy(), nxt, layer=last, site="v", seed=0, n_boot=1000, n_perm=1000)
    return vm, keys, foc, al


VARIANTS = {"bare": run_bare, "geometry": run_geometry, "naive": run_naive}


def memory_child(variant: str, kind: str) -> dict:
    import gc

    prompts = make_prompts()
    model = _load(kind)
    run_bare(model, prompts[:BATCH])  # warm-up (allocator, kernels)
    gc.collect()
    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    t0, c0 = time.perf_counter(), time.process_time()
    VARIANTS[variant](model, prompts)
    return dict(variant=variant, extra_peak_mib=(_status("VmHWM") - rss0) / 1024, rss_before_mib=rss0 / 1024,
                wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)


def timing(kind: str, repeats: int) -> dict:
    prompts = make_prompts()
    model = _load(kind)
    run_bare(model, prompts)  # warm-up
    walls = {v: [] for v in VARIANTS}
    cpus = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for v, fn in VARIANTS.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn(model, prompts)
            walls[v].append(time.perf_counter() - t0)
            cpus[v].append(time.process_time() - c0)
    import bayes_lens as bl

    return dict(kind=bl.adapter.model_info(model).kind,
                wall_s={v: statistics.median(w) for v, w in walls.items()},
                cpu_s={v: statistics.median(c) for v, c in cpus.items()},
                wall_all=walls, cpu_all=cpus)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kind", default="auto", choices=["auto", "hooked", "bridge"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--from-json", default=None, help="re-print the table of an earlier --json file")
    ap.add_argument("--timing-only", action="store_true", help="time again; memory from --from-json")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args._child:
        print(json.dumps(memory_child(args._child, args.kind)))
        return
    if args.from_json and not args.timing_only:
        with open(args.from_json) as f:
            d = json.load(f)
        report(d["timing"], d["memory"], args.repeats)
        return
    mem = {}
    if args.timing_only:  # reuse the memory measurements of an earlier run
        with open(args.from_json) as f:
            mem = json.load(f)["memory"]
    for v in ([] if args.timing_only else VARIANTS):
        out = subprocess.run([sys.executable, __file__, "--_child", v, "--kind", args.kind,
                              "--threads", str(args.threads)], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        mem[v] = json.loads(out)
    t = timing(args.kind, args.repeats)
    report(t, mem, args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(timing=t, memory=mem), f, indent=1)


def report(t: dict, mem: dict, repeats: int) -> None:
    """Print the markdown table. Times: min (best) and median of the interleaved rounds. Memory: the
    peak above the bare forward pass's own peak (what the metric machinery adds), as a share of the
    naive baseline's."""
    import platform

    import torch

    best = {v: min(w) for v, w in t["wall_all"].items()}
    best_cpu = {v: min(c) for v, c in t["cpu_all"].items()}
    med = {v: statistics.median(w) for v, w in t["wall_all"].items()}
    over = {v: mem[v]["extra_peak_mib"] - mem["bare"]["extra_peak_mib"] for v in VARIANTS}
    print(f"SmolLM2-135M ({t['kind']}), {N_PROMPTS} prompts, batch {BATCH}, {len(t['wall_all']['bare'])} "
          f"interleaved rounds; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.machine()}")
    print()
    print("| variant | best wall (s) | × bare | median wall (s) | best CPU (s) | × bare | peak RSS above load (MiB) "
          "| above bare (MiB) | % of naive's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in VARIANTS:
        share = 100 * over[v] / over["naive"] if over["naive"] > 0 else float("nan")
        print(f"| {v} | {best[v]:.1f} | {best[v] / best['bare']:.2f} | {med[v]:.1f} | {best_cpu[v]:.1f} | "
              f"{best_cpu[v] / best_cpu['bare']:.2f} | {mem[v]['extra_peak_mib']:.0f} | {over[v]:.0f} | "
              f"{share:.1f}% |")
    g = best["geometry"] / best["bare"]
    gm = over["geometry"] / over["naive"]
    print()
    print(f"target geometry ≤ 0.9 × bare time: {'PASS' if g <= 0.9 else 'FAIL'} ({g:.2f}× best wall, "
          f"{best_cpu['geometry'] / best_cpu['bare']:.2f}× best CPU); extra peak ≤ 10% of naive's: "
          f"{'PASS' if gm <= 0.10 else 'FAIL'} ({100 * gm:.1f}%)")


if __name__ == "__main__":
    main()
