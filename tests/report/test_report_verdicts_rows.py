"""Report polish (issue 26.8): verdicts on more rows where a rule exists, and a Summary table that does not
repeat every section table. Pure functions on synthetic numbers; no model."""

from __future__ import annotations

import math


from bayes_lens._results import Estimate
from bayes_lens.reporting import _html, _sections


def _est(value, lo, hi):
    return Estimate(value, (lo, hi))


def test_calibration_verdict_is_paper_a_one_percent_rule():
    clean = 0.45
    ok = _sections._calibration_verdict(_est(0.002, -0.001, 0.004), clean, "SULA MAE")
    assert ok["pass"] is True and "whole 95% CI" in ok["text"] and "Paper A §6.2" in ok["text"]
    edge = _sections._calibration_verdict(_est(0.002, -0.001, 0.009), clean, "SULA MAE")   # CI reaches 2%
    assert edge["pass"] is True and "point estimate only" in edge["text"]
    bad = _sections._calibration_verdict(_est(0.02, 0.01, 0.03), clean, "SULA MAE")      # 4.4% of clean
    assert bad["pass"] is False and f"{0.02 / clean:.2%}" in bad["text"]
    undefined = _sections._calibration_verdict(_est(0.01, 0.0, 0.02), -0.05, "SULA Pearson r")
    assert undefined["pass"] is None and "undefined" in undefined["text"]


def test_relation_and_slope_verdicts():
    yes = _sections._relation_verdict((0.1, 0.5), "related", "unrelated", "src")
    no = _sections._relation_verdict((-0.1, 0.5), "related", "unrelated", "src")
    assert yes["pass"] is None and yes["text"].startswith("CI excludes 0: related")
    assert no["text"].startswith("CI includes 0: unrelated")
    assert _sections._slope_verdict(-0.54, (-0.58, -0.51))["pass"] is False
    assert _sections._slope_verdict(-0.49, (-0.55, -0.45))["pass"] is True
    assert _sections._slope_verdict(math.nan, (math.nan, math.nan)) is None


def _row(key, refs=(), verdict=None):
    return {"section": key.split(".")[0], "key": key, "label": key, "value": 0.5, "units": "fraction",
            "ci": {"low": 0.4, "high": 0.6}, "baseline": None, "references": list(refs), "verdict": verdict}


def test_summary_keeps_only_rows_next_to_the_papers_or_judged():
    rows = [_row("geometry.a", refs=[{"model": "Phi-2", "value": "0.3", "source": "Paper A"}]),
            _row("sula.b", verdict={"pass": True, "text": "PASS: rule"}),
            _row("sula.c"), _row("martingale.d")]
    html = _html._summary_html(rows, "nav")
    assert "geometry.a" in html and "sula.b" in html
    assert "title='sula.c'" not in html and "title='martingale.d'" not in html
    assert "The other 2 numbers are in their sections." in html
