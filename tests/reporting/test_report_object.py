"""What bl.report() hands back and prints, and what its numbers are said to mean (issue 16.4, 16.5):
ReportDocument (a dict with a short repr), section headers on stderr, pass/fail verdicts against
Paper A's thresholds, |ρ| for sign-free correlations, wide-interval warnings, the papers named by
title and arXiv id, METHODS.md shipped inside the package and embedded in the HTML."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.errors import MissingExtraError
from bayes_lens.reporting import PAPERS, Metric, ReportDocument, SectionOutput, _sections, methods_path, validate
from bayes_lens.reporting._core import Section
from bayes_lens.reporting._verdicts import verdict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model():
    from bayes_lens.models.tiny import tiny_model as make

    return make("bridge", gqa=True, rotary=True)


def _section(ctx):
    out = SectionOutput(settings={"n": 3})
    # focusing 45% with a CI above 30%: PASS on the whole interval
    out.metrics.append(Metric("geometry.focusing_reduction", "focusing", 0.45, "fraction", (0.35, 0.52)))
    # a negative alignment whose CI excludes 0: related, judged by |rho|; its interval is wide (0.5 > 0.4)
    out.metrics.append(Metric("geometry.mixed.alignment_spearman", "alignment", -0.45, "correlation",
                              (-0.75, -0.25), (0.0, "no relation")))
    out.metrics.append(Metric("geometry.key_orthogonality", "keys", 0.1, "cosine",
                              verdict={"pass": True, "text": "PASS: test"}))
    return out


@pytest.fixture
def one_section(monkeypatch):
    monkeypatch.setattr(_sections, "SECTIONS", {"geometry": Section("geometry", "Stand-in", "three metrics", _section)})


def test_report_returns_a_document_with_a_short_repr_and_prints_headers(tiny_model, one_section, tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.setenv("BAYES_LENS_PROGRESS", "1")
    doc = bl.report(tiny_model, tmp_path / "r", progress=True)
    err = capsys.readouterr().err
    assert "bayes-lens: [1/1] geometry ..." in err and "bayes-lens: [1/1] geometry: ok (" in err
    assert isinstance(doc, ReportDocument) and isinstance(doc, dict)
    assert len(repr(doc)) < 400 and "report.html" in repr(doc) and "geometry: ok" in repr(doc)
    assert doc.path == tmp_path / "r" and doc.html.exists() and doc.json.exists()
    # the dict is the content of report.json; doc["sections"] works as before
    assert json.loads(doc.json.read_text()) == json.loads(json.dumps(doc.doc))
    assert doc["sections"]["geometry"]["metrics"][0]["key"] == "geometry.focusing_reduction"
    validate(doc)
    assert "focusing" in doc.summary()
    # silent with progress off
    bl.report(tiny_model, tmp_path / "q", progress=False)
    assert "bayes-lens: [" not in capsys.readouterr().err


def test_verdicts_in_json_and_html(tiny_model, one_section, tmp_path):
    doc = bl.report(tiny_model, tmp_path, progress=False)
    v = {m["key"]: m["verdict"] for m in doc["summary"]}
    assert v["geometry.focusing_reduction"] == {
        "pass": True, "text": "PASS: reduction > 30% (whole 95% CI; Paper A §4.2)"}
    assert v["geometry.mixed.alignment_spearman"]["pass"] is None
    assert v["geometry.mixed.alignment_spearman"]["text"].startswith("|ρ| = 0.45; CI excludes 0: related")
    assert "WIDE interval" in v["geometry.mixed.alignment_spearman"]["text"]
    assert v["geometry.key_orthogonality"] == {"pass": True, "text": "PASS: test"}
    html = doc.html.read_text(encoding="utf-8")
    assert "PASS: reduction &gt; 30%" in html
    for p in PAPERS.values():
        assert p["title"] in html and f"arXiv {p['arxiv']}" in html
    assert "METHODS.md (the exact definitions)" in html and "## 0. Conventions for every measurement" in html


@pytest.mark.parametrize("value, ci, expected", [
    (0.45, (0.35, 0.52), (True, "whole 95% CI")),
    (0.35, (0.25, 0.45), (True, "point estimate only")),
    (0.20, (0.15, 0.25), (False, "whole 95% CI")),
    (0.25, (0.15, 0.35), (False, "point estimate only")),
])
def test_focusing_threshold_verdict(value, ci, expected):
    m = Metric("geometry.focusing_reduction", "f", value, "fraction", ci).to_json()
    assert m["verdict"]["pass"] is expected[0] and expected[1] in m["verdict"]["text"]


def test_sign_free_correlations_are_judged_by_abs_rho():
    neg = Metric("geometry.math.alignment_spearman", "a", -0.3, "correlation", (-0.45, -0.1)).to_json()
    pos = Metric("geometry.math.alignment_spearman", "a", 0.3, "correlation", (0.1, 0.45)).to_json()
    assert neg["verdict"]["text"] == pos["verdict"]["text"] == "|ρ| = 0.30; CI excludes 0: related (sign arbitrary, compare |ρ|)"
    null = Metric("sula.rho_k_pc1", "r", 0.05, "correlation", (-0.1, 0.2)).to_json()
    assert "CI includes 0: no evidence" in null["verdict"]["text"]
    # a correlation whose sign means something (the ablation axis is signed by the entropy) gets no |ρ| reading
    assert Metric("ablation.corr_clean", "c", 0.3, "correlation", (0.2, 0.4)).to_json()["verdict"] is None


def test_wide_interval_warnings():
    # the example: alignment 0.461 [0.071, 0.725] from a quick report
    m = Metric("geometry.mixed.alignment_spearman", "a", 0.461, "correlation", (0.071, 0.725)).to_json()
    assert "WIDE interval" in m["verdict"]["text"]
    narrow = Metric("geometry.mixed.pc12", "p", 0.3, "fraction", (0.25, 0.36)).to_json()
    assert narrow["verdict"] is None
    wide = Metric("geometry.mixed.pc12", "p", 0.3, "fraction", (0.1, 0.5)).to_json()
    assert wide["verdict"]["pass"] is None and wide["verdict"]["text"].startswith("WIDE interval")
    assert verdict({"key": "x.y", "value": 1.0, "units": "bits", "ci": {"low": 0.0, "high": 9.0}}) is None


def test_key_orthogonality_verdict_counts_layers(monkeypatch):
    """The geometry section's verdict: PASS when >= 50% of layer means are below 0.20."""
    from bayes_lens.reporting._verdicts import KEY_COS_THRESHOLD, KEY_LAYER_FRACTION, threshold_verdict

    for means, ok in (([0.1, 0.15, 0.3, 0.4], True), ([0.1, 0.25, 0.3, 0.4], False)):
        means = np.asarray(means)
        passed = bool(np.mean(means < KEY_COS_THRESHOLD) >= KEY_LAYER_FRACTION)
        assert passed is ok
        assert threshold_verdict(passed, "r")["text"].startswith("PASS" if ok else "FAIL")


def test_methods_md_ships_in_the_package_identical_to_docs():
    shipped = methods_path().read_text(encoding="utf-8")
    assert shipped == (ROOT / "docs" / "METHODS.md").read_text(encoding="utf-8"), (
        "bayes_lens/data/METHODS.md must be a copy of docs/METHODS.md: cp docs/METHODS.md bayes_lens/data/")
    for p in PAPERS.values():
        assert p["arxiv"] in shipped


def test_validate_without_jsonschema_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    with pytest.raises(MissingExtraError, match=r"bayes-lens\[validate\]"):
        validate({"schema_version": "1.0.0"})
