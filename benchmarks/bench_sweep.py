"""Benchmark: what a sweep of interventions costs on each model kind (METHODS.md §13, "resumed passes").

Three measurements on the default model (SmolLM2-135M), for the kind asked for:

``resume``
    k removals at ``resid_post`` of layer L from the clean stream kept after L, stacked
    (``bl.collect.collect_each``), timed in units of one whole clean pass over the same prompts and printed
    beside the prediction 1 + k·(1 − (L + 1)/n_layers) (the clean pass plus k runs of the later blocks).
``swap``
    k swaps at the final position on 64-token prompts: the final-position route (the later blocks at one
    position, against the clean prefix's key-value cache), the whole-prompt resumed route and whole patched
    passes (the route before resuming), and two floors the route is measured against (interleaved repeats,
    medians): the model's own single-position step through the later blocks against the same prefix cache,
    all b·k rows of a batch in one call with the cache's rows repeated before the clock starts (the issue's
    "single-position forward through the later blocks"), and a bare single-position forward with no prefix
    at all (no attention to the cache; below any route). The unembedding runs at the one position in all.
    ``--skip-full`` leaves out the whole-prompt and whole-pass comparisons (the ratios to the floors only).
``docs``
    docs/localize.md's first block as written (``bl.localize(model, items)``: three layers, ranks (1, 4),
    40 draws of each null), and ``quick=True``; with ``--check`` the quick table is also made with whole
    passes (``resume=False``) and compared number by number, verdicts included.

Prints the machine, torch's threads and the load average before and after: take figures on a quiet machine.

Usage::

    python benchmarks/bench_sweep.py resume [--kind hooked|bridge] [--layer 22] [--k 8]
    python benchmarks/bench_sweep.py swap [--kind ...] [--layer 22] [--k 8] [--skip-full]
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


def _floors(model, kept, layer: int, k: int):
    """Two floors for k final-position edits of every kept batch, each one call per batch of b·k rows, nothing
    of the runner (no interventions, no reads, no chunking): ``cached``, the model's own single-position step
    through the later blocks against the batch's clean prefix cache (rows repeated and masked to each prompt's
    own prefix before the clock starts); ``bare``, one position with no prefix at all (no attention to a cache:
    below what any route can reach)."""
    from bayes_lens.adapter import _resume

    steps = []
    for batch, resid in kept.batches:
        last = batch.last_index.cpu()
        r = torch.arange(len(last))
        x = resid[r, last][:, None].repeat_interleave(k, 0)
        toks = batch.tokens[r, last][:, None]
        kv = _prefix_kv(model, batch.tokens[:, :int(last.max())])
        lengths = last.repeat_interleave(k)
        if bl.adapter.is_bridge(model):
            rep = _resume._step_cache(kv, k, layer + 1)  # repeated once; each step copies only layer objects
            steps.append(lambda x=x, toks=toks, rep=rep, lengths=lengths: _bridge_step(model, x, layer, toks, rep,
                                                                                        lengths, k))
        else:
            rep = _resume._repeated_tl_cache(kv, k, layer + 1)
            mask = _step_mask(lengths, rep.previous_attention_mask.shape[1])
            steps.append(lambda x=x, rep=rep, mask=mask: model(x, start_at_layer=layer + 1, past_kv_cache=rep,
                                                               attention_mask=mask, return_type="logits"))
    ones = torch.ones(kept.batches[0][1].shape[0] * k, 1, dtype=torch.long)
    zeros = torch.zeros(len(ones), dtype=torch.long)

    def cached():
        with torch.inference_mode(), bl.adapter.final_token_unembedding(model, zeros):
            for step in steps:
                step()

    def bare():
        with torch.inference_mode(), bl.adapter.final_token_unembedding(model, zeros):
            for batch, resid in kept.batches:
                last = batch.last_index.cpu()
                r = torch.arange(len(last))
                bl.adapter.run_from_layer(model, resid[r, last][:, None].repeat_interleave(k, 0), layer,
                                          batch.tokens[r, last][:, None].repeat_interleave(k, 0), ones[:len(r) * k])

    return cached, bare


def _prefix_kv(model, tokens):
    """The model's own key-value cache of a causal, unmasked pass over ``tokens`` (built here, not by the route,
    so the floors time the same thing whatever the route's code)."""
    from bayes_lens.adapter import _resume

    ones = torch.ones_like(tokens)
    with torch.inference_mode():
        if not bl.adapter.is_bridge(model):
            kv = _resume._tl_kv_cache_class().init_cache(model.cfg, model.cfg.device, tokens.shape[0])
            model(tokens, attention_mask=ones, past_kv_cache=kv, return_type=None)
            kv.freeze()
            return kv
        with _resume._cache_named_for_tl(model):
            return model(tokens, attention_mask=ones, use_cache=True, return_type="logits_and_cache")[1]


