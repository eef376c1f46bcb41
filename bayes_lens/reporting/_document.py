"""What ``bl.report()`` hands back and prints: the report document with a short repr, section headers
as they run, and the plain-text summary table the CLI prints (the report itself: METHODS.md §1-§9).

:class:`ReportDocument` is the content of ``report.json`` (a ``dict`` subclass, so
``doc["sections"]["sula"]["metrics"]`` and ``json.dumps(doc)`` work as before) with ``.doc`` (the
plain dict), ``.path`` (the report folder), ``.html`` and ``.json`` (the files), a one-line
``repr`` instead of the whole 100 KB document, and :meth:`ReportDocument.summary` (the table).
:class:`SectionPrinter` prints ``bayes-lens: [i/n] section ...`` lines on stderr, as the CLI does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["ReportDocument", "SectionPrinter", "summary_table"]


def _unit(units: str) -> str:
    return "" if units in ("fraction", "dimensionless") else units


def summary_table(doc: dict) -> str:
    """The report's headline numbers as a plain-text table; no label or verdict is cut short."""
    from ._html import format_ci, format_value
    from ._verdicts import verdict

    rows = [("section", "quantity", "value", "95% CI", "baseline", "verdict")]
    for r in doc["summary"]:
        base = ""
        if r["baseline"]:
            base = f"{format_value(r['baseline']['value'], r['units'])} ({r['baseline']['label']})"
        v = r.get("verdict") if "verdict" in r else verdict(r)
        rows.append((r["section"], r["label"], f"{format_value(r['value'], r['units'])} {_unit(r['units'])}".strip(),
                     format_ci(r["ci"], r["units"]), base, (v or {}).get("text", "")))
    for name, sec in doc["sections"].items():
        if sec["status"] != "ok":
            msg = sec["error"]["message"] if sec.get("error") else ""
            rows.append((name, f"{sec['status'].upper()}: {msg}", "", "", "", ""))
    # every column as wide as its widest cell, except that the last two columns (long free text) are
    # not padded: a long baseline label or verdict runs on instead of being cut
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]

    def fmt(r):
        cells = [str(c).ljust(w) for c, w in zip(r[:4], widths[:4])] + [str(r[4]).ljust(widths[4]), str(r[5])]
        return "  ".join(cells).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths[:5]) + "  " + "-" * len("verdict")]
    lines += [fmt(r) for r in rows[1:]]
    return "\n".join(lines)


class SectionPrinter:
    """``on_section`` callback printing ``bayes-lens: [i/n] name ...`` and ``... name: ok (12.3 s)``."""

    def __init__(self, names: Sequence[str], stream=None, prefix: str = "bayes-lens"):
        self.names = list(names)
        self.stream = stream
        self.prefix = prefix
        self.i = 0
        self.t = 0.0

    def __call__(self, name: str, status: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        n = len(self.names)
        if status == "start":
            self.i += 1
            self.t = time.perf_counter()
            print(f"{self.prefix}: [{self.i}/{n}] {name} ...", file=stream, flush=True)
        else:
            print(f"{self.prefix}: [{self.i}/{n}] {name}: {status} ({time.perf_counter() - self.t:.1f} s)",
                  file=stream, flush=True)


class ReportDocument(dict):
    """The report document (``report.json``'s content) with its folder; a dict with a short repr."""

    def __init__(self, doc: dict, path):
        super().__init__(doc)
        self.path = Path(path)

    @property
    def doc(self) -> dict:
        """The document as a plain ``dict``."""
        return dict(self)

    @property
    def html(self) -> Path:
        return self.path / "report.html"

    @property
    def json(self) -> Path:
        return self.path / "report.json"

    def summary(self) -> str:
        """The plain-text summary table (as ``bayes-lens report`` prints it)."""
        return summary_table(self)

    def failed_sections(self) -> List[str]:
        return [n for n, s in self.get("sections", {}).items() if s.get("status") != "ok"]

    def __repr__(self) -> str:
        secs = self.get("sections", {})
        states = ", ".join(f"{n}: {s.get('status')}" for n, s in secs.items())
        total = self.get("timings_s", {}).get("total")
        model = (self.get("model") or {}).get("name", "?")
        took = f", {total:.0f} s" if isinstance(total, (int, float)) else ""
        return (f"<ReportDocument {model} at {os.fspath(self.html)!r}: {len(self.get('summary', []))} metrics "
                f"({states}){took}; .summary() for the table, doc['sections'][...] for the data>")

    def _repr_html_(self) -> Optional[str]:  # notebooks: a link and the table, not the whole dict
        import html as _html

        return (f"<p>bayes_lens report: <a href='{_html.escape(os.fspath(self.html))}'>"
                f"{_html.escape(os.fspath(self.html))}</a></p><pre>{_html.escape(self.summary())}</pre>")
