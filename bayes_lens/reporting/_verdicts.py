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
* **Wide intervals**: a correlation interval wider than 0.4, or a fraction interval wider than 20
  percentage points, is flagged: the estimate is too uncertain to compare with the papers (quick
  reports use few prompts; run the full report).

Data and pure functions only: no model runs here.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["SIGN_ARBITRARY", "FOCUSING_THRESHOLD", "KEY_COS_THRESHOLD", "KEY_LAYER_FRACTION", "verdict",
           "threshold_verdict", "wide_interval"]

FOCUSING_THRESHOLD = 0.30   # Paper A §4.2: focusing reduction > 30%
KEY_COS_THRESHOLD = 0.20    # Paper A §4.2: mean |cos| < 0.20 ...
KEY_LAYER_FRACTION = 0.50   # ... in >= 50% of layers
WIDE = {"correlation": 0.4, "fraction": 0.2}
SIGN_ARBITRARY = ("alignment_spearman", "sula.rho_pc1_bayes", "sula.rho_k_pc1", "sula.rho_pc1_bayes_within_k")


def _sign_arbitrary(key: str) -> bool:
    return any(key == k or key.endswith("." + k) for k in SIGN_ARBITRARY)


def wide_interval(m: dict) -> bool:
    """True when the metric's 95% interval is wider than :data:`WIDE` allows for its units."""
    ci = m.get("ci") or {}
    lo, hi, limit = ci.get("low"), ci.get("high"), WIDE.get(m.get("units"))
    return lo is not None and hi is not None and limit is not None and (hi - lo) > limit


def threshold_verdict(passed: bool, rule: str, source: str = "Paper A §4.2") -> dict:
    """A verdict for a threshold the section evaluated itself (e.g. a fraction of layers)."""
    return {"pass": bool(passed), "text": f"{'PASS' if passed else 'FAIL'}: {rule} ({source})"}


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
        warn = ("WIDE interval: too uncertain to compare with the papers; trust the full report "
                "(more prompts), not a quick one")
        out = {"pass": None if out is None else out["pass"],
               "text": warn if out is None else f"{out['text']}; {warn}"}
    return out
