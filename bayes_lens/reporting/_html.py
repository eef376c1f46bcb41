"""Render a report document (and its plotly figures) as ONE self-contained HTML page.

The plotly.js library is embedded inline (``plotly.offline.get_plotlyjs()``), styles are inline and
no external URL is ever loaded, so the page opens offline. A small script records script errors
and, after load, counts the figures that rendered: ``<html data-bl-figures="N" data-bl-rendered="M"
data-bl-errors="[...]">`` (the browser test reads these) and the page footer says the same.
``report.html?only=<figure id>`` shows that one figure alone (a direct link; used for the gallery).
"""

from __future__ import annotations

import html as _html
import json
from typing import Any, Optional, Sequence, Tuple

from ._format import format_ci, format_value
from ._headline import MARKS, answer_lines, compare_to_baseline, headline_figure
from ._references import PAPERS, methods_text
from ._verdicts import split_wide, verdict

__all__ = ["render_html", "format_value", "format_ci"]


def _e(s: Any) -> str:
    return _html.escape(str(s), quote=True)


_CSS = """
.verdict.pass{color:#0a7a33;font-weight:600}.verdict.fail{color:#b3261e;font-weight:600}
pre.methods{white-space:pre-wrap;font-size:12px;max-height:40em;overflow:auto}
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
 margin:0;color:#1d232b;background:#f6f7f9;line-height:1.45}
header{background:#1f2a44;color:#fff;padding:10px 32px}
header h1{margin:0 0 4px 0;font-size:24px;font-weight:600}
header .sub{opacity:.85;font-size:14px}
header ul#answers{margin:4px 0 0 0;padding-left:18px;font-size:13px;line-height:1.35}
header ul#answers li{margin:1px 0}
main{max-width:1180px;margin:0 auto;padding:6px 32px 48px}
section{background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:16px 20px;margin:18px 0}
h2{font-size:19px;margin:0 0 8px 0}
h3{font-size:15px;margin:14px 0 6px 0}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border-bottom:1px solid #e6e8eb;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}
td.num{font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;font-size:12px;font-weight:600}
.ok{background:#dcf5e3;color:#1b6b35}.error{background:#fde2e1;color:#a1261d}.skipped{background:#fff1c9;color:#7a5a00}
.partial{background:#fff1c9;color:#7a5a00}
.err{background:#fff5f5;border:1px solid #f3c5c2;border-radius:6px;padding:8px 12px;font-family:monospace;
 font-size:12px;white-space:pre-wrap}
.refs{color:#4b5563;font-size:12px}
.muted{color:#6b7280;font-size:12px}
.bl-figure{min-height:380px;margin:8px 0 16px 0}
.bl-failed{outline:2px solid #d33}
details summary{cursor:pointer;color:#1f4fa8;font-size:13px;margin:6px 0}
td.cmp.above,td.cmp.below{color:#1f3f8a;font-weight:600}td.cmp{white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:8px;margin:6px 0 10px 0}
.card{border:1px solid #e1e4e8;border-radius:6px;padding:8px 10px;background:#fafbfc}
.card .v{font-size:17px;font-weight:600}.card .l{font-size:12px;color:#4b5563}
ul.caveats li{margin:4px 0;font-size:13px}
ul.glance{margin:4px 0;padding-left:20px}ul.glance li{margin:3px 0;font-size:14px}.errline{color:#a1261d}
.tablewrap{overflow-x:auto;max-width:100%}
.bl-figure.bl-headline{min-height:0;margin:4px 0 6px 0;overflow-x:auto}
#headline{padding-top:10px}#headline h2{margin-bottom:2px}
.legend{font-size:12px;color:#4b5563;margin:2px 0 0 0;line-height:1.7}
.legend span.k{white-space:nowrap;margin-right:12px}
.sym{display:inline-block;width:14px;text-align:center;font-weight:700}
.sym.pt{color:#1f3f8a}.sym.pp{color:#d97706}.sym.bl{color:#6b7280}.sym.th{color:#0a7a33}
.band{display:inline-block;width:14px;height:10px;background:rgba(107,114,128,.25);vertical-align:-1px}
.mark{font-weight:700}.mark.pass{color:#0a7a33}.mark.fail{color:#b3261e}.mark.inconclusive{color:#a15c00}
.mark.none{color:#6b7280}
.wide{display:inline-block;border-radius:4px;padding:0 4px;font-size:11px;font-weight:600;background:#fff1c9;
 color:#7a5a00;margin-left:4px}
td details summary{margin:0;color:inherit}td details[open] summary{margin-bottom:4px}
.refs details summary{color:#4b5563}
@media (max-width:700px){header{padding:12px 14px}header h1{font-size:19px}main{padding:8px 8px 32px}
 section{padding:12px 10px;margin:12px 0}}
"""

