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