def _step_mask(lengths, t: int):
    """A row's first ``length`` cached keys and the new position; the keys after them masked out."""
    return torch.cat([torch.arange(t)[None, :] < lengths[:, None], torch.ones(len(lengths), 1, dtype=torch.bool)],
                     1).long()


def _bridge_step(model, x, layer, toks, rep, lengths, k):
    import warnings

    from bayes_lens.adapter import _resume

    c = _resume._step_cache(rep, 1, layer + 1)
    mask = _step_mask(lengths, int(c.get_seq_length()))
    with _resume._skipped_blocks(model, layer, x), _resume._cache_named_for_tl(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(toks.repeat_interleave(k, 0), attention_mask=mask, position_ids=lengths[:, None],
                     past_key_values=c, use_cache=True, return_type="logits")


def bench_swap(model, layer: int, k: int, n: int, batch_size: int, repeat: int = 3, skip_full: bool = False) -> None:
    texts = _texts(n, 63)
    d = model.cfg.d_model
    rng = np.random.default_rng(2)
    donors = torch.tensor(rng.normal(size=(n, d)), dtype=torch.float32)
    conds = [[Intervention(layer=layer, site="resid_post", basis=orthonormal(rng.normal(size=(d, 1))), op="swap",
                           positions="final", source=donors)] for _ in range(k)]
    kept = _kept(model, texts, layer, batch_size)
    assert kept.final_position_ok(), kept.final_delta

    def route():
        collect_each(model, texts, conds, resume=kept, token_ids=[1, 2], batch_size=batch_size, progress=False)

    cached, bare = _floors(model, kept, layer, k)
    times = {"route": [], "cached": [], "bare": []}
    for fn in (route, cached, bare):
        fn()  # warm (the route builds its prefix caches here, once per stream)
    for _ in range(repeat):  # interleaved, so a change in load touches all three alike
        for name, fn in (("route", route), ("cached", cached), ("bare", bare)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    final, floor_c, floor_b = (float(np.median(times[k_])) for k_ in ("route", "cached", "bare"))
    prompt = whole = float("nan")
    if not skip_full:
        kept._final_ok = False  # the whole-prompt resumed route, for comparison
        prompt = _timed(lambda: collect_each(model, texts, conds, resume=kept, token_ids=[1, 2],
                                             batch_size=batch_size, progress=False), 1)
        whole = _timed(lambda: [collect(model, texts, token_ids=[1, 2], interventions=c, batch_size=batch_size,
                                        progress=False) for c in conds], 1)
    ntok = int(kept.batches[0][0].attention_mask.sum(1).float().mean())
    finals = sorted({int(i) for b, _ in kept.batches for i in b.last_index})
    print(f"swap: {n} prompts of ~{ntok} tokens (final indices {finals[0]}..{finals[-1]}), k = {k} final-position "
          f"swaps at layer {layer}, medians of {repeat} interleaved repeats: final-position route {final:.3f} s; "
          f"whole-prompt resumed {prompt:.3f} s ({prompt / final:.1f}x); whole patched passes {whole:.3f} s "
          f"({whole / final:.1f}x); the model's own single-position step through the later blocks against the "
          f"prefix cache, all b·k rows of a batch in one call {floor_c:.3f} s (route / cached floor = "
          f"{final / floor_c:.2f}); a bare single-position forward without a prefix {floor_b:.3f} s (route / bare "
          f"floor = {final / floor_b:.2f}); max |Δ log p| of the route {kept.final_delta:.1e}")


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
        x, y = (np.stack([t[c].to_numpy(dtype=np.float64) for c in cols]) for t in (a, b))
        nan_differs = int((np.isnan(x) != np.isnan(y)).sum())   # a number on one route, NaN on the other
        both = ~np.isnan(x) & ~np.isnan(y)                      # (NaN on both: a p of a null row, and the like)
        worst = float(np.abs(x - y)[both].max()) if both.any() else 0.0
        same = list(a.get("verdict", [])) == list(b.get("verdict", [])) and \
            list(quick.layers_table["verdict"]) == list(slow.layers_table["verdict"])
        print(f"docs: quick=True, whole passes (resume=False): max |Δ| over {len(cols)} numeric columns {worst:.1e}; "
              f"cells NaN on one route only: {nan_differs}; same verdicts: {same}")
    if not skip_full:
        t = time.perf_counter()
        loc = bl.localize(model, items)
        tf = time.perf_counter() - t
        r = loc.table[loc.table["kind"] == "random"]
        drawn_on = int((r["draw"] >= bl.ablation.Design().n_random).sum()) if "draw" in r else 0
        print(f"docs: first block (bl.localize(model, items), defaults): {tf:.0f} s = {tf / 60:.1f} min, "
              f"{len(loc.table)} rows ({len(r)} null draws, {drawn_on} of them p_value='exact''s further draws); "
              f"verdicts {list(loc.layers_table['verdict'])}")


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
        bench_swap(model, args.layer, args.k, args.n, args.batch_size, skip_full=args.skip_full)
    else:
        bench_docs(model, args.check, args.skip_full)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
