"""Every measured number the README and its docs pages quote: recorded runs, and the text made from them.

    python tools/readme_numbers.py --record flagship-smollm2   # run a recipe, store its numbers in the JSON
    python tools/readme_numbers.py --record all                # every recipe (~15-25 min on 2 CPU cores)
    .venv-tl4/bin/python tools/readme_numbers.py --record flagship-smollm2-tl4   # the flagship under TL 4.x
    python tools/readme_numbers.py --write                     # rewrite the pages' generated blocks from the JSON
    python tools/readme_numbers.py --check                     # exit 1 when a page and the JSON disagree

A *recipe* runs one recorded measurement with a stated seed and stated sizes and returns its numbers;
``--record`` stores them, with the settings and library versions, in ``docs/readme_numbers.json``.
The pages in ``PAGES`` (README.md, docs/results.md and the analyses' own pages) hold
*generated blocks*, each name in one page only::

    <!-- readme-numbers: NAME -->
    ...text rendered from the JSON...
    <!-- /readme-numbers -->

``--write`` fills them; ``tests/test_readme_numbers.py`` fails when a block differs from what the JSON
renders (so a number cannot be edited by hand, or go stale silently), and re-runs the cheapest recipe
to show the recording reproduces.

Recipes:

* ``flagship-smollm2`` / ``flagship-gemma``: README's flagship block (the first ``python`` block of
  "## Quickstart"), executed as written; for Gemma with ``bl.load_model()`` replaced by
  ``bl.load_model("gemma-3-270m")``. It records ``cmp.effect()``. ``flagship-smollm2`` runs under
  TransformerLens 3.x (``.venv``: a ``HookedTransformer``), ``flagship-smollm2-tl4`` under 4.x
  (``.venv-tl4``: a ``TransformerBridge``, what the pip route installs); docs/results.md says whether they agree.
* ``localize-smollm2`` / ``localize-gemma``: :func:`bayes_lens.localize` on 40 SULA prompts at three evenly
  spaced layers (``LOCALIZE`` holds the sizes), the non-random rows and the per-layer verdicts; the
  tables of docs/localize.md.
* ``windtunnel-localize``: :func:`bayes_lens.localize` on the shipped bijection wind tunnel, set up as the
  wind tunnel's own result P4b (``WINDTUNNEL`` holds the sizes, ``P4B`` the wind tunnel's numbers); the
  side-by-side table of docs/localize.md's "The wind tunnel's pattern, for comparison".
* ``codelength-smollm2`` / ``codelength-gemma``: Paper B v3's excess code length (``CODELENGTH`` holds
  the sizes), the table of docs/results.md's "Paper B v3" section.
* ``order-smollm2`` / ``order-gemma``: Paper B v3's order-averaging decomposition and position
  interventions (``ORDER`` holds the sizes), the second table of that section.
* ``report-quick-smollm2`` / ``report-quick-gemma``: ``bl.report(model, out, quick=True, seed=0)``
  (the sizes of ``bayes_lens.reporting``'s quick settings, recorded with the numbers); the headline
  table of docs/results.md's "The quick report on both offline models" is made from both.
* ``confidence-smollm2`` / ``confidence-gemma``: ``bl.confidence(model)`` at its defaults (60 SULA prompts, seed
  0, the last MLP layer): the screen's top neurons with their bands, total / direct / mediated effects with
  intervals and the random-neuron band, the axis's null-space overlap and norm-mediated share with their bands,
  the one-sentence answer; docs/confidence.md's "Recorded runs".
* ``steering-smollm2`` / ``steering-gemma``: ``bl.steering`` at docs/steering.md's quick setting (``STEERING``
  holds the sizes) on SULA and on the categorical task: per direction β_α, β_e, β_int with intervals, the
  verdict, the crossover, the null rates; the unsteered evidence weight; docs/steering.md's "Recorded runs".

Every timed recipe stores its seconds with the 1-minute load average at its start and end (``load_average``):
on a shared machine a time is an upper bound under that load.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"   # its quickstart holds the flagship block the recipes run
PAGES = (README, ROOT / "docs" / "results.md", ROOT / "docs" / "localize.md", ROOT / "docs" / "confidence.md",
         ROOT / "docs" / "steering.md")   # the pages whose generated blocks --write fills and --check checks
RECORD = ROOT / "docs" / "readme_numbers.json"
MODELS = {"smollm2": ("default", "SmolLM2-135M"), "gemma": ("gemma-3-270m", "Gemma 3 270M")}
BLOCK = re.compile(r"(<!-- readme-numbers: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /readme-numbers -->)", re.S)


# ------------------------------------------------------------------------------------------ recipes
def _bench():
    spec = importlib.util.spec_from_file_location("bench_quickstart", ROOT / "benchmarks" / "bench_quickstart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def flagship_source(model_name: str = "default") -> str:
    """README's flagship block, as written (with the model swapped for another named one)."""
    block = _bench().quickstart_blocks(README)[0]
    if "model = bl.load_model()" not in block or "cmp.effect()" not in block:
        raise SystemExit("README's first quickstart block is no longer the flagship (bl.load_model() ... cmp.effect())")
    if model_name != "default":
        block = block.replace("model = bl.load_model()", f"model = bl.load_model({model_name!r})", 1)
    return block.replace("print(cmp.effect())", "effect = cmp.effect()")


def _est(e) -> dict:
    return {"value": float(e.value), "ci": [float(e.ci[0]), float(e.ci[1])]}


def tl_major() -> int:
    """The installed TransformerLens's major version (3: HookedTransformer by default; 4: TransformerBridge)."""
    from importlib.metadata import version

    return int(version("transformer-lens").split(".")[0])


def run_flagship(key: str, major: Optional[int] = None) -> dict:
    """Execute the flagship block on model ``key`` and return what ``cmp.effect()`` holds; with ``major``,
    only under that TransformerLens major (docs/results.md quotes the block under both)."""
    if major is not None and tl_major() != major:
        env = ".venv" if major == 3 else ".venv-tl4"
        raise SystemExit(f"this recipe records the flagship under TransformerLens {major}.x, but "
                         f"{tl_major()}.x is installed here: run it with {env}/bin/python tools/readme_numbers.py")
    name, _ = MODELS[key]
    ns: dict = {}
    exec(compile(flagship_source(name), f"README flagship ({name})", "exec"), ns)  # noqa: S102 - our README
    eff, items, model = ns["effect"], ns["items"], ns["model"]
    layers = sorted({eff.downstream_layer, eff.last_layer})
    mae, dm, rm = eff.calibration
    numbers = {
        "patched_layer": int(eff.patched_layers[0]), "n_layers": int(model.cfg.n_layers),
        "downstream_layer": eff.downstream_layer, "last_layer": eff.last_layer,
        "at_patched": _est(eff.at_patched),
        "layers": {str(k): {"clean": _est(eff.corr[("clean", k)]), "removed": _est(eff.corr[(eff.condition, k)]),
                            "delta": _est(eff.corr_delta[k]), "random_delta": _est(eff.random_corr_delta[k])}
                   for k in layers},
        "mae_clean": _est(mae), "mae_delta": _est(dm), "mae_random_delta": _est(rm),
        "r_clean": _est(eff.calibration_corr[0]), "r_delta": _est(eff.calibration_corr[1]),
        "geometry": eff.geometry, "calibration_survives": eff.calibration_survives,
        "calibration_verdict": eff.calibration_verdict, "text": str(eff),
    }
    settings = {"model": name, "n_prompts": len(items), "ks": sorted({int(it.k) for it in items}),
                "n_per_k": 12, "seed": 0, "layer": "n_layers // 2", "n_boot": ns["cmp"].n_boot,
                "bootstrap_seed": ns["cmp"].seed, "random_control_seed": 0, "correlation": ns["cmp"].correlation}
    return {"settings": settings, "numbers": numbers}


_REPORT_KEYS = ("sula.mae_bits", "sula.pearson", "geometry.mixed.alignment_spearman", "geometry.mixed.pc12",
                "geometry.math.pc12", "geometry.focusing_reduction", "geometry.key_orthogonality")


def run_report_quick(key: str) -> dict:
    """``bl.report(model, quick=True, seed=0)``: the headline metrics docs/results.md's table quotes."""
    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    model = bl.load_model(name)
    with tempfile.TemporaryDirectory() as tmp:
        doc = bl.report(model, Path(tmp) / "report", quick=True, seed=0, progress=False)
    by_key = {m["key"]: m for m in doc["summary"]}
    numbers = {}
    for k in _REPORT_KEYS:
        m = by_key[k]
        ci = m.get("ci") or {}
        numbers[k] = {"value": m["value"], "ci": [ci.get("low"), ci.get("high")] if ci else None,
                      "baseline": (m.get("baseline") or {}).get("value")}
    sizes = {k: v for k, v in doc["settings"]["sizes"].items() if k.startswith(("geometry", "sula", "n_boot"))}
    return {"settings": {"model": name, "call": "bl.report(model, out, quick=True, seed=0)", "seed": 0,
                         "quick_sizes": json.loads(json.dumps(sizes, default=list))},
            "numbers": numbers}