_ERROR_TRAP = """
window.__blErrors=[];
window.addEventListener('error',function(e){window.__blErrors.push(String(e.message||e));});
window.addEventListener('unhandledrejection',function(e){window.__blErrors.push(String(e.reason));});
"""

# A one-row grid of 2+ subplots (geometry by domain: 5 panels; SULA: 3; ablation: 2) cannot be read at a phone's width:
# below 640 px its panels are stacked into one column (and put back side by side when the box widens again).
_NARROW = """
(function(){var NARROW=640,P=210,G=80;
 function grid(gd){var L=gd.layout,c=[],k,m;for(k in L){m=/^xaxis(\\d*)$/.exec(k);
   if(m&&L[k]&&L[k].domain&&L['yaxis'+m[1]]&&L['yaxis'+m[1]].domain){c.push({x:k,y:'yaxis'+m[1],d:L[k].domain.slice(),
    yd:L['yaxis'+m[1]].domain.slice()});}}
  if(c.length<2)return null;for(var i=0;i<c.length;i++){if(c[i].yd[0]!==c[0].yd[0]||c[i].yd[1]!==c[0].yd[1]||
   c[i].d[1]-c[i].d[0]>0.5)return null;}c.sort(function(a,b){return a.d[0]-b.d[0];});return c;}
 function fit(gd){if(!window.Plotly||!gd.layout)return;if(gd._blGrid===undefined){gd._blGrid=grid(gd);
   if(gd._blGrid){var L=gd.layout;gd._blOrig={height:L.height||gd.clientHeight||420,margin:JSON.parse(JSON.stringify(L.margin||{})),
    legend:JSON.parse(JSON.stringify(L.legend||{})),ann:(L.annotations||[]).map(function(a){return[a.x,a.y,a.yshift==null?null:a.yshift];})};}}
  var c=gd._blGrid;if(!c)return;var want=gd.parentElement.clientWidth<NARROW;if(want===!!gd._blStacked)return;
  var u={},o=gd._blOrig,n=c.length,mt=(o.margin.t==null?100:o.margin.t);
  if(want){var h=n*P+(n-1)*G,nl=gd.data.filter(function(t){return t.showlegend!==false;}).length,
    mb=70+22*Math.ceil(nl/2);
   c.forEach(function(a,i){var top=1-i*(P+G)/h;u[a.x+'.domain']=[0,1];u[a.y+'.domain']=[top-P/h,top];
    (gd.layout.annotations||[]).forEach(function(an,j){var x=o.ann[j][0];if(an.xref==='paper'&&an.yref==='paper'&&
     x>=a.d[0]-1e-9&&x<=a.d[1]+1e-9&&Math.abs(o.ann[j][1]-c[0].yd[1])<1e-6){u['annotations['+j+'].x']=0.5;
     u['annotations['+j+'].y']=top;u['annotations['+j+'].yshift']=6;}});});
   u.height=h+mt+mb;u['margin.b']=mb;u['margin.l']=56;u['margin.r']=16;u['legend.y']=-62/h;u['legend.yanchor']='top';
   u['legend.orientation']='h';u['legend.x']=0;u['legend.xanchor']='left';}
  else{c.forEach(function(a){u[a.x+'.domain']=a.d;u[a.y+'.domain']=a.yd;});
   o.ann.forEach(function(xy,j){u['annotations['+j+'].x']=xy[0];u['annotations['+j+'].y']=xy[1];
    u['annotations['+j+'].yshift']=xy[2];});
   u.height=o.height;['b','l','r'].forEach(function(k){u['margin.'+k]=o.margin[k]==null?null:o.margin[k];});u['legend.y']=o.legend.y==null?null:o.legend.y;
   ['yanchor','orientation','x','xanchor'].forEach(function(k){u['legend.'+k]=o.legend[k]==null?null:o.legend[k];});}
  gd._blStacked=want;gd.style.height=u.height+'px';Plotly.relayout(gd,u);}
 function all(){document.querySelectorAll('.bl-figure .js-plotly-plot').forEach(fit);}
 window.addEventListener('load',all);var t;window.addEventListener('resize',function(){clearTimeout(t);t=setTimeout(all,100);});
})();
"""

