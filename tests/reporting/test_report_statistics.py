"""The report's statistical readings (issue 25, statistics): WIDE scaled to the quantity, a gap fit that
explains nothing flagged, key orthogonality read against its Gaussian baseline with an interval over
heads, the gap-shape caveat and the permutation slope at the numerical floor in the martingale section."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bayes_lens.reporting import Metric, _sections
from bayes_lens.reporting._core import Context
from bayes_lens.reporting._verdicts import fit_verdict, key_orthogonality_verdict, wide_limit


def _v(key, value, units, ci, **kw):
    return Metric(key, "x", value, units, ci, **kw).to_json()["verdict"]


def test_wide_flag_is_scaled_to_small_fractions():
    # ECE and label mass live at 0.02-0.1: a fixed 0.2 could never fire there
    assert "WIDE" in _v("sula.ece", 0.05, "fraction", (0.01, 0.12))["text"]
    assert _v("sula.ece", 0.05, "fraction", (0.035, 0.07)) is None
    assert "WIDE" in _v("sula.label_mass", 0.03, "fraction", (0.004, 0.09))["text"]
    # a large fraction keeps the 20-point limit, and a difference is not judged by its own size
    assert _v("geometry.mixed.pc1", 0.6, "fraction", (0.45, 0.62)) is None
    assert _v("geometry.math.pc12_diff", 0.01, "fraction", (-0.03, 0.05)) is None
    assert wide_limit({"key": "sula.ece", "value": 0.05, "units": "fraction"}) == 0.05
    assert wide_limit({"key": "sula.ece", "value": 0.01, "units": "fraction"}) == 0.05
    assert wide_limit({"key": "geometry.mixed.pc1", "value": 0.12, "units": "fraction"}) == pytest.approx(0.12)


def test_gap_fit_of_the_issue_is_flagged_wide_and_poor():
    """A = 0.042 [-0.715, 1.061] with adjusted R² -0.327 (issue 25): the interval does not fix A's sign
    (wider than 2|A|) and the curve explains less than a constant."""
    v = _v("martingale.A", 0.042, "nats", (-0.715, 1.061), verdict=fit_verdict(-0.327))
    assert v["pass"] is None and "POOR FIT" in v["text"] and "-0.327" in v["text"] and "WIDE" in v["text"]
    # a well-determined A (Paper B: 0.182 ± 0.021) is neither
    assert _v("martingale.A", 0.182, "nats", (0.141, 0.223), verdict=fit_verdict(0.759)) is None
    assert fit_verdict(float("nan")) is None


def _mean_abs_offdiag_cos(w):
    w = w / np.linalg.norm(w, axis=0, keepdims=True)
    c = np.abs(w.T @ w)
    return (c.sum() - np.trace(c)) / (c.shape[0] * (c.shape[0] - 1))


def test_key_orthogonality_pass_is_reported_next_to_the_gaussian_ratio():
    """Gaussian random W_K (d_model = 576, d_head = 64) pass Paper A's < 0.20 rule; the verdict says so
    and gives the ratio to E|cos| = Γ(d/2)/(√π Γ((d+1)/2)), ≈ 1 for random weights."""
    from scipy.special import gammaln

    rng = np.random.default_rng(0)
    per_head = np.array([[_mean_abs_offdiag_cos(rng.standard_normal((576, 64))) for _ in range(3)]
                         for _ in range(6)])
    base = float(np.exp(gammaln(576 / 2) - gammaln(577 / 2)) / np.sqrt(np.pi))
    mean, ci = _sections._mean_over_heads(per_head, 500, 0)
    assert mean == pytest.approx(per_head.mean())
    # interval over heads: about ±1.96 s.e. of the mean of the 18 heads
    se = per_head.std(ddof=1) / np.sqrt(per_head.size)
    assert ci[0] < mean < ci[1] and (ci[1] - ci[0]) == pytest.approx(2 * 1.96 * se, rel=0.35)
    v = key_orthogonality_verdict(per_head.mean(1), mean, ci, base)
    assert v["pass"] is True and v["text"].startswith("PASS: mean |cos| < 0.20 in 6/6 layers")
    assert f"{mean / base:.2f}× the dimension-matched Gaussian baseline" in v["text"]
    assert f"[{ci[0] / base:.2f}, {ci[1] / base:.2f}]" in v["text"] and "Random Gaussian W_K" in v["text"]
    assert abs(mean / base - 1) < 0.02
    fail = key_orthogonality_verdict([0.1, 0.25, 0.3, 0.4], 0.26, (0.2, 0.3), base)
    assert fail["pass"] is False and fail["text"].startswith("FAIL")


def _mixture64(sequences):
    """Beta(1,1)/Beta(2,5) mixture updated in sequence: exchangeable up to float64 rounding."""
    x = np.asarray(sequences, dtype=float)
    a, b = np.array([1.0, 2.0]), np.array([1.0, 5.0])
    out = np.empty(x.shape)
    logw = np.zeros((x.shape[0], 2))
    k = np.zeros(x.shape[0])
    for t in range(x.shape[1]):
        pc = (k[:, None] + a) / (t + a + b)
        w = np.exp(logw - logw.max(1, keepdims=True))
        out[:, t] = ((w / w.sum(1, keepdims=True)) * pc).sum(1)
        logw = logw + np.log(np.where(x[:, t][:, None] > 0, pc, 1 - pc))
        k = k + x[:, t]
    return out


def test_martingale_section_states_the_shape_caveat_and_the_floor():
    sizes = dict(_sections.QUICK, martingale_ns=(8, 16, 24, 32), martingale_n_seqs=6, n_boot=50,
                 martingale_permutation={"seq_len": 12, "n_seqs": 3, "n_perms": 16, "ks": (1, 2, 4, 8)},
                 martingale_compression={"thetas": (0.3,), "seq_len": 16, "n_seqs": 4})
    out = _sections._martingale(Context(model=_mixture64, quick=True, seed=0, progress=False, sizes=sizes))
    m = {x.key: x for x in out.metrics}
    r2 = m["martingale.adj_r2"].note
    assert "pseudo-true" in r2 and "0.32" in r2 and "0.995" in r2
    slope = m["martingale.permutation_slope"]
    assert math.isnan(slope.value) and "numerical floor" in slope.note
    assert "uniform-prior Bayesian" in m["martingale.permutation_sd_k1"].note
    assert out.details["permutation"]["at_numerical_floor"] is True