LOCALIZE = dict(ks=(0, 1, 2, 4, 8), n_per_k=8, n_layers=3, ranks=(1, 4), n_random=40, n_boot=1000, n_null=50, seed=0,
                das_rank=1)
_LOCALIZE_COLS = ("layer", "subspace", "kind", "rank", "null", "r2", "r2_ci_low", "r2_ci_high", "r2_null_q95",
                  "readable", "delta_mae_bits", "delta_mae_ci_low", "delta_mae_ci_high", "band_low", "band_high",
                  "removal_p", "removal_p_holm", "swap_bits", "swap_ci_low", "swap_ci_high", "swap_band_low",
                  "swap_band_high", "swap_p", "swap_p_holm", "mediator", "verdict", "control_of", "das_accuracy")


def run_localize(key: str) -> dict:
    """``bl.localize`` on SULA prompts at three evenly spaced layers (docs/localize.md's tables)."""
    import torch

    import bayes_lens as bl
    from bayes_lens.ablation import default_layers

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    z = LOCALIZE
    model = bl.load_model(name)
    items = bl.sula.make_prompts(model, ks=z["ks"], n_per_k=z["n_per_k"], seed=z["seed"])
    layers = default_layers(int(model.cfg.n_layers), z["n_layers"])
    try:   # DAS rows (and their three controls) where TransformerLens has interchange (4.3, a bridge)
        bl.adapter.interchange()
        das = bl.adapter.is_bridge(model)
    except bl.MissingExtraError:
        das = False
    estimators = ("ridge", "pca") + ((bl.ablation.DAS(rank=z["das_rank"]),) if das else ())
    t0 = __import__("time").perf_counter()
    loc = bl.localize(model, items, layers=layers, ranks=z["ranks"], estimators=estimators, n_random=z["n_random"],
                      n_boot=z["n_boot"], n_null=z["n_null"], seed=z["seed"], progress=False)
    secs = __import__("time").perf_counter() - t0
    t = loc.table[loc.table["kind"] != "random"]
    def plain(v):  # JSON has no NaN: a missing number (no angle without a mediator) is null
        v = v.item() if hasattr(v, "item") else v
        return None if isinstance(v, float) and v != v else v

    rows = [{c: plain(r[c]) if c in r else None for c in _LOCALIZE_COLS} for _, r in t.iterrows()]
    lt = [{k: plain(v) for k, v in r.items()} for r in loc.layers_table.to_dict("records")]
    est = "estimators=('ridge', 'pca'" + (f", bl.ablation.DAS(rank={z['das_rank']})), " if das else "), ")
    call = (f"bl.localize(model, bl.sula.make_prompts(model, ks={z['ks']}, n_per_k={z['n_per_k']}, seed=0), "
            f"layers={layers}, ranks={z['ranks']}, {est}n_random={z['n_random']}, n_boot={z['n_boot']}, "
            f"n_null={z['n_null']}, seed=0)")
    return {"settings": {"model": name, "call": call, "n_layers": int(model.cfg.n_layers), "kind": type(model).__name__,
                         "seconds": round(secs, 1), "rule": loc.rule, "gate": loc.gate_sentence(),
                         "n_tests": int(loc.n_tests)},
            "numbers": {"rows": rows, "layers": lt}}


CODELENGTH = dict(symbols=(2, 4), seq_len=32, n_seqs=32, n_boot=1000, seed=0)


def run_codelength(key: str) -> dict:
    """``bl.martingale.codelength`` (Paper B v3) for K = 2 (KT) and K = 4 (Dirichlet ½) symbols."""
    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    z = CODELENGTH
    model = bl.load_model(name)
    numbers = {}
    for k in z["symbols"]:
        r = bl.martingale.codelength(model, n_symbols=k, alpha=0.5, seq_len=z["seq_len"], n_seqs=z["n_seqs"],
                                     n_boot=z["n_boot"], seed=z["seed"], progress=False)
        numbers[str(k)] = {
            **{f"{what}_{ref}": [float(getattr(r, what)[ref].value), *map(float, getattr(r, what)[ref].ci)]
               for what in ("excess", "cum_kl", "one_step_kl") for ref in ("bayes", "plugin")},
            "identity_exact": {str(a): float(b) for a, b in r.identity_exact.items()}}
    call = (f"bl.martingale.codelength(model, n_symbols=K, alpha=0.5, seq_len={z['seq_len']}, n_seqs={z['n_seqs']}, "
            f"n_boot={z['n_boot']}, seed=0) for K in {z['symbols']}")
    return {"settings": {"model": name, "call": call}, "numbers": numbers}


ORDER = dict(n_symbols=2, ns=(8, 16, 32), n_seqs=16, n_perms=8, move_len=16, move_seqs=16, n_boot=1000, seed=0)


def run_order(key: str) -> dict:
    """Paper B v3's order-averaging decomposition and position interventions (K = 2, KT reference)."""
    import time

    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    z = ORDER
    model = bl.load_model(name)
    t0 = time.perf_counter()
    oa = bl.martingale.order_averaging(model, n_symbols=z["n_symbols"], alpha=0.5, ns=z["ns"], n_seqs=z["n_seqs"],
                                       n_perms=z["n_perms"], n_boot=z["n_boot"], seed=z["seed"], progress=False)
    t1 = time.perf_counter()
    pi = bl.martingale.position_interventions(model, n_symbols=z["n_symbols"], alpha=0.5, seq_len=z["move_len"],
                                              n_seqs=z["move_seqs"], n_boot=z["n_boot"], seed=z["seed"],
                                              progress=False)
    t2 = time.perf_counter()
    cols = ("regret_given_bits", "regret_averaged_bits", "gain_bits", "jensen_gain_bits")
    per_n = {str(int(r.n)): {c: [float(r[c]), float(r[c + "_ci_low"]), float(r[c + "_ci_high"])] for c in cols}
             | {"mc_se_bits": float(r.mc_se_bits)} for _, r in oa.per_n.iterrows()}

    def est(e):
        return [float(e.value), *map(float, e.ci)]

    calls = (f"bl.martingale.order_averaging(model, n_symbols={z['n_symbols']}, alpha=0.5, ns={z['ns']}, "
             f"n_seqs={z['n_seqs']}, n_perms={z['n_perms']}, n_boot={z['n_boot']}, seed=0)",
             f"bl.martingale.position_interventions(model, n_symbols={z['n_symbols']}, alpha=0.5, "
             f"seq_len={z['move_len']}, n_seqs={z['move_seqs']}, n_boot={z['n_boot']}, seed=0)")
    return {"settings": {"model": name, "calls": list(calls), "seconds": [round(t1 - t0, 1), round(t2 - t1, 1)]},
            "numbers": {"per_n": per_n, "slopes": {c: float(oa.slopes[c]) for c in cols},
                        "max_decomposition_error": float(oa.max_decomposition_error),
                        "move_tv": est(pi.effect_tv), "move_kl_bits": est(pi.effect_kl_bits),
                        "shuffle_tv": est(pi.shuffle_tv), "reference_tv": float(pi.reference_tv)}}


WINDTUNNEL = dict(checkpoint="bijection", n_prompts=500, layers=(0, 1, 2), ranks=(20,), jspace_rank=8, jspace_prompts=50,
                  n_random=40,
                  n_boot=1000, n_null=100, seed=0)
#: the wind tunnel's own numbers (github vishalmisra/bayesian-wind-tunnel @ 670c6d6,
#: experiments/jlens/results/phase3_summary.json, keys P4b and P4a; bijection V = 20, 6 layers, learned
#: positions, tied embeddings): calibration MAE (bits) clean and with each subspace removed at every position,
#: per capture point ("emb": the embedding output; "l": block l's output), and the axis's held-out R².
P4B = {"baseline_mae": 0.006658957339823246,
       "layers": {"emb": dict(r2=0.999999999167221, axis=0.005635680165141821, random1=0.0064889006316661835,
                              frame20=0.7519025206565857, jspace8=0.500648021697998),
                  "0": dict(r2=0.9995743367972184, axis=0.004289668053388596, random1=0.005624734330922365,
                            frame20=0.27387508749961853, jspace8=0.3029439449310303),
                  "1": dict(r2=0.997953404340478, axis=0.006160510703921318, random1=0.010443400591611862,
                            frame20=0.8373100161552429, jspace8=0.7050599455833435),
                  "2": dict(r2=0.9979133118567907, axis=0.006016866769641638, random1=0.02287226729094982,
                            frame20=1.0149065256118774, jspace8=1.4644668102264404),
                  "3": dict(r2=0.9979250664815593, axis=0.005824716296046972, random1=0.025556648150086403,
                            frame20=1.0638054609298706, jspace8=0.6856792569160461),
                  "4": dict(r2=0.9978933215854686, axis=0.005806797184050083, random1=0.04502831771969795,
                            frame20=1.0803147554397583, jspace8=0.7774667143821716)},
       "swap_margin_bits_emb": {"frame20": 8.174, "jspace_r16": 2.857, "random16": -6.717}}