_RENDER_CHECK = """
(function(){var m=/[?&]only=([^&#]+)/.exec(location.search);if(!m)return;
 window.addEventListener('load',function(){var d=document.getElementById(decodeURIComponent(m[1]));if(!d)return;
  var box=d.closest('.bl-figure')||d,h=document.createElement('main');h.appendChild(box);
  document.body.innerHTML='';document.body.appendChild(h);if(window.Plotly){Plotly.Plots.resize(d);}});})();
window.addEventListener('load',function(){setTimeout(function(){
 var figs=document.querySelectorAll('.bl-figure'),ok=0;
 figs.forEach(function(d){var p=d.querySelector('.js-plotly-plot');
  if(p&&p.data&&p.data.length&&p.querySelector('.main-svg')){ok++;}else{d.classList.add('bl-failed');}});
 var r=document.documentElement;r.setAttribute('data-bl-figures',figs.length);
 r.setAttribute('data-bl-rendered',ok);r.setAttribute('data-bl-errors',JSON.stringify(window.__blErrors));
 var s=document.getElementById('bl-render-status');
 if(s){s.textContent=ok+' of '+figs.length+' figures rendered'+(window.__blErrors.length?
  '; script errors: '+window.__blErrors.join(' | '):'; no script errors');}
},50);});
"""


def _refs_html(refs: Sequence[dict]) -> str:
    """The first two of the papers' values on one line; all of them, with sources, one click away."""
    if not refs:
        return '<span class="muted">-</span>'
    short = ", ".join(f"{_e(r['model'])} <b>{_e(r['value'])}</b>" for r in refs[:2]) + (" …" if len(refs) > 2 else "")
    full = "<br>".join(f"{_e(r['model'])}: <b>{_e(r['value'])}</b> <span class='muted'>({_e(r['source'])})</span>"
                       for r in refs)
    return f"<details><summary>{short}</summary>{full}</details>"


def _baseline_html(b: Optional[dict], units: str) -> str:
    """The baseline's value; what it is (its label) on hover."""
    if not b:
        return '<span class="muted">-</span>'
    rng = (f" [{format_value(b['low'], units)}, {format_value(b['high'], units)}]"
           if b.get("low") is not None and b.get("high") is not None else "")
    return (f"<span title='{_e(b.get('label', ''))}{' (null 95% range)' if rng else ''}'>"
            f"{format_value(b.get('value'), units)}<span class='muted'>{rng}</span></span>")


def _short_verdict(text: str) -> str:
    """The first words of a verdict ("PASS", "FAIL (calibration changes)", "CI excludes 0"): up to its ':'."""
    head = text.split(":", 1)[0].strip()
    return head if len(head) <= 40 else head[:38].rstrip() + "…"


