"""The report's first screen (issue 37.3): a headline figure right under the title, the sentences one
click away, the WIDE warning said once, short table rows, and figures that stay inside their boxes, with
no text over another, at a laptop width (1366 px) and a phone width (390 px) in a real headless Chromium.

The browser tests render the real sections on the tiny model at reduced sizes (no SmolLM2 needed); the
figure's contents are checked on synthetic documents against numbers written out by hand.
"""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.reporting import Metric, _html, validate
from bayes_lens.reporting._headline import MARKS as MARKS_, answer_lines, compare_to_baseline, headline_figure, headline_rows, mark
from bayes_lens.reporting._references import reference_number
from bayes_lens.reporting._verdicts import WIDE_WARNING
from browser import find_chromium, measure, overlaps, screenshot

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"geometry_n": 12, "geometry_pool": 40, "geometry_n_null": 10, "sula_n_per_k": 3, "n_boot": 50,
         "martingale_ns": (8, 16, 24), "martingale_n_seqs": 4,
         "martingale_permutation": {"seq_len": 8, "n_seqs": 2, "n_perms": 8, "ks": (1, 2, 4)},
         "martingale_compression": {"thetas": (0.3, 0.7), "seq_len": 16, "n_seqs": 3}}
WIDTHS = ((1366, 900), (390, 844))
needs_chromium = pytest.mark.skipif(find_chromium() is None,
                                    reason="chromium is not installed (apt-get install -y chromium)")


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    from bayes_lens.models.tiny import tiny_model

    out = tmp_path_factory.mktemp("first_screen") / "report"
    doc = bl.report(tiny_model("bridge", gqa=True, rotary=True), out, quick=True, seed=0, progress=False, overrides=SMALL)
    assert doc["status"] == "ok", {n: s.get("error") for n, s in doc["sections"].items()}
    return doc


def _m(key, value, units, ci=None, baseline=None, verdict=None, refs=()):
    return {"section": key.split(".")[0], "key": key, "label": f"long label of {key}", "value": value,
            "units": units, "ci": None if ci is None else {"low": ci[0], "high": ci[1], "level": 0.95, "method": "m"},
            "baseline": baseline, "references": list(refs), "note": "", "verdict": verdict}


def _doc(summary, quick=True):
    return {"summary": summary, "sections": {}, "settings": {"quick": quick}}


# ------------------------------------------------------------------------------------------- the figure
def test_papers_values_are_placed_on_the_axis_as_the_papers_wrote_them():
    r = lambda value, model="m": {"model": model, "value": value, "source": "s"}  # noqa: E731
    got = lambda value, units, model="m": reference_number(r(value, model), units)  # noqa: E731
    assert got("99.7%", "fraction") == {"kind": "value", "value": pytest.approx(0.997), "low": pytest.approx(0.997),
                                        "high": pytest.approx(0.997)}
    assert got("15-20%", "fraction") == {"kind": "value", "value": pytest.approx(0.175), "low": pytest.approx(0.15),
                                         "high": pytest.approx(0.20)}
    assert got("0.182 ± 0.021", "nats") == {"kind": "value", "value": 0.182, "low": pytest.approx(0.161),
                                            "high": pytest.approx(0.203)}
    assert got("-0.48 [-0.52, -0.44]; theory -0.5", "dimensionless") == {"kind": "value", "value": -0.48,
                                                                         "low": -0.52, "high": -0.44}
    assert got("-0.32", "correlation")["value"] == -0.32 and got("+0.34", "correlation")["value"] == 0.34
    assert got("0.44 bits", "bits")["value"] == 0.44 and got("~0", "correlation")["value"] == 0.0
    assert got("> 30%", "fraction", "pass threshold") == {"kind": "threshold", "value": pytest.approx(0.3),
                                                          "low": pytest.approx(0.3), "high": pytest.approx(0.3)}
    assert got("< 0.20 in >= 50% of layers", "cosine", "pass threshold")["value"] == 0.20
    # not a point on the same axis: a bound, a |rho| on a signed axis, a percentage of something else
    assert got("< 1% change", "bits") is None and got("|rho| 0.65-0.80", "correlation") is None
    assert got("< 0.3", "dimensionless") is None and got("5%", "bits") is None


