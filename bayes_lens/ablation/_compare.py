"""Clean vs patched: does removing the entropy axis break the geometry, and does calibration survive?

Paper A §4.6, §6.2, §7.1 (METHODS.md §7). For each condition (clean, each patch, random-direction
controls summarized over seeds): the correlation of the *clean-fitted* axis coordinate with the
model's entropy (and with the Bayes entropy on SULA prompts) at the patched layer and later layers,
the coordinate's spread relative to clean, and the SULA calibration (MAE of model vs Bayes entropy,
their correlation; METHODS.md §6), each with a paired percentile bootstrap CI (over prompts) of the
difference from clean. Paper A: single-layer removal takes the axis–entropy correlation from
≈0.27–0.32 to ≈0 while SULA MAE and correlation move by < 1%.

:func:`compare_patched` runs the model (one forward pass per condition and seed, through the runner,
which applies each patch as :func:`bayes_lens.patched` does), or reads caches the user made:
``compare_patched(prompts, clean=(logits, cache), patched={"removed": (logits, cache)}, axis=axis)``.
Both give the same :class:`PatchComparison`; read it with ``.corr(condition, layer)`` and
``.calibration_delta(condition)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import adapter
from .._results import Estimate, Result, fmt, fmt_ci, plotly
from .._inputs import is_cache_like, source_model
from ..collect import check_runnable
from .._validate import check_choice, check_count, check_float, check_seed
from ..errors import InvalidInputError, MissingHookError
from ..metrics.calibration import mae_bits
from ..metrics.stats import (Equivalence, bootstrap_indices, equivalence, pearson_rows, percentile_interval,
                             spearman_rows)
from ._axis import EntropyAxis, axis_cache, signing_entropy, value_arrays
from ._common import DEGENERATE_RATIO, prompt_data, site_dim
from ._patch import Patch, check_patches, flatten_pairs

__all__ = ["PatchComparison", "AblationEffect", "compare_patched", "coordinate_corr_rows"]

_CAL_METRICS = {"mae": "sula_mae_bits", "corr": "sula_pearson"}
#: Paper A §6.2's "MAE and correlation change by less than 1%", as equivalence margins (METHODS.md §7):
#: Δ MAE within ±1% of the clean MAE (relative); Δ r within ±0.01 (absolute: r is near 0 on some models,
#: where a relative margin would be meaninglessly small).
MAE_MARGIN = 0.01
CORR_MARGIN = 0.01


def _corr_rows(x: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    return spearman_rows(x, y) if method == "spearman" else pearson_rows(x, y)


def coordinate_corr_rows(coord: np.ndarray, entropy: np.ndarray, idx: np.ndarray, correlation: str, *,
                         clean: Optional[np.ndarray] = None) -> Tuple[np.ndarray, bool]:
    """(ρ(coordinate, entropy) on every resample row of ``idx`` ``[1 + n_boot, n]`` (row 0 the full sample),
    degenerate): the downstream geometry of a patched run, the one definition :func:`compare_patched`'s
    ``axis_entropy_corr`` and :func:`bayes_lens.localize`'s Δρ use. Degenerate: the coordinate's spread fell
    below ``DEGENERATE_RATIO`` of the ``clean`` coordinate's (read right after a full removal), so its
    correlation is undefined and reported as 0."""
    degenerate = clean is not None and bool(np.std(coord) <= DEGENERATE_RATIO * np.std(clean))
    r = np.zeros(idx.shape[0]) if degenerate else _corr_rows(coord[idx], entropy[idx], correlation)
    return r, degenerate


@dataclass(frozen=True)
class _Condition:
    label: str  # group label (random seeds share it)
    kind: str
    patches: Tuple[object, ...]  # one per seed (a Patch or a [(name, fn)] list); () for clean
    seeds: Tuple[Optional[int], ...]
    layers: Tuple[int, ...]
    is_random: bool


def _conditions(patches, n_random_seeds: int) -> List[_Condition]:
    if isinstance(patches, Patch):
        items = [(patches.label, patches)]
    elif isinstance(patches, dict):
        items = list(patches.items())
    elif isinstance(patches, (list, tuple)):
        items = []
        for i, p in enumerate(patches):
            if isinstance(p, Patch):
                items.append((p.label, p))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and callable(p[1]):
                raise InvalidInputError("compare_patched takes a list of patches (one per condition), not one list "
                                        "of (hook_name, fn) pairs; pass {'my patch': pairs} to name raw hooks.")
            else:
                items.append((f"patch {i}", p))
    else:
        raise InvalidInputError(f"patches must be a Patch, a list of patches or a dict label -> patch; got "
                                f"{type(patches).__name__}.")
    if not items:
        raise InvalidInputError("no patches given; pass e.g. [axis.removal()].")
    groups: Dict[str, dict] = {}
    order: List[str] = []

    def add(label, kind, patch, seed, layers, is_random):
        if label not in groups:
            groups[label] = {"kind": kind, "patches": [], "seeds": [], "layers": layers, "is_random": is_random}
            order.append(label)
        g = groups[label]
        if seed in g["seeds"] and seed is not None:
            return
        if seed is None and g["patches"]:
            raise InvalidInputError(f"two patches share the label {label!r}; give them distinct labels (a dict).")
        g["patches"].append(patch)
        g["seeds"].append(seed)

    for label, p in items:
        if isinstance(p, Patch):
            if p.is_random_control:
                add(p.group, p.kind, p, p.random_seed, p.layers, True)
            else:
                add(label, p.kind, p, None, p.layers, False)
        else:
            pairs = flatten_pairs(p)
            add(str(label), "hooks", pairs, None, (), False)
    # automatic random controls for every axis patch
    for label, p in items:
        if isinstance(p, Patch) and not p.is_random_control and p.axis is not None and \
                p.kind in ("removal", "keep_only", "shift"):
            for s in range(n_random_seeds):
                r = p.random_like(seed=s)
                add(r.group, r.kind, r, s, r.layers, True)
    return [_Condition(label=k, kind=groups[k]["kind"], patches=tuple(groups[k]["patches"]),
                       seeds=tuple(groups[k]["seeds"]), layers=tuple(groups[k]["layers"]),
                       is_random=groups[k]["is_random"]) for k in order]


@dataclass(frozen=True, eq=False)
class PatchComparison(Result):
    """Clean vs patched: axis–entropy correlation by readout layer and SULA calibration, with CIs.

    ``table`` (long format; also ``to_dataframe()``) has one row per condition × metric × readout
    layer × entropy: ``condition`` (``"clean"``, a patch label, or a random-control group
    summarized over ``n_seeds`` seeds: values are means over seeds), ``kind``, ``is_random``,
    ``patched_layers``, ``metric`` (``axis_entropy_corr``: correlation of the clean-fitted axis
    coordinate with an entropy; ``coordinate_std_ratio``: std of that coordinate / its clean std;
    ``sula_mae_bits`` and ``sula_pearson``: calibration against the Bayes posterior, METHODS.md §6),
    ``readout_layer``, ``entropy`` (``model`` = the model's own entropy under that condition, or
    ``bayes``), ``value`` with ``value_ci_low/high``, ``diff_from_clean`` with ``diff_ci_low/high``
    (paired percentile bootstrap over prompts: the same resampled prompts for clean and patched),
    ``rel_diff`` (diff / clean value), ``seed_diff_min/max`` (spread over random seeds) and
    ``degenerate`` (the coordinate's spread collapsed — e.g. read right after a full removal — so
    its correlation is undefined and reported as 0).
    """

    table: object
    conditions: Tuple[str, ...]
    readout_layers: Tuple[int, ...]
    site: str
    correlation: str
    entropy_kind: str
    calibration: bool
    n_prompts: int
    n_boot: int
    seed: int
    n_random_seeds: int
    axis_layers: Tuple[int, ...]
    task: str = "SULA"  # the task whose exact posterior calibration is read against ("SULA" or a bl.tasks name)

    def _summary(self):
        title = (f"{len(self.conditions)} conditions, readout layers {list(self.readout_layers)}, "
                 f"axis layers {list(self.axis_layers)}, n = {self.n_prompts} prompts")
        rows = []
        later = [l for l in self.readout_layers if l > max(self.axis_layers, default=-1)]
        for cond in self.conditions:
            for layer in ([self.axis_layers[0]] if self.axis_layers else []) + later[-1:]:
                try:
                    e = self.corr(cond, layer)  # with the model's own entropy under that condition
                except Exception:  # noqa: BLE001 - a condition without that row: leave it out
                    continue
                rows.append((f"{cond}: corr at layer {layer}", fmt(e.value), fmt_ci(e.ci), ""))
            if self.calibration:
                try:
                    e = self.calibration_value(cond, "mae")
                except Exception:  # noqa: BLE001
                    continue
                rows.append((f"{cond}: {self.task} MAE", f"{fmt(e.value)} bits", fmt_ci(e.ci), ""))
        return title, rows[:10]

    # --- typed accessors (use these instead of string queries on the table) ---
    def _row(self, condition: str, metric: str, layer=None, entropy=None):
        if condition not in self.conditions:
            raise InvalidInputError(f"unknown condition {condition!r}; this comparison has {list(self.conditions)}.")
        t = self.table
        sel = (t["condition"] == condition) & (t["metric"] == metric)
        if layer is not None:
            sel &= t["readout_layer"].apply(lambda v: v is not None and v == v and int(v) == int(layer))
        if entropy is not None:
            sel &= t["entropy"] == entropy
        rows = t[sel]
        if len(rows) != 1:
            raise InvalidInputError(f"no {metric} row for condition {condition!r}"
                                    + (f" at readout layer {layer}" if layer is not None else "")
                                    + (f" ({entropy} entropy)" if entropy is not None else "")
                                    + f"; readout layers are {list(self.readout_layers)}.")
        return rows.iloc[0]

    def _layer(self, layer):
        if layer is None:
            return self.axis_layers[0]
        if layer < 0:
            layer = self.readout_layers[-1] + 1 + layer
        return layer

    def corr(self, condition: str, layer: Optional[int] = None, *, entropy: str = "model") -> Estimate:
        """The axis–entropy correlation under ``condition`` at readout ``layer`` (default: the first
        axis layer), with its bootstrap interval (random controls: the mean over seeds)."""
        r = self._row(condition, "axis_entropy_corr", self._layer(layer), entropy)
        return Estimate(float(r["value"]), (float(r["value_ci_low"]), float(r["value_ci_high"])),
                        "percentile bootstrap over prompts", n=self.n_prompts)

    def corr_delta(self, condition: str, layer: Optional[int] = None, *, entropy: str = "model") -> Estimate:
        """Patched − clean axis–entropy correlation, with its paired bootstrap interval."""
        r = self._row(condition, "axis_entropy_corr", self._layer(layer), entropy)
        return Estimate(float(r["diff_from_clean"]), (float(r["diff_ci_low"]), float(r["diff_ci_high"])),
                        "paired percentile bootstrap over prompts", n=self.n_prompts)

    def calibration_value(self, condition: str, metric: str = "mae") -> Estimate:
        """SULA calibration under ``condition``: ``metric="mae"`` (MAE of model vs Bayes entropy, bits)
        or ``"corr"`` (their correlation)."""
        r = self._row(condition, _CAL_METRICS[self._cal(metric)])
        return Estimate(float(r["value"]), (float(r["value_ci_low"]), float(r["value_ci_high"])),
                        "percentile bootstrap over prompts", n=self.n_prompts)

    def calibration_delta(self, condition: str, metric: str = "mae") -> Estimate:
        """Patched − clean SULA calibration (``"mae"`` in bits, or ``"corr"``), paired bootstrap interval."""
        r = self._row(condition, _CAL_METRICS[self._cal(metric)])
        return Estimate(float(r["diff_from_clean"]), (float(r["diff_ci_low"]), float(r["diff_ci_high"])),
                        "paired percentile bootstrap over prompts", n=self.n_prompts)

    def _cal(self, metric: str) -> str:
        if not self.calibration:
            raise InvalidInputError("this comparison has no calibration (plain strings, or calibration=False).")
        return check_choice(metric, "metric", sorted(_CAL_METRICS))

    def _random_control(self, condition: str) -> Optional[str]:
        """The random-control condition of an axis patch's ``condition`` (same op, same layers), or None.

        Its default label is ``"random ⟂ " + <the patch's label>``; a patch passed under a label of
        its own is matched by its op and layers in the table.
        """
        for c in self.conditions:
            if c.startswith("random ⟂") and condition.split(" @")[-1] == c.split(" @")[-1] and \
                    condition.split(" @")[0] in c:
                return c
        t = self.table
        rows = t[t["condition"] == condition]
        same = t[t["is_random"].astype(bool) & (t["kind"] == rows["kind"].iloc[0])
                 & (t["patched_layers"] == rows["patched_layers"].iloc[0])]
        return same["condition"].iloc[0] if len(same) else None

    def to_dataframe(self):
        return self.table.copy()

    def effect(self, condition: Optional[str] = None, *, downstream: Optional[int] = None,
               mae_margin: float = MAE_MARGIN, corr_margin: float = CORR_MARGIN) -> "AblationEffect":
        """What the patch did, in the few numbers a reader needs and one sentence computed from them.

        Paper A's question (METHODS.md §7): does removing the axis *break the geometry* — the
        correlation of the clean-fitted axis coordinate with the model's entropy, read at layers
        *after* the patched one (at the patched layer itself a removed coordinate is 0 by
        construction) — while *calibration survives* (Paper A §6.2: SULA MAE *and* correlation change by
        less than 1%)? "Survives" is an equivalence test on each change's paired 95% interval
        (:func:`bayes_lens.metrics.stats.equivalence`): the whole interval of Δ MAE must lie inside
        ±``mae_margin`` × the clean MAE (relative, default 1%), and the whole interval of Δ r (the SULA
        Pearson correlation) inside ±``corr_margin`` (absolute, default 0.01: a relative margin means
        nothing on a correlation near 0). Either interval wholly outside its margin: calibration
        *changes*; otherwise *inconclusive*, with the number of prompts that would decide it.
        ``condition`` defaults to the first patch; ``downstream`` is the readout layer of the
        headline (default: the first layer after the patched layers); the last layer is always shown.
        The random-direction control (same op and layers), when the comparison has one, is shown next to it.
        """
        mae_margin = check_float(mae_margin, "mae_margin", min=0, min_inclusive=False)
        corr_margin = check_float(corr_margin, "corr_margin", min=0, min_inclusive=False)
        if condition is None:
            condition = next((c for c in self.conditions if c != "clean" and not c.startswith("random ⟂")), None)
            if condition is None:
                raise InvalidInputError("this comparison has no patched condition; pass patches to compare_patched.")
        check_choice(condition, "condition (a patched condition)", [c for c in self.conditions if c != "clean"])
        t = self.table
        rows = t[t["condition"] == condition]
        patched = sorted({int(x) for v in rows["patched_layers"] for x in str(v).split(",") if x.strip()}) \
            or list(self.axis_layers)
        after = [k for k in self.readout_layers if k > max(patched)]
        if downstream is None:
            if not after:
                raise InvalidInputError(f"no readout layer after the patched layers {patched} (readout layers "
                                        f"{list(self.readout_layers)}): patch an earlier layer to see downstream.")
            downstream = after[0]
        elif downstream not in self.readout_layers:
            raise InvalidInputError(f"downstream must be a readout layer {list(self.readout_layers)}, got {downstream!r}.")
        last = self.readout_layers[-1]
        rnd = self._random_control(condition)
        layers = sorted({downstream, last})
        corr = {(c, k): self.corr(c, k) for c in ("clean", condition) for k in layers}
        delta = {k: self.corr_delta(condition, k) for k in layers}
        rdelta = {k: self.corr_delta(rnd, k) for k in layers} if rnd else {}
        cal = cal_corr = None
        if self.calibration:
            cal, cal_corr = ((self.calibration_value("clean", m), self.calibration_delta(condition, m),
                              self.calibration_delta(rnd, m) if rnd else None) for m in ("mae", "corr"))
        return AblationEffect(condition=condition, patched_layers=tuple(patched), downstream_layer=int(downstream),
                              last_layer=int(last), corr=corr, corr_delta=delta, random_condition=rnd,
                              random_corr_delta=rdelta, calibration=cal, n_prompts=self.n_prompts,
                              at_patched=self.corr("clean", patched[0]) if patched[0] in self.readout_layers else None,
                              calibration_corr=cal_corr, mae_margin=mae_margin, corr_margin=corr_margin,
                              task=self.task)

    def summary(self):
        """The headline rows: axis–entropy correlation at each patched layer, and calibration."""
        t = self.table
        keep = (t["metric"].isin(["sula_mae_bits", "sula_pearson"])
                | ((t["metric"] == "axis_entropy_corr") & t["readout_layer"].isin(list(self.axis_layers))))
        return t[keep].reset_index(drop=True)

    def plot(self):
        """Two panels: axis–entropy correlation (model entropy) by readout layer; calibration change vs clean."""
        go = plotly()
        from plotly.subplots import make_subplots

        t = self.table
        fig = make_subplots(rows=1, cols=2, subplot_titles=(
            f"{self.correlation} ρ(axis coordinate, model entropy)", "calibration: change vs clean"))
        corr = t[(t["metric"] == "axis_entropy_corr") & (t["entropy"] == "model")]
        for cond in self.conditions:
            d = corr[corr["condition"] == cond].sort_values("readout_layer")
            if d.empty:
                continue
            fig.add_trace(go.Scatter(
                x=d["readout_layer"], y=d["value"], mode="lines+markers", name=cond,
                line={"dash": "dot"} if bool(d["is_random"].iloc[0]) else None,
                error_y={"type": "data", "symmetric": False, "array": d["value_ci_high"] - d["value"],
                         "arrayminus": d["value"] - d["value_ci_low"]}), row=1, col=1)
        cal = t[t["metric"].isin(["sula_mae_bits", "sula_pearson"]) & (t["condition"] != "clean")]
        for metric in ("sula_mae_bits", "sula_pearson"):
            d = cal[cal["metric"] == metric]
            if d.empty:
                continue
            fig.add_trace(go.Bar(
                x=d["condition"], y=d["diff_from_clean"], name=f"Δ {metric}",
                error_y={"type": "data", "symmetric": False, "array": d["diff_ci_high"] - d["diff_from_clean"],
                         "arrayminus": d["diff_from_clean"] - d["diff_ci_low"]}), row=1, col=2)
        fig.update_xaxes(title_text="readout layer", row=1, col=1)
        fig.update_yaxes(title_text="correlation", row=1, col=1)
        fig.update_yaxes(title_text="patched − clean", row=1, col=2)
        fig.update_layout(title="Entropy-axis ablation (Paper A §4.6; METHODS.md §7)", barmode="group")
        return fig


def _ci_side(e: Estimate) -> str:
    return "excludes 0" if e.excludes(0.0) else "includes 0"


@dataclass(frozen=True, eq=False)
class AblationEffect:
    """The headline of a :class:`PatchComparison` (from :meth:`PatchComparison.effect`): the clean and
    patched axis–entropy correlations downstream of the patch, their paired difference (and the
    random control's), the SULA calibration change, and :attr:`sentence`, which reads them.

    ``corr[(condition, layer)]`` and ``corr_delta[layer]`` are :class:`~bayes_lens.Estimate` values at
    ``downstream_layer`` and ``last_layer``; ``calibration`` is ``(clean MAE, Δ MAE, random Δ MAE)`` in bits
    and ``calibration_corr`` ``(clean r, Δ r, random Δ r)`` for the SULA Pearson correlation (both None
    without SULA items). :attr:`mae_test` and :attr:`corr_test` are the equivalence tests of the two
    changes against ``mae_margin`` (relative to the clean MAE) and ``corr_margin`` (absolute), and
    :attr:`calibration_verdict` combines them (METHODS.md §7).
    """

    condition: str
    patched_layers: Tuple[int, ...]
    downstream_layer: int
    last_layer: int
    corr: Dict[Tuple[str, int], Estimate]
    corr_delta: Dict[int, Estimate]
    random_condition: Optional[str]
    random_corr_delta: Dict[int, Estimate]
    calibration: Optional[Tuple[Estimate, Estimate, Optional[Estimate]]]
    n_prompts: int
    at_patched: Optional[Estimate] = None
    calibration_corr: Optional[Tuple[Estimate, Estimate, Optional[Estimate]]] = None
    mae_margin: float = MAE_MARGIN
    corr_margin: float = CORR_MARGIN
    task: str = "SULA"

    @property
    def geometry(self) -> str:
        """``"breaks"``, ``"weakens"``, ``"unchanged"`` or ``"strengthens"`` at the downstream layer
        (breaks: the paired Δρ interval excludes 0 and |ρ| falls below half its clean value)."""
        k = self.downstream_layer
        clean, patched, d = self.corr[("clean", k)], self.corr[(self.condition, k)], self.corr_delta[k]
        if not d.excludes(0.0):
            return "unchanged"
        if abs(patched.value) < abs(clean.value):
            return "breaks" if abs(patched.value) < 0.5 * abs(clean.value) else "weakens"
        return "strengthens"

    @property
    def mae_test(self) -> Optional[Equivalence]:
        """Equivalence test of Δ SULA MAE against ±``mae_margin`` × the clean MAE (bits); None without calibration."""
        if self.calibration is None:
            return None
        clean, d, _ = self.calibration
        if not (math.isfinite(clean.value) and clean.value > 0):
            return Equivalence("inconclusive", d.value, d.ci, float("nan"), self.n_prompts)
        return equivalence(d.value, d.ci, self.mae_margin * abs(clean.value), n=self.n_prompts)

    @property
    def corr_test(self) -> Optional[Equivalence]:
        """Equivalence test of Δ SULA Pearson r against the absolute ±``corr_margin``; None without it."""
        if self.calibration_corr is None:
            return None
        _, d, _ = self.calibration_corr
        return equivalence(d.value, d.ci, self.corr_margin, n=self.n_prompts)

    @property
    def calibration_verdict(self) -> Optional[str]:
        """``"survives"`` when every calibration test is equivalent, ``"changes"`` when any is
        different, else ``"inconclusive"``; None without calibration (Paper A §6.2 as an interval test)."""
        tests = [t for t in (self.mae_test, self.corr_test) if t is not None]
        if not tests:
            return None
        if any(t.outcome == "different" for t in tests):
            return "changes"
        return "survives" if all(t.outcome == "equivalent" for t in tests) else "inconclusive"

    @property
    def calibration_survives(self) -> Optional[bool]:
        """True when :attr:`calibration_verdict` is ``"survives"``, False when ``"changes"``, None when
        inconclusive or without calibration (an undecided test is not a survival)."""
        return {"survives": True, "changes": False}.get(self.calibration_verdict)

    def calibration_lines(self) -> list:
        """The equivalence tests in words: the rule, the numbers and the outcome, one line each."""
        out = []
        if self.mae_test is not None:
            clean = self.calibration[0].value
            out.append(self.mae_test.describe(f"Δ {self.task} MAE / clean MAE", scale=abs(clean), pct=True)
                       if math.isfinite(self.mae_test.margin) else
                       f"Δ {self.task} MAE: the clean MAE is {clean:.3g}, so a relative margin is undefined: inconclusive")
        if self.corr_test is not None:
            out.append(self.corr_test.describe(f"Δ {self.task} r"))
        return out

    @property
    def sentence(self) -> str:
        """One sentence of interpretation, computed from the numbers (METHODS.md §7)."""
        k = self.downstream_layer
        clean, patched, d = self.corr[("clean", k)], self.corr[(self.condition, k)], self.corr_delta[k]
        where = "layer" + ("s " if len(self.patched_layers) > 1 else " ") + ",".join(map(str, self.patched_layers))
        weak = not clean.excludes(0.0)
        geo = {"breaks": "breaks the geometry downstream", "weakens": "weakens the geometry downstream but does "
               "not break it", "unchanged": "leaves the geometry downstream unchanged",
               "strengthens": "makes the geometry downstream stronger"}[self.geometry]
        text = (f"Removing the axis at {where} {geo}: at layer {k} ρ(axis, entropy) goes "
                f"{clean.value:+.2f} → {patched.value:+.2f} (Δ {d.value:+.3f}, CI {_ci_side(d)}")
        rd = self.random_corr_delta.get(k)
        text += f"; a random direction: Δ {rd.value:+.3f})" if rd is not None else ")"
        if weak:
            text += (f", but the clean correlation there is weak (CI {_ci_side(clean)}), so there is little "
                     "geometry to break")
        if self.calibration is not None:
            mae, dm, _ = self.calibration
            rel = dm.value / mae.value if mae.value else float("nan")
            verdict = {"survives": "calibration survives", "changes": "calibration changes",
                       "inconclusive": "whether calibration survives is inconclusive"}[self.calibration_verdict]
            text += (f"; {verdict} (equivalence test: survives only when the 95% intervals of Δ MAE and Δ r lie "
                     f"inside ±{self.mae_margin:.0%} of the clean MAE and ±{self.corr_margin:g}): {self.task} MAE "
                     f"{mae.value:.3f} bits moves by {dm.value:+.4f} ({rel:+.1%})")
            if self.calibration_corr is not None:
                r, dr, _ = self.calibration_corr
                text += f", r {r.value:+.3f} by {dr.value:+.4f}"
        return text + "."

    def to_dataframe(self):
        """One row per readout layer shown: clean and patched ρ, Δρ with its CI, and the random control's Δρ."""
        import pandas as pd

        rows = []
        for k in sorted({self.downstream_layer, self.last_layer}):
            c, p, d = self.corr[("clean", k)], self.corr[(self.condition, k)], self.corr_delta[k]
            rd = self.random_corr_delta.get(k)
            rows.append({"readout_layer": k, "clean_corr": c.value, "patched_corr": p.value, "delta": d.value,
                         "delta_ci_low": d.ci[0], "delta_ci_high": d.ci[1],
                         "random_delta": rd.value if rd is not None else float("nan")})
        return pd.DataFrame(rows)

    def __str__(self) -> str:
        lines = [f"{self.condition} (n = {self.n_prompts} prompts; ρ = correlation of the clean-fitted axis "
                 "coordinate with the model's entropy)"]
        if self.at_patched is not None:
            a = self.at_patched
            lines.append(f"  clean ρ at the patched layer {self.patched_layers[0]}: {a.value:+.3f} "
                         f"[{a.ci[0]:+.3f}, {a.ci[1]:+.3f}] (after removal 0 by construction)")
        for k in sorted({self.downstream_layer, self.last_layer}):
            c, p, d = self.corr[("clean", k)], self.corr[(self.condition, k)], self.corr_delta[k]
            rd = self.random_corr_delta.get(k)
            lines.append(f"  layer {k}: ρ clean {c.value:+.3f} → patched {p.value:+.3f}, Δ {d.value:+.3f} "
                         f"[{d.ci[0]:+.3f}, {d.ci[1]:+.3f}]" + (f"; random ⟂: Δ {rd.value:+.3f}" if rd else ""))
        if self.calibration is not None:
            mae, dm, rm = self.calibration
            lines.append(f"  {self.task} MAE {mae.value:.3f} bits: Δ {dm.value:+.4f} [{dm.ci[0]:+.4f}, {dm.ci[1]:+.4f}]"
                         + (f"; random ⟂: Δ {rm.value:+.4f}" if rm is not None else ""))
            if self.calibration_corr is not None:
                r, dr, rr = self.calibration_corr
                lines.append(f"  {self.task} r {r.value:+.3f}: Δ {dr.value:+.4f} [{dr.ci[0]:+.4f}, {dr.ci[1]:+.4f}]"
                             + (f"; random ⟂: Δ {rr.value:+.4f}" if rr is not None else ""))
            lines += [f"  {line}" for line in self.calibration_lines()]
        lines.append(self.sentence)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<AblationEffect {self.condition!r}: geometry {self.geometry} at layer {self.downstream_layer}" + (
            f", calibration {self.calibration_verdict}>" if self.calibration else ">")

    def _repr_pretty_(self, p, cycle):  # IPython / notebooks: the lines, not the one-line repr
        p.text(str(self))