def _verdict_html(m: dict) -> str:
    """The verdict in a few words, its sentence one click away, and a WIDE flag instead of the warning."""
    v = m.get("verdict") if "verdict" in m else verdict(m)
    if not v:
        return '<span class="muted">-</span>'
    cls = {True: "pass", False: "fail"}.get(v.get("pass"), "info")
    text, wide = split_wide(v["text"])
    flag = "<span class='wide' title='the 95% interval is too wide to compare with the papers'>WIDE</span>" if wide else ""
    if not text:
        return flag
    short = _short_verdict(text)
    if short == text:
        return f"<span class='verdict {cls}'>{_e(text)}</span>{flag}"
    return (f"<details><summary><span class='verdict {cls}'>{_e(short)}</span>{flag}</summary>"
            f"<span class='muted'>{_e(text)}</span></details>")


def _value_html(m: dict) -> str:
    u = m["units"]
    unit = "" if u in ("fraction", "dimensionless") else f" <span class='muted'>{_e(u)}</span>"
    ci = format_ci(m["ci"], u)
    return f"<b>{format_value(m['value'], u)}</b>{unit}" + (f" <span class='muted'>{ci}</span>" if ci else "")


def _metrics_table(rows: Sequence[dict], with_section: bool) -> str:
    """One short line per metric: value with its 95% CI, baseline, comparison, verdict in a few words and the
    papers' first values; the long texts (verdict sentence, baseline label, every paper) are one click away."""
    head = ("<tr>" + ("<th>Section</th>" if with_section else "")
            + "<th>Quantity</th><th>This model [95% CI]</th><th>Baseline</th><th>vs baseline</th>"
              "<th>Verdict</th><th>Papers report</th></tr>")
    body = []
    for m in rows:
        units = m["units"]
        cmp = compare_to_baseline(m)
        body.append(
            "<tr>" + (f"<td>{_e(m.get('section', ''))}</td>" if with_section else "")
            + f"<td title='{_e(m['key'])}'>{_e(m['label'])}</td>"
            f"<td class='num'>{_value_html(m)}</td>"
            f"<td class='num'>{_baseline_html(m['baseline'], units)}</td>"
            f"<td class='cmp {cmp.split(' ')[0]}'>{_e(cmp)}</td>"
            f"<td>{_verdict_html(m)}</td><td class='refs'>{_refs_html(m['references'])}</td></tr>"
        )
    return f"<div class='tablewrap'><table>{head}{''.join(body)}</table></div>"


def _figure_html(fig, div_id: str, config: Optional[dict] = None) -> str:
    """A figure as a div that follows its box's width: a fixed ``layout.width`` (made for a notebook) is
    dropped, or the figure runs out of its box on a narrow window (the SULA figure did at 1300 px)."""
    import plotly.graph_objects as go

    fig = go.Figure(fig)  # a copy: the caller's figure keeps its width
    fig.update_layout(width=None, autosize=True)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config=config or {"displaylogo": False, "responsive": True}, default_height="420px",
                       default_width="100%")


