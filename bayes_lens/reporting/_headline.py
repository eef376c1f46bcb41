"""The report's first screen: one figure with every headline number, its interval, its random baseline,
the papers' values and the verdict, one row per signature.

Layout: *small multiples*, one thin panel per row, each with its own x axis in the quantity's own
units. The headline numbers come in six units (fractions, cosines, correlations, bits, nats, a slope)
and on ranges from 0.001 bits to 100%, so one shared axis would flatten most rows into a dot, and a
normalised axis (each row rescaled to [0, 1]) would show where the point sits but not what it is: a
reader could not read "0.36 bits" or "30%" off it. Within a row everything drawn (the model's point
and 95% interval, the baseline and its null range, the papers' values, a pass threshold) has the
same units, which is the comparison a row makes. Each panel's title line names the quantity and
gives the value and interval in words, so the numbers do not depend on reading ticks, and the mark at
its right end, in a column of its own (the right margin), is the verdict: ✓ pass, ✗ fail, ? inconclusive (an INCONCLUSIVE verdict or a WIDE
interval), – no rule. Hovering a point shows the full label and verdict sentence.

:func:`headline_rows` picks the rows from a report document; :func:`headline_figure` draws them;
:func:`answer_lines` answers the report's question in two or three lines of words (calibration to the
exact posterior, geometry against its null, the ablation), read off the same verdicts and baselines.
Pure functions of the document: no model runs here.
"""

from __future__ import annotations

import textwrap
from typing import List, Optional

from ._format import format_ci, format_value
from ._references import reference_number
from ._verdicts import split_wide, verdict

__all__ = ["HEADLINE_KEYS", "headline_rows", "headline_figure", "mark", "MARKS", "answer_lines", "compare_to_baseline"]

# (metric key, short label) in the order of the figure; "geometry.<domain>.pc12_diff" rows follow the
# value manifold for every restricted domain the report has
HEADLINE_KEYS = (
    ("geometry.mixed.pc12", "Value manifold PC1+PC2"),
    ("geometry.*.pc12_diff", "PC1+PC2 {domain} − mixed"),
    ("geometry.key_orthogonality", "Key orthogonality |cos|"),
    ("geometry.focusing_reduction", "Attention focusing"),
    ("geometry.mixed.alignment_spearman", "Entropy alignment ρ"),
    ("sula.mae_bits", "SULA MAE vs Bayes"),
    ("sula.pearson", "SULA r, model vs Bayes"),
    ("ablation.corr_removed", "Ablation: ρ after removal"),
    ("ablation.delta_mae_bits", "Ablation: Δ SULA MAE"),
    ("ablation.delta_pearson", "Ablation: Δ SULA r"),
    ("martingale.A", "Martingale gap A"),
    ("martingale.permutation_slope", "Permutation slope"),
)

# verdict mark -> (symbol, colour, legend word)
MARKS = {"pass": ("✓", "#0a7a33", "pass"), "fail": ("✗", "#b3261e", "fail"),
         "inconclusive": ("?", "#a15c00", "inconclusive"), "none": ("–", "#6b7280", "no rule")}
_MODEL, _PAPER, _BASE, _THRESH = "#1f3f8a", "#d97706", "#6b7280", "#0a7a33"


def _verdict_of(m: dict) -> Optional[dict]:
    return m.get("verdict") if "verdict" in m else verdict(m)


def mark(m: dict) -> str:
    """The verdict of metric ``m`` as one of "pass", "fail", "inconclusive", "none".

    A verdict with ``pass`` True/False is pass/fail (a WIDE interval does not change it, the row is also
    flagged WIDE); ``pass`` None is inconclusive when the verdict says INCONCLUSIVE, POOR FIT or WIDE,
    and "none" for a reading without a rule (e.g. "CI excludes 0: related"); no verdict is "none"."""
    v = _verdict_of(m)
    if not v:
        return "none"
    if v.get("pass") is True:
        return "pass"
    if v.get("pass") is False:
        return "fail"
    text, wide = split_wide(v.get("text", ""))
    return "inconclusive" if wide or text.startswith(("INCONCLUSIVE", "POOR FIT")) else "none"