def test_verdict_marks():
    wide = {"pass": None, "text": WIDE_WARNING}
    assert mark(_m("a", 1, "bits", verdict={"pass": True, "text": "PASS: x"})) == "pass"
    assert mark(_m("a", 1, "bits", verdict={"pass": False, "text": f"FAIL: x; {WIDE_WARNING}"})) == "fail"
    assert mark(_m("a", 1, "bits", verdict={"pass": None, "text": "INCONCLUSIVE: n = 600 would decide"})) == "inconclusive"
    assert mark(_m("a", 1, "bits", verdict=wide)) == "inconclusive"
    assert mark(_m("a", 1, "bits", verdict={"pass": None, "text": "CI excludes 0: related"})) == "none"
    assert mark(_m("a", 1, "bits")) == "none"


def test_headline_figure_draws_point_interval_baseline_band_papers_and_threshold():
    pc12 = _m("geometry.mixed.pc12", 0.359, "fraction", (0.292, 0.436),
              {"value": 0.233, "label": "Gaussian null", "low": 0.21, "high": 0.256},
              refs=[{"model": "Phi-2", "value": "60.6%", "source": "A"},
                    {"model": "Mistral-7B", "value": "15-20%", "source": "A"}])
    focus = _m("geometry.focusing_reduction", 0.029, "fraction", (0.012, 0.045),
               verdict={"pass": False, "text": "FAIL: reduction > 30%"},
               refs=[{"model": "pass threshold", "value": "> 30%", "source": "A"}])
    gap = _m("martingale.A", 1.057, "nats", (-0.716, 3.568), {"value": 0.567, "label": "Laplace"},
             verdict={"pass": None, "text": WIDE_WARNING},
             refs=[{"model": "GPT-3", "value": "0.182 ± 0.021", "source": "B"}])
    other = _m("sula.kl_bits", 1.2, "bits", (0.7, 1.7))               # not a headline row
    missing = _m("sula.mae_bits", None, "bits")                         # no value: no row
    doc = _doc([gap, other, missing, focus, pc12])
    rows = headline_rows(doc)
    assert [r["key"] for r in rows] == ["geometry.mixed.pc12", "geometry.focusing_reduction", "martingale.A"]
    fig = headline_figure(doc)
    # one panel (x axis) per row, each with its own range containing everything it draws
    xaxes = [fig.layout[f"xaxis{'' if i == 0 else i + 1}"] for i in range(3)]
    lo, hi = xaxes[0].range
    assert lo < 0.15 and hi > 0.606 and xaxes[0].tickformat == ".0%"
    lo, hi = xaxes[2].range
    assert lo < -0.716 and hi > 3.568 and xaxes[2].tickformat is None
    models = [t for t in fig.data if t.name == "this model"]
    assert [t.x[0] for t in models] == [0.359, 0.029, 1.057]
    np.testing.assert_allclose([models[0].error_x.arrayminus[0], models[0].error_x.array[0]], [0.359 - 0.292, 0.436 - 0.359])
    papers = [t for t in fig.data if t.name == "papers"]
    np.testing.assert_allclose(papers[0].x, [0.606, 0.175])
    np.testing.assert_allclose(papers[0].error_x.arrayminus, [0, 0.025], atol=1e-12)
    np.testing.assert_allclose(papers[1].x, [0.182])
    assert [t.x[0] for t in fig.data if t.name == "random baseline"] == [0.233, 0.567]
    # the null's 95% range is a band on the first panel; the focusing threshold a line at 30% on the second
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 1 and (rects[0].x0, rects[0].x1, rects[0].xref) == (0.21, 0.256, "x")
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].x0 == pytest.approx(0.3) and lines[0].xref == "x2"
    # each panel's title line names it, gives value and CI, flags WIDE; its mark is the verdict
    text = [a.text for a in fig.layout.annotations]
    assert "Value manifold PC1+PC2" in text[0] and "35.9% [29.2%, 43.6%]" in text[0]
    assert "1.057 nats [-0.716, 3.568]" in text[4] and "WIDE" in text[4] and "WIDE" not in text[0]
    assert [re.sub("<[^>]+>", "", text[i]) for i in (1, 3, 5)] == ["–", "✗", "?"]