def _section_html(sec: dict, figures: Sequence[Tuple[str, Any]], out_tables) -> str:
    status = sec["status"]
    parts = [f"<section id='sec-{_e(sec['name'])}'><h2>{_e(sec['title'])} "
             f"<span class='badge {status}'>{status}</span> "
             f"<span class='muted'>{sec['seconds']:.1f} s</span></h2>",
             f"<p class='muted'>{_e(sec['description'])}</p>"]
    if sec.get("error"):
        err = sec["error"]
        parts.append(f"<div class='err'><b>{_e(err['type'])}</b>: {_e(err['message'])}</div>")
        if err.get("traceback"):
            parts.append(f"<details><summary>traceback</summary><div class='err'>{_e(err['traceback'])}</div></details>")
    if sec["metrics"]:
        parts.append(_metrics_table(sec["metrics"], with_section=False))
    for meta, (_, fig) in zip(sec["figures"], figures):
        parts.append(f"<h3>{_e(meta['title'])}</h3><div class='bl-figure'>{_figure_html(fig, meta['id'])}</div>")
    for t in sec["tables"]:
        df = out_tables.get(t["name"])
        inner = ""
        if df is not None:
            inner = df.head(200).to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)
        parts.append(f"<details><summary>table: {_e(t['name'])} ({t['n_rows']} rows; {_e(t['file'])})</summary>"
                     f"{inner}</details>")
    if sec["notes"]:
        parts.append("<ul>" + "".join(f"<li class='muted'>{_e(n)}</li>" for n in sec["notes"]) + "</ul>")
    if sec.get("settings"):
        parts.append(f"<details><summary>settings</summary><pre class='muted'>"
                     f"{_e(json.dumps(sec['settings'], indent=1))}</pre></details>")
    parts.append("</section>")
    return "".join(parts)


def _sentence(m: dict) -> str:
    """One headline number in words: value, CI, baseline, comparison, verdict sentence, the papers."""
    u = m["units"]
    unit = "" if u in ("fraction", "dimensionless") else f" {u}"
    text = f"<b>{_e(m['label'])}</b>: <b>{format_value(m['value'], u)}{_e(unit)}</b>"
    if m["ci"]:
        text += f" {format_ci(m['ci'], u)}"
    if m["baseline"]:
        text += (f"; baseline {format_value(m['baseline']['value'], u)} "
                 f"<span class='muted'>({_e(m['baseline']['label'])})</span>")
        vs = compare_to_baseline(m)
        if vs:
            text += f" → <b>{_e(vs)}</b>"
    v = m.get("verdict") if "verdict" in m else verdict(m)
    if v:
        vt, wide = split_wide(v["text"])
        cls = {True: "pass", False: "fail"}.get(v.get("pass"), "info")
        if vt:
            text += f" · <span class='verdict {cls}'>{_e(vt)}</span>"
        if wide:
            text += " <span class='wide'>WIDE</span>"
    if m["references"]:
        refs = ", ".join(f"{r['model']} {r['value']}" for r in m["references"][:3])
        text += f" <span class='muted'>· papers: {_e(refs)}</span>"
    return text


_LEGEND = ("<span class='k'><span class='sym pt'>●</span>this model, 95% CI</span> "
           "<span class='k'><span class='sym bl'>|</span>random baseline "
           "(<span class='band'></span> its null's 95% range)</span> "
           "<span class='k'><span class='sym pp'>◆</span>papers' values (other models)</span> "
           "<span class='k'><span class='sym th'>┆</span>pass threshold</span> ")