def run_windtunnel_localize() -> dict:
    """``bl.localize`` on the shipped bijection wind tunnel, set up as the wind tunnel's P4b (docs/localize.md).
    One thread for torch and BLAS: a 64-wide model gains nothing from more, and on shared cores the threads'
    spin-waits made it ten times slower."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            return _windtunnel_localize()
    finally:
        torch.set_num_threads(threads)


def _windtunnel_localize() -> dict:
    import time

    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    z = WINDTUNNEL
    model, task = bl.windtunnel.load(z["checkpoint"])
    items = bl.windtunnel.task_prompts(task, z["n_prompts"], seed=z["seed"])
    t0 = time.perf_counter()
    bridge, _ = bl.windtunnel.load(z["checkpoint"], kind="bridge")   # TL's JacobianLens needs a bridge (same weights)
    jspace = bl.ablation.jacobian_basis(bridge, items[:z["jspace_prompts"]], list(z["layers"]), rank=z["jspace_rank"],
                                        skip_first=0)   # the first prompts hold every position (i mod K)
    bases = {"hypothesis frame (embedding)": bl.windtunnel.hypothesis_frame(model, task),
             "answer unembedding": bl.windtunnel.hypothesis_frame(model, task, side="unembedding"),
             f"J-space r={z['jspace_rank']}": jspace}
    loc = bl.localize(model, items, layers=list(z["layers"]), ranks=z["ranks"], bases=bases, n_random=z["n_random"],
                      n_boot=z["n_boot"], n_null=z["n_null"], seed=z["seed"], progress=False)
    secs = time.perf_counter() - t0
    t = loc.table

    def plain(v):
        v = v.item() if hasattr(v, "item") else v
        return None if isinstance(v, float) and v != v else v

    rows = [{c: plain(r[c]) if c in r else None for c in _LOCALIZE_COLS} for _, r in t[t["kind"] != "random"].iterrows()]
    # P4b's "random direction" is a Haar draw: the rank-1 Haar rows (the covariance-matched ones are another null)
    rnd = t[(t["kind"] == "random") & (t["rank"] == 1)]
    rnd1 = (rnd[rnd["null"] == "haar"] if "null" in rnd else rnd).groupby("layer")["delta_mae_bits"]
    random1 = {str(k): [float(v.min()), float(v.max())] for k, v in rnd1}
    lt = [{k: plain(v) for k, v in r.items()} for r in loc.layers_table.to_dict("records")]
    call = (f"model, task = bl.windtunnel.load({z['checkpoint']!r}); bridge, _ = bl.windtunnel.load("
            f"{z['checkpoint']!r}, kind='bridge'); "
            f"items = bl.windtunnel.task_prompts(task, {z['n_prompts']}, seed=0); "
            f"bl.localize(model, items, layers={list(z['layers'])}, ranks={z['ranks']}, bases={{'hypothesis frame "
            f"(embedding)': bl.windtunnel.hypothesis_frame(model, task), 'answer unembedding': "
            f"bl.windtunnel.hypothesis_frame(model, task, side='unembedding'), 'J-space r={z['jspace_rank']}': "
            f"bl.ablation.jacobian_basis(bridge, items[:{z['jspace_prompts']}], {list(z['layers'])}, rank={z['jspace_rank']}, skip_first=0)}}, "
            f"n_random={z['n_random']}, n_boot={z['n_boot']}, n_null={z['n_null']}, seed=0)")
    cfg = model.cfg
    return {"settings": {"checkpoint": z["checkpoint"], "task": task.to_dict(), "call": call,
                         "model": f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads",
                         "kind": type(model).__name__, "seconds": round(secs, 1), "rule": loc.rule,
                         "n_tests": int(loc.n_tests), "gate": loc.gate_sentence(), "n_random": z["n_random"]},
            "numbers": {"rows": rows, "layers": lt, "random1_delta_mae": random1,
                        "clean_mae_bits": float(loc.layers_table["clean_mae_bits"].iloc[0])}}


CONFIDENCE = dict(n_per_k=12, seed=0)   # bl.confidence's own defaults otherwise (60 SULA prompts, the last MLP layer)


def _plain(v):
    """A JSON value: numpy scalars made plain, NaN made null (JSON has no NaN)."""
    v = v.item() if hasattr(v, "item") else v
    return None if isinstance(v, float) and v != v else v


def _iv(e) -> list:
    """An estimate as [value, ci low, ci high] (null where NaN)."""
    return [_plain(float(e.value)), _plain(float(e.ci[0])), _plain(float(e.ci[1]))]


def _load_average() -> Optional[float]:
    """The 1-minute load average now (None where the system has none): recorded beside a time, which on a shared
    machine is an upper bound under that load."""
    import os

    return round(os.getloadavg()[0], 1) if hasattr(os, "getloadavg") else None


def run_confidence(key: str) -> dict:
    """``bl.confidence(model)`` (60 SULA prompts, seed 0): the screen's top neurons with their bands, their total /
    direct / mediated effects with intervals and the random-neuron band, the axis join and the one-sentence answer
    (docs/confidence.md)."""
    import time

    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    model = bl.load_model(name)
    load0, t0 = _load_average(), time.perf_counter()
    res = bl.confidence(model, progress=False)
    secs, load1 = time.perf_counter() - t0, _load_average()
    scr = res.screen.table.set_index("neuron")
    eff = res.effects
    measured = [n for n in dict.fromkeys(eff["neuron"].astype(str)) if eff.loc[eff["neuron"].astype(str) == n,
                                                                              "role"].iloc[0] in ("candidate", "requested")]

    def effect_rows(neuron):
        out = {}
        for metric in ("d_entropy_bits", "d_loss_nats", "top1_agreement", "d_mae_bits"):
            for path in ("total", "direct", "mediated"):
                r = eff[(eff["neuron"].astype(str) == str(neuron)) & (eff["metric"] == metric) & (eff["path"] == path)]
                if len(r):
                    r = r.iloc[0]
                    out[f"{metric}.{path}"] = [_plain(r["value"]), _plain(r["ci_low"]), _plain(r["ci_high"])]
        return out

    neurons = []
    for j in measured:
        row = scr.loc[int(j)]
        neurons.append({"neuron": int(j), "out_norm": float(row["out_norm"]), "logit_var": float(row["logit_var"]),
                        "null_fraction": float(row["null_fraction"]), "null_space": bool(row["null_space"]),
                        "freq_cos": _plain(float(row["freq_cos"])), "rank": int(row["rank"]),
                        "entropy_neuron": int(j) in res.entropy_neurons, "effects": effect_rows(j)})
    band = {}
    rnd = eff[(eff["role"] == "random")]
    for (path, metric), g in rnd.groupby(["path", "metric"]):
        band[f"{metric}.{path}"] = [_plain(float(g["band_low"].iloc[0])), _plain(float(g["band_high"].iloc[0]))]
    bands = {r["metric"]: {"null": r["null"], "low": _plain(r["null_low"]), "high": _plain(r["null_high"]),
                           "flag": _plain(r["flag_threshold"])} for r in res.screen.bands.to_dict("records")}
    ax = res.axis
    cosines = {str(r["neuron"]): [float(r["value"]), float(r["null_high"])]
               for r in ax[ax["metric"] == "abs_cos_with_w_out"].to_dict("records")}
    ov, sh = res.axis_overlap, res.axis_norm_share
    t = res.screen.table
    numbers = {
        "neurons": neurons, "random_band": band, "screen_bands": bands, "entropy_neurons": list(res.entropy_neurons),
        "frequency_neurons": list(res.frequency_neurons), "n_null_space": int(t["null_space"].sum()),
        "max_abs_freq_cos": _plain(float(t["freq_cos"].abs().max())),
        "axis_overlap": {"value": float(ov.value), "null": float(ov.null), "band": [float(ov.null_interval[0]),
                                                                                  float(ov.null_interval[1])],
                         "how": ov.ci_method},
        "axis_norm_share": {"value": _iv(sh), "random": None if sh.null_interval is None else
                            [_plain(sh.null_interval[0]), _plain(sh.null_interval[1])]},
        "axis_effects": effect_rows("axis"), "axis_cos_with_w_out": cosines,
        "random_axis_effects": {n: effect_rows(n)["d_entropy_bits.total"] for n in dict.fromkeys(eff["neuron"].astype(str))
                                if n.startswith("random direction")},
        "verdict": res.verdict, "answer": res.answer, "norm": res.norm, "unigram_proxy": res.screen.unigram_proxy,
        "neuron_rule": res.neuron_rule, "axis_rule": res.axis_rule}
    call = "bl.confidence(model)" if name == "default" else "bl.confidence(model)"
    return {"settings": {"model": name, "call": f"model = bl.load_model({'' if name == 'default' else repr(name)}); "
                         + call, "kind": type(model).__name__, "n_prompts": res.n_prompts, "task": res.task,
                         "layer": res.layer, "axis_layer": res.axis_layer, "n_layers": int(model.cfg.n_layers),
                         "k": res.screen.k, "d": res.screen.d, "d_mlp": int(model.cfg.d_mlp), "passes": res.passes,
                         "seed": CONFIDENCE["seed"], "seconds": round(secs, 1), "load_average": [load0, load1]},
            "numbers": numbers}


STEERING = dict(ks=(0, 1, 2, 4, 8), n_per_k=12, alphas=(-0.5, 0, 0.5), n_random=2, n_symbols=3, seed=0)
_STEER_COLS = ("direction", "kind", "alpha_scale", "beta_0", "beta_0_ci_low", "beta_0_ci_high", "beta_alpha",
               "beta_alpha_ci_low", "beta_alpha_ci_high", "beta_e", "beta_e_ci_low", "beta_e_ci_high", "beta_int",
               "beta_int_ci_low", "beta_int_ci_high", "crossover_alpha", "crossover_alpha_ci_low",
               "crossover_alpha_ci_high", "evidence_weight_at_alpha_min", "evidence_weight_at_alpha_max", "margin",
               "equivalence", "verdict", "fpr_reweights", "fpr_int_test", "fpr_prior_shift", "reliable",
               "beyond_random", "random_band_beta_alpha_abs_max")


def run_steering(key: str) -> dict:
    """``bl.steering`` at the quick setting of docs/steering.md on SULA and on the categorical task (3 symbols):
    per direction the β's with intervals, the verdict, the crossover, the null rates; the unsteered evidence weight."""
    import time

    import torch

    import bayes_lens as bl

    torch.set_grad_enabled(False)
    name, _ = MODELS[key]
    z = STEERING
    model = bl.load_model(name)
    makers = {"sula": (lambda: bl.sula.make_prompts(model, ks=z["ks"], n_per_k=z["n_per_k"], seed=z["seed"]),
                       f"bl.sula.make_prompts(model, ks={z['ks']}, n_per_k={z['n_per_k']}, seed=0)"),
              "categorical": (lambda: bl.tasks.categorical_prompts(model, n_symbols=z["n_symbols"], ks=z["ks"],
                                                                   n_per_k=z["n_per_k"], seed=z["seed"]),
                              f"bl.tasks.categorical_prompts(model, n_symbols={z['n_symbols']}, ks={z['ks']}, "
                              f"n_per_k={z['n_per_k']}, seed=0)")}
    settings = {"model": name, "kind": type(model).__name__, "n_layers": int(model.cfg.n_layers), "tasks": {}}
    numbers = {}
    for task, (make, items_call) in makers.items():
        items = make()
        load0, t0 = _load_average(), time.perf_counter()
        res = bl.steering(model, items, alphas=z["alphas"], n_random=z["n_random"], seed=z["seed"], progress=False)
        secs, load1 = time.perf_counter() - t0, _load_average()
        rows = [{c: _plain(r[c]) for c in _STEER_COLS} for r in res.table.to_dict("records")]
        numbers[task] = {"rows": rows, "evidence_weight": _iv(res.evidence_weight),
                         "clean_intercept": _iv(res.clean_intercept), "label": res.label,
                         "nats_per_example": float(res.nats_per_example), "rule": res.rule}
        settings["tasks"][task] = {
            "call": f"items = {items_call}; bl.steering(model, items, alphas={z['alphas']}, n_random={z['n_random']}, "
                    "seed=0)", "n_prompts": res.n_prompts, "layer": res.layer, "site": res.site,
            "positions": res.positions, "alphas": list(res.alphas), "alpha_unit": res.alpha_unit,
            "n_boot": res.n_boot, "n_null": res.n_null, "margin": res.margin, "seconds": round(secs, 1),
            "load_average": [load0, load1]}
    return {"settings": settings, "numbers": numbers}


