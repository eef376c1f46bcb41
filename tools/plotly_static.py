"""A static PNG of a plotly figure, drawn with matplotlib from the figure's own JSON.

Used by ``tools/build_tutorials.py --execute`` so that every interactive plotly output of a committed
notebook also carries an ``image/png`` that GitHub (which runs no JavaScript) can show.

Why not plotly's own export: ``fig.to_image`` needs kaleido, and kaleido 1.x drives a Chrome/Chromium
that it finds on the machine or downloads at run time — neither works offline or on a bare CI box.
matplotlib is an ordinary wheel with no browser, so the build is reproducible anywhere the dev
extra installs. The rendering covers what bayes_lens's figures use: scatter (lines, markers, filled
bands, error bars), bars (grouped, with error bars), histograms, horizontal/vertical reference
lines, subplot grids and their titles, log axes and legends. Anything else is drawn as an empty
panel with the figure's title rather than failing the build.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any, Dict, List, Tuple

import numpy as np

PLOTLY_MIME = "application/vnd.plotly.v1+json"
COLORWAY = ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
            "#FF97FF", "#FECB52"]
_DASH = {"dash": "--", "dot": ":", "dashdot": "-.", "longdash": "--", "longdashdot": "-.", "solid": "-"}
_DTYPES = {"f8": "<f8", "f4": "<f4", "i1": "i1", "u1": "u1", "i2": "<i2", "u2": "<u2", "i4": "<i4",
           "u4": "<u4", "i8": "<i8", "u8": "<u8"}


def array(value) -> Any:
    """A plotly array as a Python/numpy sequence (plotly ≥ 6 writes numpy arrays as base64 ``bdata``)."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=_DTYPES.get(value.get("dtype", "f8"), "<f8"))
        shape = value.get("shape")
        if shape:
            dims = [int(s) for s in str(shape).split(",")] if isinstance(shape, str) else list(shape)
            out = out.reshape(dims)
        return out
    return value


def text(s) -> str:
    """Plotly's HTML-ish labels as plain text."""
    if s is None:
        return ""
    if isinstance(s, dict):
        s = s.get("text", "")
    s = re.sub(r"<br\s*/?>", "\n", str(s)).replace("⟂", "⊥")  # DejaVu Sans has ⊥, not ⟂
    return re.sub(r"<[^>]+>", "", s)


def color(c, default=None):
    """A plotly colour (hex, name, ``rgb(...)``, ``rgba(...)``) as something matplotlib accepts."""
    if c is None or isinstance(c, (list, tuple, dict)):
        return default
    m = re.match(r"rgba?\(([^)]*)\)", str(c).replace(" ", ""))
    if m:
        parts = [float(p) for p in m.group(1).split(",")]
        rgb = [p / 255.0 for p in parts[:3]]
        return tuple(rgb + [parts[3] if len(parts) > 3 else 1.0])
    return c


def _axis_key(ref: str, letter: str) -> str:
    """'x' -> 'xaxis', 'x2' -> 'xaxis2'."""
    return f"{letter}axis{ref[1:]}"


def _numeric(values) -> bool:
    try:
        np.asarray(values, dtype=float)
        return True
    except (TypeError, ValueError):
        return False