def _headline_html(doc: dict, figure=None) -> str:
    """The first screen: the headline figure (one row per signature), its legend, the rows in words one
    click away, the WIDE/quick-report warning said once, and any section that did not run."""
    from ._headline import headline_rows

    rows = headline_rows(doc)
    failed = [s for s in doc["sections"].values() if s["status"] != "ok"]
    if not rows and not failed:
        return ""
    parts = ["<section id='headline'><h2>At a glance</h2>"]
    if figure is not None:
        marks = " ".join(f"<span class='k'><span class='mark {k}'>{sym}</span> {word}</span>"
                        for k, (sym, _, word) in MARKS.items())
        parts.append(f"<div class='legend'>{_LEGEND}<span class='k'>verdict:</span>{marks}</div>"
                     f"<div class='bl-figure bl-headline'>"
                     + _figure_html(figure, "fig-headline", {"displayModeBar": False, "responsive": True})
                     + "</div>")
    n_wide = sum(split_wide(((m.get("verdict") if "verdict" in m else verdict(m)) or {}).get("text", ""))[1]
                 for m in doc["summary"])
    notes = []
    if n_wide:  # the warning every WIDE verdict carries, said once
        notes.append(f"<span class='wide'>WIDE</span> ({n_wide} of {len(doc['summary'])} numbers): the 95% "
                     "interval is too wide to compare with the papers" + ("." if doc["settings"].get("quick") else
                                                                         "; more prompts narrow it."))
    if doc["settings"].get("quick"):
        notes.append("This is a <b>quick</b> report (few prompts and sequences): where it and the full report "
                     "disagree, trust the full one (<code>bayes-lens report</code> without <code>--quick</code>).")
    if notes:
        parts.append(f"<p class='muted'>{' '.join(notes)}</p>")
    for s in failed:
        msg = (s.get("error") or {}).get("message", "")
        parts.append(f"<p class='errline'><b>{_e(s['title'])}</b>: {s['status']} - {_e(msg[:200])}</p>")
    if rows:
        parts.append("<details id='glance-words'><summary>the same in words: value, interval, baseline, verdict "
                     "and the papers' numbers for each row</summary><ul class='glance'>"
                     + "".join(f"<li>{_sentence(m)}</li>" for m in rows) + "</ul></details>")
    parts.append("</section>")
    return "".join(parts)


def _status_badge(status: str, n_err: int) -> str:
    """The run's status (report.json's ``status``: every section finished, or not), labelled as such: it is
    not a verdict on the model."""
    what = ("every section ran; not a verdict on the model" if status == "ok" and not n_err else
            f"{n_err} section(s) did not finish; see them below")
    return (f"<span class='badge {status}' id='run-status' title='report.json status: whether the report ran, "
            f"not what it found'>report run: {_e(status)} ({_e(what)})</span>")


def _answers_html(doc: dict) -> str:
    """Two or three lines under the title answering its question in words (:func:`answer_lines`)."""
    lines = answer_lines(doc)
    if not lines:
        return ""
    return ("<ul id='answers'>" + "".join(f"<li><b>{_e(label)}:</b> {_e(text)}</li>" for label, text in lines)
            + "</ul>")


def _parameters_card(m: dict) -> str:
    """``n_parameters`` (``sum(p.numel() for p in model.parameters())``) with why it differs from the
    checkpoint's weight count, when the report recorded both (a HookedTransformer stores a tied
    unembedding as its own copy of ``W_E.T`` and every bias, zeros included)."""
    text = f"{m['n_parameters'] / 1e6:.1f} M"
    weights, note = m.get("n_weights"), m.get("parameters_note")
    if weights is not None and weights != m["n_parameters"]:
        text += f" ({weights / 1e6:.1f} M weights in the checkpoint; the rest: {note})"
    return text


def _cards(doc: dict) -> str:
    m = doc["model"]
    facts = [("model", m["name"]), ("kind", m["kind"]),
             ("layers × heads (KV)", f"{m['n_layers']} × {m['n_heads']} ({m['n_kv_heads']})"),
             ("parameters (as loaded)", _parameters_card(m)),
             ("seed / mode", f"{doc['settings']['seed']} / {'quick' if doc['settings']['quick'] else 'full'}"),
             ("run time", f"{doc['timings_s'].get('total', 0):.0f} s")]
    return "<div class='grid'>" + "".join(
        f"<div class='card'><div class='l'>{_e(k)}</div><div class='v'>{_e(v)}</div></div>" for k, v in facts) + "</div>"


