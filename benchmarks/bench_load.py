"""Benchmark: load time and peak memory of bl.load_gguf vs transformers' own GGUF route.

Both offline models: SmolLM2-135M (``default``) and Gemma 3 270M (``gemma-3-270m``, assembled into
the cache before timing starts).

Each variant runs in a fresh subprocess (so peak memory, read from VmHWM in /proc/self/status, is
its own), after the imports it needs (import time is reported separately and excluded from the
load time). Targets: load time <= 0.6x transformers' route; peak memory <= 1.5x the
final model's size (parameter + buffer bytes; we report the peak both as an absolute and as the
increase over the post-import baseline).

    python benchmarks/bench_load.py [--repeats 3] [--model default|gemma-3-270m|all]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, os
def vm(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
t0 = time.perf_counter()
import torch, transformers, transformer_lens, gguf, bayes_lens as bl
from bayes_lens.models import default_model_path, gemma_model_path
t_import = time.perf_counter() - t0
path = default_model_path() if sys.argv[2] == 'default' else gemma_model_path()
rss0 = vm('VmRSS')
variant = sys.argv[1]
t = time.perf_counter()
if variant == 'transformers':
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
else:
    model = bl.load_gguf(path, kind=variant)
elapsed = time.perf_counter() - t
size = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
size += sum(b.numel() * b.element_size() for b in model.buffers())
print(json.dumps(dict(variant=variant, load_s=elapsed, import_s=t_import, peak_bytes=vm('VmHWM'),
                      rss_after_import=rss0, model_bytes=size)))
"""


def run(variant: str, model: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, variant, model], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=["default", "gemma-3-270m", "all"], default="all")
    args = ap.parse_args()
    from bayes_lens.adapter import has_hooked_transformer
    from bayes_lens.models import gemma_model_path

    models = ["default", "gemma-3-270m"] if args.model == "all" else [args.model]
    if "gemma-3-270m" in models:
        gemma_model_path()  # assemble once, outside the timings
    variants = ["transformers", "bridge"] + (["hooked"] if has_hooked_transformer() else [])
    gib = 1024 ** 3
    print(f"machine: {platform.machine()}, {platform.processor() or '?'}, python {platform.python_version()}, "
          f"cores {__import__('os').cpu_count()}; command: python benchmarks/bench_load.py --repeats "
          f"{args.repeats} --model {args.model}")
    print("| model | route | load time (s, median) | x transformers | peak RSS (GiB) | peak - post-import RSS (GiB) "
          "| model size (GiB) | (peak - base) / model |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        rows = {}
        for v in variants:
            runs = [run(v, model) for _ in range(args.repeats)]
            rows[v] = dict(load_s=statistics.median(r["load_s"] for r in runs),
                           peak=max(r["peak_bytes"] for r in runs), base=min(r["rss_after_import"] for r in runs),
                           model=runs[0]["model_bytes"])
        ref = rows["transformers"]["load_s"]
        for v, r in rows.items():
            extra = r["peak"] - r["base"]
            print(f"| {model} | {v} | {r['load_s']:.2f} | {r['load_s'] / ref:.2f} | {r['peak'] / gib:.2f} "
                  f"| {extra / gib:.2f} | {r['model'] / gib:.2f} | {extra / r['model']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
