"""How the report writes a number: fractions as %, bits and correlations with 3 decimals, tiny and huge
values with 3 significant digits. Shared by the HTML page, its headline figure and the text table."""

from __future__ import annotations

from typing import Optional

__all__ = ["format_value", "format_ci"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_value(value: Optional[float], units: str) -> str:
    """Human formatting of a metric value: fractions as %, bits and correlations with 3 decimals."""
    if value is None:
        return "n/a"
    if units == "fraction":
        return _pct(value)
    a = abs(value)
    if a != 0 and (a < 1e-3 or a >= 1e4):
        return f"{value:.3g}"
    return f"{value:.3f}"


def format_ci(ci: Optional[dict], units: str) -> str:
    if not ci:
        return ""
    return f"[{format_value(ci.get('low'), units)}, {format_value(ci.get('high'), units)}]"