def _check_common(correlation, n_random_seeds, n_boot, seed=0):
    check_seed(seed)
    check_choice(correlation, "correlation", ("pearson", "spearman"))
    check_count(n_random_seeds, "n_random_seeds")
    check_count(n_boot, "n_boot")


def compare_patched(source, prompts=None, patches=None, *, clean=None, patched=None,  # noqa: C901
                    axis: Optional[EntropyAxis] = None, readout_layers="auto", n_random_seeds: int = 3,
                    correlation: str = "pearson", calibration="auto", n_boot: int = 1000, seed: int = 0,
                    attention_mask=None, tokens=None, model=None, batch_size: int = 16,
                    progress: Optional[bool] = None) -> PatchComparison:
    """Clean vs each patch: axis–entropy correlation by layer and SULA calibration, with CIs.

    Two forms:

    * ``compare_patched(model, prompts, patches)`` runs the model: one forward pass per condition and
      seed (the patch, the read-outs at every readout layer and the label log-probabilities together);
    * ``compare_patched(prompts, clean=pair, patched={"label": pair, ...}, axis=axis)`` reads caches
      you made on ``prompts``: each ``pair`` is what ``model.run_with_cache(tokens, names_filter=f)``
      returned (``(logits, cache)``, holding ``hook_v`` at the readout layers), the patched ones made
      inside ``with bl.patched(model, patch):``. A value may be a list of pairs: random-control seeds,
      summarized over seeds. Pass ``tokens`` (or ``attention_mask``) when the batch was padded.

    Parameters
    ----------
    patches:
        A :class:`Patch`, a list of them (one condition each), or a dict ``{label: patch}`` (a value
        may also be a raw ``[(hook_name, fn)]`` list). Random controls passed in are grouped by
        their label without the seed.
    axis:
        The axis whose *clean-fitted* coordinate is read (default: the axis the first patch came
        from; for a sum of patches of several axes, ``a1.removal() + a2.removal()``, their layers
        together, each layer read with the axis patched there). At readout layers it was not fitted
        on, an axis with the same settings is fitted on the clean run of ``prompts``.
    readout_layers:
        ``"auto"``: every layer from the first patched layer to the last (from caches: the layers the
        clean cache holds from the first axis layer on); or a list of layers.
    n_random_seeds:
        For every axis patch (removal, keep-only, shift) add random-direction controls with seeds
        ``0..n_random_seeds-1`` (same op, λ, layers and site), summarized over seeds (0 = none).
    correlation:
        ``"pearson"`` (default) or ``"spearman"``.
    calibration:
        ``"auto"`` (SULA items given → yes), True or False: compare MAE and correlation of model vs
        Bayes entropy under each condition.
    n_boot, seed:
        Paired percentile bootstrap over prompts (one index matrix shared by every condition).
    To run the clean pass and every patched pass in shards, call it inside ``with bl.shard.sharded(...)``:
    each condition is its own collection, its folder named by its patch's :meth:`Patch.digest`
    (engines whose workers are other processes, such as Ray, cannot take patches, which are Python
    callables: they are refused with :class:`bl.shard.ShardEngineError` before any compute).

    The model's entropy under a condition is the entropy over the two SULA labels (renormalized,
    as in :func:`bayes_lens.sula.evaluate`) for SULA items, else the full next-token entropy; the
    Bayes entropy is fixed by the prompt.

    Example
    -------
    >>> items = bl.sula.make_prompts(model, ks=(0, 1, 2), n_per_k=4, seed=0)
    >>> axis = bl.EntropyAxis(layer=-1).fit(model, items)
    >>> cmp = bl.compare_patched(model, items, [axis.removal()], n_boot=100, n_random_seeds=1)
    >>> cmp.conditions
    ('clean', 'removal λ=1 @L1', 'random ⟂ removal λ=1 @L1')
    >>> clean, delta = cmp.corr("clean", axis.layer_), cmp.corr_delta(cmp.conditions[1], axis.layer_)
    >>> bool(np.isclose(delta.value, -clean.value))        # the removed coordinate is 0 at the patched layer
    True
    >>> toks, mask = bl.adapter.tokenize(model, items.texts)
    >>> f = bl.hook_filter(model, layers=range(axis.layer_, model.cfg.n_layers))
    >>> clean = model.run_with_cache(toks, attention_mask=mask, names_filter=f)
    >>> with bl.patched(model, axis.removal()):
    ...     removed = model.run_with_cache(toks, attention_mask=mask, names_filter=f)
    >>> d = bl.compare_patched(items, clean=clean, patched={"removed": removed}, axis=axis,
    ...                        attention_mask=mask, n_boot=100).calibration_delta("removed")
    >>> bool(np.isclose(d.value, cmp.calibration_delta(cmp.conditions[1]).value))   # same numbers from caches
    True
    """
    _check_common(correlation, n_random_seeds, n_boot, seed)
    if clean is not None or patched is not None:
        if clean is None or patched is None:
            raise InvalidInputError("from caches pass both clean=(logits, cache) and patched={label: (logits, cache)}.")
        if prompts is not None or patches is not None:
            raise InvalidInputError("from caches call compare_patched(prompts, clean=..., patched=..., axis=...).")
        return _from_caches(source, clean, patched, axis=axis, readout_layers=readout_layers,
                            correlation=correlation, calibration=calibration, n_boot=n_boot, seed=seed,
                            attention_mask=attention_mask, tokens=tokens, model=model)
    model = source
    adapter.check_model(model)
    if patches is None:
        raise InvalidInputError("pass the patches to compare, e.g. compare_patched(model, prompts, [axis.removal()]).")
    texts, bayes = _check_prompts(prompts)
    calibration = _check_calibration(calibration, bayes)
    conds = _conditions(patches, int(n_random_seeds))
    if axis is None:
        axis = _reading_axis(conds)
    if axis is None:
        raise InvalidInputError("no axis to read: pass axis=EntropyAxis(...).fit(...) or patches made by an axis.")
    axis.check_fitted()
    site = axis.site_
    info = adapter.model_info(model)
    if int(axis.model_meta_["dim"]) != site_dim(info, site):
        raise InvalidInputError(f"the axis has dimension {axis.model_meta_['dim']} but this model's {site!r} site "
                                f"has {site_dim(info, site)}; fit the axis on this model.")
    for c in conds:  # validate every patch before any compute, as bl.patched does
        for p in c.patches:
            check_patches(model, p)
    if readout_layers == "auto":
        patched_layers = [layer for c in conds for layer in c.layers] or list(axis.layers_)
        readouts = list(range(min(patched_layers), info.n_layers))
    else:
        readouts = adapter.resolve_layers(model, readout_layers)

    def collect_condition(p, label):
        # one way for every condition: the patch's hooks (on the site's own hook point) go to the runner, so a
        # sharded run names each condition's shard folder by its patch's digest
        rc, _ = axis_cache(model, prompts, layers=readouts, site=site, batch_size=batch_size, progress=progress,
                           desc=f"compare_patched: {label}", fwd_hooks=[] if p is None else flatten_pairs(p))
        return _run_arrays(rc, prompts, readouts, site)

    for c in conds:  # a runner that cannot run a patch (bl.shard.sharded on Ray) refuses it before the clean run
        for p in c.patches:
            check_runnable(flatten_pairs(p), desc=f"compare_patched: {c.label}")
    runs = {"clean": [collect_condition(None, "clean")]}
    for c in conds:
        runs[c.label] = [collect_condition(p, c.label) for p in c.patches]
    meta = [("clean", "clean", False, (), 1)] + [(c.label, c.kind, c.is_random, c.layers, len(c.patches))
                                                  for c in conds]
    return _comparison(runs, meta, axis=axis, model=model, readouts=readouts, bayes=bayes, calibration=calibration,
                       correlation=correlation, n_boot=int(n_boot), seed=seed, n_random_seeds=int(n_random_seeds), strata=_strata(prompts),
                       task=_task_label(prompts))


