"""Benchmark: bl.sula.evaluate on the 250 default SULA prompts vs bare batched forward passes.

Target: evaluating the 250 prompts (forward passes with metric hooks, label
log-probabilities, all bootstrap CIs, the shared PCA and permutation nulls) takes at most 1.2x the
time of bare batched forward passes over the same prompts (same batch size, same padding, no hooks,
no statistics). The two are run alternately ``--repeats`` times after a warm-up, so that load from
other processes hits both alike; we report the minimum of each and the ratio of the minima, plus
the median of the per-repeat ratios.

    python benchmarks/bench_sula.py [--repeats 3] [--batch-size 16] [--kind auto|hooked|bridge]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--kind", default="auto")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()

    import torch
    import transformer_lens

    import bayes_lens as bl
    from bayes_lens import adapter

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = bl.load_model(kind=args.kind)
    prompts = bl.sula.make_prompts(model, seed=0)  # 5 k values x 50 = 250 prompts
    texts = prompts.texts
    bs = args.batch_size
    batches = [adapter.tokenize(model, texts[i:i + bs]) for i in range(0, len(texts), bs)]

    def bare() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            for tokens, mask in batches:
                model(tokens, attention_mask=mask, return_type="logits")
        return time.perf_counter() - t

    def full() -> float:
        t = time.perf_counter()
        bl.sula.evaluate(model, prompts, batch_size=bs, n_boot=args.n_boot, progress=False)
        return time.perf_counter() - t

    # warm-up (first-call allocations, lazy imports): one batch through each path
    with torch.inference_mode():
        model(*batches[0][:1], attention_mask=batches[0][1], return_type="logits")
    bl.sula.evaluate(model, prompts[:bs], batch_size=bs, n_boot=10, progress=False)
    t_bare, t_full = [], []
    for _ in range(args.repeats):
        t_bare.append(bare())
        t_full.append(full())
    ratios = [f / b for f, b in zip(t_full, t_bare)]
    out = {
        "model": adapter.model_info(model).name, "kind": adapter.model_info(model).kind,
        "n_prompts": len(prompts), "batch_size": bs, "n_boot": args.n_boot,
        "bare_forward_s": t_bare, "evaluate_s": t_full,
        "bare_forward_min_s": min(t_bare), "evaluate_min_s": min(t_full),
        "ratio_of_minima": min(t_full) / min(t_bare), "median_ratio": statistics.median(ratios),
        "target": "<= 1.2", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "transformer_lens": getattr(transformer_lens, "__version__", "?"), "python": platform.python_version(),
        "load_average_1min": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
