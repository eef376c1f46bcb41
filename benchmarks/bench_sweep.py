"""Benchmark: what a sweep of interventions costs on each model kind (METHODS.md §13, "resumed passes").

Three measurements on the default model (SmolLM2-135M), for the kind asked for:

``resume``
    k removals at ``resid_post`` of layer L from the clean stream kept after L, stacked
    (``bl.collect.collect_each``), timed in units of one whole clean pass over the same prompts and printed
    beside the prediction 1 + k·(1 − (L + 1)/n_layers) (the clean pass plus k runs of the later blocks).
``swap``
    k swaps at the final position on 64-token prompts: the final-position route (the later blocks at one
    position, against the clean prefix's key-value cache), the whole-prompt resumed route and whole patched
    passes (the route before resuming), and a plain single-position forward through the later blocks (the
    physical floor the route is measured against).
``docs``
    docs/localize.md's first block as written (``bl.localize(model, items)``: three layers, ranks (1, 4),
    40 draws of each null), and ``quick=True``; with ``--check`` the quick table is also made with whole
    passes (``resume=False``) and compared number by number, verdicts included.

Prints the machine, torch's threads and the load average before and after: take figures on a quiet machine.

Usage::

    python benchmarks/bench_sweep.py resume [--kind hooked|bridge] [--layer 22] [--k 8]
    python benchmarks/bench_sweep.py swap [--kind ...] [--layer 22] [--k 8]
    python benchmarks/bench_sweep.py docs [--kind ...] [--check] [--skip-full]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib.metadata import version

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402
from bayes_lens.collect import StreamKeeper, collect, collect_each  # noqa: E402
from bayes_lens.interventions import Intervention, orthonormal  # noqa: E402


def _timed(fn, repeat: int = 1) -> float:
    fn()  # warm
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat


def _texts(n: int, n_words: int, seed: int = 0):
    words = "the cat sat on a mat and then it ran to the big red barn where a dog slept".split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, n_words)) for _ in range(n)]


def _kept(model, texts, layer, batch_size):
    keeper = StreamKeeper(model, [layer])
    collect(model, texts, token_ids=[1, 2], fwd_hooks=keeper, batch_size=batch_size, progress=False)
    return keeper.stream(layer, len(texts))


def bench_resume(model, layer: int, k: int, n: int, batch_size: int) -> None:
    texts = _texts(n, 40)
    d, n_layers = model.cfg.d_model, model.cfg.n_layers
    rng = np.random.default_rng(1)
    conds = [[Intervention(layer=layer, site="resid_post", basis=orthonormal(rng.normal(size=(d, 4))))]
             for _ in range(k)]
    whole = _timed(lambda: collect(model, texts, token_ids=[1, 2], batch_size=batch_size, progress=False), 2)

    def resumed():
        kept = _kept(model, texts, layer, batch_size)  # the clean pass, keeping the stream
        collect_each(model, texts, conds, resume=kept, token_ids=[1, 2], batch_size=batch_size, progress=False)

    t = _timed(resumed, 1)
    pred = 1 + k * (1 - (layer + 1) / n_layers)
    print(f"resume: {n} prompts of ~40 words, k = {k} removals (rank 4) at resid_post of layer {layer}/{n_layers}: "
          f"whole clean pass {whole:.2f} s; clean pass + k resumed = {t:.2f} s = {t / whole:.2f} whole passes, "
          f"predicted 1 + k(1 - (L+1)/n) = {pred:.2f} (Δ {t / whole - pred:+.2f})")


def bench_swap(model, layer: int, k: int, n: int, batch_size: int) -> None:
    texts = _texts(n, 63)
    d = model.cfg.d_model
    rng = np.random.default_rng(2)
    donors = torch.tensor(rng.normal(size=(n, d)), dtype=torch.float32)
    conds = [[Intervention(layer=layer, site="resid_post", basis=orthonormal(rng.normal(size=(d, 1))), op="swap",
                           positions="final", source=donors)] for _ in range(k)]
    kept = _kept(model, texts, layer, batch_size)
    assert kept.final_position_ok(), kept.final_delta
    final = _timed(lambda: collect_each(model, texts, conds, resume=kept, token_ids=[1, 2], batch_size=batch_size,
                                        progress=False), 2)
    kept._final_ok = False  # the whole-prompt resumed route, for comparison
    prompt = _timed(lambda: collect_each(model, texts, conds, resume=kept, token_ids=[1, 2], batch_size=batch_size,
                                         progress=False), 1)
    whole = _timed(lambda: [collect(model, texts, token_ids=[1, 2], interventions=c, batch_size=batch_size,
                                    progress=False) for c in conds], 1)
    # the floor: one position per prompt and swap through the later blocks, no cache, no attention to a prefix
    resid = kept.batches[0][1][:, -1:].repeat_interleave(k, 0)
    with torch.inference_mode():
        floor = _timed(lambda: bl.adapter.run_from_layer(model, resid, layer, kept.batches[0][0].tokens[:, -1:]
                                                         .repeat_interleave(k, 0),
                                                         torch.ones(resid.shape[0], 1, dtype=torch.long)), 3)
    floor *= len(kept.batches)
    ntok = int(kept.batches[0][0].attention_mask.sum(1).float().mean())
    print(f"swap: {n} prompts of {ntok} tokens, k = {k} final-position swaps at layer {layer}: final-position route "
          f"{final:.3f} s; whole-prompt resumed {prompt:.3f} s ({prompt / final:.1f}x); whole patched passes "
          f"{whole:.3f} s ({whole / final:.1f}x); a bare single-position forward through the later blocks "
          f"{floor:.3f} s (route / floor = {final / floor:.2f}); max |Δ log p| of the route {kept.final_delta:.1e}")


def bench_docs(model, check: bool, skip_full: bool) -> None:
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=8)
    t = time.perf_counter()
    quick = bl.localize(model, items, quick=True)
    tq = time.perf_counter() - t
    print(f"docs: quick=True: {tq:.0f} s, {len(quick.table)} rows; verdicts {list(quick.layers_table['verdict'])}")
    if check:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slow = bl.localize(model, items, quick=True, resume=False)
        a, b = quick.table, slow.table
        cols = [c for c in a.columns if a[c].dtype.kind == "f"]
        worst = max(float(np.nanmax(np.abs(a[c].to_numpy() - b[c].to_numpy()))) if len(a) else 0.0 for c in cols)
        same = list(a.get("verdict", [])) == list(b.get("verdict", [])) and \
            list(quick.layers_table["verdict"]) == list(slow.layers_table["verdict"])
        print(f"docs: quick=True, whole passes (resume=False): max |Δ| over {len(cols)} numeric columns {worst:.1e}; "
              f"same verdicts: {same}")
    if not skip_full:
        t = time.perf_counter()
        loc = bl.localize(model, items)
        tf = time.perf_counter() - t
        print(f"docs: first block (bl.localize(model, items), defaults): {tf:.0f} s = {tf / 60:.1f} min, "
              f"{len(loc.table)} rows; verdicts {list(loc.layers_table['verdict'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("resume", "swap", "docs"))
    ap.add_argument("--kind", default=None, help="hooked or bridge (default: what bl.load_model() returns)")
    ap.add_argument("--layer", type=int, default=22)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--skip-full", action="store_true")
    args = ap.parse_args()
    model = bl.load_model(**({} if args.kind is None else {"kind": args.kind}))
    load0 = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {type(model).__name__}, TransformerLens {version('transformer-lens')}, "
          f"load average before {load0[0]:.2f}")
    if args.what == "resume":
        bench_resume(model, args.layer, args.k, args.n, args.batch_size)
    elif args.what == "swap":
        bench_swap(model, args.layer, args.k, args.n, args.batch_size)
    else:
        bench_docs(model, args.check, args.skip_full)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