def _task_label(prompts) -> str:
    """The task name printed in calibration rows: "SULA" for SULA items (and plain strings), else the
    ``task`` of a :mod:`bayes_lens.tasks` prompt set or of its items."""
    task = getattr(prompts, "task", None)
    if task is None and isinstance(prompts, (list, tuple)) and prompts:
        task = getattr(prompts[0], "task", None)
    return "SULA" if not task or str(task).lower() == "sula" else str(task)


def _strata(prompts):
    """The k of each SULA item (the bootstrap resamples within k), None for plain strings."""
    k = getattr(prompts, "k", None)
    if k is None and isinstance(prompts, (list, tuple)) and prompts and all(hasattr(p, "k") for p in prompts):
        k = [p.k for p in prompts]  # a plain list of SULA items
    return None if k is None else np.asarray(k)


def _reading_axis(conds) -> Optional[EntropyAxis]:
    """The axis a comparison reads when none is given: the first patch's axis, or — for a patch that sums
    patches of several axes — one axis holding each of their layers (the first axis of the site wins a
    layer two of them share; axes of another site than the first are not read)."""
    for c in conds:
        for p in c.patches:
            if not isinstance(p, Patch) or not p.axes:
                continue
            if p.axis is not None or len(p.axes) == 1:
                return p.axis if p.axis is not None else p.axes[0]
            return _merged_axis(p.axes)
    return None


