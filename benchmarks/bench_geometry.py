"""Benchmark: bl.geometry against bare forward passes and a naive run_with_cache baseline (SmolLM2-135M).

The variants on the same 64 prompts (batch size 16, right padding):

* ``bare``     — the user's plain forward passes: ``model(tokens, attention_mask=mask)`` per batch, with
  full logits at every position (tokenization included, as in the other variants);
* ``bare_grouped`` — the same plain passes in the batches ``bl.geometry`` runs: the prompts in
  ``bl.collect.run_order`` (similar lengths together), so tokenized, masked and batched alike — the
  like-for-like baseline of the runner's pass (``bare`` is what a user's loop in the given order costs);
* ``floor``    — ``bare_grouped`` with the unembedding at each prompt's final token only, and nothing of
  bayes_lens: the least any geometry pass must compute (``floor / bare_grouped`` bounds every geometry
  target from below; ``geometry / floor`` is what bayes_lens's hooks and statistics add);
* ``geometry`` — ``bl.geometry(model, prompts)`` with its defaults (1,000 bootstrap resamples,
  200 null simulations, 1,000 permutations): one streaming pass with metric hooks + statistics;
* ``naive``    — ``model.run_with_cache(tokens, attention_mask=mask)`` of *every* hook for every
  batch, all caches kept, then the same statistics computed from the caches.

Time: bare, bare_grouped, floor and geometry run interleaved in one process (``--repeats`` rounds after a
warm-up pass, in a new random order each round, so neither load from other processes nor the position
in a round favours one), then naive in rounds of its own; the best (minimum) and median
wall-clock and the best CPU (process) time are reported — on a busy machine the minimum is the
stable estimate. Peak memory: each variant runs once in its own subprocess;
after loading the model and a warm-up pass the peak-RSS counter is reset (``/proc/self/clear_refs``
"5"), and the extra peak is ``VmHWM`` after the run minus ``VmRSS`` before it. The memory target
compares what each variant adds *above the bare forward pass's own peak* (logits, activations).

Targets: geometry time ≤ 0.85 × bare at the short and ≈ 64-token prompts, ≤ 0.9 × at 1,024 tokens (the
runner computes the unembedding at the final token only, so it does less than a plain forward); geometry extra peak ≤ 10% of naive's extra peak (the runner keeps only the final-position
reductions, a naive ``run_with_cache`` keeps every activation). Each time ratio is given as best wall over
best wall and as the median of the per-round ratios; geometry / floor (target ≤ 1.05×) also with a 95%
bootstrap interval over the rounds and a verdict on it (:func:`ratio_ci`), on wall-clock time (the target's)
and on CPU time (the work, less moved by other processes). ``--floor-only`` times floor and geometry alone
(no other variant, no memory), so more rounds fit and that interval narrows.

Page faults: each pass's minor page faults are recorded (``minor_faults_all``). On this machine a
TransformerBridge pass of 64 × 64 tokens took 0.1–0.45 million of them, differing up to 30-fold between
identical passes, while a HookedTransformer pass took almost none: glibc's malloc returning memory to
the system and faulting it back. That moves a bridge's times by several per cent either way. Fixed
thresholds (``MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432`` in the environment,
inherited by the children) removed the faults (under 100 a pass); the settings in force are printed.

Kinds: ``--kind all`` (the default) runs every kind available, each in a subprocess: the
TL 3 ``HookedTransformer`` and ``TransformerBridge`` of the TL 3 venv and the TL 4 bridge of the TL 4
venv (``.venv`` / ``.venv-tl4`` of the repository or next to this interpreter's venv, or the
interpreters given with ``--python``), then prints one summary table. ``--seq-len N`` replaces the 64
templated prompts by ``--n-prompts`` prompts of exactly ``N`` random tokens (space-led word tokens that
re-tokenize to themselves; seeded), batched by ``--batch``.

Long-prompt memory: ``--memory-seq-len 4096`` measures, on one prompt of that many tokens,
``bl.geometry``'s peak above the bare forward's peak, against what a ``run_with_cache`` of the hooks
geometry needs (``names_filter=bl.hook_filter(model)``: ``hook_v`` and ``hook_pattern`` of every layer)
keeps: the bytes of those activations, summed in a forward pass that keeps none of them (a real
``run_with_cache`` at 4k tokens holds ≈ 18 GiB of patterns on SmolLM2). Below ``--real-cache-max-gib``
(default 2) of patterns the real ``run_with_cache`` is measured too, as a check of the sum. Slow on a
CPU: run it once.

Usage::

    python benchmarks/bench_geometry.py [--repeats 3] [--kind all|auto|hooked|bridge] [--seq-len N --n-prompts 4
        --batch 4] [--threads N] [--json out.json]
    python benchmarks/bench_geometry.py --floor-only --seq-len 64 --n-prompts 64 --batch 16 --repeats 20
    python benchmarks/bench_geometry.py --memory-seq-len 4096 --kind bridge
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

N_PROMPTS = 64
BATCH = 16
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"seq_len": None, "n_prompts": N_PROMPTS, "batch": BATCH}  # set by main() (and passed to children)

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


def random_token_prompts(model, n: int, seq_len: int, seed: int = 0):
    """``n`` prompts of exactly ``seq_len`` tokens (BOS excluded): seeded random space-led word tokens
    (`` the``, `` river``) whose concatenation the tokenizer splits back into the same tokens (checked)."""
    import random

    tok = model.tokenizer
    words = []
    for i in range(min(len(tok), 50000)):
        t = tok.decode([i])
        if re.fullmatch(r" [a-z]{3,10}", t) and tok(t, add_special_tokens=False)["input_ids"] == [i]:
            words.append(t)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = "".join(rng.choice(words) for _ in range(seq_len))
        got = len(tok(text, add_special_tokens=False)["input_ids"])
        if got != seq_len:
            raise RuntimeError(f"a random prompt re-tokenized to {got} tokens, not {seq_len}")
        out.append(text)
    return out


def bench_prompts(model):
    """The prompts of this run: the 64 templated ones, or ``--seq-len`` random-token ones."""
    if SETTINGS["seq_len"]:
        return random_token_prompts(model, SETTINGS["n_prompts"], SETTINGS["seq_len"])
    return make_prompts(SETTINGS["n_prompts"])


def _status(field: str) -> int:
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1))  # kB


def _load(kind: str):
    import bayes_lens as bl

    return bl.load_model(kind=kind)


def run_bare(model, prompts):
    import torch

    from bayes_lens import adapter

    b = SETTINGS["batch"]
    with torch.inference_mode():
        for s in range(0, len(prompts), b):
            toks, mask = adapter.tokenize(model, prompts[s:s + b])
            model(toks, attention_mask=mask)


def grouped_batches(model, prompts):
    """``(tokens, mask)`` of the batches bl.geometry runs: the prompts in ``bl.collect.run_order``, right padded."""
    from bayes_lens import adapter
    from bayes_lens.collect import run_order

    b = SETTINGS["batch"]
    ids = adapter.encode_prompts(model, prompts)
    order = run_order(prompts)
    for s in range(0, len(order), b):
        yield adapter.pad_batch(model, [ids[i] for i in order[s:s + b]])


def run_bare_grouped(model, prompts):
    """The bare forward in the batches bl.geometry runs (the prompts in ``bl.collect.run_order``)."""
    import torch

    with torch.inference_mode():
        for toks, mask in grouped_batches(model, prompts):
            model(toks, attention_mask=mask)


def run_floor(model, prompts):
    """The limit of a geometry pass: ``bare_grouped`` with the unembedding at each row's final real token only.

    Everything a plain forward computes except the logits of the other positions (a forward pre-hook on
    ``model.unembed`` keeps one position per row), and none of bayes_lens: no metric hooks, no
    statistics. On a HookedTransformer the unembedding is the plain product ``x @ W_U + b_U``: TL 3.9's
    ``Unembed`` copies ``W_U.T`` on every call, work no pass needs (bayes_lens's runner skips it too).
    ``geometry / floor`` is what bayes_lens adds on top of the least a geometry pass must compute.
    """
    import torch

    from bayes_lens import adapter

    def final_only(last):
        def pre(module, args):
            x = args[0]
            return (x[torch.arange(x.shape[0]), last].unsqueeze(1),) + tuple(args[1:])
        return pre

    unembed = model.unembed
    plain = not adapter.is_bridge(model) and hasattr(unembed, "W_U")
    with torch.inference_mode():
        for toks, mask in grouped_batches(model, prompts):
            handle = unembed.register_forward_pre_hook(final_only(mask.sum(1) - 1))  # right padding
            if plain:
                unembed.forward = lambda x: x @ unembed.W_U + unembed.b_U
            try:
                model(toks, attention_mask=mask)
            finally:
                handle.remove()
                if plain:
                    del unembed.forward


def run_geometry(model, prompts):
    import bayes_lens as bl

    return bl.geometry(model, prompts, batch_size=SETTINGS["batch"], progress=False)


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
    b = SETTINGS["batch"]
    with torch.inference_mode():
        for s in range(0, len(prompts), b):
            toks, mask = adapter.tokenize(model, prompts[s:s + b])
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


VARIANTS = {"bare": run_bare, "bare_grouped": run_bare_grouped, "floor": run_floor, "geometry": run_geometry,
            "naive": run_naive}
MEMORY_VARIANTS = ("bare", "geometry", "naive")  # bare_grouped and floor are timed only


def memory_child(variant: str, kind: str) -> dict:
    import gc

    model = _load(kind)
    prompts = bench_prompts(model)
    run_bare(model, prompts[:SETTINGS["batch"]])  # warm-up (allocator, kernels)
    gc.collect()
    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM) to the current RSS
    t0, c0 = time.perf_counter(), time.process_time()
    VARIANTS[variant](model, prompts)
    return dict(variant=variant, extra_peak_mib=(_status("VmHWM") - rss0) / 1024, rss_before_mib=rss0 / 1024,
                wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)


def timing(kind: str, repeats: int, floor_only: bool = False) -> dict:
    model = _load(kind)
    prompts = bench_prompts(model)
    run_bare(model, prompts)  # warm-up
    phases = [["floor", "geometry"]] if floor_only else [["bare", "bare_grouped", "floor", "geometry"], ["naive"]]
    walls = {v: [] for ph in phases for v in ph}
    cpus = {v: [] for ph in phases for v in ph}
    faults = {v: [] for ph in phases for v in ph}  # minor page faults per pass (glibc handing memory back and forth)
    # the compared variants in a new random order every round (a variant that always ran first, right
    # after naive freed its caches, paid the page faults: 3-6% in the rounds of 2026-12-01 17:06); naive,
    # which allocates gigabytes, in rounds of its own afterwards (--floor-only: floor and geometry only, so
    # more rounds fit in the same time and narrow the interval of the one ratio its target is on)
    rng = random.Random(0)
    for phase in phases:
        for _ in range(repeats):
            rng.shuffle(phase)
            for v in phase:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0, c0 = time.perf_counter(), time.process_time()
                VARIANTS[v](model, prompts)
                walls[v].append(time.perf_counter() - t0)
                cpus[v].append(time.process_time() - c0)
                faults[v].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    import importlib.metadata

    import torch

    import bayes_lens as bl

    n_tok = [int(m.sum()) for m in (bl.adapter.tokenize(model, [p])[1] for p in prompts)]
    return dict(kind=bl.adapter.model_info(model).kind, tl=importlib.metadata.version("transformer-lens"),
                settings=dict(SETTINGS, n_prompts=len(prompts)), mean_tokens=sum(n_tok) / len(n_tok),
                load_avg=os.getloadavg(), threads=torch.get_num_threads(), wall_s={v: statistics.median(w) for v, w in walls.items()},
                cpu_s={v: statistics.median(c) for v, c in cpus.items()},
                wall_all=walls, cpu_all=cpus, minor_faults_all=faults,
                malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")})


def long_memory_child(variant: str, kind: str, seq_len: int) -> dict:
    """One ``seq_len``-token prompt, batch 1: the extra peak RSS of ``variant`` (``bare``: the forward;
    ``geometry``: ``collect`` with ``bl.geometry``'s settings, i.e. its one pass — the statistics run on
    the kept final-token rows; ``cache_bytes``: bytes of the needed hooks' activations, summed in a pass
    keeping none; ``cache_real``: a real ``run_with_cache(names_filter=bl.hook_filter(model))``, kept)."""
    import gc

    import torch

    import bayes_lens as bl
    from bayes_lens.collect import collect

    model = _load(kind)
    prompts = random_token_prompts(model, 1, seq_len)
    run_bare(model, random_token_prompts(model, 1, 16, seed=1))  # warm-up (short: the long pass is slow)
    toks, mask = bl.adapter.tokenize(model, prompts)
    gc.collect()
    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0 = time.perf_counter()
    out = dict(variant=variant, n_tokens=int(mask.sum()))
    if variant == "bare":
        with torch.inference_mode():
            model(toks, attention_mask=mask)
    elif variant == "geometry":
        collect(model, prompts, value_layers=[-1], attention=True, batch_size=1, progress=False)
    elif variant == "cache_bytes":
        total = [0]
        names = [n for n in bl.adapter.hook_names(model) if bl.hook_filter(model)(n)]

        def count(act, hook=None):
            total[0] += act.numel() * act.element_size()

        with torch.inference_mode(), model.hooks(fwd_hooks=[(n, count) for n in names]):
            model(toks, attention_mask=mask)
        out.update(cache_mib=total[0] / 2**20, cached_hooks=len(names))
    else:  # cache_real
        with torch.inference_mode():
            _, cache = model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter(model))
        out.update(cache_mib=sum(v.numel() * v.element_size() for v in cache.values()) / 2**20,
                   cached_hooks=len(cache))
        del cache
    out.update(extra_peak_mib=(_status("VmHWM") - rss0) / 1024, wall_s=time.perf_counter() - t0)
    return out


def long_memory(args) -> dict:
    """The ``--memory-seq-len`` measurement (one child process per variant), printed as a table."""
    import importlib.metadata

    variants = ["bare", "geometry", "cache_bytes"]
    n_layers, n_heads = 30, 9  # SmolLM2-135M: the float32 patterns a real cache would hold
    pattern_gib = n_layers * n_heads * args.memory_seq_len ** 2 * 4 / 2**30
    if pattern_gib <= args.real_cache_max_gib:
        variants.append("cache_real")
    res = {}
    for v in variants:
        res[v] = _child(args, ["--_long_child", v, "--memory-seq-len", str(args.memory_seq_len)])
    geo_over = res["geometry"]["extra_peak_mib"] - res["bare"]["extra_peak_mib"]
    cache = res["cache_bytes"]["cache_mib"]
    print(f"SmolLM2-135M ({args.kind}), transformer-lens {importlib.metadata.version('transformer-lens')}, one prompt "
          f"of {res['bare']['n_tokens']} tokens, float32 CPU; load average {os.getloadavg()}")
    print()
    print("| variant | extra peak RSS (MiB) | above bare (MiB) | kept by the cache (MiB) | wall (s) |")
    print("|---|---:|---:|---:|---:|")
    for v in variants:
        r = res[v]
        over = r["extra_peak_mib"] - res["bare"]["extra_peak_mib"]
        print(f"| {v} | {r['extra_peak_mib']:.0f} | {over:.0f} | {r.get('cache_mib', float('nan')):.0f} | "
              f"{r['wall_s']:.0f} |")
    share = 100 * geo_over / cache
    print()
    print(f"geometry's peak above the bare forward: {geo_over:.0f} MiB = {share:.2f}% of the {cache:.0f} MiB a "
          f"run_with_cache of the {res['cache_bytes']['cached_hooks']} needed hooks keeps (target ≤ 5%): "
          f"{'PASS' if share <= 5 else 'FAIL'}" + ("" if "cache_real" in res else
                                                    f" (real run_with_cache not run: ≈ {pattern_gib:.0f} GiB of patterns)"))
    return dict(memory_long=res, share_pct=share, load_avg=os.getloadavg())


def _child(args, extra: list) -> dict:
    cmd = [sys.executable, __file__, "--kind", args.kind, "--threads", str(args.threads)] + _settings_argv(args) + extra
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"benchmark child {extra} failed (rc {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child_env() -> dict:
    """Children import this checkout's bayes_lens (the venvs may be editable installs of another one)."""
    env = dict(os.environ, BAYES_LENS_PROGRESS="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _settings_argv(args) -> list:
    out = ["--n-prompts", str(args.n_prompts), "--batch", str(args.batch)]
    return out + (["--seq-len", str(args.seq_len)] if args.seq_len else [])


def venv_pythons(given) -> list:
    """The interpreters of ``--kind all``: ``--python`` ones, else this one plus the repository's (or
    this venv's siblings') ``.venv`` / ``.venv-tl4`` that exist, each once."""
    if given:
        return list(given)
    here = Path(sys.prefix)
    cands = [Path(sys.executable)] + [d / name / "bin" / "python" for d in (ROOT, here.parent)
                                      for name in (".venv", ".venv-tl4")]
    seen, out = set(), []
    for c in cands:
        if c.exists():
            key = str(Path(c).parent.parent.resolve())  # the venv, not the (symlinked) binary
            if key not in seen:
                seen.add(key)
                out.append(str(c))
    return out


def run_all(args) -> None:
    """``--kind all``: every kind of every venv, each in a subprocess, then one summary table."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for py in venv_pythons(args.python):
            probe = subprocess.run([py, "-c", "import bayes_lens.adapter as a, importlib.metadata as m; "
                                    "print(a.has_hooked_transformer(), m.version('transformer-lens'))"],
                                   capture_output=True, text=True, env=_child_env())
            if probe.returncode != 0:
                print(f"skipping {py}: cannot import bayes_lens there ({probe.stderr.strip()[-200:]})", file=sys.stderr)
                continue
            hooked, tl = probe.stdout.split()
            for kind in (["hooked", "bridge"] if hooked == "True" else ["bridge"]):
                out = Path(tmp) / f"{len(rows)}.json"
                print(f"\n### {kind}, transformer-lens {tl} ({py})\n", flush=True)
                cmd = [py, __file__, "--kind", kind, "--repeats", str(args.repeats), "--threads", str(args.threads),
                       "--json", str(out)] + _settings_argv(args) + (["--floor-only"] if args.floor_only else [])
                if subprocess.run(cmd, env=_child_env()).returncode != 0:
                    rows.append(dict(kind=kind, tl=tl, python=py, failed=True))
                    continue
                d = json.loads(out.read_text())
                rows.append(dict(kind=kind, tl=tl, python=py, **d))
    print("\n### summary\n")
    if args.floor_only:
        _floor_summary(rows)
    else:
        _full_summary(rows)
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _floor_summary(rows: list) -> None:
    print("| kind | transformer-lens | prompts × tokens (mean), batch | rounds | threads | best floor (s) | best geometry (s) | "
          "geometry / floor, median of round ratios [95% CI] | verdict (≤ 1.05×) | the same on CPU time | verdict | "
          "minor page faults per pass, floor / geometry (median) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|")
    for r in rows:
        if r.get("failed"):
            print(f"| {r['kind']} | {r['tl']} | FAILED | | | | | | | | | |")
            continue
        t, st = r["timing"], r["timing"]["settings"]
        ci, cpu = ratio_ci(t, "floor"), ratio_ci(t, "floor", clock="cpu")
        print(f"| {t['kind']} | {r['tl']} | {st['n_prompts']} × {t['mean_tokens']:.0f}, {st['batch']} | "
              f"{len(t['wall_all']['floor'])} | {t.get('threads', '?')} | {min(t['wall_all']['floor']):.2f} | "
              f"{min(t['wall_all']['geometry']):.2f} | {round_ratio(t, 'floor'):.3f}× [{ci[0]:.3f}, {ci[1]:.3f}] | "
              f"{verdict(ci, FLOOR_TARGET)} | {round_ratio(t, 'floor', clock='cpu'):.3f}× [{cpu[0]:.3f}, {cpu[1]:.3f}] | "
              f"{verdict(cpu, FLOOR_TARGET)} | {_median_faults(t, 'floor')} / {_median_faults(t, 'geometry')} |")


def _median_faults(t: dict, variant: str) -> str:
    f = t.get("minor_faults_all", {}).get(variant)
    return f"{statistics.median(f):,.0f}" if f else "—"


def _full_summary(rows: list) -> None:
    print("| kind | transformer-lens | prompts × tokens (mean), batch | geometry / bare, best wall | best CPU | "
          "median of round ratios | geometry / bare batched alike (run order), best wall | median of round ratios | "
          "target | floor / bare batched alike, median | geometry / floor, median [95% CI] verdict | extra peak above bare, % of naive's |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("failed"):
            print(f"| {r['kind']} | {r['tl']} | FAILED | | | | | | | | | |")
            continue
        t, mem = r["timing"], r["memory"]
        best = {v: min(w) for v, w in t["wall_all"].items()}
        cpu = {v: min(c) for v, c in t["cpu_all"].items()}
        over = {v: mem[v]["extra_peak_mib"] - mem["bare"]["extra_peak_mib"] for v in mem}
        share = 100 * over["geometry"] / over["naive"] if over.get("naive", 0) > 0 else float("nan")
        st = t["settings"]
        ci = ratio_ci(t, "floor")
        print(f"| {t['kind']} | {r['tl']} | {st['n_prompts']} × {t['mean_tokens']:.0f}, {st['batch']} | "
              f"{best['geometry'] / best['bare']:.3f}× | {cpu['geometry'] / cpu['bare']:.3f}× | "
              f"{round_ratio(t, 'bare'):.3f}× | {best['geometry'] / best['bare_grouped']:.3f}× | "
              f"{round_ratio(t, 'bare_grouped'):.3f}× | ≤ {target(st)}× | {round_ratio(t, 'bare_grouped', 'floor'):.3f}× | "
              f"{round_ratio(t, 'floor'):.3f}× [{ci[0]:.3f}, {ci[1]:.3f}] {verdict(ci, FLOOR_TARGET)} | {share:.1f}% |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kind", default="all", choices=["all", "auto", "hooked", "bridge"],
                    help="all (default): every kind of every venv found, each in a subprocess")
    ap.add_argument("--python", action="append", default=None,
                    help="with --kind all: an interpreter to run (repeatable; default: .venv and .venv-tl4)")
    ap.add_argument("--seq-len", type=int, default=None, help="prompts of exactly this many random tokens")
    ap.add_argument("--n-prompts", type=int, default=None, help=f"prompts (default {N_PROMPTS}; 4 with --seq-len)")
    ap.add_argument("--batch", type=int, default=None, help=f"batch size (default {BATCH}; 4 with --seq-len)")
    ap.add_argument("--memory-seq-len", type=int, default=None,
                    help="only the long-prompt memory measurement, on one prompt of this many tokens (slow: run once)")
    ap.add_argument("--real-cache-max-gib", type=float, default=2.0,
                    help="with --memory-seq-len: also run a real run_with_cache when its patterns fit in this")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--from-json", default=None, help="re-print the table of an earlier --json file")
    ap.add_argument("--timing-only", action="store_true", help="time again; memory from --from-json")
    ap.add_argument("--floor-only", action="store_true",
                    help="time only floor and geometry (no other variant, no memory): more rounds for the same "
                         "time, for the geometry / floor interval")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_long_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.timing_only and not args.from_json:
        ap.error("--timing-only re-times and reuses the memory figures of an earlier run, so it needs "
                 "--from-json FILE (a file written by --json); drop --timing-only to measure both.")
    if args.timing_only and args.kind == "all":
        ap.error("--timing-only reuses one kind's memory figures: pass --kind hooked|bridge|auto as well.")
    for name in ("seq_len", "n_prompts", "batch", "memory_seq_len"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {v}.")
    if args.n_prompts is None:
        args.n_prompts = 4 if args.seq_len else N_PROMPTS
    if args.batch is None:
        args.batch = 4 if args.seq_len else BATCH
    SETTINGS.update(seq_len=args.seq_len, n_prompts=args.n_prompts, batch=args.batch)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args._child:
        print(json.dumps(memory_child(args._child, args.kind)))
        return
    if args._long_child:
        print(json.dumps(long_memory_child(args._long_child, args.kind, args.memory_seq_len)))
        return
    if args.memory_seq_len:
        if args.kind == "all":
            ap.error("--memory-seq-len measures one kind (it is slow): pass --kind hooked|bridge|auto.")
        d = long_memory(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(d, f, indent=1)
        return
    if args.from_json and not args.timing_only:
        with open(args.from_json) as f:
            d = json.load(f)
        report(d["timing"], d["memory"], args.repeats)
        return
    if args.kind == "all":
        run_all(args)
        return
    mem = {}
    if args.timing_only:  # reuse the memory measurements of an earlier run
        with open(args.from_json) as f:
            mem = json.load(f)["memory"]
    for v in ([] if args.timing_only or args.floor_only else MEMORY_VARIANTS):
        mem[v] = _child(args, ["--_child", v])
    t = timing(args.kind, args.repeats, floor_only=args.floor_only)
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
    over = {v: mem[v]["extra_peak_mib"] - mem["bare"]["extra_peak_mib"] for v in MEMORY_VARIANTS if mem}
    st = t.get("settings", {"n_prompts": N_PROMPTS, "batch": BATCH, "seq_len": None})
    size = f"{st['n_prompts']} prompts" + (f" of {st['seq_len']} random tokens" if st.get("seq_len") else "")
    print(f"SmolLM2-135M ({t['kind']}, transformer-lens {t.get('tl', '?')}), {size}, batch {st['batch']}, "
          f"{len(t['wall_all']['floor'])} interleaved rounds, load average {t.get('load_avg', '?')}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.machine()}")
    print()
    ref = "bare" if "bare" in best else "floor"  # --floor-only: ratios to the floor
    print(f"| variant | best wall (s) | × {ref} | median wall (s) | best CPU (s) | × {ref} | peak RSS above load (MiB) "
          "| above bare (MiB) | % of naive's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in t["wall_all"]:
        if v in over:
            share = 100 * over[v] / over["naive"] if over["naive"] > 0 else float("nan")
            m = f"{mem[v]['extra_peak_mib']:.0f} | {over[v]:.0f} | {share:.1f}%"
        else:
            m = "— | — | —"
        print(f"| {v} | {best[v]:.2f} | {best[v] / best[ref]:.2f} | {med[v]:.2f} | {best_cpu[v]:.2f} | "
              f"{best_cpu[v] / best_cpu[ref]:.2f} | {m} |")
    limit = target(st)
    print()
    for base in [b for b in ("bare_grouped", "bare") if b in best]:
        g, r = best["geometry"] / best[base], round_ratio(t, base)
        print(f"target geometry ≤ {limit} × {base}: {'PASS' if max(g, r) <= limit else 'FAIL'} ({g:.3f}× best wall, "
              f"{r:.3f}× median of the per-round ratios, {best_cpu['geometry'] / best_cpu[base]:.3f}× best CPU)")
    if "floor" in best and "bare_grouped" in best:
        fl = round_ratio(t, "bare_grouped", "floor")
        print(f"the floor (bare batched alike, logits at the final token only) / bare_grouped: {fl:.3f}× (median of "
              f"the per-round ratios){' — below the target' if fl <= limit else ' — ABOVE the target: no geometry pass can meet it'}; "
              f"geometry / floor: {round_ratio(t, 'floor'):.3f}× (what bayes_lens adds: metric hooks, statistics)")
    if "floor" in best:
        ci = ratio_ci(t, "floor")
        print(f"target geometry / floor ≤ {FLOOR_TARGET}×: median of the per-round ratios {round_ratio(t, 'floor'):.3f}×, "
              f"95% bootstrap CI over the rounds [{ci[0]:.3f}, {ci[1]:.3f}]: {verdict(ci, FLOOR_TARGET).upper()} "
              f"(met: upper end ≤ target; not met: lower end > target; else undecided)")
        cpu = ratio_ci(t, "floor", clock="cpu")
        print(f"the same on CPU (process) time: {round_ratio(t, 'floor', clock='cpu'):.3f}× [{cpu[0]:.3f}, {cpu[1]:.3f}]: "
              f"{verdict(cpu, FLOOR_TARGET).upper()}")
    if t.get("minor_faults_all"):
        fl = {v: statistics.median(f) for v, f in t["minor_faults_all"].items()}
        print("minor page faults per pass, median of the rounds: " + ", ".join(f"{v} {n:,.0f}" for v, n in fl.items())
              + f" (malloc settings from the environment: {t.get('malloc_env') or 'none'})")
    if not over:
        return
    gm = over["geometry"] / over["naive"]
    print(f"extra peak ≤ 10% of naive's: {'PASS' if gm <= 0.10 else 'FAIL'} ({100 * gm:.1f}%)")


def target(settings: dict) -> float:
    """The time target of these prompts: ≤ 0.85 × bare at short and ≈ 64-token prompts, ≤ 0.9 × at ≥ 1,024."""
    return 0.9 if (settings.get("seq_len") or 0) >= 1024 else 0.85


def ratio_ci(t: dict, base: str, variant: str = "geometry", *, n_boot: int = 2000, seed: int = 0,
             clock: str = "wall") -> tuple:
    """95% percentile-bootstrap interval of :func:`round_ratio` (the rounds resampled with replacement, seeded).

    A round's geometry / floor ratio spanned 0.69–1.35 (pool prompts) and 0.90–1.20 (64 × 64 tokens) on this
    quiet 2-core machine (2026-12-02, TL 4.3, 2 threads), so the median of 5 rounds cannot place a ratio on either side of a 5% target. The rule of :func:`verdict`:
    met when the interval's upper end is at or below the target, not met when its lower end is above it,
    undecided (more rounds needed) otherwise.
    """
    import numpy as np

    times = t[f"{clock}_all"]  # "wall" (the target's clock) or "cpu" (process time: the work, less moved by neighbours)
    r = np.array([g / b for g, b in zip(times[variant], times[base])])
    idx = np.random.default_rng(seed).integers(0, len(r), size=(n_boot, len(r)))
    meds = np.median(r[idx], axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def verdict(ci: tuple, limit: float) -> str:
    """``met`` / ``not met`` / ``undecided`` of a ratio's interval against its upper ``limit`` (rule in :func:`ratio_ci`)."""
    lo, hi = ci
    return "met" if hi <= limit else ("not met" if lo > limit else "undecided")


#: geometry / floor: what bayes_lens's hooks and statistics add to the least a geometry pass computes.
FLOOR_TARGET = 1.05


def round_ratio(t: dict, base: str, variant: str = "geometry", clock: str = "wall") -> float:
    """The median over the interleaved rounds of ``variant``'s wall time over ``base``'s in the same round
    (a round's variants run back to back, so a slow spell of the machine hits both)."""
    times = t[f"{clock}_all"]
    return statistics.median(g / b for g, b in zip(times[variant], times[base]))


if __name__ == "__main__":
    main()
