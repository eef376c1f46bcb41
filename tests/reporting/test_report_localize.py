"""The opt-in report section "localize" (bl.localize in the report and `bayes-lens localize`)."""

import json

import bayes_lens as bl
from bayes_lens.models.tiny import tiny_model


def test_localize_section_is_opt_in_and_writes_its_rows(tmp_path):
    from bayes_lens.reporting._sections import SECTIONS

    assert not SECTIONS["localize"].default
    model = tiny_model("bridge")
    doc = bl.report(model, tmp_path / "r", sections=["sula", "localize"], quick=True, progress=False,
                    overrides={"localize_n_random": 3, "n_boot": 50, "sula_n_per_k": 4})
    sec = doc["sections"]["localize"]
    assert sec["status"] == "ok", sec
    keys = [m["key"] for m in sec["metrics"]]
    assert keys and all(k.startswith("localize.L") for k in keys)
    for m in sec["metrics"]:
        assert m["units"] == "bits" and m["ci"] is not None and m["baseline"]["low"] <= m["baseline"]["high"]
        assert m["verdict"]["pass"] is None and m["verdict"]["text"].split(":")[0] in (
            "READOUT AND MEDIATOR", "READOUT ONLY", "MEDIATOR ONLY", "NEITHER")
    assert (tmp_path / "r" / "tables" / "localize__localize.csv").is_file()
    assert (tmp_path / "r" / "tables" / "localize__localize_downstream.csv").is_file()
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert "localize" in saved["sections"]


def test_a_report_without_named_sections_leaves_localize_out(monkeypatch):
    from bayes_lens.reporting._core import check_sections
    from bayes_lens.reporting._sections import SECTIONS

    names = [s.name for s in check_sections(None, SECTIONS)]
    assert "localize" not in names and names == ["geometry", "sula", "ablation", "martingale"]


def test_a_section_pulls_in_the_sections_it_needs():
    """Issue 53.6: `report --sections localize` skipped localize silently (its SULA prompts come from the sula
    section, which was not named); `--sections ablation` failed the same way. A section's prerequisites are
    now added before it, and a prerequisite named after its section is moved before it."""
    from bayes_lens.reporting._core import check_sections
    from bayes_lens.reporting._sections import SECTIONS

    def names(x):
        return [s.name for s in check_sections(x, SECTIONS)]

    assert names(["localize"]) == ["sula", "localize"]
    assert names(["ablation"]) == ["sula", "ablation"]
    assert names(["localize", "sula"]) == ["sula", "localize"]
    assert names(["geometry", "localize", "ablation"]) == ["geometry", "sula", "localize", "ablation"]
    assert names(["martingale", "geometry"]) == ["martingale", "geometry"]   # otherwise the order asked for
    for section in SECTIONS.values():   # every shared result a section reads comes from a section before it
        assert set(section.after) <= set(SECTIONS), section.name


def test_report_with_only_localize_runs_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BAYES_LENS_PROGRESS", "1")   # the "[i/n] section" lines count the sections added
    model = tiny_model("bridge")
    doc = bl.report(model, tmp_path / "r", sections=["localize"], quick=True, progress=True,
                    overrides={"localize_n_random": 3, "n_boot": 50, "sula_n_per_k": 4})
    assert list(doc["sections"]) == ["sula", "localize"]
    assert doc["sections"]["localize"]["status"] == "ok", doc["sections"]["localize"]
    err = capsys.readouterr().err
    assert "[1/2] sula ..." in err and "[2/2] localize ..." in err