def _merged_axis(axes) -> EntropyAxis:
    first = axes[0]
    for a in axes:
        a.check_fitted()
    same = [a for a in axes if a.site_ == first.site_]
    picked: Dict[int, EntropyAxis] = {}
    for a in same:
        for k in a.layers_:
            picked.setdefault(k, a)
    layers = sorted(picked)
    merged = EntropyAxis(layer=layers, site=first.site_, standardize=first.standardize, sign_by=first.sign_by)

    def take(attr):
        return {k: getattr(picked[k], attr)[k] for k in layers}

    merged._set_fitted(None, first.model_meta_, take("axes_"), take("means_"), take("scales_"), take("sigma_"),
                       take("explained_variance_ratio_"), take("entropy_correlation_"), n_prompts=first.n_prompts_,
                       versions=first.versions_)
    merged.entropy_kind_ = getattr(first, "entropy_kind_", None)
    return merged


def _check_prompts(prompts):
    texts, bayes = prompt_data(prompts)
    if len(texts) < 4:
        raise InvalidInputError(f"compare_patched needs at least 4 prompts for correlations and CIs, got {len(texts)}.")
    return texts, bayes


def _check_calibration(calibration, bayes):
    if calibration == "auto":
        return bayes is not None
    if calibration and bayes is None:
        raise InvalidInputError("calibration needs items with an exact posterior (bl.sula.make_prompts or a "
                                "bl.tasks prompt set); pass calibration=False for plain strings.")
    return bool(calibration)


