"""What a headline number means: pass/fail against the papers' thresholds, |ρ| for sign-free correlations,
and a warning when an interval is too wide to trust (docs/METHODS.md §2-§4; Paper A §4.2, §4.5).

Rules (each verdict names its rule and source, so a reader can check it):

* **Thresholds the papers state** (Paper A §4.2): key orthogonality passes when the per-layer mean
  |cos| between W_K columns is below 0.20 in at least 50% of layers (the section computes that
  fraction and passes the verdict in); attention focusing passes when the first-to-last entropy
  reduction exceeds 30%. The verdict says whether the whole 95% interval is on the passing side
  or only the point estimate.
* **Correlations whose sign is arbitrary** (a principal component's sign is a convention,
  METHODS.md §4): judged by |ρ| — related when the 95% interval excludes 0, whatever its sign.
* **Wide intervals**: the estimate is too uncertain to compare with the papers (quick reports use
  few prompts; run the full report). A correlation interval is wide above 0.4. A fraction's limit
  is scaled to the quantity: min(0.2, max(|value|, 0.05)), i.e. 20 percentage points for a PC1 of
  30% but 5 points for an ECE or a label mass of 0.02–0.1, where a fixed 0.2 could never fire
  (differences, ``*_diff``/``delta_*``, keep 0.2: their scale is not their value). A fitted
  coefficient (:data:`RELATIVE_WIDE_KEYS`: the gap fit's A) is wide when its interval is wider than
  2·|value|: its sign is not determined (the gap fit ``A = 0.042 [−0.715, 1.061]`` is).
* **Fits that explain nothing**: a gap fit whose adjusted R² is below 0 fits worse than a constant;
  :func:`fit_verdict` says so (the section attaches it to A).
* **Key orthogonality** passes Paper A's threshold for Gaussian random weights too (E|cos| ≈ 0.033
  for d_model = 576 is far below 0.20), so :func:`key_orthogonality_verdict` reports the PASS/FAIL
  next to the ratio to the dimension-matched Gaussian baseline with an interval over heads.

Data and pure functions only: no model runs here.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["SIGN_ARBITRARY", "FOCUSING_THRESHOLD", "KEY_COS_THRESHOLD", "KEY_LAYER_FRACTION", "verdict",
           "threshold_verdict", "wide_interval", "wide_limit", "fit_verdict", "key_orthogonality_verdict",
           "RELATIVE_WIDE_KEYS", "WIDE_WARNING", "split_wide"]

FOCUSING_THRESHOLD = 0.30   # Paper A §4.2: focusing reduction > 30%
KEY_COS_THRESHOLD = 0.20    # Paper A §4.2: mean |cos| < 0.20 ...
KEY_LAYER_FRACTION = 0.50   # ... in >= 50% of layers
WIDE = {"correlation": 0.4, "fraction": 0.2}
FRACTION_WIDE_FLOOR = 0.05  # a fraction's interval is never called wide below 5 percentage points
RELATIVE_WIDE_KEYS = ("martingale.A",)
# appended to a verdict whose interval is wide; the HTML shows it once and marks the rows "WIDE"
WIDE_WARNING = ("WIDE interval: too uncertain to compare with the papers; trust the full report "
                "(more prompts), not a quick one")
SIGN_ARBITRARY = ("alignment_spearman", "sula.rho_pc1_bayes", "sula.rho_k_pc1", "sula.rho_pc1_bayes_within_k")


def _sign_arbitrary(key: str) -> bool:
    return any(key == k or key.endswith("." + k) for k in SIGN_ARBITRARY)


def _is_difference(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last.endswith("_diff") or last.startswith("delta")


def wide_limit(m: dict) -> Optional[float]:
    """The widest 95% interval metric ``m`` (JSON form) may have before it is flagged WIDE, or None."""
    key, v, units = m.get("key", ""), m.get("value"), m.get("units")
    if key in RELATIVE_WIDE_KEYS:
        return None if v is None else 2.0 * abs(v)
    if units == "fraction" and v is not None and not _is_difference(key):
        return min(WIDE["fraction"], max(abs(v), FRACTION_WIDE_FLOOR))
    return WIDE.get(units)


def wide_interval(m: dict) -> bool:
    """True when the metric's 95% interval is wider than :func:`wide_limit` allows."""
    ci = m.get("ci") or {}
    lo, hi, limit = ci.get("low"), ci.get("high"), wide_limit(m)
    return lo is not None and hi is not None and limit is not None and (hi - lo) > limit