RECIPES: Dict[str, Callable[[], dict]] = {
    "flagship-smollm2": lambda: run_flagship("smollm2", major=3),
    "flagship-smollm2-tl4": lambda: run_flagship("smollm2", major=4),   # the pip route's TransformerLens
    "flagship-gemma": lambda: run_flagship("gemma"),
    "report-quick-smollm2": lambda: run_report_quick("smollm2"),
    "report-quick-gemma": lambda: run_report_quick("gemma"),
    "localize-smollm2": lambda: run_localize("smollm2"),
    "localize-gemma": lambda: run_localize("gemma"),
    "codelength-smollm2": lambda: run_codelength("smollm2"),
    "codelength-gemma": lambda: run_codelength("gemma"),
    "order-smollm2": lambda: run_order("smollm2"),
    "order-gemma": lambda: run_order("gemma"),
    "windtunnel-localize": run_windtunnel_localize,
    "confidence-smollm2": lambda: run_confidence("smollm2"),
    "confidence-gemma": lambda: run_confidence("gemma"),
    "steering-smollm2": lambda: run_steering("smollm2"),
    "steering-gemma": lambda: run_steering("gemma"),
}
CHEAPEST = "flagship-smollm2"   # what tests/test_readme_numbers.py re-runs (a few minutes on 2 CPU cores)
BY_MAJOR = {3: "flagship-smollm2", 4: "flagship-smollm2-tl4"}   # the cheapest recipe of each TL major


def _versions() -> dict:
    from importlib.metadata import version

    import torch

    import bayes_lens as bl

    return {"bayes_lens": bl.__version__, "transformer_lens": version("transformer-lens"), "torch": torch.__version__}


def record(names) -> dict:
    data = load()
    for name in names:
        print(f"recording {name} ...", file=sys.stderr, flush=True)
        out = RECIPES[name]()
        out["measured"] = {"utc": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
                           **_versions()}
        data[name] = out
        RECORD.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


def load() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.exists() else {}


# ------------------------------------------------------------------------------------------ rendering
def _ci(e, fmt="{:+.3f}") -> str:
    lo, hi = e["ci"]
    return f"{fmt.format(e['value'])} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _verdict_words(n) -> str:
    return {"survives": "it survives", "changes": "it changes",
            "inconclusive": "inconclusive at n = 60"}[n["calibration_verdict"]]


def render_flagship(data: dict) -> str:
    out = []
    for key in ("smollm2", "gemma"):
        rec = data[f"flagship-{key}"]
        n, z = rec["numbers"], rec["settings"]
        call = "bl.load_model()" if z["model"] == "default" else f'bl.load_model("{z["model"]}")'
        out.append(f"**{MODELS[key][1]}** (`{call}`, {n['n_layers']} layers; measured "
                   f"{rec['measured']['utc'][:10]}, bayes_lens {rec['measured']['bayes_lens']}, TransformerLens "
                   f"{rec['measured']['transformer_lens']}):\n\n```text\n{n['text']}\n```\n")
        if key == "smollm2":
            out.append(render_other_major(rec, data[BY_MAJOR[4]]))
    s, g = data["flagship-smollm2"]["numbers"], data["flagship-gemma"]["numbers"]

    def spread(n):
        return max(abs(v["delta"]["value"]) for v in n["layers"].values())

    out.append(f"On both models removing the axis leaves the downstream correlation where it was (|Δρ| ≤ "
               f"{max(spread(s), spread(g)):.3f} at the layers shown, the size of a random direction's change). "
               f"Calibration, by the equivalence test (the 95% intervals of Δ MAE inside ±1% of the clean MAE and "
               f"of Δ r inside ±0.01): {_verdict_words(s)} on SmolLM2 (Δ MAE {_ci(s['mae_delta'], '{:+.4f}')} "
               f"bits, Δ r {_ci(s['r_delta'], '{:+.4f}')}), {_verdict_words(g)} on Gemma (Δ MAE "
               f"{_ci(g['mae_delta'], '{:+.4f}')} bits, Δ r {_ci(g['r_delta'], '{:+.4f}')}). "
               f"On Gemma there is a strong signal to break (ρ "
               f"{g['layers'][str(g['downstream_layer'])]['clean']['value']:+.2f} at layer "
               f"{g['downstream_layer']}) and it survives: the uncertainty signal is carried or recomputed past the "
               f"ablated layer, so one layer's axis is not where the model keeps it — unlike Paper A's single-layer "
               f"result (≈0.3 → ≈0). On SmolLM2 the axis barely carries the entropy at the ablated layer (ρ "
               f"{s['at_patched']['value']:+.2f}), so there is little to break; its label entropy does not follow "
               f"the evidence to begin with (table below).\n")
    return "\n".join(out)


