"""Could ``p_value="exact"`` change a verdict of a table recorded under the prediction-interval p? Check one cell.

Under the two-stage exact p (METHODS.md §13) a test's p is its first-stage rank p, (1 + #{draws ≥ x}) / (1 + m₁),
unless the candidate beats every one of its null's m₁ first draws; only then is the null drawn on. So a recorded
candidate whose statistic some first draw reaches has p ≥ 2 / (m₁ + 1) under ``"exact"`` (0.049 with 40 draws),
and in a Holm family of n tests it can clear only if that is ≤ α / (n − j + 1) at its step j: with 24 tests and 40
draws, never before the 23rd step. This reruns one (layer, rank) cell of a recorded ``bl.localize`` table with the
recipe's prompts and seed (draws, donors and folds are keyed per layer and draw number, so the cell's numbers are
the recorded ones; the script prints both) and says, for each non-random row and each test, how many first draws
reach it.

    python tools/localize_exact_check.py --model gemma-3-270m --layer 8 --rank 4     # in .venv-tl4 for the bridge

Runs on 2026-12-07 (TL 4.3 bridge, 2 cores shared with the test suite, load average 4): SmolLM2's layer-22 rank-4
frame, with this script (284 s; Δ MAE −0.086420 and swap +1.305195 against the recorded −0.086420 and +1.305194;
27 and 11 of 40 covariance-matched draws reach them). Gemma 3 270M's layer-8 rank-4 frame, the one fitted row of
the recorded tables whose swap lies above its band's 97.5th percentile, with the same ``bl.localize`` call as here
before this script existed (525 s): swap +0.738343 against the recorded +0.738344, and the largest of its 40
covariance-matched draws +0.925, so its exact p is 2/41 (docs/localize.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="a bl.load_model name (default: SmolLM2-135M)")
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--n-random", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    model = bl.load_model(args.model)
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=8, seed=0)   # the recipe's prompts
    t0 = time.perf_counter()
    loc = bl.localize(model, items, layers=[args.layer], ranks=(args.rank,), estimators=(), n_random=args.n_random,
                      n_boot=1000, n_null=50, seed=args.seed, progress=False)
    t = loc.table
    print(f"{type(model).__name__}, layer {args.layer}, rank {args.rank}, {args.n_random} draws per null: "
          f"{time.perf_counter() - t0:.0f} s")
    rand = t[t["kind"] == "random"]
    recorded = {}
    key = {"default": "localize-smollm2", "gemma-3-270m": "localize-gemma"}.get(args.model)
    if key:
        rows = json.loads((ROOT / "docs" / "readme_numbers.json").read_text(encoding="utf-8"))[key]["numbers"]["rows"]
        recorded = {r["subspace"]: r for r in rows if r["layer"] == args.layer}
    for _, r in t[t["kind"] != "random"].iterrows():
        draws = rand[rand["null"] == r["null"]]
        for stat, pcol in (("delta_mae_bits", "removal_p_exact"), ("swap_bits", "swap_p_exact")):
            reach = int((draws[stat].to_numpy() >= r[stat]).sum())
            rec = recorded.get(r["subspace"], {}).get(stat)
            print(f"  {r['subspace']:<12} {stat:<15} {r[stat]:+.6f}"
                  + (f" (recorded {rec:+.6f})" if rec is not None else "")
                  + f"; {reach} of {len(draws)} {r['null']} draws reach it; exact p "
                  + (f"{r[pcol]:.4g}" if reach else "needs the extension"))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
