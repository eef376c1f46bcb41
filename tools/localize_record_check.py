"""Check that bl.localize still gives the SmolLM2 numbers recorded under the earlier rule (recipe
``localize-smollm2`` of docs/readme_numbers.json at commit 58fb3f2, read with ``git show``: the HookedTransformer,
10 Haar draws) for one layer: the held-out R², the Δ MAE and swap point estimates and the Haar bands.

The redesign into one intervention object and one runner promised that every recorded number still reproduces to the
digit; this checks it for the parts of the table the later rule change (intervals, matched nulls, Holm) left as
they were: it reruns the recipe's call at one layer (the draws,
folds and bootstrap indices are keyed per layer, so one layer's rows are the recorded ones) with the Haar null only,
and prints the largest difference per column.

    python tools/localize_record_check.py [--layer 7] [--rev 58fb3f2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLS = ("r2", "r2_null_q95", "delta_mae_bits", "swap_bits", "band_low", "band_high", "swap_band_low", "swap_band_high")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", type=int, default=7)
    ap.add_argument("--rev", default="58fb3f2", help="the commit whose record to check (default: the last one made "
                    "under the earlier rule; today's record uses matched nulls, 40 draws and the TL 4.3 bridge)")
    ap.add_argument("--tol", type=float, default=1e-5,
                    help="largest difference allowed (default 1e-5: the pages print 2-3 significant digits; the one "
                    "PC1 and the batched swap reorder float32 arithmetic in the 7th)")
    args = ap.parse_args(argv)
    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    text = subprocess.run(["git", "show", f"{args.rev}:docs/readme_numbers.json"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    rec = json.loads(text)["localize-smollm2"]
    want = [r for r in rec["numbers"]["rows"] if r["layer"] == args.layer]
    model = bl.load_model("default")
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=8, seed=0)
    t0 = time.perf_counter()
    loc = bl.localize(model, items, layers=[args.layer], ranks=(1, 4), n_random=10, n_boot=1000, n_null=50, seed=0,
                      nulls=("haar",), progress=False)
    secs = time.perf_counter() - t0
    t = loc.table.set_index("subspace")
    worst = {}
    for r in want:
        for c in COLS:
            worst[c] = max(worst.get(c, 0.0), abs(float(t.loc[r["subspace"], c]) - float(r[c])))
    for c, w in worst.items():
        print(f"{c:16s} max |Δ| = {w:.3g}")
    ok = all(w <= args.tol for w in worst.values())
    print(f"{len(want)} recorded rows at layer {args.layer}, {type(model).__name__}, {secs:.0f} s: "
          + ("the same to the digit" if ok else f"DIFFERENT (tolerance {args.tol})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