def compare_to_baseline(m: dict) -> str:
    """'above' / 'below' when the 95% CI excludes the baseline, '≈' when it includes it, '' without one."""
    b = (m.get("baseline") or {}).get("value")
    v = m.get("value")
    if b is None or v is None:
        return ""
    ci = m.get("ci") or {}
    lo, hi = ci.get("low"), ci.get("high")
    if lo is not None and hi is not None:
        if lo > b:
            return "above"
        if hi < b:
            return "below"
        return "≈ (CI includes it)"
    return "above (no CI)" if v > b else "below (no CI)" if v < b else "equal"


def _text_of(m: Optional[dict]) -> str:
    return split_wide(((_verdict_of(m) or {}) if m else {}).get("text", ""))[0]


def _calibration_line(by_key: dict) -> Optional[str]:
    mae, r = by_key.get("sula.mae_bits"), by_key.get("sula.pearson")
    parts = []
    if mae and mae.get("value") is not None:
        side, b = compare_to_baseline(mae), (mae.get("baseline") or {}).get("value")
        v = _fmt(mae["value"], "bits")
        if b is None or not side:
            parts.append(f"MAE {v}")
        else:
            bt = _fmt(b, "bits")
            parts.append({"below": f"MAE {v}, below the evidence-blind baseline's {bt} (it uses the evidence)",
                          "above": f"MAE {v}, above the evidence-blind baseline's {bt} (worse than ignoring "
                                   "the evidence)"}.get(
                side.split(" (")[0], f"MAE {v}, not distinguishable from the evidence-blind baseline's {bt}"))
    if r and r.get("value") is not None:
        t = _text_of(r)
        rv = f"r = {format_value(r['value'], 'correlation')}"
        parts.append(f"its entropy follows the Bayes entropy ({rv}, CI excludes 0)" if t.startswith("CI excludes 0")
                     else f"no evidence that its entropy follows Bayes's ({rv}, CI includes 0)"
                     if t.startswith("CI includes 0") else rv)
    return "; ".join(parts) or None


def _geometry_line(by_key: dict) -> Optional[str]:
    parts = []
    pc = by_key.get("geometry.mixed.pc12")
    if pc and pc.get("value") is not None and (pc.get("baseline") or {}).get("value") is not None:
        side = compare_to_baseline(pc).split(" (")[0]
        v, b = _fmt(pc["value"], "fraction"), _fmt(pc["baseline"]["value"], "fraction")
        parts.append({"above": f"yes for the value manifold (PC1+PC2 {v}, CI above the null's {b})",
                      "below": f"no: the value manifold's PC1+PC2 {v} is below the null's {b}"}.get(
            side, f"not shown: the value manifold's PC1+PC2 {v} is within reach of the null's {b} (CI includes it)"))
    judged = [(short, mark(by_key[k])) for k, short in (("geometry.key_orthogonality", "key orthogonality"),
                                                        ("geometry.focusing_reduction", "attention focusing"))
              if k in by_key and by_key[k].get("value") is not None]
    if judged:
        words = {"pass": "PASS", "fail": "FAIL", "inconclusive": "inconclusive", "none": "no rule"}
        parts.append("Paper A's thresholds: " + ", ".join(f"{s} {words[mk]}" for s, mk in judged))
    return "; ".join(parts) or None


def _ablation_line(by_key: dict) -> Optional[str]:
    parts = []
    removed, clean = by_key.get("ablation.corr_removed"), by_key.get("ablation.corr_clean")
    if removed and removed.get("value") is not None:
        t = _text_of(removed)
        geo = ("removing the entropy axis breaks the geometry (ρ after removal: CI includes 0)"
               if "includes 0" in t else "removing the entropy axis does not break the geometry (ρ after removal: "
               "CI excludes 0)" if "excludes 0" in t else f"ρ after removal {format_value(removed['value'], 'correlation')}")
        if clean and _text_of(clean).startswith("CI includes 0"):
            geo += ", but there was little to break (clean ρ: CI includes 0)"
        parts.append(geo)
    marks = [mark(by_key[k]) for k in ("ablation.delta_mae_bits", "ablation.delta_pearson")
             if k in by_key and by_key[k].get("value") is not None]
    if marks:
        parts.append("calibration changes" if "fail" in marks else "calibration survives"
                     if all(mk == "pass" for mk in marks) else "whether calibration survives is inconclusive")
    return "; ".join(parts) or None


#: the report's question, part by part: (label, the function that answers it from the summary)
_ANSWERS = (("Calibration to the exact posterior", _calibration_line),
            ("Geometry above its null", _geometry_line),
            ("Ablation", _ablation_line))