def _numbers(x, path=""):
    """Every float of a recorded ``numbers`` dict, by path (for comparing two records)."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(x, float):
        yield path, x


def render_other_major(rec: dict, other: dict) -> str:
    """The same flagship under the other TransformerLens major: "the same printout" when it is, else its text."""
    a, b = dict(_numbers(rec["numbers"])), dict(_numbers(other["numbers"]))
    if set(a) != set(b) or rec["settings"] != other["settings"]:
        raise SystemExit("the two TransformerLens majors' flagship records have different settings or fields; "
                         "record both again")
    diff = max(abs(a[k] - b[k]) for k in a)
    m = other["measured"]
    head = (f"Under **TransformerLens {m['transformer_lens']}** (what the pip route installs; `bl.load_model()` "
            f"then returns a `TransformerBridge`; measured {m['utc'][:10]}, bayes_lens {m['bayes_lens']}) the same "
            f"block prints ")
    if other["numbers"]["text"] == rec["numbers"]["text"]:
        return head + (f"the same text, digit for digit (the largest difference between the two majors' recorded "
                       f"numbers is {diff:.1e}).\n")
    return head + f"(largest difference {diff:.1e}):\n\n```text\n{other['numbers']['text']}\n```\n"


def _pct(m) -> str:
    return f"{m['value']:.1%}"


def render_report_table(data: dict) -> str:
    s, g = data["report-quick-smollm2"], data["report-quick-gemma"]
    S, G = s["numbers"], g["numbers"]
    z = s["settings"]["quick_sizes"]

    def ci3(m, sign=False):
        f = "{:+.3f}" if sign else "{:.3f}"
        lo, hi = m["ci"]
        return f"{f.format(m['value'])} [{f.format(lo)}, {f.format(hi)}]".replace("-", "−")

    rows = [
        (f"SULA MAE, model vs Bayes entropy (bits; evidence-blind {S['sula.mae_bits']['baseline']:.3f} / "
         f"{G['sula.mae_bits']['baseline']:.3f})", ci3(S["sula.mae_bits"]), ci3(G["sula.mae_bits"])),
        ("SULA Pearson r, model vs Bayes entropy", ci3(S["sula.pearson"], True), ci3(G["sula.pearson"], True)),
        ("ρ(PC1 of values, next-token entropy), mixed", ci3(S["geometry.mixed.alignment_spearman"], True),
         ci3(G["geometry.mixed.alignment_spearman"], True)),
        ("PC1+PC2 variance, mixed → maths", f"{_pct(S['geometry.mixed.pc12'])} → {_pct(S['geometry.math.pc12'])}",
         f"{_pct(G['geometry.mixed.pc12'])} → {_pct(G['geometry.math.pc12'])}"),
        ("attention focusing, entropy reduction first → last layer", _pct(S["geometry.focusing_reduction"]),
         _pct(G["geometry.focusing_reduction"])),
        (f"key orthogonality, mean \\|cos\\| (Gaussian {S['geometry.key_orthogonality']['baseline']:.3f} / "
         f"{G['geometry.key_orthogonality']['baseline']:.3f})", f"{S['geometry.key_orthogonality']['value']:.3f}",
         f"{G['geometry.key_orthogonality']['value']:.3f}"),
    ]
    head = (f"Headline numbers of `bayes-lens report --quick` (seed 0; n = {z['geometry_n']} prompts per set, "
            f"drawn from a seeded {z['geometry_pool']}-candidate subsample of each pool; "
            f"{len(z['sula_ks']) * z['sula_n_per_k']} SULA prompts; {z['n_boot']} bootstrap resamples, 95 % CIs; "
            f"measured {s['measured']['utc'][:10]} with bayes_lens {s['measured']['bayes_lens']} — quick "
            "settings, so the intervals are wide):\n\n| quantity | SmolLM2-135M | Gemma 3 270M |\n|---|---|---|\n")
    body = "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows)
    gm, sm = G["sula.mae_bits"], S["sula.mae_bits"]
    gr, sr = G["sula.pearson"], S["sula.pearson"]

    def follows(r):
        return r["ci"][0] > 0

    said = (f"\nGemma's SULA entropy {'tracks' if follows(gr) else 'does not clearly track'} the Bayesian posterior "
            f"(r = {gr['value']:.2f}, CI {'above' if follows(gr) else 'not above'} 0; MAE "
            f"{gm['value'] / gm['baseline']:.0%} of the evidence-blind baseline); SmolLM2's "
            f"{'does' if follows(sr) else 'does not'} (r = {sr['value']:+.2f}, MAE {sm['value'] / sm['baseline']:.0%} "
            "of that baseline).").replace("-", "−").replace("evidence−blind", "evidence-blind")
    return head + body + said + (" The sign of a principal component is arbitrary, so ρ(PC1, entropy) is read "
                                 "by its magnitude.\n")


def _p(v) -> str:
    return "—" if v is None else f"{v:.2g}"


def render_localize(data: dict) -> str:
    out = []
    for key in ("smollm2", "gemma"):
        rec = data.get(f"localize-{key}")
        if rec is None:
            continue
        st, num = rec["settings"], rec["numbers"]

        def iv(v, lo, hi, f="{:+.3f}"):
            if v is None:
                return "—"
            return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]".replace("-", "−")

        out.append(f"**{MODELS[key][1]}** ({st['kind']}, {st['n_layers']} layers; measured "
                   f"{rec['measured']['utc'][:10]} with TransformerLens {rec['measured']['transformer_lens']}, "
                   f"{st['seconds']:.0f} s on 2 CPU cores; {st.get('n_tests', '?')} tests in the family):\n\n"
                   f"`{st['call']}`\n\n" + (f"{st['gate']}\n\n" if st.get("gate") else "") +
                   "| layer | subspace | null | held-out R² [95% CI] (null q95) | Δ MAE bits [CI] | null band | "
                   "Holm p | swap bits [CI] | null band | Holm p | verdict |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in num["rows"]:
            r2 = "—" if r["r2"] is None else iv(r["r2"], r["r2_ci_low"], r["r2_ci_high"], "{:.3f}") + \
                f" ({r['r2_null_q95']:.3f})".replace("-", "−")
            name = r["subspace"] + (f" (control of {r['control_of']})" if r.get("control_of") else "")
            band = "—" if r["band_low"] is None else iv(0, r["band_low"], r["band_high"])[7:]
            sband = "—" if r["swap_band_low"] is None else iv(0, r["swap_band_low"], r["swap_band_high"])[7:]
            out.append(f"| {r['layer']} | {name} | {r.get('null') or '—'} | {r2} | "
                       f"{iv(r['delta_mae_bits'], r['delta_mae_ci_low'], r['delta_mae_ci_high'])} | {band} | "
                       f"{_p(r.get('removal_p_holm'))} | "
                       f"{iv(r['swap_bits'], r['swap_ci_low'], r['swap_ci_high'])} | {sband} | "
                       f"{_p(r.get('swap_p_holm'))} | {r['verdict'] or ('control' if r['kind'] == 'control' else '')} |\n")

        def angle(r):
            if r.get("angle_deg") is None:
                return r.get("angle_note") or "no mediator, so no angle"
            p = r.get("angle_p")
            tail = f", p = {p:.2g}" if p is not None else ""
            note = f"; {r['angle_note']}" if r.get("angle_note") else ""
            return (f"readout–mediator angle between {r['best_readout']} and {r['most_causal']}: "
                    f"{r['angle_deg']:.0f}°{tail}{note}")

        out.append("\nPer layer: " + "; ".join(
            f"layer {r['layer']}: **{r['verdict']}** ({angle(r)})" for r in num["layers"]) + ".\n\n")
    if not out:
        return "(not recorded yet: `python tools/readme_numbers.py --record localize-smollm2 localize-gemma`)\n"
    return "".join(out) + f"Rule: {data[next(k for k in ('localize-smollm2', 'localize-gemma') if k in data)]['settings']['rule']}.\n"


NULL_WORDS = {"haar": "Haar", "cov": "covariance-matched"}


def render_windtunnel_localize(data: dict) -> str:
    """P4b's numbers next to ``bl.localize`` on the shipped bijection wind tunnel, then the full table."""
    rec = data.get("windtunnel-localize")
    if rec is None:
        return "(not recorded yet: `python tools/readme_numbers.py --record windtunnel-localize`)\n"
    st, num = rec["settings"], rec["numbers"]
    rows = {(r["layer"], r["subspace"]): r for r in num["rows"]}
    layers = sorted({r["layer"] for r in num["rows"]})
    base = P4B["baseline_mae"]
    deep = [P4B["layers"][str(k)] for k in range(5)]

    def m(x, f="{:+.3f}"):
        return f.format(x).replace("-", "−")

    def span(key, delta=True, f="{:+.3f}"):
        v = [d[key] - base if delta else d[key] for d in deep]
        e = P4B["layers"]["emb"][key] - (base if delta else 0.0)
        return f"emb {m(e, f)}; layers 0–4 {m(min(v), f)} … {m(max(v), f)}"

    def ours(sub, col="delta_mae_bits", f="{:+.3f}", ci=True):
        out = []
        for k in layers:
            r = rows.get((k, sub))
            if r is None:
                continue
            lo, hi = (r["delta_mae_ci_low"], r["delta_mae_ci_high"]) if col == "delta_mae_bits" else \
                (r["swap_ci_low"], r["swap_ci_high"]) if col == "swap_bits" else (r["r2_ci_low"], r["r2_ci_high"])
            out.append(f"L{k} {m(r[col], f)}" + (f" [{m(lo, f)}, {m(hi, f)}]" if ci else ""))
        return "; ".join(out)

    def band(rank, col="delta_mae_bits"):
        """The band of the first row of this rank, named by its null (Haar for user bases, covariance-matched
        for fitted frames)."""
        lo, hi = ("band_low", "band_high") if col == "delta_mae_bits" else ("swap_band_low", "swap_band_high")
        out, nulls = [], set()
        for k in layers:
            r = next(r for r in num["rows"] if r["layer"] == k and r["rank"] == rank)
            nulls.add(r.get("null") or "haar")
            out.append(f"L{k} {m(r[lo])} … {m(r[hi])}")
        return f"{' / '.join(NULL_WORDS.get(n, n) for n in sorted(nulls))} rank {rank}: " + "; ".join(out)

    jname = next(r["subspace"] for r in num["rows"] if r["subspace"].startswith("J-space"))
    rank1 = "; ".join(f"L{k} {m(a, '{:+.4f}')} … {m(b, '{:+.4f}')}" for k, (a, b) in sorted(num["random1_delta_mae"].items()))
    head = (f"**Shipped bijection wind tunnel** (V = {st['task']['V']}, {st['model']}, {st['kind']}; measured "
            f"{rec['measured']['utc'][:10]} with TransformerLens {rec['measured']['transformer_lens']}, "
            f"{st['seconds']:.0f} s on 2 CPU cores; clean MAE {num['clean_mae_bits']:.4f} bits, P4b's "
            f"{base:.4f}):\n\n`{st['call']}`\n\n")
    side = ("| quantity | P4b (jlens bijection, V = 20, 6 layers) | ours (shipped bijection; layers 0–2) |\n"
            "|---|---|---|\n"
            f"| entropy axis, held-out R² | {span('r2', False, '{:.3f}')} (ridge 10⁻³, half the rows, every "
            f"position) | {ours('ridge axis', 'r2', '{:.3f}')} (cross-fitted RidgeCV) |\n"
            f"| axis removed, Δ MAE bits | {span('axis', f='{:+.4f}')} | {ours('ridge axis', f='{:+.4f}')} |\n"
            f"| random direction removed, Δ MAE bits | {span('random1', f='{:+.4f}')} (one draw per layer) | {rank1} "
            f"({st.get('n_random', 20)} Haar draws per layer) |\n"
            f"| hypothesis frame removed, Δ MAE bits | {span('frame20')} (rank 20: the value tokens' "
            f"embeddings) | {ours('hypothesis frame (embedding)')} (rank 10: the answers' embeddings); {band(10)} |\n"
            f"| answers' unembedding removed, Δ MAE bits | the same span (tied embeddings) | "
            f"{ours('answer unembedding')} (rank 10) |\n"
            f"| top-20 PC frame removed, Δ MAE bits | — | {ours('frame k=20')}; {band(20)} |\n"
            f"| J-space removed (rank 8), Δ MAE bits | {span('jspace8')} | {ours(jname)}; "
            f"{band(8)} |\n"
            f"| swap | redirect margin at emb (evidence region, toward the donor's Bayes posterior): frame "
            f"{m(P4B['swap_margin_bits_emb']['frame20'], '{:+.2f}')}, J-space r16 "
            f"{m(P4B['swap_margin_bits_emb']['jspace_r16'], '{:+.2f}')}, random r16 "
            f"{m(P4B['swap_margin_bits_emb']['random16'], '{:+.2f}')} bits | final position, toward the donor's "
            f"output: axis {ours('ridge axis', 'swap_bits', ci=False)}; embedding frame {ours('hypothesis frame (embedding)', 'swap_bits', ci=False)}; "
            f"unembedding {ours('answer unembedding', 'swap_bits', ci=False)}; top-20 PCs "
            f"{ours('frame k=20', 'swap_bits', ci=False)}; {band(10, 'swap')} |\n\n")
    full = ["| layer | subspace | null | held-out R² [95% CI] | Δ MAE bits [CI] | null band | Holm p | swap bits [CI] | "
            "null band | Holm p | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|\n"]
    for r in num["rows"]:
        r2 = "—" if r["r2"] is None else f"{r['r2']:.3f} [{r['r2_ci_low']:.3f}, {r['r2_ci_high']:.3f}]"
        full.append(f"| {r['layer']} | {r['subspace']} | {r.get('null') or '—'} | {r2} | {m(r['delta_mae_bits'])} "
                    f"[{m(r['delta_mae_ci_low'])}, {m(r['delta_mae_ci_high'])}] | {m(r['band_low'])} … "
                    f"{m(r['band_high'])} | {_p(r.get('removal_p_holm'))} | {m(r['swap_bits'])} "
                    f"[{m(r['swap_ci_low'])}, {m(r['swap_ci_high'])}] | "
                    f"{m(r['swap_band_low'])} … {m(r['swap_band_high'])} | {_p(r.get('swap_p_holm'))} | {r['verdict']} |\n")
    verdicts = "; ".join(f"layer {r['layer']}: **{r['verdict']}**" for r in num["layers"])
    fam = f" {st['n_tests']} tests in the family." if st.get("n_tests") else ""
    return (head + side + "".join(full) + f"\nPer layer: {verdicts}.{fam} Rule: {st['rule']}.\n")