def _from_caches(prompts, clean, patched_caches, *, axis, readout_layers, correlation, calibration, n_boot, seed,
                 attention_mask, tokens, model) -> PatchComparison:
    texts, bayes = _check_prompts(prompts)
    calibration = _check_calibration(calibration, bayes)
    if axis is None:
        raise InvalidInputError("from caches pass the axis whose clean-fitted coordinate to read: axis=...")
    axis.check_fitted()
    if not isinstance(patched_caches, dict) or not patched_caches:
        raise InvalidInputError("patched must be a non-empty dict {label: (logits, cache)} (a value may be a list "
                                "of pairs: random-control seeds).")
    if not is_cache_like(clean):
        raise InvalidInputError("clean must be what model.run_with_cache returned: the (logits, cache) pair.")
    m = source_model(clean, model)
    if m is None:
        raise InvalidInputError("a plain dict cache does not record its model; pass model=.")
    site = axis.site_
    _check_axis_fits(axis, m)
    if readout_layers == "auto":
        cache = clean[1] if isinstance(clean, tuple) else clean
        first = min(axis.layers_)
        readouts = [layer for layer in range(first, int(m.cfg.n_layers))
                    if adapter.cache_has(cache, adapter.hook_name(m, layer, site))]
        if first not in readouts:
            raise MissingHookError(
                f"the clean cache has no {adapter.hook_name(m, first, site)!r} (it holds "
                f"{adapter.cache_contents(cache)}); make the caches with "
                f"names_filter=bl.hook_filter(model, layers=range({first}, model.cfg.n_layers)).")
    else:
        readouts = adapter.resolve_layers(m, readout_layers)
    kw = dict(layers=readouts, site=site, model=model, attention_mask=attention_mask, tokens=tokens)

    def arrays(cache):
        return _run_arrays(axis_cache(cache, prompts, **kw)[0], prompts, readouts, site)

    runs = {"clean": [arrays(clean)]}
    meta = [("clean", "clean", False, (), 1)]
    for label, value in patched_caches.items():
        label = str(label)
        if label == "clean":
            raise InvalidInputError("'clean' is reserved for the clean run; name the patched caches otherwise.")
        group = list(value) if isinstance(value, list) else [value]
        if not group or not all(is_cache_like(v) for v in group):
            raise InvalidInputError(f"patched[{label!r}] must be a (logits, cache) pair or a list of them.")
        runs[label] = [arrays(v) for v in group]
        meta.append((label, "cache", isinstance(value, list), (), len(group)))
    return _comparison(runs, meta, axis=axis, model=m, readouts=readouts, bayes=bayes, calibration=calibration,
                       correlation=correlation, n_boot=int(n_boot), seed=seed, n_random_seeds=0, strata=_strata(prompts),
                       task=_task_label(prompts))