def answer_lines(doc: dict) -> List[tuple]:
    """The report's question ("does this model carry, and use, Bayesian geometry?") answered in words:
    ``[(label, answer), ...]`` for calibration to the exact posterior (SULA MAE against the evidence-blind
    baseline, the entropy correlation's verdict), the geometry against its null (the value manifold's
    PC1+PC2 against the Gaussian null, Paper A's thresholds) and the ablation (whether the geometry breaks,
    whether calibration survives). Each is read off the same verdicts and baselines the figure marks; a
    part whose numbers the report does not have is left out."""
    by_key = {m["key"]: m for m in doc.get("summary", [])}
    out = []
    for label, answer in _ANSWERS:
        text = answer(by_key)
        if text:
            out.append((label, text))
    return out


def headline_rows(doc: dict) -> List[dict]:
    """The summary metrics the first screen shows (those with a value), with ``short`` labels, in order."""
    by_key = {m["key"]: m for m in doc.get("summary", [])}
    rows = []
    for key, short in HEADLINE_KEYS:
        if "*" in key:
            head, tail = key.split("*")
            found = [(k[len(head):-len(tail)], m) for k, m in by_key.items() if k.startswith(head) and k.endswith(tail)]
        else:
            found = [(None, by_key[key])] if key in by_key else []
        for domain, m in found:
            if m.get("value") is None:
                continue
            rows.append(dict(m, short=short.format(domain=domain)))
    return rows


def _fmt(v: float, units: str) -> str:
    unit = "" if units in ("fraction", "dimensionless", "cosine", "correlation") else f" {units}"
    return f"{format_value(v, units)}{unit}"


def _value_text(m: dict) -> str:
    u = m["units"]
    text = _fmt(m["value"], u)
    ci = format_ci(m.get("ci"), u)
    return f"{text} {ci}" if ci else text


def _wrap(text: str, width: int = 64) -> str:
    return "<br>".join(textwrap.wrap(text, width)) or ""


def _span(m: dict, papers: list, threshold: Optional[float]):
    """The x range of a row: everything it draws, padded."""
    xs = [m["value"]]
    ci = m.get("ci") or {}
    xs += [x for x in (ci.get("low"), ci.get("high")) if x is not None]
    b = m.get("baseline") or {}
    xs += [x for x in (b.get("value"), b.get("low"), b.get("high")) if x is not None]
    for p in papers:
        xs += [p["low"], p["high"]]
    if threshold is not None:
        xs.append(threshold)
    lo, hi = min(xs), max(xs)
    pad = (hi - lo) * 0.06 or max(abs(hi), 1e-3) * 0.1
    return lo - pad, hi + pad


