"""Benchmark: sharded runs - 2 local workers vs 1 process, and the merge's memory bound.

Part 1 (``workers``): SmolLM2-135M (``bl.load_model()``), the same prompts, ``collect`` with every
layer's final-token values and the attention entropies (batch 8). "1 process" runs all shards in one
process (``engine="local"``), with torch's default threads and with ``OMP_NUM_THREADS=1``; "2 workers" is ``torchrun --standalone
--nproc_per_node 2`` (gloo; torchrun gives each worker one thread), each rank running half the shards,
rank 0 merging. Reported: wall time of each (model load included, and the collect part alone),
their ratio, and peak RSS (``ru_maxrss``) per worker. Both results are checked ``torch.equal``.

Part 2 (``merge``): synthetic shards of ``--merge-prompts`` (10,000) prompts × ``--merge-layers`` (30)
layers of ``--dim`` (576, SmolLM2's d_model) float32 rows, written with
:func:`bayes_lens.shard.commit_shard`; then, each in a fresh subprocess, (a) a layer-at-a-time
read over :meth:`ShardSet.iter_layers`, (b) the same with a reduction per layer (the standardized
covariance's top eigenvalue share, i.e. PC1, in float64: its own working copies add to the peak), and
(c) a merge of all layers at once. Reported: peak RSS (VmHWM, reset with ``/proc/self/clear_refs`` after
the imports, whose own peak would otherwise hide the merge's) above the RSS after opening the shards, against
one layer's rows (n × dim × 4 bytes) and all layers' rows.

Usage::

    python benchmarks/bench_scale.py [--n-prompts 96] [--merge-prompts 10000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
KW = dict(value_layers="all", attention=True, batch_size=8)


def prompts(n: int):
    words = "the cat sat on a warm stone while the river ran past an old house under the moon".split()
    return [" ".join(words[(i * 7) % 5:(i * 7) % 5 + 6 + i % 11]) + f" {i}" for i in range(n)]


def rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_now_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------ part 1, a worker


def worker(out: str, n_prompts: int, n_shards: int, engine: str) -> None:
    import bayes_lens.shard as sh

    t0 = time.perf_counter()
    ps = prompts(n_prompts)
    col = sh.collect_sharded(sh.ModelSpec("default"), ps, out, engine=engine, n_shards=n_shards, **KW)
    wall = time.perf_counter() - t0
    rank = sh.dist_rank_world()[0]
    collect_s = sum(json.loads(p.read_text())["seconds"] for p in Path(out).glob("shard-*.json")
                    if json.loads(p.read_text())["worker"]["rank"] == rank)
    rec = {"rank": rank, "wall_s": wall, "collect_s": collect_s, "peak_rss_mib": rss_peak_mib()}
    Path(out, f"timing-{engine}-{rank}.json").write_text(json.dumps(rec))
    if col is not None:
        col.save(Path(out, "merged.safetensors"))


def part_workers(n_prompts: int, n_shards: int, tmp: Path) -> dict:
    import torch

    import bayes_lens.shard as sh

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = {}
    one_cmd = [sys.executable, str(HERE), "_worker", None, str(n_prompts), str(n_shards), "local"]
    runs = [
        ("1 process", "one", one_cmd, {}),
        ("1 process, 1 thread", "one1", one_cmd, {"OMP_NUM_THREADS": "1"}),
        ("2 workers (torchrun)", "two", [str(Path(sys.executable).parent / "torchrun"), "--standalone",
                                         "--nproc_per_node", "2", str(HERE), "_worker", None, str(n_prompts),
                                         str(n_shards), "torchrun"], {}),
    ]
    for name, folder, cmd, extra in runs:
        cmd = [str(tmp / folder) if c is None else c for c in cmd]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=dict(env, **extra))
        res[name] = {"total_wall_s": time.perf_counter() - t0,
                     "workers": sorted((json.loads(p.read_text()) for p in (tmp / folder).glob("timing-*.json")),
                                       key=lambda r: r["rank"])}
    for base in ("1 process", "1 process, 1 thread"):
        two, one = res["2 workers (torchrun)"], res[base]
        res[f"ratio_total_wall vs {base}"] = two["total_wall_s"] / one["total_wall_s"]
        res[f"ratio_collect vs {base}"] = (max(w["collect_s"] for w in two["workers"]) /
                                           one["workers"][0]["collect_s"])
    from bayes_lens.reduced import ReducedCache

    a = ReducedCache.load(tmp / "one" / "merged.safetensors")
    b = ReducedCache.load(tmp / "two" / "merged.safetensors")
    ta, tb = a.file_tensors(), b.file_tensors()
    res["equal"] = sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
    return res


# ------------------------------------------------------------------------------ part 2


def write_fake(out: Path, n: int, layers: int, dim: int, n_shards: int) -> None:
    import torch

    import bayes_lens.shard as sh
    from bayes_lens.reduced import NEXT_TOKEN_ENTROPY, ReducedCache, row_name

    g = torch.Generator().manual_seed(0)
    settings = sh.collect_settings({"value_layers": "all", "batch_size": 16})
    for s in sh.plan(n, 16, n_shards):
        m = len(s)
        rows = {row_name(k): torch.randn(m, dim, generator=g) for k in range(layers)}
        col = ReducedCache({**rows, NEXT_TOKEN_ENTROPY: torch.rand(m, dtype=torch.float64)},
                           n_tokens=torch.full((m,), 20), indices=torch.arange(s.start, s.stop))
        sh.commit_shard(out, s, col, n_prompts=n, prompt_sha256=[f"{i:064x}" for i in range(s.start, s.stop)],
                        settings=settings, model_fingerprint="synthetic")
        del col


def merge_child(out: str, mode: str) -> None:
    import torch

    import bayes_lens.shard as sh

    shards = sh.open_shards(out)
    peak_before = rss_peak_mib()
    reset = reset_peak()
    base = rss_now_mib()
    t0 = time.perf_counter()
    pc1, total = [], 0.0

    def pca1(rows):
        x = rows.double()
        x = (x - x.mean(0)) / x.std(0)
        ev = torch.linalg.eigvalsh(x.T @ x)
        return float(ev[-1] / ev.sum())

    if mode in ("read_layer_at_a_time", "pca_layer_at_a_time"):
        for layer, rows in shards.iter_layers("v"):
            total += float(rows.sum())
            if mode == "pca_layer_at_a_time":
                pc1.append(pca1(rows))
            del rows
    else:
        rc = shards.reduced()
        for layer in rc.layers("v"):
            total += float(rc.value_rows(layer).sum())
    pc1 = pc1 or [float("nan")]
    peak = rss_now_mib("VmHWM") if reset else rss_peak_mib()
    print(json.dumps({"mode": mode, "base_rss_mib": base, "peak_before_mib": peak_before, "peak_reset": reset,
                      "peak_rss_mib": peak,
                      "seconds": time.perf_counter() - t0, "pc1_mean": sum(pc1) / len(pc1)}))


def part_merge(n: int, layers: int, dim: int, tmp: Path) -> dict:
    out = tmp / "fake"
    t0 = time.perf_counter()
    write_fake(out, n, layers, dim, n_shards=10)
    write_s = time.perf_counter() - t0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = {"n_prompts": n, "layers": layers, "dim": dim, "write_s": write_s,
           "one_layer_rows_mib": n * dim * 4 / 2 ** 20, "all_rows_mib": n * dim * 4 * layers / 2 ** 20,
           "disk_mib": sum(p.stat().st_size for p in out.iterdir()) / 2 ** 20}
    for mode in ("read_layer_at_a_time", "pca_layer_at_a_time", "read_all_at_once"):
        proc = subprocess.run([sys.executable, str(HERE), "_merge", str(out), mode], check=True, env=env,
                              capture_output=True, text=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["peak_above_base_mib"] = r["peak_rss_mib"] - r["base_rss_mib"]
        res[mode] = r
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_merge":
        merge_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=96)
    ap.add_argument("--n-shards", type=int, default=4)
    ap.add_argument("--merge-prompts", type=int, default=10000)
    ap.add_argument("--merge-layers", type=int, default=30)
    ap.add_argument("--dim", type=int, default=576)
    ap.add_argument("--skip-workers", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        out = {"load_before": os.getloadavg()}
        if not args.skip_workers:
            out["workers"] = part_workers(args.n_prompts, args.n_shards, tmp)
        out["merge"] = part_merge(args.merge_prompts, args.merge_layers, args.dim, tmp)
        out["load_after"] = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
