"""Benchmark: bl.martingale.predictive (one pass per sequence) vs one pass per prefix.

The target workload is 100 balanced sequences of length 198 (Paper B's largest n). The
one-pass predictive is timed on ``--n-seqs`` sequences; the per-prefix approach (a forward pass over
the tokens up to each reading position, the logits read at its last token) is timed on a sample of
``--prefix-sample`` prefix lengths of ``--prefix-seqs`` sequences, a linear cost model
time = a + b·tokens is fitted to those timings and summed over every prefix of every sequence.
Both extrapolations (to 100 sequences, to all prefixes) are printed as such. Agreement is the max
absolute difference of P(next = 1) between the two approaches on the sampled prefixes.

Usage::

    python benchmarks/bench_martingale.py                       # SmolLM2, defaults below
    python benchmarks/bench_martingale.py --n-seqs 100 --prefix-seqs 2 --prefix-sample 40   # full run (GPU)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--target-seqs", type=int, default=100)
    ap.add_argument("--length", type=int, default=198)
    ap.add_argument("--n-seqs", type=int, default=8, help="sequences actually run through the one-pass predictive")
    ap.add_argument("--prefix-seqs", type=int, default=1, help="sequences whose prefixes are sampled")
    ap.add_argument("--prefix-sample", type=int, default=12, help="prefix lengths timed per sequence")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import bayes_lens as bl
    from bayes_lens.martingale import DEFAULT_TEMPLATE, balanced_sequences, predictive
    from bayes_lens.martingale._predict import _layout

    t = time.perf_counter()
    model = bl.load_model(args.model)
    print(f"model {type(model).__name__} loaded in {time.perf_counter() - t:.1f} s; torch threads {torch.get_num_threads()}")
    rng = np.random.default_rng(args.seed)
    seqs = balanced_sequences(args.length, max(args.n_seqs, args.prefix_seqs), rng)

    predictive(model, seqs[:1, :8])  # warm-up
    t = time.perf_counter()
    p = predictive(model, seqs[: args.n_seqs], batch_size=args.batch_size).numpy()
    one_pass = time.perf_counter() - t
    one_pass_target = one_pass * args.target_seqs / args.n_seqs

    tok = model.tokenizer
    _, _, sym = _layout(tok, DEFAULT_TEMPLATE, [0, 1])
    times, lengths, diffs = [], [], []
    all_prefix_tokens = []
    for i in range(args.prefix_seqs):
        ids, pos, _ = _layout(tok, DEFAULT_TEMPLATE, seqs[i])
        all_prefix_tokens.append(pos.astype(float))  # prefix t has pos[t] tokens
        sample = np.unique(np.linspace(0, args.length - 1, args.prefix_sample).round().astype(int))
        for t_idx in sample:
            toks = torch.tensor([ids[: pos[t_idx]]])
            t = time.perf_counter()
            with torch.inference_mode():
                lg = model(toks, return_type="logits")[0, -1].double()
            times.append(time.perf_counter() - t)
            lengths.append(pos[t_idx])
            diffs.append(abs(torch.sigmoid(lg[sym[1]] - lg[sym[0]]).item() - p[i, t_idx]))
    b, a = np.polyfit(lengths, times, 1)
    per_seq_prefix_cost = float(np.mean([np.sum(a + b * L) for L in all_prefix_tokens]))
    per_prefix_target = per_seq_prefix_cost * args.target_seqs
    print()
    print(f"| workload: {args.target_seqs} sequences x {args.length} symbols | seconds | how |")
    print("|---|---|---|")
    print(f"| one pass per sequence (bl.martingale.predictive) | {one_pass_target:.1f} | measured on {args.n_seqs} "
          f"sequences ({one_pass:.1f} s), scaled x{args.target_seqs / args.n_seqs:g} |")
    print(f"| one pass per prefix | {per_prefix_target:.1f} | {len(times)} prefix passes timed, cost model "
          f"{a:.3f} s + {b * 1e3:.3f} ms/token summed over all {args.length} prefixes x {args.target_seqs} |")
    print(f"| speedup | {per_prefix_target / one_pass_target:.0f}x | |")
    print(f"| max abs difference of P(next=1) | {max(diffs):.2e} | over the {len(diffs)} sampled prefixes |")


if __name__ == "__main__":
    main()
