"""Shared behaviour of result objects: JSON-safe ``to_dict``, short reprs and lazy plotly import.

Every analysis returns a frozen dataclass that inherits :class:`Result`. Subclasses implement
``to_dataframe()`` (long format, units in column names such as ``entropy_bits``) and ``plot()``;
``to_dict()`` is generic: it walks the dataclass fields and turns tensors, arrays, DataFrames and
nested results into plain Python values so that ``json.dumps(result.to_dict())`` always works.

``repr(result)`` is a few lines: a title (what was measured, on how many prompts or sequences),
the headline numbers with their intervals and nulls, and one line naming the arrays and tables
the result holds with their shapes (``coords (75, 10)``): the arrays themselves only on request,
as attributes. ``_repr_html_`` shows the same as a small table in notebooks. A subclass supplies
``_summary()`` -> ``(title, rows)`` (rows of ``(label, value, interval, note)`` strings); the
dataclass-generated repr is replaced for every subclass (:meth:`Result.__init_subclass__`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from ._validate import check_nonneg_int
from .errors import InvalidInputError, require_extra

__all__ = ["Result", "Estimate", "jsonable", "plotly", "fmt", "fmt_ci", "fmt_pct", "shape_of"]


def fmt(x: Any, digits: int = 4) -> str:
    """A number in ``digits`` significant figures (``nan`` for a missing or non-finite one)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "nan" if not math.isfinite(x) else f"{x:.{digits}g}"


def fmt_ci(ci: Any, digits: int = 4, pct: bool = False) -> str:
    """``[lo, hi]`` of a ``(lo, hi)`` pair or of an :class:`Estimate`'s ``ci`` (``""`` when there is no interval)."""
    if isinstance(ci, Estimate):
        ci = ci.ci
    try:
        lo, hi = (float(v) for v in ci)
    except (TypeError, ValueError):
        return ""
    if not (math.isfinite(lo) or math.isfinite(hi)):
        return ""
    if pct:
        return f"[{fmt_pct(lo)}, {fmt_pct(hi)}]"
    return f"[{fmt(lo, digits)}, {fmt(hi, digits)}]"