def fit_verdict(adj_r2: float) -> Optional[dict]:
    """A warning for a fit whose adjusted R² is below 0 (it explains less than a constant), else None."""
    if adj_r2 is None or not adj_r2 < 0:
        return None
    return {"pass": None, "text": f"POOR FIT: adjusted R² = {adj_r2:.3f} < 0, the curve explains less than a "
                                  "constant; A and B are not estimates of anything"}


def key_orthogonality_verdict(layer_means, per_head_mean: float, ci, gaussian_baseline: float) -> dict:
    """Paper A's PASS/FAIL (mean |cos| < 0.20 in >= 50% of layers) next to the ratio of the mean over
    heads to the dimension-matched Gaussian baseline, with its interval over heads (``ci`` of the mean)."""
    import numpy as np

    lm = np.asarray(layer_means, dtype=float)
    below = int(np.sum(lm < KEY_COS_THRESHOLD))
    passed = bool(np.mean(lm < KEY_COS_THRESHOLD) >= KEY_LAYER_FRACTION)
    lo, hi = (ci if ci is not None else (None, None))
    r = per_head_mean / gaussian_baseline
    r_ci = (f" [{lo / gaussian_baseline:.2f}, {hi / gaussian_baseline:.2f}] (95% bootstrap over heads)"
            if lo is not None and hi is not None else "")
    return {"pass": passed,
            "text": (f"{'PASS' if passed else 'FAIL'}: mean |cos| < 0.20 in {below}/{len(lm)} layers (needs >= 50%; "
                     f"Paper A §4.2); mean over heads = {r:.2f}× the dimension-matched Gaussian baseline "
                     f"{gaussian_baseline:.3f}{r_ci}. Random Gaussian W_K ({gaussian_baseline:.3f}) pass this "
                     "threshold too: read the ratio, not the PASS")}


def threshold_verdict(passed: bool, rule: str, source: str = "Paper A §4.2") -> dict:
    """A verdict for a threshold the section evaluated itself (e.g. a fraction of layers)."""
    return {"pass": bool(passed), "text": f"{'PASS' if passed else 'FAIL'}: {rule} ({source})"}


def split_wide(text: str):
    """``(text without the WIDE warning, whether it had one)``: the page says the warning once."""
    if WIDE_WARNING not in text:
        return text, False
    rest = text.replace("; " + WIDE_WARNING, "").replace(WIDE_WARNING, "").strip().rstrip(";").strip()
    return rest, True


def verdict(m: dict) -> Optional[dict]:
    """``{"pass": bool or None, "text": str}`` for metric ``m`` (its JSON form), or None without a rule.

    ``m["verdict"]`` set by the section wins; then the focusing threshold, then |ρ| for sign-free
    correlations. A wide interval appends a warning to whichever verdict (or makes one).
    """
    out = m.get("verdict")
    key, v = m.get("key", ""), m.get("value")
    ci = m.get("ci") or {}
    lo, hi = ci.get("low"), ci.get("high")
    if out is None and v is not None and key == "geometry.focusing_reduction":
        passed = v > FOCUSING_THRESHOLD
        how = ("whole 95% CI" if lo is not None and ((passed and lo > FOCUSING_THRESHOLD) or
                                                   (not passed and hi is not None and hi <= FOCUSING_THRESHOLD))
               else "point estimate only; the CI straddles 30%")
        out = {"pass": passed, "text": f"{'PASS' if passed else 'FAIL'}: reduction > 30% ({how}; Paper A §4.2)"}
    elif out is None and v is not None and _sign_arbitrary(key):
        if lo is not None and hi is not None:
            related = lo > 0 or hi < 0
            out = {"pass": None, "text": (f"|ρ| = {abs(v):.2f}; CI excludes 0: related (sign arbitrary, "
                                          "compare |ρ|)" if related else
                                          f"|ρ| = {abs(v):.2f}; CI includes 0: no evidence of a relation")}
        else:
            out = {"pass": None, "text": f"|ρ| = {abs(v):.2f} (sign arbitrary, compare |ρ|)"}
    if wide_interval(m):
        warn = WIDE_WARNING
        out = {"pass": None if out is None else out["pass"],
               "text": warn if out is None else f"{out['text']}; {warn}"}
    return out
