"""Report polish (issue 26.8): verdicts on more rows where a rule exists, and a Summary table that does not
repeat every section table. Pure functions on synthetic numbers; no model."""

from __future__ import annotations

import math


from bayes_lens._results import Estimate
from bayes_lens.reporting import _html, _sections


def _est(value, lo, hi):
    return Estimate(value, (lo, hi))


def test_calibration_verdict_is_an_equivalence_test_on_the_interval():
    """Paper A's "< 1%" read on the whole 95% interval (METHODS.md §7): PASS only inside the margin,
    FAIL wholly outside, INCONCLUSIVE otherwise (the old rule passed a point estimate whose CI reached 2%)."""
    clean = 0.45
    ok = _sections._calibration_verdict(_est(0.002, -0.001, 0.004), clean, "mae", 60)
    assert ok["pass"] is True and ok["text"].startswith("PASS (calibration survives)") and "Paper A §6.2" in ok["text"]
    assert "wholly inside the equivalence margin ±1.0%" in ok["text"] and "rule:" in ok["text"]
    edge = _sections._calibration_verdict(_est(0.002, -0.001, 0.009), clean, "mae", 60)   # CI reaches 2%
    assert edge["pass"] is None and edge["text"].startswith("INCONCLUSIVE") and "n = " in edge["text"]
    bad = _sections._calibration_verdict(_est(0.02, 0.01, 0.03), clean, "mae", 60)      # 4.4% of clean
    assert bad["pass"] is False and bad["text"].startswith("FAIL (calibration changes)")
    assert f"{100 * 0.02 / clean:+.1f}%" in bad["text"] and "wholly outside" in bad["text"]
    # the correlation: an absolute margin of 0.01, which a clean r near 0 does not make meaningless
    r = _sections._calibration_verdict(_est(0.0085, -0.0016, 0.0203), -0.0716, "corr", 60)
    assert r["pass"] is None and "±0.0100" in r["text"] and "+0.0085" in r["text"]
    r = _sections._calibration_verdict(_est(0.001, -0.004, 0.006), -0.0716, "corr", 60)
    assert r["pass"] is True
    undefined = _sections._calibration_verdict(_est(0.01, 0.0, 0.02), 0.0, "mae", 60)
    assert undefined["pass"] is None and "undefined" in undefined["text"]


def test_slope_verdict_prints_the_interval_on_the_side_it_is():
    """"FAIL: −0.5 inside the 95% CI [-0.56, -0.50]" confused readers: rounding made the shown interval
    contain −0.5 while the real one excludes it. Enough digits are shown to tell, and the rule is stated."""
    v = _sections._slope_verdict(-0.53, (-0.5604, -0.5004))
    assert v["pass"] is False and "[−0.5604, −0.5004] excludes −0.5" in v["text"] and "rule: PASS when" in v["text"]
    v = _sections._slope_verdict(-0.52, (-0.56, -0.49))
    assert v["pass"] is True and "contains −0.5" in v["text"]


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