def fmt_pct(x: Any) -> str:
    """A fraction as a percentage with one decimal (``0.1234`` -> ``12.3%``)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "nan" if not math.isfinite(x) else f"{100 * x:.1f}%"


def shape_of(value: Any) -> Optional[str]:
    """``(75, 10)`` for a tensor/array, ``(12 rows)`` for a table, ``None`` for anything else."""
    import sys

    shape = getattr(value, "shape", None)
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        return f"({len(value)} rows x {value.shape[1]} cols)"
    if shape is not None and not isinstance(value, (int, float)) and hasattr(value, "ndim"):
        return "(" + ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    return None


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def jsonable(value: Any) -> Any:
    """Convert ``value`` into JSON-safe Python data (non-finite floats become ``None``)."""
    import pandas as pd
    import torch

    if isinstance(value, (Result, Estimate)):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, pd.DataFrame):
        return [jsonable(r) for r in value.to_dict(orient="records")]
    if isinstance(value, pd.Series):
        return jsonable(value.to_dict())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return repr(value)


class Result:
    """Mixin for frozen result dataclasses (``to_dict``, short repr; subclasses add ``to_dataframe``/``plot``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # @dataclass adds a __repr__ (every field, arrays in full) unless the class body defines one;
        # put the short one there first, unless the subclass wrote its own.
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Result.__repr__

    def to_dict(self) -> dict:
        """All public fields as JSON-safe data (tensors and arrays become nested lists)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.name.startswith("_")}

    def to_dataframe(self):  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    # --- short display ---
    def _summary(self):
        """``(title, rows)``; the generic one lists the scalar fields (subclasses give their headline)."""
        rows = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("_") or shape_of(v) is not None:
                continue
            if isinstance(v, (bool, int, float, str)) or v is None:
                rows.append((f.name, fmt(v) if isinstance(v, float) else str(v), "", ""))
        return "", rows[:8]

    def _arrays(self) -> str:
        """``name (shape)`` for every array-valued or table-valued field: what ``repr`` leaves out."""
        parts = []
        for f in dataclasses.fields(self):
            if f.name.startswith("_"):
                continue
            shape = shape_of(getattr(self, f.name))
            if shape is not None:
                parts.append(f"{f.name} {shape}")
        return ", ".join(parts)

    def _display(self):
        try:
            title, rows = self._summary()
        except Exception as err:  # noqa: BLE001 - display must never raise
            title, rows = f"(summary unavailable: {type(err).__name__}: {err})", []
        return f"{type(self).__name__}" + (f": {title}" if title else ""), list(rows), self._arrays()

    def __repr__(self) -> str:
        head, rows, arrays = self._display()
        lines = [head]
        if rows:
            widths = [max(len(str(r[i])) for r in rows) for i in range(3)]
            for r in rows:
                cells = [str(r[i]).ljust(widths[i]) for i in range(3)] + [str(r[3]) if len(r) > 3 else ""]
                lines.append(("  " + "  ".join(cells)).rstrip())
        if arrays:
            lines.append(f"  arrays and tables (as attributes): {arrays}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:  # notebooks: the same few lines as a small table
        head, rows, arrays = self._display()
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{_html_escape(str(c))}</td>"
                                        for c in (tuple(r) + ("", "", "", ""))[:4]) + "</tr>" for r in rows)
        html = f"<div><b>{_html_escape(head)}</b>"
        if body:
            html += ("<table><thead><tr><th style='text-align:left'></th><th style='text-align:left'>value</th>"
                     "<th style='text-align:left'>95% interval</th><th style='text-align:left'></th></tr></thead>"
                     f"<tbody>{body}</tbody></table>")
        if arrays:
            html += f"<small>arrays and tables (as attributes): {_html_escape(arrays)}</small>"
        return html + "</div>"


@dataclass(frozen=True)
class Estimate:
    """A headline number with its interval: ``value``, ``ci`` (and ``ci_method``, what made it), a null, ``n``.

    Every result field that carries a headline number with an interval is an ``Estimate``
    (``ValueManifold.pc12``, ``SULAResult.mae_bits``, ``GapFit.A`` ...), as are the accessors of
    :class:`~bayes_lens.ablation.PatchComparison`, so that a number is looked up by meaning and
    its interval travels with it.

    - ``ci``: the ``(low, high)`` interval (``(nan, nan)`` when none could be computed, e.g. one
      prompt); ``ci_low`` / ``ci_high`` name its ends. ``ci_method`` says how it was made
      (``"percentile bootstrap over prompts (95%)"``, ``"t interval ..."``, ``"Fisher z ..."``).
    - ``null`` / ``null_interval``: the value expected without the effect, where the result has one
      (a simulated random baseline with its 95% range, or a reference value such as 0 with no range).
    - ``n``: the number of independent units the interval is over (prompts, sequences, heads ...).

    It behaves like its value where that is unambiguous: ``float(est)``, ``f"{est:.3f}"`` (any
    format spec is the value's; ``f"{est}"`` is ``str(est.value)``) and ``math.isfinite(est)``.
    Arithmetic and comparisons with numbers are not defined and raise ``TypeError``, ``==`` and ``!=``
    included (``est == 0.25`` would otherwise be silently False): write ``est.value`` (an interval does
    not survive arithmetic). Two estimates compare equal when every field is equal, and an estimate is
    hashable (a dict key, a set member). The constructor checks its fields: ``value`` and ``null`` are
    real numbers, ``ci`` and ``null_interval`` two of them with ``low <= high`` (NaN for an end that
    could not be computed), ``n`` a non-negative integer or None
    (:class:`~bayes_lens.errors.InvalidInputError` otherwise). ``to_dict()`` is flat and JSON-safe (``value, ci_low, ci_high, ci_method, null,
    null_low, null_high, n``), the columns result tables use.

    >>> e = Estimate(0.25, (0.2, 0.31), "percentile bootstrap over prompts (95%)", n=40)
    >>> f"{e:.1%}", e.ci_high, e.excludes(0.0)
    ('25.0%', 0.31, True)
    """

    value: float
    ci: Tuple[float, float] = (float("nan"), float("nan"))
    ci_method: str = "percentile bootstrap over prompts"
    null: Optional[float] = None
    null_interval: Optional[Tuple[float, float]] = None
    n: Optional[int] = None

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: the checked, normalised fields
        set_(self, "value", _real(self.value, "value"))
        set_(self, "ci", _interval(self.ci, "ci"))
        if not isinstance(self.ci_method, str):
            raise InvalidInputError(f"Estimate ci_method must be a string saying how the interval was made, got "
                                    f"{self.ci_method!r}.")
        if self.null is not None:
            set_(self, "null", _real(self.null, "null"))
        if self.null_interval is not None:
            set_(self, "null_interval", _interval(self.null_interval, "null_interval"))
        if self.n is not None:
            set_(self, "n", check_nonneg_int(self.n, "Estimate n (the number of independent units)"))

    def __eq__(self, other):
        if isinstance(other, Estimate):
            return dataclasses.astuple(self) == dataclasses.astuple(other)
        if isinstance(other, numbers.Number):
            raise TypeError(f"an Estimate is not compared with a number ({other!r}): compare est.value (or "
                            "est.ci_low / est.ci_high, est.excludes(x) for the interval).")
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(dataclasses.astuple(self))

    def __float__(self) -> float:
        return float(self.value)

    def __format__(self, spec: str) -> str:
        return format(float(self.value), spec)

    @property
    def ci_low(self) -> float:
        """The interval's lower end (``nan`` when there is none)."""
        return float(self.ci[0])

    @property
    def ci_high(self) -> float:
        """The interval's upper end (``nan`` when there is none)."""
        return float(self.ci[1])

    def excludes(self, x: float = 0.0) -> bool:
        """Whether the interval lies entirely on one side of ``x`` (the difference is resolved)."""
        if isinstance(x, (bool, str, bytes)) or not isinstance(x, numbers.Real) and np.ndim(x) != 0:
            raise InvalidInputError(f"Estimate.excludes(x) needs a real number x (the value the interval may "
                                    f"exclude, e.g. 0.0), got {x!r}.")
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise InvalidInputError(f"Estimate.excludes(x) needs a real number x (the value the interval may "
                                    f"exclude, e.g. 0.0), got {x!r}.") from None
        lo, hi = self.ci
        return bool(math.isfinite(lo) and math.isfinite(hi) and (lo > x or hi < x))

    def to_dict(self, prefix: str = "") -> dict:
        """Flat JSON-safe fields (non-finite numbers become ``None``), each name prefixed by ``prefix``."""
        nlo, nhi = self.null_interval if self.null_interval is not None else (None, None)
        out = {"value": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high, "ci_method": self.ci_method,
               "null": self.null, "null_low": nlo, "null_high": nhi, "n": self.n}
        return {prefix + k: jsonable(v) for k, v in out.items()}

    def __repr__(self) -> str:
        lo, hi = self.ci
        text = f"Estimate({self.value:.4g}, CI [{lo:.4g}, {hi:.4g}], {self.ci_method}"
        if self.null is not None:
            text += f", null {self.null:.4g}"
            if self.null_interval is not None:
                text += f" [{self.null_interval[0]:.4g}, {self.null_interval[1]:.4g}]"
        if self.n is not None:
            text += f", n = {self.n}"
        return text + ")"


def _real(x, name: str) -> float:
    """``x`` as a float, or the InvalidInputError of an Estimate field that is not a real number."""
    if isinstance(x, (bool, str, bytes)) or x is None:
        ok = False
    else:
        try:
            ok = isinstance(x, numbers.Real) or np.ndim(x) == 0
            out = float(x)
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise InvalidInputError(f"Estimate {name} must be a real number (NaN for one that could not be "
                                f"computed), got {x!r}.")
    return out


def _interval(ci, name: str) -> Tuple[float, float]:
    """``ci`` as a ``(low, high)`` pair of floats with ``low <= high``, or the InvalidInputError saying what is wrong."""
    if ci is None or isinstance(ci, (str, bytes)) or not hasattr(ci, "__len__") or len(ci) != 2:
        raise InvalidInputError(f"Estimate {name} must be a (low, high) pair ((nan, nan) when there is none), got "
                                f"{ci!r}.")
    lo, hi = _real(ci[0], f"{name} low end"), _real(ci[1], f"{name} high end")
    if lo > hi:
        raise InvalidInputError(f"Estimate {name} ({lo!r}, {hi!r}) has its low end above its high end; pass "
                                "(low, high).")
    return (lo, hi)


def plotly():
    """Return ``plotly.graph_objects`` or raise MissingExtraError naming the ``plot`` extra."""
    require_extra("plotly", "plot")
    import plotly.graph_objects as go

    return go
