"""Time the README's quickstart end to end, statement by statement, on the default model.

The Python code blocks of README.md's "## Quickstart" section (up to the next "## " heading) are run
in order, in one namespace, as written, inside a temporary folder (so ``out="report/"`` lands there).
Every top-level statement is timed; the table names the slowest and the total. Targets: every
statement under 60 s and the whole quickstart under 5 minutes on 2 CPU cores (SmolLM2-135M).
``tests/test_readme_quickstart.py`` runs the same blocks (extracted by :func:`quickstart_blocks`).

Usage: ``.venv/bin/python benchmarks/bench_quickstart.py [--readme README.md] [--json out.json]``
(set ``BAYES_LENS_PROGRESS=0`` for a clean log). Note the machine load (``uptime``) with the figures:
wall-clock times scale with contention for the cores.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]


def quickstart_blocks(readme: Path = ROOT / "README.md") -> List[str]:
    """The ```python blocks of README.md's "## Quickstart" section, in order."""
    text = readme.read_text(encoding="utf-8")
    m = re.search(r"^## Quickstart\s*$(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        raise SystemExit("README.md has no '## Quickstart' section")
    return re.findall(r"^```python\n(.*?)^```", m.group(1), re.S | re.M)


def statements(block: str) -> List[Tuple[str, ast.Module]]:
    """Each top-level statement of ``block`` as (its source, a module holding only it)."""
    tree = ast.parse(block)
    out = []
    for node in tree.body:
        src = ast.get_source_segment(block, node) or ast.unparse(node)
        out.append((src, ast.Module(body=[node], type_ignores=[])))
    return out


def run_quickstart(readme: Path = ROOT / "README.md", *, echo: bool = True,
                   namespace: Optional[dict] = None) -> List[Tuple[str, float]]:
    """Execute the quickstart in a temporary working folder; returns ``[(first line, seconds)]``.

    The quickstart's variables are left in ``namespace`` when one is given (the test reads them).
    """
    ns: dict = namespace if namespace is not None else {}
    ns.setdefault("__name__", "__quickstart__")
    timings = []
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for i, block in enumerate(quickstart_blocks(readme)):
                for src, mod in statements(block):
                    t0 = time.perf_counter()
                    exec(compile(mod, f"<README quickstart block {i + 1}>", "exec"), ns)  # noqa: S102
                    dt = time.perf_counter() - t0
                    line = src.splitlines()[0]
                    timings.append((line, dt))
                    if echo:
                        print(f"{dt:8.1f} s  {line[:100]}", flush=True)
        finally:
            os.chdir(here)
    return timings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    load = os.getloadavg()
    t0 = time.perf_counter()
    timings = run_quickstart(args.readme)
    total = time.perf_counter() - t0
    slow = max(timings, key=lambda t: t[1])
    print(f"\nload average before: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}")
    print(f"total {total:.1f} s over {len(timings)} statements (target <= 300 s); slowest {slow[1]:.1f} s: "
          f"{slow[0][:80]} (target < 60 s)")
    if args.json:
        args.json.write_text(json.dumps({"total_s": total, "load_before": load, "statements": timings}, indent=1))
    return 0 if total <= 300 and slow[1] < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