def test_first_screen_html_has_the_figure_first_and_the_sentences_one_click_away():
    rows = [_m("geometry.mixed.alignment_spearman", 0.236, "correlation", (-0.16, 0.58), {"value": 0.0, "label": "none"},
               verdict={"pass": None, "text": "|ρ| = 0.24; CI includes 0: no evidence of a relation; " + WIDE_WARNING}),
            _m("sula.pearson", 0.47, "correlation", (0.16, 0.73),
               verdict={"pass": None, "text": "CI excludes 0: follows; " + WIDE_WARNING}),
            _m("ablation.delta_pearson", 0.039, "correlation", (0.016, 0.076),
               verdict={"pass": False, "text": "FAIL (calibration changes): Δ r = +0.039 wholly outside ±0.01; rule: x"})]
    doc = dict(_doc(rows), sections={})
    page = _html._headline_html(doc, headline_figure(doc))
    # the figure comes before the words, which are in a closed <details>
    assert page.index("fig-headline") < page.index("<details id='glance-words'>")
    assert "<details id='glance-words'><summary>" in page and "<details open" not in page
    # the WIDE warning is said once (not once per row) and rows carry a WIDE flag instead
    assert page.count("too wide to compare with the papers") == 1 and WIDE_WARNING not in page
    table = _html._metrics_table(rows, with_section=True)
    assert WIDE_WARNING not in table and table.count(">WIDE</span>") == 2
    # a verdict sentence is one click away behind its first words
    assert ("<summary><span class='verdict fail'>FAIL (calibration changes)</span></summary>"
            "<span class='muted'>FAIL (calibration changes): Δ r = +0.039") in table


# ------------------------------------------------------------------------------------ the answer in words
def _answer_doc(pc12_ci, pearson_text, removed_text, delta_marks):
    def v(p):
        return {"pass": p, "text": {True: "PASS (calibration survives): x", False: "FAIL (calibration changes): x",
                                    None: "INCONCLUSIVE: x"}[p]}
    rows = [_m("geometry.mixed.pc12", 0.5, "fraction", pc12_ci, {"value": 0.34, "label": "null"}),
            _m("geometry.key_orthogonality", 0.1, "cosine", (0.09, 0.11), {"value": 0.1, "label": "g"},
               verdict={"pass": True, "text": "PASS: x"}),
            _m("geometry.focusing_reduction", 0.01, "fraction", (0.0, 0.02), verdict={"pass": False, "text": "FAIL: x"}),
            _m("sula.mae_bits", 0.43, "bits", (0.35, 0.49), {"value": 0.62, "label": "evidence-blind"}),
            _m("sula.pearson", 0.47, "correlation", (0.16, 0.73), verdict={"pass": None, "text": pearson_text}),
            _m("ablation.corr_clean", 0.4, "correlation", (0.2, 0.6), verdict={"pass": None, "text": "CI excludes 0: x"}),
            _m("ablation.corr_removed", 0.0, "correlation", (-0.1, 0.1), verdict={"pass": None, "text": removed_text}),
            _m("ablation.delta_mae_bits", 0.0, "bits", (-0.01, 0.01), verdict=v(delta_marks[0])),
            _m("ablation.delta_pearson", 0.0, "correlation", (-0.01, 0.01), verdict=v(delta_marks[1]))]
    return dict(_doc(rows), sections={})


def test_answer_lines_read_the_same_verdicts_as_the_figure():
    """Issue 53 §2: the first screen answers its question in words, each part from the verdicts and
    baselines the figure marks (synthetic documents, every branch)."""
    lines = dict(answer_lines(_answer_doc((0.4, 0.6), "CI excludes 0: follows", "CI includes 0: (geometry breaks)",
                                          (True, True))))
    assert list(lines) == ["Calibration to the exact posterior", "Geometry above its null", "Ablation"]
    assert lines["Calibration to the exact posterior"] == (
        "MAE 0.430 bits, below the evidence-blind baseline's 0.620 bits (it uses the evidence); its entropy "
        "follows the Bayes entropy (r = 0.470, CI excludes 0)")
    assert lines["Geometry above its null"] == ("yes for the value manifold (PC1+PC2 50.0%, CI above the null's "
                                                "34.0%); Paper A's thresholds: key orthogonality PASS, attention "
                                                "focusing FAIL")
    assert lines["Ablation"] == ("removing the entropy axis breaks the geometry (ρ after removal: CI includes 0); "
                                 "calibration survives")
    lines = dict(answer_lines(_answer_doc((0.3, 0.6), "CI includes 0: no evidence", "CI excludes 0: x",
                                          (True, False))))
    assert "no evidence that its entropy follows" in lines["Calibration to the exact posterior"]
    assert lines["Geometry above its null"].startswith("not shown: ")
    assert lines["Ablation"] == ("removing the entropy axis does not break the geometry (ρ after removal: CI "
                                 "excludes 0); calibration changes")
    lines = dict(answer_lines(_answer_doc((0.1, 0.2), "CI includes 0: x", "CI includes 0: x", (True, None))))
    assert lines["Geometry above its null"].startswith("no: ")
    assert lines["Ablation"].endswith("whether calibration survives is inconclusive")
    assert answer_lines(_doc([])) == []  # a report without these numbers says nothing rather than guessing


