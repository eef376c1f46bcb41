"""Gallery images of a report, rendered by our own code in headless Chromium (no kaleido needed).

``python tools/make_gallery.py REPORT_DIR OUT_DIR`` writes ``report_first_screen.png`` (the
first 1366 x 900 pixels of report.html, a laptop), ``report_first_screen_390.png`` (the first
390 x 844, a phone) and one PNG per figure (``report.html?only=<figure id>``),
named after the section and figure index. Used for README's gallery (docs/gallery/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reporting"))
from browser import find_chromium, screenshot  # noqa: E402  (the headless-Chromium helper of the tests)

__all__ = ["make_gallery"]


def make_gallery(report_dir, out_dir, *, width: int = 1366, height: int = 900) -> list:
    """Screenshots of ``report_dir/report.html``: the first screen and every figure. Returns the paths."""
    if find_chromium() is None:
        raise FileNotFoundError("no chromium executable found (apt-get install chromium)")
    report_dir, out_dir = Path(report_dir), Path(out_dir)
    doc = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    html = (report_dir / "report.html").resolve()
    paths = [screenshot(html, out_dir / "report_first_screen.png", width=width, height=height),
             screenshot(html, out_dir / "report_first_screen_390.png", width=390, height=844)]
    for name, sec in doc["sections"].items():
        for fig in sec["figures"]:
            target = out_dir / f"{fig['id']}.png"
            url = f"{html.as_uri()}?only={fig['id']}"
            paths.append(screenshot(url, target, width=1320, height=470))
    return paths


if __name__ == "__main__":  # pragma: no cover
    for p in make_gallery(sys.argv[1], sys.argv[2]):
        print(p)
