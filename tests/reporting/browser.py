"""Open a report in a real headless Chromium with networking disabled (for tests and the gallery).

:func:`render` loads ``report.html`` from disk with every network route closed (a dead proxy, a
host resolver that resolves nothing, no background networking), lets the page's scripts run, and
returns what the page's own render check wrote on ``<html>`` (figures found / rendered, script
errors) plus console errors from Chromium's log. :func:`screenshot` saves a PNG of the first
screen. :func:`measure` loads the page at a given window size and returns where its boxes are (every
plotly figure's width against its box's, the page's width against the window's, the headline
figure's top and bottom). All need a ``chromium`` (or ``chromium-browser`` / ``google-chrome``) executable.

Example
-------
>>> from browser import find_chromium, render   # doctest: +SKIP
>>> render("report/report.html")["rendered"]                       # doctest: +SKIP
7
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Union

__all__ = ["find_chromium", "render", "screenshot", "measure", "overlaps", "OFFLINE_FLAGS"]

OFFLINE_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
    "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def find_chromium() -> Optional[str]:
    """Path of a Chromium-like browser, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args, timeout: float) -> subprocess.CompletedProcess:
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium executable found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="bl-chromium-") as profile:
        return subprocess.run([browser, *OFFLINE_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


_CONSOLE = re.compile(r"CONSOLE[:(]\d+\)?\] \"(.*?)\", source: (\S*)")


def render(html: Union[str, Path], *, budget_ms: int = 15000, timeout: float = 120) -> dict:
    """Load ``html`` offline and return ``{figures, rendered, errors, console_errors, dom}``."""
    url = Path(html).resolve().as_uri()
    proc = _run(["--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}",
                 "--dump-dom", url], timeout)
    dom = proc.stdout
    head = re.search(r"<html[^>]*>", dom)
    attrs = dict(re.findall(r'(data-bl-[a-z]+)="([^"]*)"', head.group(0))) if head else {}
    errors = json.loads(attrs.get("data-bl-errors", "null").replace("&quot;", '"')) if attrs else None
    console = [m.group(1) for m in _CONSOLE.finditer(proc.stderr)
               if "error" in m.group(1).lower() or "uncaught" in m.group(1).lower()]
    net = [line for line in proc.stderr.splitlines() if "net::ERR" in line]
    return {
        "figures": int(attrs["data-bl-figures"]) if "data-bl-figures" in attrs else None,
        "rendered": int(attrs["data-bl-rendered"]) if "data-bl-rendered" in attrs else None,
        "errors": errors,
        "console_errors": console,
        "network_errors": net,
        "dom": dom,
        "returncode": proc.returncode,
    }


# Chromium's headless window is never narrower than 500 CSS px (whatever --window-size says): a narrower
# viewport is a page that holds the report in an iframe of that size
_MIN_WINDOW = 500


def _frame(url: str, width: int, height: int, folder: Path, listen: bool = False) -> Path:
    """A page in ``folder`` showing ``url`` in a ``width`` x ``height`` iframe (its viewport)."""
    script = ("<script>window.addEventListener('message',function(e){document.documentElement"
              ".setAttribute('data-bl-layout',String(e.data));});</script>" if listen else "")
    page = folder / "frame.html"
    page.write_text(f"<!DOCTYPE html><html><head>{script}</head><body style='margin:0;background:#fff'>"
                    f"<iframe src='{url}' width='{width}' height='{height}' style='border:0;display:block'>"
                    "</iframe></body></html>", encoding="utf-8")
    return page


def screenshot(html: Union[str, Path], png: Union[str, Path], *, width: int = 1280, height: int = 900,
               budget_ms: int = 15000, timeout: float = 120) -> Path:
    """Save a PNG of the first ``width`` x ``height`` pixels of ``html`` (a path or a file:// URL), offline.

    The page is shown in an iframe of exactly ``width`` x ``height`` (Chromium's headless window is at
    least 500 px wide and its height includes the window's frame), and the PNG cropped to it (Pillow)."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    url = str(html) if str(html).startswith("file://") else Path(html).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="bl-shot-") as tmp:
        frame = _frame(url, width, height, Path(tmp))
        proc = _run([f"--window-size={max(width, _MIN_WINDOW)},{height + 200}",
                     f"--virtual-time-budget={budget_ms}", f"--screenshot={png}", frame.as_uri()], timeout)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    from PIL import Image

    with Image.open(png) as im:
        im.crop((0, 0, width, min(height, im.size[1]))).save(png)
    return png


# run after the page's own render check (load + 50 ms) and plotly's responsive resizes
_MEASURE = """<script>window.addEventListener('load',function(){setTimeout(function(){
 var out={innerWidth:window.innerWidth,innerHeight:window.innerHeight,
  docScrollWidth:document.documentElement.scrollWidth,figures:[]};
 document.querySelectorAll('.js-plotly-plot').forEach(function(p){
  var box=p.closest('.bl-figure')||p.parentElement,r=p.getBoundingClientRect(),b=box.getBoundingClientRect();
  var svg=p.querySelector('.main-svg'),sw=svg?svg.getBoundingClientRect().width:null;
  function boxes(sel){return Array.prototype.map.call(p.querySelectorAll(sel),function(e){
   var q=e.getBoundingClientRect();return {text:(e.textContent||'').slice(0,40),l:q.left,t:q.top,r:q.right,b:q.bottom};})
   .filter(function(q){return q.r>q.l&&q.b>q.t;});}
  out.figures.push({id:p.id,scrollWidth:p.scrollWidth,clientWidth:p.clientWidth,svgWidth:sw,
   boxClientWidth:box.clientWidth,left:r.left,right:r.right,boxLeft:b.left,boxRight:b.right,
   top:r.top+window.scrollY,bottom:r.bottom+window.scrollY,
   texts:boxes('.infolayer .annotation-text-g, .infolayer [class^="g-x"][class$="title"], '+
               '.infolayer [class^="g-y"][class$="title"], .xtick text, .ytick text'),
   areas:boxes('.bglayer rect.bg'),
   points:boxes('.scatterlayer .point, .scatterlayer .errorbar path'),
   ticks:boxes('.xaxislayer-above text, .yaxislayer-above text')});});
 parent.postMessage(JSON.stringify(out),'*');},400);});</script>"""


def measure(html: Union[str, Path], *, width: int, height: int, budget_ms: int = 15000,
            timeout: float = 120) -> dict:
    """Load ``html`` offline in a ``width`` x ``height`` viewport; return the boxes of its figures.

    ``{"innerWidth", "innerHeight", "docScrollWidth", "figures": [{"id", "scrollWidth", "clientWidth",
    "svgWidth", "boxClientWidth", "left", "right", "boxLeft", "boxRight", "top", "bottom", "texts",
    "areas", "points", "ticks"}, ...]}`` in CSS pixels (tops and bottoms from the top of the page; ``texts``: the
    boxes ``{text, l, t, r, b}`` of a figure's annotations (subplot titles, a forest row's label and
    verdict mark), axis titles and tick labels (of the first axes), ``areas``: its plot areas, ``points``:
    its markers and error bars, ``ticks``: the tick labels of every axis, all in viewport pixels). A copy of the page with a measuring script is loaded in an
    iframe of exactly that size (see :func:`screenshot`).
    """
    src = Path(html)
    page = src.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>")
    with tempfile.TemporaryDirectory(prefix="bl-measure-") as tmp:
        copy = Path(tmp) / src.name
        copy.write_text(page, encoding="utf-8")
        frame = _frame(copy.resolve().as_uri(), width, height, Path(tmp), listen=True)
        proc = _run([f"--window-size={max(width, _MIN_WINDOW)},{height + 200}", f"--virtual-time-budget={budget_ms}",
                     "--dump-dom", frame.resolve().as_uri()], timeout)
    m = re.search(r'data-bl-layout="([^"]*)"', proc.stdout)
    if not m:
        raise RuntimeError(f"the page wrote no measurements (exit {proc.returncode}): {proc.stderr[-500:]}")
    import html as _html

    return json.loads(_html.unescape(m.group(1)))


def overlaps(figure: dict, tolerance: float = 1.0) -> list:
    """Pairs of a :func:`measure` figure's texts that overlap each other or a plot area (by > tolerance px)."""
    def hit(a, b):
        return (min(a["r"], b["r"]) - max(a["l"], b["l"]) > tolerance
                and min(a["b"], b["b"]) - max(a["t"], b["t"]) > tolerance)

    texts, areas = figure["texts"], figure["areas"]
    out = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:] if hit(a, b)]
    out += [(a["text"], "plot area") for a in texts for b in areas if hit(a, b)]
    return out