def test_parameter_card_explains_the_count_in_place():
    """Issue 53 §2: "163.0 M parameters (as loaded)" for SmolLM2-135M is explained on the card: a
    HookedTransformer stores the tied unembedding as its own copy of W_E.T (28.3 M) and every bias (zeros)."""
    from bayes_lens.cli import _parameter_counts
    from bayes_lens.models.tiny import tiny_model
    from bayes_lens.reporting._core import model_identity

    m = {"n_parameters": 162_997_632, "n_weights": 134_515_008,
         "parameters_note": "28,311,552 in a separate copy of the tied unembedding; 171,072 in all-zero biases"}
    card = _html._parameters_card(m)
    assert card.startswith("163.0 M (134.5 M weights in the checkpoint; the rest: 28,311,552 in a separate copy")
    assert _html._parameters_card({"n_parameters": 5_000_000}) == "5.0 M"           # a 1.1 document
    assert _html._parameters_card(dict(m, n_weights=162_997_632)) == "163.0 M"      # the two agree: no note
    import torch
    from bayes_lens.adapter import has_hooked_transformer

    for model in ([tiny_model("hooked")] if has_hooked_transformer() else []) + [tiny_model("bridge")]:
        ident = model_identity(model, None)
        assert (ident["n_parameters"], ident["n_weights"], ident["parameters_note"]) == _parameter_counts(model)
        assert ident["n_parameters"] == sum(p.numel() for p in model.parameters())
    if not has_hooked_transformer():
        return
    model = tiny_model("hooked")   # tie the unembedding as TL does for SmolLM2: its own copy of W_E.T
    with torch.no_grad():
        model.unembed.W_U.copy_(model.embed.W_E.T)
    ident = model_identity(model, None)
    assert ident["n_parameters"] - ident["n_weights"] >= model.unembed.W_U.numel()
    assert f"{model.unembed.W_U.numel():,} in a separate copy of the tied unembedding" in ident["parameters_note"]


# ------------------------------------------------------------------------------------ the real page
def test_tiny_report_headline_and_baseline_band(tiny_report):
    validate(tiny_report)
    pc12 = next(m for m in tiny_report["summary"] if m["key"] == "geometry.mixed.pc12")
    b = pc12["baseline"]
    assert b["low"] < b["value"] < b["high"]  # the simulated null's 95% range travels with its mean
    html = tiny_report.html.read_text(encoding="utf-8")
    assert html.index("id='headline'") < html.index("id='summary'")
    assert html.index("id='headline'") < html.index("class='grid'")  # right under the title, before the cards
    keys = [r["key"] for r in headline_rows(tiny_report)]
    assert keys[:3] == ["geometry.mixed.pc12", "geometry.math.pc12_diff", "geometry.key_orthogonality"]
    assert {"sula.mae_bits", "sula.pearson", "ablation.delta_mae_bits", "martingale.A"} <= set(keys)
    # no verdict sentence repeats the WIDE warning anywhere on the page
    assert htmllib.escape(WIDE_WARNING, quote=True) not in html and WIDE_WARNING not in html


def test_tiny_report_answers_its_question_under_the_title(tiny_report):
    """Issue 53 §2 on a real report of the tiny model: two or three lines under the title, in the header
    before the figure, that say what the verdicts say; the status badge says it is the run's status."""
    html = tiny_report.html.read_text(encoding="utf-8")
    head = html[html.index("<header>"):html.index("</header>")]
    assert html.index("id='answers'") < html.index("id='headline'")
    lines = answer_lines(tiny_report)
    assert 2 <= len(lines) <= 3
    for label, text in lines:
        assert f"<li><b>{label}:</b> {htmllib.escape(text, quote=True)}</li>" in head
    by_key = {m["key"]: m for m in tiny_report["summary"]}
    got = dict(lines)
    side = compare_to_baseline(by_key["geometry.mixed.pc12"])
    assert got["Geometry above its null"].startswith({"above": "yes", "below": "no"}.get(side, "not shown"))
    marks = [mark(by_key[k]) for k in ("ablation.delta_mae_bits", "ablation.delta_pearson")]
    assert got["Ablation"].endswith("calibration changes" if "fail" in marks else "calibration survives"
                                    if marks == ["pass", "pass"] else "inconclusive")
    mae = by_key["sula.mae_bits"]
    assert ("below the evidence-blind" in got["Calibration to the exact posterior"]) == (
        mae["ci"]["high"] < mae["baseline"]["value"])
    # the badge: the run's status, not a verdict on the model
    assert "report run: ok (every section ran; not a verdict on the model)" in head
    assert "<span class='badge ok'>ok</span>" not in head
    # the parameter card carries the checkpoint's count and why they differ, when they do
    m = tiny_report["model"]
    assert m["n_weights"] <= m["n_parameters"]
    assert _html._parameters_card(m) in html