def _papers_html() -> str:
    """The papers by title and arXiv id, and the method definitions (METHODS.md, embedded)."""
    items = "".join(f"<li><b>{_e(k)}</b>: {_e(p['title'])}, <a href='{_e(p['url'])}'>arXiv {_e(p['arxiv'])}</a>"
                    f" <span class='muted'>({_e(p['note'])})</span></li>" for k, p in PAPERS.items())
    try:
        methods = methods_text()
    except (OSError, FileNotFoundError):  # pragma: no cover - an installation without package data
        methods = "METHODS.md is missing from this installation; see docs/METHODS.md in the source."
    return ("<section id='references'><h2>References and methods</h2><p>“Paper A” and “Paper B” in this report "
            f"are:</p><ul>{items}</ul><p class='muted'>Every “METHODS.md §n” refers to the method definitions "
            "below (docs/METHODS.md; shipped in the package as bayes_lens/data/METHODS.md).</p>"
            f"<details><summary>METHODS.md (the exact definitions)</summary><pre class='methods'>{_e(methods)}"
            "</pre></details></section>")


def _summary_html(summary: Sequence[dict], nav: str) -> str:
    """The numbers the papers report too, or that a rule judges (a verdict); the rest stay in their sections.

    (The summary used to repeat every section's table row for row.)"""
    rows = [m for m in summary if m.get("references") or (m.get("verdict") if "verdict" in m else verdict(m))]
    rest = len(summary) - len(rows)
    more = f" The other {rest} numbers are in their sections." if rest else ""
    return (f"<section id='summary'><h2>Summary: this model next to the papers</h2>"
            f"<p class='muted'>The numbers the papers also report, or that a stated rule judges, with their 95% "
            f"bootstrap interval over prompts and random baseline; papers' numbers are for other (larger) models, "
            f"see the caveats.{more} Sections: {nav}</p>"
            f"{_metrics_table(rows, with_section=True) if rows else ''}</section>")


def render_html(doc: dict, figures: Sequence[Sequence[Tuple[str, Any]]], tables: Optional[Sequence[dict]] = None) -> str:
    """The complete HTML page for report document ``doc`` (figures are plotly ``Figure`` objects)."""
    from plotly.offline import get_plotlyjs

    secs = list(doc["sections"].values())
    tables = tables or [{} for _ in secs]
    n_err = sum(s["status"] != "ok" for s in secs)
    status = doc["status"]
    summary = list(doc["summary"])
    nav = " · ".join(f"<a href='#sec-{_e(s['name'])}'>{_e(s['title'])}</a>" for s in secs)
    body = [
        f"<header><h1>bayes_lens report: {_e(doc['model']['name'])}</h1>"
        f"<div class='sub'>Does this model carry, and use, Bayesian geometry? "
        f"Created {_e(doc['created_utc'])} · bayes_lens {_e(doc['environment']['bayes_lens'])} · "
        f"TransformerLens {_e(doc['environment']['transformer_lens'])} · schema {_e(doc['schema_version'])} "
        f"{_status_badge(status, n_err)}</div>{_answers_html(doc)}</header><main>",
        _headline_html(doc, headline_figure(doc)),
        _cards(doc),
        _summary_html(summary, nav),
    ]
    for sec, figs, tabs in zip(secs, figures, tables):
        body.append(_section_html(sec, figs, tabs))
    body.append("<section id='caveats'><h2>Caveats</h2><ul class='caveats'>"
                + "".join(f"<li>{_e(c)}</li>" for c in doc["caveats"]) + "</ul></section>")
    body.append(_papers_html())
    env = json.dumps({"model": doc["model"], "environment": doc["environment"], "settings": doc["settings"],
                      "timings_s": doc["timings_s"]}, indent=1)
    body.append(f"<section id='provenance'><h2>Provenance</h2><details><summary>model, library versions, "
                f"settings and timings</summary><pre class='muted'>{_e(env)}</pre></details></section>")
    body.append("<p class='muted' id='bl-render-status'>figures not rendered yet (JavaScript is needed for "
                "the plots; the numbers above do not need it)</p></main>")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>bayes_lens report: {_e(doc['model']['name'])}</title><style>{_CSS}</style>"
        f"<script>{_ERROR_TRAP}</script>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        + "".join(body)
        + f"<script>{_NARROW}{_RENDER_CHECK}</script></body></html>"
    )
