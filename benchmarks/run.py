"""Run every benchmark once with its default settings (``make bench``); results go to stdout.

Each script prints a markdown table and its targets; copy the figures into benchmarks/RESULTS.md with
the machine, the load and the command. Run on a quiet machine: the timings are wall-clock.
``bench_geometry.py`` and ``bench_native.py`` run every kind of both venvs (``.venv``: TL 3
HookedTransformer and bridge; ``.venv-tl4``: TL 4 bridge), at the short prompts and at long ones
(``--seq-len 64`` and ``1024``); the long-prompt memory case (``--memory-seq-len 4096``) is slow on a CPU and
is run by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [["bench_load.py"], ["bench_geometry.py"], ["bench_geometry.py", "--seq-len", "64", "--n-prompts", "64",
                                                      "--batch", "16"],
           ["bench_geometry.py", "--seq-len", "1024", "--n-prompts", "4", "--batch", "4"],
           ["bench_native.py", "--n-prompts", "48", "--repeats", "3"],
           ["bench_native.py", "--seq-len", "1024", "--n-prompts", "4", "--repeats", "3"],
           ["bench_ablation.py"], ["bench_sula.py"], ["bench_martingale.py"], ["bench_report.py"]]


def main() -> int:
    failed = []
    for name, *args in SCRIPTS:
        print(f"\n## {' '.join([name] + args)}\n", flush=True)
        if subprocess.run([sys.executable, str(HERE / name), *args], cwd=HERE.parent).returncode != 0:
            failed.append(" ".join([name] + args))
    if failed:
        print(f"\nfailed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