@needs_chromium
@pytest.mark.parametrize("width,height", WIDTHS)
def test_figures_stay_in_their_boxes_and_the_headline_is_on_the_first_screen(tiny_report, width, height, tmp_path):
    m = measure(tiny_report.html, width=width, height=height)
    assert (m["innerWidth"], m["innerHeight"]) == (width, height)
    n = sum(len(s["figures"]) for s in tiny_report["sections"].values())
    figs = {f["id"]: f for f in m["figures"]}
    assert len(figs) == n + 1 and "fig-headline" in figs
    for f in m["figures"]:
        assert f["scrollWidth"] <= f["boxClientWidth"], f   # the SULA figure was 1300 px in a 1138 px box
        assert f["svgWidth"] <= f["boxClientWidth"] + 0.5, f
        assert f["boxLeft"] - 0.5 <= f["left"] and f["right"] <= f["boxRight"] + 0.5, f
    assert m["docScrollWidth"] <= width  # nothing makes the page scroll sideways
    # no subplot title, axis title or tick label runs into another or into a plot area ("Geometry by domain"
    # had five rotated y-axis titles over the neighbouring panels; at 390 px multi-panel figures are stacked)
    for fid in ("fig-geometry-0", "fig-sula-0", "fig-ablation-0"):
        assert figs[fid]["texts"] and overlaps(figs[fid]) == [], fid
    head = figs["fig-headline"]
    if width >= 1000:  # on a laptop the answer in words and the whole figure are on the first screen
        assert head["top"] < 0.35 * height and head["bottom"] <= height
    else:  # on a phone the answer in words fills the first screen's top; the figure starts on it
        assert head["top"] < 0.65 * height
    png = screenshot(tiny_report.html, tmp_path / f"first_screen_{width}.png", width=width, height=height)
    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (width, height)


@needs_chromium
@pytest.mark.parametrize("width,height", WIDTHS)
def test_headline_forest_fits_a_phone_and_a_laptop(tiny_report, width, height):
    """Issue 53 §3: at 390 px (a phone) and 1366 px, nothing of the forest plot is cut off: its drawing is no
    wider than its box, every row label, tick label, verdict mark, marker and error bar lies inside the box,
    and the verdict marks sit in a column of their own (the right margin), clear of every plot area, every
    marker and every label. (Measured in an iframe of exactly that width: Chromium's headless window is at
    least 500 px wide, so a plain --window-size=390 screenshot crops a 500-px layout and cuts off its right
    part.) If a drawing were ever wider than its box, the box scrolls (overflow-x: auto) instead of cutting."""
    m = measure(tiny_report.html, width=width, height=height)
    f = {x["id"]: x for x in m["figures"]}["fig-headline"]
    assert f["svgWidth"] <= f["boxClientWidth"] + 0.5 and f["scrollWidth"] <= f["boxClientWidth"], f
    lo, hi = f["boxLeft"] - 0.5, f["boxRight"] + 0.5
    n_rows = len(headline_rows(tiny_report))
    assert len(f["texts"]) >= 2 * n_rows and f["ticks"] and len(f["points"]) >= n_rows
    for t in f["texts"] + f["ticks"] + f["points"]:
        assert lo <= t["l"] and t["r"] <= hi, (width, t)
    marks = [t for t in f["texts"] if t["text"] in {sym for sym, _, _ in MARKS_.values()}]
    labels = [t for t in f["texts"] if t not in marks]
    assert len(marks) == n_rows
    right_of_points = max(p["r"] for p in f["points"])
    for mk in marks:
        assert mk["l"] >= right_of_points - 0.5, mk              # the verdict column is right of every axis's drawing
        for other in labels + f["points"]:
            assert not (min(mk["r"], other["r"]) - max(mk["l"], other["l"]) > 0.5
                        and min(mk["b"], other["b"]) - max(mk["t"], other["t"]) > 0.5), (mk, other)
    assert m["docScrollWidth"] <= width
