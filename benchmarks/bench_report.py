"""Benchmark: wall time of ``bayes-lens report --quick`` and of the full report, against their targets.

Targets on a 2-core CPU with the default model (SmolLM2-135M): ``--quick`` ≤ 3 minutes, the full
report (``make demo``) ≤ 15 minutes. The command is run exactly as a user runs it (the console
script, a fresh process that loads the model), and the per-section timings recorded in report.json
are printed next to the wall time, with the machine's load average before and after (other
processes on a shared machine slow every number down; compare with the load).

    python benchmarks/bench_report.py [--full] [--out DIR] [--seed 0]

Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cli():
    exe = Path(sys.executable).parent / "bayes-lens"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bayes_lens.cli"]


def run(quick: bool, out: Path, seed: int) -> dict:
    load_before = os.getloadavg()
    cmd = _cli() + ["report", "--out", str(out), "--seed", str(seed), "--no-progress"] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, BAYES_LENS_PROGRESS="0"))
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
    doc = json.loads((out / "report.json").read_text())
    return {
        "benchmark": "report_quick" if quick else "report_full",
        "command": " ".join(cmd),
        "wall_s": round(wall, 1),
        "target_s": 180 if quick else 900,
        "within_target": wall <= (180 if quick else 900),
        "timings_s": {k: round(v, 1) for k, v in doc["timings_s"].items()},
        "status": doc["status"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 0),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "transformer_lens": doc["environment"]["transformer_lens"],
        "torch": doc["environment"]["torch"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also run the full report (≈10-15 min)")
    ap.add_argument("--out", default=None, help="output folder (default: a temporary folder)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-report-"))
    print(json.dumps(run(True, base / "quick", args.seed)), flush=True)
    if args.full:
        print(json.dumps(run(False, base / "full", args.seed)), flush=True)


if __name__ == "__main__":
    main()
