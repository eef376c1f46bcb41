"""Run every benchmark once with its default settings (``make bench``); results go to stdout.

Each script prints a markdown table and its targets; copy the figures into benchmarks/RESULTS.md with
the machine, the load and the command. Run on a quiet machine: the timings are wall-clock.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_load.py", "bench_geometry.py", "bench_native.py", "bench_ablation.py", "bench_sula.py",
           "bench_martingale.py", "bench_report.py"]


def main() -> int:
    failed = []
    for name in SCRIPTS:
        print(f"\n## {name}\n", flush=True)
        if subprocess.run([sys.executable, str(HERE / name)], cwd=HERE.parent).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