def _check_axis_fits(axis: EntropyAxis, model) -> None:
    """Refuse an axis fitted on another model than the caches' (its width or layers do not fit)."""
    info = adapter.model_info(model)
    site = axis.site_
    dim = site_dim(info, site)
    fitted = (axis.model_meta_ or {}).get("model_name", "another model")
    widths = {int(u.shape[0]) for u in axis.axes_.values()}
    if widths != {dim}:
        raise InvalidInputError(f"the axis was fitted on {fitted!r}, whose {site!r} site has dimension "
                                f"{sorted(widths)[0]}, but the caches' model {info.name!r} has {dim}: fit the axis on "
                                "the model that made the caches (bl.EntropyAxis(...).fit(model, prompts)).")
    if max(axis.layers_) >= info.n_layers:
        raise InvalidInputError(f"the axis holds layers {list(axis.layers_)} (fitted on {fitted!r}) but the caches' "
                                f"model {info.name!r} has {info.n_layers} layers: fit the axis on that model.")


def _run_arrays(rc, prompts, readouts, site) -> Tuple[Dict[int, np.ndarray], np.ndarray]:
    """One condition's ``({layer: [n, dim]}, model entropy [n])`` from its reduced cache."""
    return value_arrays(rc, readouts, site), signing_entropy(rc, prompts)