def render_png(fig_json: Dict[str, Any], *, dpi: int = 72) -> str:
    """The figure as a base64 PNG (what a notebook's ``image/png`` output holds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data: List[Dict[str, Any]] = list(fig_json.get("data", []))
    layout: Dict[str, Any] = dict(fig_json.get("layout", {}))
    template = layout.get("template", {}).get("layout", {}) if isinstance(layout.get("template"), dict) else {}
    colorway = layout.get("colorway") or template.get("colorway") or COLORWAY
    width = float(layout.get("width") or 900)
    height = float(layout.get("height") or 450)
    fig = plt.figure(figsize=(width / 100, height / 100))

    # one matplotlib Axes per (x axis, y axis) pair, placed at the plotly domains
    pairs: List[Tuple[str, str]] = []
    for tr in data:
        pair = (tr.get("xaxis", "x"), tr.get("yaxis", "y"))
        if pair not in pairs:
            pairs.append(pair)
    for key in sorted(layout):
        if re.fullmatch(r"xaxis\d*", key):  # empty subplots still get their panel
            anchor = layout[key].get("anchor", "y" + key[5:])
            if (("x" + key[5:]), anchor) not in pairs:
                pairs.append(("x" + key[5:], anchor))
    if not pairs:
        pairs = [("x", "y")]
    legend = any(tr.get("showlegend", True) is not False and tr.get("name") for tr in data) and \
        layout.get("showlegend", True) is not False
    longest = max([len(text(tr.get("name"))) for tr in data if tr.get("name")] or [0])
    legend_inches = 0.7 + 0.068 * min(longest, 45)  # the handle, then about 0.065 inch per character (size 8)
    right = max(0.55, 1 - legend_inches / (width / 100)) if legend else 0.97
    left, bottom, top = 0.08, 0.13, (0.85 if layout.get("title") else 0.92)
    axes = {}
    for xr, yr in pairs:
        xa, ya = layout.get(_axis_key(xr, "x"), {}), layout.get(_axis_key(yr, "y"), {})
        x0, x1 = xa.get("domain", [0, 1])
        y0, y1 = ya.get("domain", [0, 1])
        ax = fig.add_axes([left + (right - left) * x0, bottom + (top - bottom) * y0,
                           (right - left) * (x1 - x0), (top - bottom) * (y1 - y0)])
        ax.tick_params(labelsize=8)
        ax.grid(True, color="#e5e5e5", linewidth=0.6)
        ax.set_axisbelow(True)
        if xa.get("type") == "log":
            ax.set_xscale("log")
        if ya.get("type") == "log":
            ax.set_yscale("log")
        ax.set_xlabel(text(xa.get("title")), fontsize=9)
        ax.set_ylabel(text(ya.get("title")), fontsize=9)
        axes[(xr, yr)] = ax

    handles, labels = [], []
    bars: Dict[Tuple[str, str], List[int]] = {}
    for i, tr in enumerate(data):
        if tr.get("type", "scatter") == "bar":
            bars.setdefault((tr.get("xaxis", "x"), tr.get("yaxis", "y")), []).append(i)
    previous: Dict[Tuple[str, str], Tuple[Any, Any]] = {}
    categories: Dict[Tuple[str, str], List[Any]] = {}  # bar categories per panel, in order of appearance
    n_color = 0

    def category_positions(pair, cats):
        order = categories.setdefault(pair, [])
        for cat in cats:
            if cat not in order:
                order.append(cat)
        return np.array([order.index(cat) for cat in cats], dtype=float)

    for i, tr in enumerate(data):
        kind = tr.get("type", "scatter")
        pair = (tr.get("xaxis", "x"), tr.get("yaxis", "y"))
        ax = axes[pair]
        marker = tr.get("marker", {}) or {}
        line = tr.get("line", {}) or {}
        c = color(line.get("color")) or color(marker.get("color"))
        if c is None:
            c = colorway[n_color % len(colorway)]
            n_color += 1
        name = text(tr.get("name")) if tr.get("showlegend", True) is not False else ""
        x, y = array(tr.get("x")), array(tr.get("y"))
        opacity = float(tr.get("opacity", 1.0) if tr.get("opacity") is not None else 1.0)
        artist = None
        if kind == "scatter":
            if y is None:
                continue
            y = np.asarray(y, dtype=float) if _numeric(y) else list(y)
            x = np.arange(len(y)) if x is None else (np.asarray(x, dtype=float) if _numeric(x) else
                                                     category_positions(pair, list(x)))
            mode = tr.get("mode") or ("lines+markers" if len(y) < 20 else "lines")
            err = tr.get("error_y") or {}
            yerr = None
            if err.get("array") is not None and err.get("visible", True) is not False:
                hi = np.asarray(array(err["array"]), dtype=float)
                lo = np.asarray(array(err.get("arrayminus", err["array"])), dtype=float) \
                    if err.get("symmetric", True) is False else hi
                yerr = np.vstack([lo, hi])
            if tr.get("fill") == "tonexty" and pair in previous:
                px, py = previous[pair]
                if len(px) != len(x) and _numeric(px) and _numeric(x):  # plotly joins traces of any length
                    py = np.interp(np.asarray(x, dtype=float), np.asarray(px, dtype=float), np.asarray(py, dtype=float))
                if len(py) == len(x):
                    artist = ax.fill_between(x, py, y, color=c, alpha=0.25, linewidth=0)
            elif tr.get("fill") in ("tozeroy",):
                artist = ax.fill_between(x, 0, y, color=c, alpha=0.25, linewidth=0)
            lw = line.get("width", 2)
            sym = str(marker.get("symbol", "circle"))
            mk = "_" if sym.startswith("line-ew") else "|" if sym.startswith("line-ns") else "o"
            size = marker.get("size", 6)
            size = float(np.mean(array(size))) if not isinstance(size, (int, float)) else float(size)
            mo = marker.get("opacity", opacity)
            mo = float(mo) if isinstance(mo, (int, float)) else opacity
            if "lines" in mode and lw != 0:  # a line, with its markers when it has them (one legend entry)
                artist = ax.plot(x, y, color=c, linestyle=_DASH.get(line.get("dash") or "solid", "-"),
                                 linewidth=min(float(lw), 2.5) * 0.8, alpha=opacity,
                                 marker="o" if "markers" in mode else None, markersize=size * 0.8)[0]
            elif "markers" in mode:
                artist = ax.scatter(x, y, color=c, s=(size * 1.1) ** 2 if mk == "o" else size ** 2 * 4, marker=mk,
                                    alpha=mo, zorder=3, linewidths=1.5 if mk != "o" else 0)
            if yerr is not None:
                ax.errorbar(x, y, yerr=yerr, fmt="none", ecolor=c, elinewidth=1, capsize=2, alpha=opacity)
            previous[pair] = (x, y)
        elif kind == "bar":
            group = bars[pair]
            k, nb = group.index(i), len(group)
            grouped = layout.get("barmode", "group") == "group"
            width_each = 0.8 / nb if grouped else 0.8
            cats = list(x) if x is not None else list(range(len(y)))
            pos = np.asarray(cats, dtype=float) if _numeric(cats) else category_positions(pair, cats)
            off = (k - (nb - 1) / 2) * width_each if grouped else 0.0
            err = tr.get("error_y") or {}
            yerr = None
            if err.get("array") is not None:
                hi = np.asarray(array(err["array"]), dtype=float)
                lo = np.asarray(array(err.get("arrayminus", err["array"])), dtype=float) \
                    if err.get("symmetric", True) is False else hi
                yerr = np.vstack([lo, hi])
            artist = ax.bar(pos + off, np.asarray(y, dtype=float), width=width_each, color=c, alpha=opacity,
                            yerr=yerr, capsize=2, error_kw={"elinewidth": 1})
        elif kind == "histogram":
            vals = np.asarray(x if x is not None else y, dtype=float)
            vals = vals[np.isfinite(vals)]
            artist = ax.hist(vals, bins=int(tr.get("nbinsx") or 30), color=c, alpha=min(opacity, 0.75))[2][0]
        else:  # a trace type this renderer does not draw: say so in the panel
            ax.text(0.5, 0.5, f"({kind} trace: interactive view only)", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="gray")
        if artist is not None and name and name not in labels:
            handles.append(artist)
            labels.append(name)

    for pair, order in categories.items():  # categorical x axes (domains, conditions)
        names = [text(o) for o in order]
        crowded = sum(len(n) for n in names) * 0.07 > axes[pair].get_position().width * width / 100
        axes[pair].set_xticks(range(len(order)))
        axes[pair].set_xticklabels(names, fontsize=7 if crowded else 8, rotation=90 if crowded else 0)
    for ref, key in (("x", "xaxis"), ("y", "yaxis")):  # explicit axis ranges
        for lk, spec in layout.items():
            if re.fullmatch(key + r"\d*", lk) and isinstance(spec, dict) and spec.get("range"):
                for (xr, yr), ax in axes.items():
                    if (xr if ref == "x" else yr) == ref + lk[5:]:
                        lo, hi = spec["range"]
                        if spec.get("type") == "log":
                            lo, hi = 10 ** lo, 10 ** hi
                        (ax.set_xlim if ref == "x" else ax.set_ylim)(lo, hi)

    def axes_for(xref: str, yref: str):
        xr = xref.replace(" domain", "")
        yr = yref.replace(" domain", "")
        for (ax_x, ax_y), ax in axes.items():
            if (xr in ("paper", ax_x)) and (yr in ("paper", ax_y)):
                return ax
        return next(iter(axes.values()))

    for shape in layout.get("shapes", []) or []:
        if shape.get("type") != "line":
            continue
        ax = axes_for(shape.get("xref", "x"), shape.get("yref", "y"))
        ls = _DASH.get((shape.get("line") or {}).get("dash") or "solid", "-")
        sc = color((shape.get("line") or {}).get("color"), "#444444")
        spans_x = "domain" in str(shape.get("xref", "")) or shape.get("xref") == "paper"
        spans_y = "domain" in str(shape.get("yref", "")) or shape.get("yref") == "paper"
        if shape.get("y0") == shape.get("y1") and spans_x:
            ax.axhline(float(shape["y0"]), color=sc, linestyle=ls, linewidth=1)
        elif shape.get("x0") == shape.get("x1") and spans_y:
            ax.axvline(float(shape["x0"]), color=sc, linestyle=ls, linewidth=1)
        else:
            ax.plot([shape.get("x0"), shape.get("x1")], [shape.get("y0"), shape.get("y1")], color=sc,
                    linestyle=ls, linewidth=1)

    for ann in layout.get("annotations", []) or []:
        label = text(ann.get("text"))
        if not label:
            continue
        xref, yref = str(ann.get("xref", "x")), str(ann.get("yref", "y"))
        if xref == "paper" and yref == "paper":  # subplot titles
            fig.text(left + (right - left) * float(ann.get("x", 0.5)),
                     bottom + (top - bottom) * float(ann.get("y", 1.0)) + 0.01, label, ha="center",
                     va="bottom", fontsize=9)
        else:
            ax = axes_for(xref, yref)
            tx = ax.transAxes if "domain" in xref and "domain" in yref else (
                ax.get_yaxis_transform() if "domain" in xref else ax.get_xaxis_transform() if "domain" in yref
                else ax.transData)
            ax.text(float(ann.get("x", 1.0)), float(ann.get("y", 1.0)), label, transform=tx, fontsize=7,
                    ha="right", va="bottom", color="#444444")

    title = text(layout.get("title"))
    if title:
        fig.suptitle(title, fontsize=11, y=0.98)
    if handles and legend:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.01, 0.5), fontsize=8,
                   frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def add_static_images(nb) -> int:
    """Give every plotly output of ``nb`` an ``image/png`` next to it; returns how many."""
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            bundle = out.get("data", {})
            if PLOTLY_MIME in bundle:
                bundle["image/png"] = render_png(bundle[PLOTLY_MIME])
                bundle.setdefault("text/plain", "<plotly figure: interactive in Jupyter, static PNG on GitHub>")
                n += 1
    return n
