"""Shared behaviour of result objects: JSON-safe ``to_dict`` and lazy plotly import.

Every analysis returns a frozen dataclass that inherits :class:`Result`. Subclasses implement
``to_dataframe()`` (long format, units in column names such as ``entropy_bits``) and ``plot()``;
``to_dict()`` is generic: it walks the dataclass fields and turns tensors, arrays, DataFrames and
nested results into plain Python values so that ``json.dumps(result.to_dict())`` always works.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from .errors import require_extra

__all__ = ["Result", "Estimate", "jsonable", "plotly"]


def jsonable(value: Any) -> Any:
    """Convert ``value`` into JSON-safe Python data (non-finite floats become ``None``)."""
    import pandas as pd
    import torch

    if isinstance(value, Result):
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
    """Mixin for frozen result dataclasses (``to_dict``; subclasses add ``to_dataframe``/``plot``)."""

    def to_dict(self) -> dict:
        """All public fields as JSON-safe data (tensors and arrays become nested lists)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.name.startswith("_")}

    def to_dataframe(self):  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def _repr_html_(self) -> str:  # notebooks show the table
        try:
            return self.to_dataframe().to_html(max_rows=40)
        except Exception:  # noqa: BLE001 - display must never raise
            return repr(self)


@dataclass(frozen=True)
class Estimate:
    """A typed headline number: its value, interval (and the method that made it), and a null.

    Returned by the accessors of results (e.g. ``PatchComparison.corr(condition, layer)``) so that a
    number is looked up by meaning, not by a string query on a table; ``float(est)`` is the value.
    """

    value: float
    ci: Tuple[float, float] = (float("nan"), float("nan"))
    ci_method: str = "percentile bootstrap over prompts"
    null: Optional[float] = None
    null_interval: Optional[Tuple[float, float]] = None
    n: Optional[int] = None

    def __float__(self) -> float:
        return float(self.value)

    def excludes(self, x: float = 0.0) -> bool:
        """Whether the interval lies entirely on one side of ``x`` (the difference is resolved)."""
        lo, hi = self.ci
        return bool(math.isfinite(lo) and math.isfinite(hi) and (lo > x or hi < x))

    def __repr__(self) -> str:
        lo, hi = self.ci
        return f"Estimate({self.value:.4g}, CI [{lo:.4g}, {hi:.4g}], {self.ci_method})"


def plotly():
    """Return ``plotly.graph_objects`` or raise MissingExtraError naming the ``plot`` extra."""
    require_extra("plotly", "plot")
    import plotly.graph_objects as go

    return go