def render_codelength(data: dict) -> str:
    recs = {key: data.get(f"codelength-{key}") for key in ("smollm2", "gemma")}
    if not all(recs.values()):
        return "(not recorded yet: `python tools/readme_numbers.py --record codelength-smollm2 codelength-gemma`)\n"

    def iv(v):
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    s = recs["smollm2"]
    head = (f"`{s['settings']['call']}` (measured {s['measured']['utc'][:10]}, TransformerLens "
            f"{s['measured']['transformer_lens']}; bits, 95% bootstrap intervals over sequences; sequences drawn "
            "from the reference mixture):\n\n| quantity | K | SmolLM2-135M | Gemma 3 270M | Paper B v3, Qwen2.5-7B / 14B |\n"
            "|---|---|---|---|---|\n")
    rows = []
    paper = {"2": "0.020 / 0.011 (one-step excess, support 256)", "4": "0.039 / 0.022 (one-step excess, support 256)"}
    for k in ("2", "4"):
        S, G = recs["smollm2"]["numbers"][k], recs["gemma"]["numbers"][k]
        ref = "KT" if k == "2" else "Dirichlet ½"
        rows.append(f"| cumulative excess code length vs {ref} (Bayes) | {k} | {iv(S['excess_bayes'])} | "
                    f"{iv(G['excess_bayes'])} | |\n")
        rows.append(f"| cumulative KL to {ref} | {k} | {iv(S['cum_kl_bayes'])} | {iv(G['cum_kl_bayes'])} | |\n")
        rows.append(f"| cumulative KL to the plug-in | {k} | {iv(S['cum_kl_plugin'])} | {iv(G['cum_kl_plugin'])} | |\n")
        rows.append(f"| one-step KL to {ref} at the last position | {k} | {iv(S['one_step_kl_bayes'])} | "
                    f"{iv(G['one_step_kl_bayes'])} | {paper[k]} |\n")
    def one(rec, k):
        e = rec["numbers"][k]["identity_exact"]
        return (f"n = {e['n']:.0f}: {e['expected_excess_bits']:.4f} = {e['expected_cum_kl_bits']:.4f} bits "
                f"(difference {e['difference_bits']:.1e})")

    ident = "; ".join(f"{MODELS[key][1]} K = {k}, {one(rec, k)}" for key, rec in recs.items() for k in ("2", "4")
                      if rec["numbers"][k]["identity_exact"])
    return (head + "".join(rows) + "\nThe exact identity E[excess code length] = E[cumulative KL] under the "
            "reference mixture, by enumerating every sequence on the model's own predictions: " + ident +
            ". The paper's figures are not directly comparable: their context length and what \"support 256\" "
            "counts are not readable in our copy (METHODS.md §8b). The one-step KL's 95% percentile-bootstrap "
            "interval over sequences covers the true mean about **91%** of the time, not 95% (an independent "
            "audit's simulation: the per-sequence KL is skewed and the sequences few; read it as a ~90% interval).\n")