def _comparison(runs: Dict[str, List[Tuple[Dict[int, np.ndarray], np.ndarray]]], meta, *, axis, model, readouts, bayes, calibration, correlation,
                n_boot, seed, n_random_seeds, strata=None, task: str = "SULA") -> PatchComparison:
    """The statistics of a comparison from the runs' activations and entropies (streaming or caches)."""
    import pandas as pd

    site = axis.site_
    clean_values, clean_entropy = runs["clean"][0]
    n = int(clean_entropy.shape[0])
    for label, members in runs.items():
        for _, h in members:
            if int(h.shape[0]) != n:
                raise InvalidInputError(f"the {label!r} run holds {int(h.shape[0])} prompts, the clean run {n}.")
    missing = [k for k in readouts if k not in axis.axes_]
    ref_u = {k: axis.axes_[k].double().numpy() for k in readouts if k in axis.axes_}
    ref_mean = {k: axis.means_[k].double().numpy() for k in readouts if k in axis.axes_}
    if missing:
        extra = EntropyAxis(layer=missing, site=site, standardize=axis.standardize, sign_by=axis.sign_by)
        h_sign = bayes if axis.sign_by == "bayes" else clean_entropy
        extra.fit({k: clean_values[k] for k in missing}, h_sign, model=model)
        ref_u.update({k: extra.axes_[k].double().numpy() for k in missing})
        ref_mean.update({k: extra.means_[k].double().numpy() for k in missing})

    def coords(run):
        values, entropy = run
        return {k: (values[k] - ref_mean[k]) @ ref_u[k] for k in readouts}, entropy

    members_of = {label: [coords(r) for r in rs] for label, rs in runs.items()}
    # row 0 = full sample; SULA items are resampled within k (their count per k is fixed by the design)
    idx = np.concatenate([np.arange(n)[None, :], bootstrap_indices(n, n_boot, seed=seed, strata=strata)])
    clean_c, _ = members_of["clean"][0]
    entropies = [("model", None)] + ([("bayes", bayes)] if bayes is not None else [])

    def metric_rows(member):
        """metric key -> (values over idx rows [1 + n_boot], degenerate flag) for one run."""
        cs, h = member
        out = {}
        for k in readouts:
            x = cs[k]
            ratio = x[idx].std(-1, ddof=1) / clean_c[k][idx].std(-1, ddof=1)
            out[("coordinate_std_ratio", k, None)] = (ratio, False)
            for ename, e in entropies:
                out[("axis_entropy_corr", k, ename)] = coordinate_corr_rows(x, h if e is None else e, idx,
                                                                            correlation, clean=clean_c[k])
        if calibration:
            out[("sula_mae_bits", None, None)] = (mae_bits(h[idx], bayes[idx]), False)
            out[("sula_pearson", None, None)] = (_corr_rows(h[idx], bayes[idx], correlation), False)
        return out

    clean_rows = metric_rows(members_of["clean"][0])
    records = []
    for label, kind, is_random, layers, n_seeds in meta:
        members = [metric_rows(m) for m in members_of[label]] if label != "clean" else [clean_rows]
        for key, (clean_vals, _) in clean_rows.items():
            metric, layer, ename = key
            per = np.stack([m[key][0] for m in members])  # [seeds, 1 + n_boot]
            degenerate = any(m[key][1] for m in members)
            value = per.mean(0)
            diff = value - clean_vals
            seed_diffs = per[:, 0] - clean_vals[0]
            v_lo, v_hi = percentile_interval(value[1:])
            d_lo, d_hi = percentile_interval(diff[1:]) if label != "clean" else (0.0, 0.0)
            base = clean_vals[0]
            records.append({
                "condition": label, "kind": kind, "is_random": is_random, "n_seeds": n_seeds,
                "patched_layers": ",".join(str(x) for x in layers), "metric": metric,
                "readout_layer": layer, "entropy": ename, "value": float(value[0]),
                "value_ci_low": v_lo, "value_ci_high": v_hi, "diff_from_clean": float(diff[0]),
                "diff_ci_low": d_lo, "diff_ci_high": d_hi,
                "rel_diff": float(diff[0] / base) if np.isfinite(base) and base != 0 else float("nan"),
                "seed_diff_min": float(seed_diffs.min()), "seed_diff_max": float(seed_diffs.max()),
                "degenerate": degenerate,
            })
    table = pd.DataFrame.from_records(records)
    table["readout_layer"] = pd.Series([None if v is None or v != v else int(v) for v in table["readout_layer"]],
                                       dtype=object)
    return PatchComparison(
        table=table, conditions=tuple(m[0] for m in meta), readout_layers=tuple(readouts), site=site,
        correlation=correlation, entropy_kind="labels" if bayes is not None else "next_token",
        calibration=bool(calibration), n_prompts=n, n_boot=int(n_boot), seed=int(seed),
        n_random_seeds=int(n_random_seeds), axis_layers=tuple(axis.layers_), task=task,
    )
