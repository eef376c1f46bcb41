"""The verdict rules of the readout-or-mediator test, in one place: bands, readable, mediator, the layer's verdict,
the readout–mediator angle and the rule sentence.

METHODS.md §13. With the per-subspace table of :func:`bayes_lens.localize` (one row per layer ×
subspace, random rows included):

* **Random band** of a quantity (Δ MAE, the swap's move, Δρ): the 2.5–97.5th percentiles of the
  same rank's random subspaces at the same layer (:func:`band_columns`).
* **Readable** (:func:`readable`): the held-out R² interval lies above the shuffled-target null's 95th
  percentile and ``min_r2``.
* **Mediator** (:func:`mediator_columns`): the lower end of the Δ MAE interval, or of the swap's move,
  lies above both that quantity's band's upper end and ``min_effect_bits``.
* **Verdict** (:func:`verdict`): "readout and mediator", "readout only", "mediator only", "neither";
  a layer's verdict reads any non-random subspace's (:func:`layer_rows`).
* **Angle** (:func:`angle`): between the best rank-one readout u and the most causal subspace S,
  cos θ = ‖Bᵀu‖; under the Haar null cos²θ ~ Beta(k/2, (d − k)/2).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

__all__ = ["VERDICTS", "readable", "verdict", "band_columns", "mediator_columns", "angle", "layer_rows", "rule_text"]

VERDICTS = ("readout and mediator", "readout only", "mediator only", "neither")


def readable(r2_ci_low: float, null_q95: float, min_r2: float) -> bool:
    """The readout rule: the held-out R² interval's lower end above the null's 95th percentile and ``min_r2``."""
    return bool(r2_ci_low > max(null_q95, min_r2))


def verdict(is_readable: bool, is_mediator: bool) -> str:
    """The four-way verdict of a subspace (or a layer)."""
    return VERDICTS[0] if is_readable and is_mediator else VERDICTS[1] if is_readable else \
        VERDICTS[2] if is_mediator else VERDICTS[3]


def band_columns(table, value: str, keys: Sequence[str], low: str, high: str) -> None:
    """Add ``low``/``high`` to ``table``: the 2.5th/97.5th percentiles of ``value`` over the random rows that share
    ``keys`` (layer and rank; and the readout layer for Δρ) with each row."""
    rand = table[table["kind"] == "random"]
    band = rand.groupby(list(keys))[value].quantile([0.025, 0.975]).unstack()
    at = [tuple(getattr(r, k) for k in keys) for r in table.itertuples()]
    at = [a[0] if len(keys) == 1 else a for a in at]
    table[low] = [band.loc[a, 0.025] for a in at]
    table[high] = [band.loc[a, 0.975] for a in at]


def mediator_columns(table, *, swap: bool, min_effect: float) -> None:
    """Add the bands of Δ MAE (and the swap's move), ``removal_matters``, ``swap_redirects``, ``mediator`` and
    ``verdict`` to the per-subspace table."""
    band_columns(table, "delta_mae_bits", ("layer", "rank"), "band_low", "band_high")
    table["removal_matters"] = table["delta_mae_ci_low"] > np.maximum(table["band_high"], min_effect)
    if swap:
        band_columns(table, "swap_bits", ("layer", "rank"), "swap_band_low", "swap_band_high")
        table["swap_redirects"] = table["swap_ci_low"] > np.maximum(table["swap_band_high"], min_effect)
        table["mediator"] = table["removal_matters"] | table["swap_redirects"]
    else:
        table["mediator"] = table["removal_matters"]
    table["verdict"] = [verdict(bool(r.readable), bool(r.mediator)) for r in table.itertuples()]


def angle(u: np.ndarray, basis: np.ndarray) -> Dict[str, float]:
    """The readout–mediator angle θ between a direction ``u`` ``[d]`` and the span of ``basis`` ``[d, k]``
    (orthonormal): cos²θ = ‖Bᵀu‖²/‖u‖², and the Haar-null p-value P(cos²θ ≥ observed), cos²θ ~ Beta(k/2, (d − k)/2)
    for u uniform on the sphere (exact for a direction chosen independently of the subspace)."""
    from scipy.stats import beta

    d, k = basis.shape
    cos2 = float(np.clip(np.sum((basis.T @ u) ** 2) / float(u @ u), 0.0, 1.0))
    return {"angle_deg": float(np.degrees(np.arccos(np.sqrt(cos2)))), "cos2": cos2, "cos2_null_mean": k / d,
            "angle_p": float(beta.sf(cos2, k / 2, (d - k) / 2))}


def layer_rows(table, layers: Sequence[int], bases: Dict[tuple, np.ndarray], *, swap: bool,
               clean_mae: float) -> List[dict]:
    """One row per layer: its verdict (any non-random subspace readable; any a mediator), and the angle between its
    best rank-one readout (the largest held-out R²) and its most causal subspace (the mediator furthest above its
    band, removal or swap); ``bases`` ``{(layer, subspace): [d, k]}`` fitted on every prompt."""
    rows = []
    for layer in layers:
        t = table[table["layer"] == layer]
        est = t[(t["kind"] == "estimator") & (t["rank"] == 1)]
        real = t[t["kind"] != "random"]
        row = {"layer": layer, "verdict": verdict(bool(real["readable"].any()) if len(real) else False,
                                                  bool(real["mediator"].any()) if len(real) else False),
               "clean_mae_bits": clean_mae}
        ones = real[real["rank"] == 1] if len(est) == 0 else est
        meds = real[real["mediator"]]
        if len(ones) and len(meds) and ones["r2"].notna().any():
            excess = meds["delta_mae_ci_low"] - meds["band_high"]
            if swap:
                excess = np.maximum(excess, meds["swap_ci_low"] - meds["swap_band_high"])
            best_r = ones.loc[ones["r2"].idxmax(), "subspace"]
            best_c = meds.loc[excess.idxmax(), "subspace"]
            row.update(best_readout=best_r, most_causal=best_c,
                       **angle(bases[(layer, best_r)][:, 0], bases[(layer, best_c)]))
        else:
            row.update(best_readout=None, most_causal=None, angle_deg=np.nan, cos2=np.nan, cos2_null_mean=np.nan,
                       angle_p=np.nan)
        rows.append(row)
    return rows


def rule_text(*, folds: int, min_r2: float, operation: str, swap: bool, n_random: int, min_effect: float) -> str:
    """The verdict rule in words (the table's ``rule``)."""
    return (f"readable: the held-out R² interval (cross-fitted, {folds} folds) lies above the shuffled-target null's "
            f"95th percentile and {min_r2}; mediator: the Δ MAE interval (paired bootstrap, 95%) of the {operation}"
            + (" or the swap's move toward the donor (bits of KL)" if swap else "") +
            f" lies above its random band's 97.5th percentile ({n_random} Haar subspaces of the same rank) and "
            f"{min_effect} bits")
