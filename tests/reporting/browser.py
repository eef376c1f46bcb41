"""Open a report in a real headless Chromium with networking disabled (for tests and the gallery).

:func:`render` loads ``report.html`` from disk with every network route closed (a dead proxy, a
host resolver that resolves nothing, no background networking), lets the page's scripts run, and
returns what the page's own render check wrote on ``<html>`` (figures found / rendered, script
errors) plus console errors from Chromium's log. :func:`screenshot` saves a PNG of the first
screen. Both need a ``chromium`` (or ``chromium-browser`` / ``google-chrome``) executable.

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

__all__ = ["find_chromium", "render", "screenshot", "OFFLINE_FLAGS"]

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


def screenshot(html: Union[str, Path], png: Union[str, Path], *, width: int = 1280, height: int = 900,
               budget_ms: int = 15000, timeout: float = 120) -> Path:
    """Save a PNG of the first ``width`` x ``height`` pixels of ``html`` (a path or a file:// URL), offline."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    url = str(html) if str(html).startswith("file://") else Path(html).resolve().as_uri()
    proc = _run([f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}",
                 f"--screenshot={png}", url], timeout)
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png
