"""The opt-in report section "confidence" (bl.confidence in the report and `bayes-lens confidence`)."""

import json

import bayes_lens as bl
from bayes_lens.models.tiny import confidence_model


def test_confidence_section_is_opt_in_and_finds_the_planted_neuron(tmp_path):
    from bayes_lens.reporting._sections import SECTIONS

    assert not SECTIONS["confidence"].default
    model, planted = confidence_model("bridge")
    doc = bl.report(model, tmp_path / "r", sections=["confidence"], quick=True, progress=False,
                    overrides={"n_boot": 100})
    sec = doc["sections"]["confidence"]
    assert sec["status"] == "ok", sec
    keys = [m["key"] for m in sec["metrics"]]
    assert f"confidence.neuron{planted.entropy_neuron}.mediated" in keys
    assert {"confidence.axis_overlap", "confidence.axis_norm_share"} <= set(keys)
    share = next(m for m in sec["metrics"] if m["key"] == "confidence.axis_norm_share")
    assert share["verdict"]["text"].split(":")[0] in ("YES", "NO", "UNDECIDED")
    assert (tmp_path / "r" / "tables" / "confidence__confidence_screen.csv").is_file()
    assert "confidence" in json.loads((tmp_path / "r" / "report.json").read_text())["sections"]


def test_cli_has_the_confidence_command():
    from bayes_lens.cli import build_parser

    args = build_parser().parse_args(["confidence", "--quick", "--out", "x"])
    assert args.command == "confidence" and args.quick
