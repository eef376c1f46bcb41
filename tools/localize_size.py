"""Measure the error rates of bl.localize's mediator test (METHODS.md §13): its size on null candidates and its
power on planted ground truth, over independent repetitions.

Each repetition is one ``bl.localize`` call at one layer with fresh SULA prompts (``make_prompts(seed=...)``, the
docs' design: k ∈ {0, 1, 2, 4, 8}, 8 prompts each), fresh null draws and donors (``localize(seed=...)``) and
``--users`` fresh Haar-random user bases (a Gaussian vector per basis, normalized by localize: exactly
exchangeable with the Haar null's draws), against ``--n-random`` draws of each null (Haar, covariance-matched).

* **random** model (``bl.models.tiny.tiny_model(kind)``, the suite's tiny random llama): nothing in it follows
  the posterior, so every candidate is a null one.
  (a) per-test false-"mediator" rate of the Haar user bases, removal and swap apart, at α: with the
      prediction-interval p (the rule's) and with the rank p, alone and with the rule's effect floor;
  (b) family-wise: the fraction of tables (the user rows × removal and swap: ``--users`` × 2 tests) with at
      least one Holm-adjusted false mediator, and the fraction whose own table (Holm over every test of it, the
      fitted axes' included) calls any candidate a mediator;
  (c) the fitted candidates (the ridge and PCA axes, each against its covariance-matched null): how often each
      test's p is ≤ α, and how often the table calls the axis a mediator.
* **planted** model (``bl.models.tiny.planted_model(kind)``, its layer): (d) power - the planted mediator
  called a mediator, the read-but-unused copy not - and (a)-(b) again for Haar user bases there (a null whose
  Δ MAE is far from normal: a Haar direction matters only through its overlap with the one used direction).

* ``--das`` (TransformerLens 4.3, ``--kind bridge``): a cross-fitted rank-one DAS row with its three controls
  (``bl.ablation.DAS``) in every table. On the random model every DAS "mediator" is a false one: (e) how often the
  DAS row is called a mediator (its Holm-cleared test, the effect floor and beating all three controls), and how
  often each half of that rule fires alone; on the planted model, how often DAS finds the used direction.

Intervals: Clopper–Pearson 95% for a count of independent events (one per repetition: a table's family-wise
outcome, the first user basis's test, a fitted axis's test). The pooled per-test rate over every user basis of
every table shares each table's draws and prompts, so its interval is the normal one over repetitions of the
per-table rate (the repetitions are independent; the bases of one table are not).

    python tools/localize_size.py --kind hooked --reps 150 --json size_hooked.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def clopper_pearson(k: int, n: int) -> list:
    """The exact (Clopper–Pearson) 95% interval of a binomial proportion k/n."""
    from scipy.stats import binomtest

    if n == 0:
        return [float("nan"), float("nan")]
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=0.95, method="exact")
    return [float(ci.low), float(ci.high)]


def rate(hits) -> dict:
    """A rate over independent events with its Clopper–Pearson interval."""
    hits = np.asarray(hits, dtype=bool)
    return {"rate": float(hits.mean()) if len(hits) else float("nan"), "k": int(hits.sum()), "n": int(len(hits)),
            "ci95": clopper_pearson(int(hits.sum()), len(hits))}


def clustered_rate(per_rep) -> dict:
    """The pooled rate over ``[reps, m]`` events correlated within a repetition: mean of the per-repetition rates,
    its normal 95% interval from their spread over repetitions (independent)."""
    per_rep = np.asarray(per_rep, dtype=np.float64)
    r = per_rep.mean(1)
    se = float(r.std(ddof=1) / np.sqrt(len(r))) if len(r) > 1 else float("nan")
    m = float(r.mean())
    return {"rate": m, "k": int(per_rep.sum()), "n": int(per_rep.size), "ci95": [m - 1.96 * se, m + 1.96 * se],
            "interval": "normal over repetitions (tests of one table share its draws)"}


def one_rep(model, planted, kind: str, rep_seed: int, args) -> dict:
    """One localize call; the p-values, estimates and decisions of its rows."""
    import bayes_lens as bl

    d = int(model.cfg.d_model)
    rng = np.random.default_rng([rep_seed, 491])
    users = {f"null {i}": rng.standard_normal(d) for i in range(args.users)}
    if planted is None:
        items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=8, seed=rep_seed)
        layer, estimators, target = args.layer, ("ridge", "pca"), "bayes"
    else:
        items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4, 8), n_per_k=8, seed=rep_seed)
        layer, estimators, target = planted.layer, ("ridge",), "log_odds"
        users = {**users, "mediator": planted.mediator.numpy(), "readout_only": planted.readout_only.numpy()}
    if args.das:
        estimators = estimators + (bl.ablation.DAS(rank=1),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loc = bl.localize(model, items, layers=[layer], ranks=(1,), estimators=estimators, bases=users,
                          target=target, n_random=args.n_random, folds=5, n_boot=args.n_boot, n_null=0,
                          nulls=tuple(args.nulls.split(",")), p_value=args.p_value, seed=rep_seed, progress=False)
    t = loc.to_dataframe()
    draws = {null: {col: t[(t["kind"] == "random") & (t["null"] == null)][col].round(8).tolist()
                    for col in ("delta_mae_bits", "swap_bits")} for null in args.nulls.split(",")}
    t = t[t["kind"] != "random"]
    cols = ["subspace", "kind", "null", "delta_mae_bits", "swap_bits", "removal_p", "removal_p_rank", "swap_p",
            "swap_p_rank", "removal_p_holm", "swap_p_holm", "mediator", "verdict"]
    if args.das:
        cols += ["removal_beats_controls", "swap_beats_controls", "das_accuracy"]
    return {"seed": rep_seed, "n_tests": int(loc.n_tests), "min_effect": 0.01,
            "draws": draws,
            "rows": [{c: (r[c].item() if hasattr(r[c], "item") else r[c]) for c in cols} for _, r in t.iterrows()]}


def summarize(reps: list, alpha: float, model_name: str) -> dict:
    """(a)-(d) from the repetitions' rows."""
    from bayes_lens.ablation._rules import holm  # the rule's own Holm step-down

    out = {}
    user = [[r for r in rep["rows"] if r["subspace"].startswith("null ")] for rep in reps]
    floor = reps[0]["min_effect"]
    for test, est in (("removal", "delta_mae_bits"), ("swap", "swap_bits")):
        for pk, col in (("pi", f"{test}_p"), ("rank", f"{test}_p_rank")):
            p = np.array([[r[col] for r in rows] for rows in user])
            e = np.array([[r[est] for r in rows] for rows in user])
            out[f"user_{test}_{pk}_per_test"] = clustered_rate(p <= alpha)
            out[f"user_{test}_{pk}_per_test_first_basis"] = rate(p[:, 0] <= alpha)
            out[f"user_{test}_{pk}_per_test_with_floor"] = clustered_rate((p <= alpha) & (e > floor))
    for pk, suffix in (("pi", ""), ("rank", "_rank")):
        fam = []
        for rows in user:
            p = np.array([r[f"removal_p{suffix}"] for r in rows] + [r[f"swap_p{suffix}"] for r in rows])
            e = np.array([r["delta_mae_bits"] for r in rows] + [r["swap_bits"] for r in rows])
            fam.append(bool(np.any((holm(p) <= alpha) & (e > floor))))
        out[f"user_familywise_{pk}"] = rate(fam)
        out[f"user_familywise_{pk}"]["family"] = f"{len(user[0])} Haar user rows × removal and swap"
    out["user_table_called_any_mediator"] = rate([any(r["mediator"] for r in rows) for rows in user])
    if model_name == "random":
        every = [[r for r in rep["rows"]] for rep in reps]
        out["table_familywise_any_mediator"] = rate([any(r["mediator"] for r in rows) for rows in every])
        out["table_familywise_any_mediator"]["family"] = f"the table's own Holm over {reps[0]['n_tests']} tests"
        for name in ("ridge axis", "pca axis"):
            rows = [next(r for r in rep["rows"] if r["subspace"] == name) for rep in reps]
            key = name.split()[0]
            out[f"fitted_{key}_null"] = rows[0]["null"]
            for test in ("removal", "swap"):
                out[f"fitted_{key}_{test}_pi"] = rate([r[f"{test}_p"] <= alpha for r in rows])
                out[f"fitted_{key}_{test}_rank"] = rate([r[f"{test}_p_rank"] <= alpha for r in rows])
            out[f"fitted_{key}_called_mediator"] = rate([r["mediator"] for r in rows])
    else:
        med = [next(r for r in rep["rows"] if r["subspace"] == "mediator") for rep in reps]
        ro = [next(r for r in rep["rows"] if r["subspace"] == "readout_only") for rep in reps]
        ridge = [next(r for r in rep["rows"] if r["subspace"] == "ridge axis") for rep in reps]
        out["planted_mediator_found"] = rate([r["mediator"] for r in med])
        out["planted_mediator_verdicts"] = sorted({r["verdict"] for r in med})
        out["planted_unused_copy_rejected"] = rate([not r["mediator"] for r in ro])
        out["planted_ridge_axis_called_mediator"] = rate([r["mediator"] for r in ridge])
    if any(r["subspace"] == "DAS k=1" for r in reps[0]["rows"]):
        das = [next(r for r in rep["rows"] if r["subspace"] == "DAS k=1") for rep in reps]
        key = "das_called_mediator" if model_name == "random" else "planted_das_found"
        out[key] = rate([bool(r["mediator"]) for r in das])
        out[key]["rule"] = "Holm-cleared against its Haar band, above the effect floor and above all three controls"
        for test in ("removal", "swap"):
            out[f"das_{test}_clears_band_per_test"] = rate([r[f"{test}_p"] <= alpha for r in das])
            out[f"das_{test}_beats_controls"] = rate([bool(r[f"{test}_beats_controls"]) for r in das])
        out["das_verdicts"] = sorted({r["verdict"] for r in das})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=150, help="independent tables per model (default 150)")
    ap.add_argument("--planted-reps", type=int, default=None, help="tables on the planted model (default --reps)")
    ap.add_argument("--kind", default="hooked", choices=("hooked", "bridge"))
    ap.add_argument("--seed", type=int, default=0, help="repetition r uses seed 1000·seed + r")
    ap.add_argument("--users", type=int, default=9, help="Haar user bases per table (default 9: the docs' 9 rows)")
    ap.add_argument("--n-random", type=int, default=40, help="draws per null (default 40, localize's default)")
    ap.add_argument("--n-boot", type=int, default=20,
                    help="bootstrap replicates (ECE/Brier only; the p-values do not use them)")
    ap.add_argument("--layer", type=int, default=1,
                    help="the layer tested, on both models (default 1, the last of the tiny models: a pass resumed "
                    "after it is cheap; the planted model is built with its planted direction there)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--p-value", default="interval", choices=("interval", "rank", "exact"),
                    help="the p Holm's correction runs on in localize's own verdicts (Design.p_value)")
    ap.add_argument("--nulls", default="haar,cov", help="the null families drawn (default haar,cov)")
    ap.add_argument("--models", default="random,planted")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the cores are shared)")
    ap.add_argument("--das", action="store_true",
                    help="add a cross-fitted DAS row (rank 1, TransformerLens 4.3's fit_das) with its three controls "
                    "(--kind bridge under TL 4.3): on the random model its mediator calls are false ones")
    ap.add_argument("--json", default=None, help="write the repetitions and the summary here")
    args = ap.parse_args(argv)
    import torch

    from bayes_lens._files import write_text
    from bayes_lens.models.tiny import planted_model, tiny_model

    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    result = {"command": " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv))),
              "args": vars(args), "load_before": os.getloadavg(), "models": {}}
    for name in args.models.split(","):
        if name == "random":
            model, planted, n = tiny_model(args.kind), None, args.reps
        else:
            (model, planted), n = planted_model(args.kind, layer=args.layer), args.planted_reps or args.reps
        t0 = time.perf_counter()
        reps = []
        for r in range(n):
            reps.append(one_rep(model, planted, args.kind, 1000 * args.seed + r, args))
            if (r + 1) % 10 == 0:
                print(f"{name}: {r + 1}/{n} tables, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        summary = summarize(reps, args.alpha, name)
        result["models"][name] = {"reps": n, "seconds": time.perf_counter() - t0, "summary": summary,
                                  "repetitions": reps}
        print(f"== {name} ({args.kind}, {n} tables, {time.perf_counter() - t0:.0f} s)")
        for key, v in summary.items():
            if isinstance(v, dict):
                ci = v.get("ci95", [np.nan, np.nan])
                print(f"  {key:42s} {v['rate']:.4f}  [{ci[0]:.4f}, {ci[1]:.4f}]  ({v['k']}/{v['n']})")
            else:
                print(f"  {key:42s} {v}")
    result["load_after"] = os.getloadavg()
    if args.json:
        write_text(args.json, json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