def render_order(data: dict) -> str:
    recs = {key: data.get(f"order-{key}") for key in ("smollm2", "gemma")}
    if not all(recs.values()):
        return "(not recorded yet: `python tools/readme_numbers.py --record order-smollm2 order-gemma`)\n"

    def iv(v):
        return f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"

    s = recs["smollm2"]
    calls = s["settings"]["calls"]
    out = [f"`{calls[0]}` and `{calls[1]}` (measured {s['measured']['utc'][:10]}, TransformerLens "
           f"{s['measured']['transformer_lens']}; bits, 95% bootstrap intervals over sequences; K = 2, the KT "
           "reference; sequences drawn from the KT mixture):\n\n"
           "| n | quantity | SmolLM2-135M | Gemma 3 270M |\n|---|---|---|---|\n"]
    names = (("regret_given_bits", "regret of the given order"), ("regret_averaged_bits", "regret of the "
             "order-averaged predictor"), ("gain_bits", "order-averaging gain"),
             ("jensen_gain_bits", "expected single-order regret − averaged (Jensen gap)"))
    for n in sorted(s["numbers"]["per_n"], key=int):
        for col, label in names:
            out.append(f"| {n} | {label} | {iv(recs['smollm2']['numbers']['per_n'][n][col])} | "
                       f"{iv(recs['gemma']['numbers']['per_n'][n][col])} |\n")
    S, G = recs["smollm2"]["numbers"], recs["gemma"]["numbers"]
    for col, label in names[1:3]:
        out.append(f"| slope | log-log slope of the mean {label} in n | {S['slopes'][col]:+.2f} | "
                   f"{G['slopes'][col]:+.2f} |\n")
    out.append(f"| {s['settings']['calls'][1].split('seq_len=')[1].split(',')[0]} | total variation of the final "
               f"prediction after moving one symbol (exchangeable reference: 0) | {iv(S['move_tv'])} | "
               f"{iv(G['move_tv'])} |\n")
    out.append(f"| | the same after a random reordering of the whole sequence | {iv(S['shuffle_tv'])} | "
               f"{iv(G['shuffle_tv'])} |\n")
    for n in sorted(s["numbers"]["per_n"], key=int):
        out.append(f"| {n} | Monte Carlo s.e. of the averaged predictor's log₂ probability (mean over sequences) | "
                   f"{S['per_n'][n]['mc_se_bits']:.3f} | {G['per_n'][n]['mc_se_bits']:.3f} |\n")
    err = max(S["max_decomposition_error"], G["max_decomposition_error"])
    m = s["settings"]["calls"][0].split("n_perms=")[1].split(",")[0]
    return ("".join(out) + f"\nThe decomposition given = averaged + gain holds **by construction** (the gain is "
            f"defined as the difference of the two regrets; the largest rounding residue on any sequence is "
            f"{err:.1e} bits), so it checks nothing about the model. With {m} orderings the averaged predictor's "
            "regret is biased up and the gain down against the mixture over all orderings (log₂ of a mean over "
            "few orderings is biased low: −26% / −20% / −7% at 4 / 8 / 32 orderings on a synthetic predictor "
            "with an exact answer); `per_n.gain_jackknife_bits` is the leave-one-ordering-out jackknife, which "
            "removes most of it (METHODS.md §8b). "
            "Paper B v3 reports no number we can set beside these at this size (METHODS.md §8b).\n")


def _digits(*xs, sig: int = 2) -> int:
    """Decimals that show the largest of ``xs`` with ``sig`` significant digits (at most 6)."""
    big = max((abs(x) for x in xs if x is not None and x == x), default=0.0)
    if big == 0:
        return sig
    return int(min(6, max(0, sig - 1 - math.floor(math.log10(big)))))


def _f(x, d: int, sign: bool = True) -> str:
    """``x`` with ``d`` decimals (at 6, the most :func:`_digits` gives, in powers of ten instead); "—" for None."""
    if x is None:
        return "—"
    return f"{x:{'+' if sign else ''}.{1 if d >= 6 else d}{'e' if d >= 6 else 'f'}}".replace("-", "−")


def _civ(v, sig: int = 2, sign: bool = True) -> str:
    """[value, low, high] as "value [low, high]", one number of decimals for all three."""
    if v is None or v[0] is None:
        return "—"
    d = _digits(*v, sig=sig)
    return f"{_f(v[0], d, sign)} [{_f(v[1], d, sign)}, {_f(v[2], d, sign)}]"


def _span(lo, hi, sig: int = 2, sign: bool = True) -> str:
    d = _digits(lo, hi, sig=sig)
    return f"{_f(lo, d, sign)} to {_f(hi, d, sign)}"


QUIET_LOAD = 2.1   # a 1-minute load average up to the run's own two threads: nothing else ran (benchmarks/RESULTS.md)


def _timing(st: dict) -> str:
    """"N s on 2 quiet CPU cores (load L, the run's own threads)" when the 1-minute load average at the start and the
    end of the run stayed within :data:`QUIET_LOAD`, else "N s on 2 shared CPU cores, measured under load L; an upper
    bound"."""
    loads = [x for x in (st.get("load_average") or []) if x is not None]
    if loads and max(loads) <= QUIET_LOAD:
        return f"**{st['seconds']:.0f} s** on 2 quiet CPU cores (load {max(loads):.1f}: the run's own threads)"
    load = f"measured under load {max(loads):.1f}; an upper bound" if loads else "an upper bound on a shared machine"
    return f"**{st['seconds']:.0f} s** on 2 shared CPU cores ({load})"