def headline_figure(doc: dict):
    """The first-screen figure (a plotly ``Figure``), or None when the report has no headline number."""
    rows = headline_rows(doc)
    if not rows:
        return None
    import plotly.graph_objects as go

    label_px, band_px, tick_px, gap_px = 17, 18, 13, 4
    mark_px = 22  # the verdict column: a right margin of its own, so no axis, marker or label runs under a mark
    slot = label_px + band_px + tick_px + gap_px
    mt, mb = 4, 0
    plot_h = slot * len(rows) - gap_px
    height = plot_h + mt + mb

    def y(px):  # paper y of a distance from the top of the plot area
        return 1 - px / plot_h

    fig = go.Figure()
    layout = dict(height=height, margin=dict(l=10, r=mark_px, t=mt, b=mb, autoexpand=True), showlegend=False,
                  plot_bgcolor="#ffffff", paper_bgcolor="#ffffff", hovermode="closest", autosize=True,
                  font=dict(size=11, color="#1d232b"), hoverlabel=dict(font_size=12, align="left"))
    annotations, shapes = [], []
    for i, m in enumerate(rows):
        n = "" if i == 0 else str(i + 1)
        xref, yref = f"x{n}", f"y{n}"
        u = m["units"]
        top = i * slot
        papers, threshold = [], None
        for r in m.get("references") or []:
            p = reference_number(r, u)
            if p is None:
                continue
            if p["kind"] == "threshold":
                threshold = p["value"]
            else:
                papers.append(dict(p, model=r["model"], text=r["value"], source=r["source"]))
        x0, x1 = _span(m, papers, threshold)
        layout[f"xaxis{n}"] = dict(domain=[0, 1], anchor=yref, range=[x0, x1], fixedrange=True, nticks=6,
                                   tickformat=".0%" if u == "fraction" else None, tickfont=dict(size=10),
                                   showgrid=True, gridcolor="#eef0f3", zeroline=True, zerolinecolor="#c9cdd3",
                                   ticks="outside", ticklen=3, tickcolor="#c9cdd3", showline=True,
                                   linecolor="#c9cdd3", automargin=True)
        layout[f"yaxis{n}"] = dict(domain=[y(top + label_px + band_px), y(top + label_px)], anchor=xref,
                                   range=[-1, 1], visible=False, fixedrange=True)
        v = _verdict_of(m) or {}
        text, wide = split_wide(v.get("text", ""))
        mk = mark(m)
        sym, colour, word = MARKS[mk]
        label = (f"<b>{m['short']}</b>  <span style='color:#4b5563'>{_value_text(m)}</span>"
                 + ("  <span style='color:#a15c00'>WIDE</span>" if wide else ""))
        annotations.append(dict(xref="paper", yref="paper", x=0, y=y(top), xanchor="left", yanchor="top",
                                text=label, showarrow=False, font=dict(size=12), align="left"))
        annotations.append(dict(xref="paper", yref="paper", x=1, y=y(top), xanchor="left", yanchor="top", xshift=4,
                                text=f"<b>{sym}</b>", showarrow=False, font=dict(size=14, color=colour),
                                hovertext=_wrap(f"{word.upper()}: {text}" if text else word), name=f"mark-{mk}"))
        b = m.get("baseline") or {}
        if b.get("low") is not None and b.get("high") is not None:
            shapes.append(dict(type="rect", xref=xref, yref=f"{yref} domain", x0=b["low"], x1=b["high"], y0=0,
                               y1=1, fillcolor="rgba(107,114,128,0.20)", line=dict(width=0), layer="below"))
        if threshold is not None:
            shapes.append(dict(type="line", xref=xref, yref=f"{yref} domain", x0=threshold, x1=threshold, y0=0,
                               y1=1, line=dict(color=_THRESH, width=2.5)))
        if b.get("value") is not None:
            rng = (f" (null 95% range {_fmt(b['low'], u)} to {_fmt(b['high'], u)})"
                   if b.get("low") is not None and b.get("high") is not None else "")
            fig.add_trace(go.Scatter(
                x=[b["value"]], y=[0], xaxis=xref, yaxis=yref, mode="markers", name="random baseline",
                marker=dict(symbol="line-ns-open", size=20, color=_BASE, line=dict(width=3, color=_BASE)),
                hovertemplate=_wrap(f"baseline {_fmt(b['value'], u)}{rng}: {b.get('label', '')}") + "<extra></extra>"))
        if papers:
            fig.add_trace(go.Scatter(
                x=[p["value"] for p in papers], y=[-0.5] * len(papers), xaxis=xref, yaxis=yref, mode="markers",
                name="papers", marker=dict(symbol="diamond", size=9, color=_PAPER, line=dict(width=1, color="#fff")),
                error_x=dict(type="data", symmetric=False, array=[p["high"] - p["value"] for p in papers],
                             arrayminus=[p["value"] - p["low"] for p in papers], color=_PAPER, thickness=1.5,
                             width=3),
                hovertemplate="%{text}<extra>papers</extra>",
                text=[f"{p['model']}: {p['text']} ({p['source']})" for p in papers]))
        ci = m.get("ci") or {}
        lo, hi = ci.get("low"), ci.get("high")
        err = (dict(type="data", symmetric=False, array=[hi - m["value"]], arrayminus=[m["value"] - lo],
                    color=_MODEL, thickness=2.5, width=5) if lo is not None and hi is not None else None)
        fig.add_trace(go.Scatter(
            x=[m["value"]], y=[0.35], xaxis=xref, yaxis=yref, mode="markers", name="this model",
            marker=dict(symbol="circle", size=10, color=_MODEL, line=dict(width=1.5, color="#fff")), error_x=err,
            hovertemplate=(f"<b>{_wrap(m['label'])}</b><br>{_value_text(m)}"
                           f"{'<br>95% CI: ' + ci['method'] if ci.get('method') else ''}"
                           + (f"<br>{word.upper()}: {_wrap(text)}" if text else "")
                           + ("<br>WIDE interval" if wide else "") + "<extra></extra>")))
    layout["annotations"], layout["shapes"] = annotations, shapes
    fig.update_layout(**layout)
    return fig
