"""Calibration metrics (bayes_lens.metrics.calibration) against independent numpy/scipy/sklearn code."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy as scipy_entropy
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss

import bayes_lens as bl
from bayes_lens.metrics.calibration import (
    binary_entropy_bits,
    brier_score,
    expected_calibration_error,
    kl_bernoulli_bits,
    mae_bits,
    reliability_bins,
)


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, n)
    y = (rng.uniform(0, 1, n) < p ** 1.5).astype(float)  # miscalibrated on purpose
    return p, y


def test_binary_entropy_matches_scipy():
    p = np.array([0.0, 1e-9, 0.1, 0.5, 0.9, 1.0])
    want = [scipy_entropy([x, 1 - x], base=2) for x in p]
    np.testing.assert_allclose(binary_entropy_bits(p), want, atol=1e-12)
    np.testing.assert_allclose(binary_entropy_bits(torch.tensor([0.9], dtype=torch.float64)), [0.4689955935892812], atol=1e-12)


def test_mae_bits_matches_numpy():
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 50), rng.uniform(0, 1, 50)
    assert float(mae_bits(a, b)) == pytest.approx(np.mean(np.abs(a - b)))
    stacked = mae_bits(np.stack([a, b]), np.stack([b, a]))
    np.testing.assert_allclose(stacked, [np.mean(np.abs(a - b))] * 2)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1), st.floats(1e-6, 1 - 1e-6))
def test_kl_bernoulli_matches_scipy_and_is_nonnegative(p, q):
    got = float(kl_bernoulli_bits(p, q))
    want = scipy_entropy([p, 1 - p], [q, 1 - q], base=2)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert got >= -1e-12
    assert float(kl_bernoulli_bits(q, q)) == pytest.approx(0.0, abs=1e-12)


def test_kl_clips_zero_model_mass_to_a_finite_number():
    assert np.isfinite(kl_bernoulli_bits(0.5, 0.0))
    assert float(kl_bernoulli_bits(0.0, 0.0)) == pytest.approx(0.0, abs=1e-9)  # impossible outcome: no penalty


def _ece_reference(p, y, n_bins):
    # sklearn's reliability curve + numpy's histogram counts (no bin edge is hit by continuous data)
    frac_pos, mean_pred = calibration_curve(y, p, n_bins=n_bins, strategy="uniform")
    counts, _ = np.histogram(p, bins=np.linspace(0, 1, n_bins + 1))
    counts = counts[counts > 0]
    return float(np.sum(counts / len(p) * np.abs(frac_pos - mean_pred)))


@pytest.mark.parametrize("n_bins", [1, 5, 10, 15])
def test_ece_matches_sklearn_reliability_curve(n_bins):
    p, y = _data()
    assert float(expected_calibration_error(p, y, n_bins=n_bins)) == pytest.approx(_ece_reference(p, y, n_bins))


def test_ece_is_batched_over_rows_and_zero_for_perfect_bins():
    p, y = _data(seed=3)
    rows = np.stack([p, p[::-1], np.sort(p)]), np.stack([y, y[::-1], y])
    got = expected_calibration_error(*rows, n_bins=10)
    want = [expected_calibration_error(a, b, n_bins=10) for a, b in zip(*rows)]
    np.testing.assert_allclose(got, want)
    # predictions 0.25 / 0.75, each bin's frequency exactly that: ECE = 0
    p2 = np.array([0.25] * 4 + [0.75] * 4)
    y2 = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    assert float(expected_calibration_error(p2, y2, n_bins=10)) == pytest.approx(0.0)
    # the edge p = 1.0 lands in the last bin
    assert float(expected_calibration_error(np.array([1.0]), np.array([1.0]))) == 0.0


def test_brier_matches_sklearn():
    p, y = _data(seed=4)
    assert float(brier_score(p, y)) == pytest.approx(brier_score_loss(y, p))


def test_reliability_bins_match_a_loop():
    p, y = _data(seed=5, n=200)
    rb = reliability_bins(p, y, n_bins=8)
    edges = np.linspace(0, 1, 9)
    for b in range(8):
        m = (p >= edges[b]) & ((p < edges[b + 1]) if b < 7 else (p <= 1))
        assert rb["count"][b] == m.sum()
        if m.any():
            assert rb["mean_predicted"][b] == pytest.approx(p[m].mean())
            assert rb["observed_frequency"][b] == pytest.approx(y[m].mean())
        else:
            assert np.isnan(rb["mean_predicted"][b])
    assert rb["count"].sum() == len(p)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(bl.InvalidInputError, match="probabilities"):
        brier_score([1.2, 0.5], [1, 0])
    with pytest.raises(bl.InvalidInputError, match="same shape"):
        expected_calibration_error([0.2, 0.5], [1])
    with pytest.raises(bl.InvalidInputError, match="0 or 1"):
        brier_score([0.2, 0.5], [1, 0.5])
    with pytest.raises(bl.InvalidInputError, match="NaN"):
        mae_bits([np.nan], [0.0])
    with pytest.raises(bl.InvalidInputError, match="n_bins"):
        expected_calibration_error([0.2], [1], n_bins=0)
    with pytest.raises(bl.InvalidInputError, match="empty"):
        brier_score([], [])


# ------------------------------------------------------------------ K classes (any task, METHODS.md §6a)


def test_multiclass_metrics_against_independent_computations():
    from scipy import special

    from bayes_lens.metrics.calibration import kl_categorical_bits, multiclass_brier_score, top_label

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=40)
    q = rng.dirichlet(np.ones(5), size=40)
    y = rng.integers(0, 5, size=40)
    np.testing.assert_allclose(kl_categorical_bits(p, q), special.rel_entr(p, q).sum(1) / np.log(2), rtol=1e-12)
    assert float(kl_categorical_bits(p[0], p[0])) == 0.0
    brier = np.mean([sum((q[i, j] - (j == y[i])) ** 2 for j in range(5)) for i in range(40)])
    assert float(multiclass_brier_score(q, y)) == pytest.approx(brier, abs=1e-14)
    # K = 2: twice the binary Brier score of the first class
    q2 = np.stack([q[:, 0], 1 - q[:, 0]], 1)
    y2 = (y % 2).astype(int)
    assert float(multiclass_brier_score(q2, y2)) == pytest.approx(2 * float(brier_score(q2[:, 0], (y2 == 0).astype(float))))
    conf, hit = top_label(q, y)
    np.testing.assert_array_equal(conf, q.max(1))
    np.testing.assert_array_equal(hit, [float(np.argmax(r) == t) for r, t in zip(q, y)])
    # stacked bootstrap rows reduce over the prediction axis
    assert multiclass_brier_score(np.stack([q, q]), np.stack([y, y])).shape == (2,)
    with pytest.raises(bl.InvalidInputError):
        multiclass_brier_score(q, y + 5)
    with pytest.raises(bl.InvalidInputError):
        kl_categorical_bits(p, q[:, :4])