def render_confidence(data: dict) -> str:
    """docs/confidence.md's tables: the screen's top neurons, their effects and bands, the axis join, the answer."""
    out = []
    for key in ("smollm2", "gemma"):
        rec = data.get(f"confidence-{key}")
        if rec is None:
            continue
        st, num = rec["settings"], rec["numbers"]
        b, rb = num["screen_bands"], num["random_band"]
        k = st["k"]
        out.append(f"**{MODELS[key][1]}** ({st['kind']}, {st['n_layers']} layers; measured {rec['measured']['utc'][:10]} "
                   f"with TransformerLens {rec['measured']['transformer_lens']}, {_timing(st)}, {st['passes']} passes "
                   f"over {st['n_prompts']} {st['task'].upper()} prompts): `{st['call']}`. MLP layer {st['layer']} "
                   f"({st['d_mlp']} neurons), k = {k} of d = {st['d']}; {num['norm']}.\n\n"
                   f"| neuron | ‖w_out‖ | LogitVar | ρ_{k} | ΔH total (bits) [95% CI] | ΔH direct [CI] | "
                   f"ΔH mediated [CI] | Δloss mediated (nats) | entropy neuron |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in num["neurons"]:
            e = r["effects"]
            flag = "**yes**" if r["entropy_neuron"] else "no"
            name = f"**{r['neuron']}**" if r["entropy_neuron"] else str(r["neuron"])
            ns = "" if r["null_space"] else " (not null-space)"
            out.append(f"| {name} | {r['out_norm']:.2f} | {r['logit_var']:.2g} | {r['null_fraction']:.2f}{ns} | "
                       f"{_civ(e['d_entropy_bits.total'])} | {_civ(e['d_entropy_bits.direct'])} | "
                       f"{_civ(e['d_entropy_bits.mediated'])} | {_civ(e['d_loss_nats.mediated'])} | {flag} |\n")
        ov, lv, rho = b["out_norm"], b["logit_var"], b["null_fraction"]
        out.append(f"| bands | σ·χ_d: {ov['low']:.2f}–{ov['high']:.2f} | Haar: {lv['low']:.2g}–{lv['high']:.2g} | "
                   f"Haar Beta: {rho['low']:.3f}–{rho['high']:.3f} (flag > {rho['flag']:.3f}) | random neurons: "
                   f"{_span(*rb['d_entropy_bits.total'])} | {_span(*rb['d_entropy_bits.direct'])} | "
                   f"{_span(*rb['d_entropy_bits.mediated'])} | {_span(*rb['d_loss_nats.mediated'])} | |\n\n")
        top1 = min(r["effects"]["top1_agreement.total"][0] for r in num["neurons"])
        ents = ", ".join(str(j) for j in num["entropy_neurons"]) or "none"
        fc = b["freq_cos"]
        freq = ", ".join(str(j) for j in num["frequency_neurons"]) or "none"
        ax, sh = num["axis_effects"], num["axis_norm_share"]
        cos = "; ".join(f"neuron {j} {c:.3f}" for j, (c, _) in num["axis_cos_with_w_out"].items())
        cos_band = next(iter(num["axis_cos_with_w_out"].values()))[1] if num["axis_cos_with_w_out"] else None
        rnd = sh["random"]
        share = _civ([100 * x for x in sh["value"]], sig=2, sign=False)
        rshare = (f"; {len(num['random_axis_effects'])} random directions removed beside it: "
                  f"{100 * rnd[0]:.{_digits(100 * rnd[0], 100 * rnd[1])}f}–{100 * rnd[1]:.{_digits(100 * rnd[0], 100 * rnd[1])}f}%"
                  if rnd and rnd[0] is not None else "")
        out.append(
            f"- Entropy neurons by the rule: **{ents}**; {num['n_null_space']} of the layer's {st['d_mlp']} neurons are "
            f"null-space (ρ_{k} above the Haar flag). Top-1 agreement with the clean model under each candidate's "
            f"ablation: at least {top1:.2f}.\n"
            f"- Token-frequency neurons: {freq} (largest |frequency cosine| {num['max_abs_freq_cos']:.2f}, flag > "
            f"{fc['flag']:.2f}; {num['unigram_proxy']}).\n"
            f"- The entropy axis (ridge, layer {st['axis_layer']}'s `resid_post`): null-space overlap "
            f"**{num['axis_overlap']['value']:.4f}** (Haar band {num['axis_overlap']['band'][0]:.4f}–"
            f"{num['axis_overlap']['band'][1]:.4f}, {num['axis_overlap']['how'].split('; ')[-1].rstrip(')')}); |cos| with "
            f"the top neurons' w_out: {cos} (Haar 95%: {cos_band:.3f}). Removing it: ΔH total "
            f"{_civ(ax['d_entropy_bits.total'])} bits, direct {_civ(ax['d_entropy_bits.direct'])}, top-1 agreement "
            f"{ax['top1_agreement.total'][0]:.2f}; norm-mediated share of |ΔH| **{share}%**{rshare}.\n"
            f"- The answer printed (**{num['verdict']}**): *\"{num['answer']}\"*\n\n")
    if not out:
        return "(not recorded yet: `python tools/readme_numbers.py --record confidence-smollm2 confidence-gemma`)\n"
    last = data.get("confidence-smollm2") or data.get("confidence-gemma")
    return "".join(out) + (f"Entropy-neuron rule: {last['numbers']['neuron_rule']}. Axis rule: "
                           f"{last['numbers']['axis_rule']}.\n")


def render_steering(data: dict) -> str:
    """docs/steering.md's tables: per model and task, every direction's β's, verdict, crossover and null rates."""
    out = []
    for key in ("smollm2", "gemma"):
        rec = data.get(f"steering-{key}")
        if rec is None:
            continue
        st = rec["settings"]
        for task in ("sula", "categorical"):
            if task not in rec["numbers"]:
                continue
            num, ts = rec["numbers"][task], st["tasks"][task]
            rows = num["rows"]
            scale = rows[0]["alpha_scale"] if rows else float("nan")
            what = "SULA" if task == "sula" else "the categorical task (3 symbols)"
            out.append(
                f"**{MODELS[key][1]}, {what}** ({st['kind']}, layer {ts['layer']} of {st['n_layers']} `{ts['site']}`, "
                f"{'every position' if ts['positions'] == 'all' else 'the final position'}; α ∈ "
                f"{{{', '.join(f'{a:g}' for a in ts['alphas'])}}} in units of the mean final-token norm ({scale:.1f}); "
                f"{ts['n_prompts']} prompts, {ts['n_boot']} resamples, {ts['n_null']} null data sets per direction; "
                f"measured {rec['measured']['utc'][:10]} with TransformerLens {rec['measured']['transformer_lens']}, "
                f"{_timing(ts)}): `{ts['call']}`\n\n"
                f"The unsteered model's evidence weight (log-odds of {num['label'].strip()!r} against the rest per nat "
                f"of exact evidence; Bayes: 1) **β_e = {_civ(num['evidence_weight'], 3, False)}**, intercept β₀ = "
                f"{_civ(num['clean_intercept'], 2)} nats. Margin ±{rows[0]['margin']:.3g} per unit α; one example "
                f"is λ = {num['nats_per_example']:.3g} nats.\n\n"
                "| direction | kind | verdict | β_α [95% CI] | β_e [CI] | β_int [CI] | evidence weight at α min → max | "
                "crossover α [CI] | null rates (β_int test, prior shift) | beyond random |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                def tri(t, sig=2, sign=True):
                    return _civ([r[t], r[t + "_ci_low"], r[t + "_ci_high"]], sig, sign)
                fpr = ("—" if r["fpr_int_test"] is None else
                       f"{r['fpr_int_test']:.1%}, {r['fpr_prior_shift']:.1%}" + ("" if r["reliable"] else " (not reliable)"))
                out.append(f"| {r['direction']} | {r['kind']} | {r['verdict']} | {tri('beta_alpha')} | "
                           f"{tri('beta_e', 3, False)} | {tri('beta_int')} | "
                           f"{_f(r['evidence_weight_at_alpha_min'], 3, False)} → {_f(r['evidence_weight_at_alpha_max'], 3, False)} | "
                           f"{tri('crossover_alpha')} | {fpr} | {'yes' if r['beyond_random'] else 'no'} |\n")
            top = rows[0]["random_band_beta_alpha_abs_max"] if rows else None
            out.append(f"\nRandom band: the Haar directions' |β_α| reach {_f(top, _digits(top), False)}.\n\n")
    if not out:
        return "(not recorded yet: `python tools/readme_numbers.py --record steering-smollm2 steering-gemma`)\n"
    last = data.get("steering-smollm2") or data.get("steering-gemma")
    return "".join(out) + f"Rule: {last['numbers']['sula']['rule']}\n"


RENDER: Dict[str, Callable[[dict], str]] = {"flagship": render_flagship, "report-quick": render_report_table,
                                            "localize": render_localize, "codelength": render_codelength,
                                            "order": render_order, "windtunnel-localize": render_windtunnel_localize,
                                            "confidence": render_confidence, "steering": render_steering}


def rendered(text: str, data: dict, page: str = "README.md") -> str:
    """``text`` (of ``page``) with every generated block refilled from ``data``."""
    def fill(m):
        name = m.group("name")
        if name not in RENDER:
            raise SystemExit(f"{page} has an unknown generated block {name!r}; known: {sorted(RENDER)}")
        return m.group(1) + RENDER[name](data) + m.group(4)

    return BLOCK.sub(fill, text)


def blocks(text: str) -> Dict[str, str]:
    return {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}


def page_blocks() -> Dict[str, str]:
    """Every generated block of every page in ``PAGES``, by name; a name used twice is refused."""
    out: Dict[str, str] = {}
    for page in PAGES:
        for m in BLOCK.finditer(page.read_text(encoding="utf-8")):
            if m.group("name") in out:
                raise SystemExit(f"generated block {m.group('name')!r} appears twice (again in "
                                 f"{page.relative_to(ROOT)}); keep one")
            out[m.group("name")] = m.group("body")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", nargs="+", metavar="RECIPE", help=f"run recipes and store them: {list(RECIPES)} or all")
    p.add_argument("--write", action="store_true", help="rewrite the pages' generated blocks from the JSON")
    p.add_argument("--check", action="store_true", help="exit 1 when a page's blocks differ from the JSON")
    args = p.parse_args(argv)
    if args.record:
        # "all": every recipe of the installed TransformerLens major (the -tl4 one needs .venv-tl4)
        names = [n for n in RECIPES if (4 if n.endswith("-tl4") else 3) == tl_major()] if args.record == ["all"] \
            else args.record
        bad = [n for n in names if n not in RECIPES]
        if bad:
            p.error(f"unknown recipe(s) {bad}; known: {list(RECIPES)}")
        record(names)
    data, stale = load(), []
    page_blocks()   # refuses a block name used in two pages
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = rendered(text, data, str(page.relative_to(ROOT)))
        if args.write and new != text:
            page.write_text(new, encoding="utf-8")
        elif args.check and new != text:
            stale.append(str(page.relative_to(ROOT)))
    if stale:
        print(f"the generated numbers of {', '.join(stale)} differ from docs/readme_numbers.json; run: "
              "python tools/readme_numbers.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
