"""Tests of bayes_lens.metrics.keys against brute-force cosines and closed forms."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_lens as bl
from bayes_lens.metrics.keys import (
    gaussian_abs_cosine, mean_abs_offdiag_cosine, paper_abs_cosine_baseline, simulate_gaussian_abs_cosine,
)


def _brute(w):
    m = w.shape[1]
    vals = []
    for i in range(m):
        for j in range(m):
            if i != j:
                a, b = w[:, i], w[:, j]
                vals.append(abs(float(a @ b)) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return float(np.mean(vals))


def test_matches_brute_force_and_batches():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 20, 6)) + rng.normal(size=(1, 20, 1))
    got = mean_abs_offdiag_cosine(w)
    assert got.shape == (3,)
    for h in range(3):
        assert got[h] == pytest.approx(_brute(w[h]), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.integers(0, 10 ** 6))
def test_orthonormal_columns_give_zero(d_model, seed):
    rng = np.random.default_rng(seed)
    d_head = int(rng.integers(2, d_model + 1))
    q, _ = np.linalg.qr(rng.normal(size=(d_model, d_head)))
    assert mean_abs_offdiag_cosine(q) == pytest.approx(0.0, abs=1e-12)
    # column scaling does not matter
    assert mean_abs_offdiag_cosine(q * rng.uniform(0.1, 10, size=d_head)) == pytest.approx(0.0, abs=1e-12)


def test_gaussian_abs_cosine_closed_forms():
    assert gaussian_abs_cosine(2) == pytest.approx(2 / math.pi)  # uniform angle
    assert gaussian_abs_cosine(3) == pytest.approx(0.5)  # cos uniform on [-1, 1] in R^3
    assert gaussian_abs_cosine(576) == pytest.approx(0.0332, abs=5e-4)
    assert gaussian_abs_cosine(10 ** 6) == pytest.approx(math.sqrt(2 / (math.pi * 10 ** 6)), rel=1e-5)
    assert paper_abs_cosine_baseline(64) == pytest.approx(0.0997, abs=1e-4)
    with pytest.raises(bl.InvalidInputError):
        gaussian_abs_cosine(1)


def test_monte_carlo_agrees_with_exact_formula():
    rng = np.random.default_rng(1)
    d = 20
    a, b = rng.normal(size=(2, 20000, d))
    cos = np.abs((a * b).sum(1)) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cos.mean() == pytest.approx(gaussian_abs_cosine(d), abs=4 * cos.std() / np.sqrt(cos.size))
    sims = simulate_gaussian_abs_cosine(576, 64, n_sims=40, seed=0)
    assert sims.shape == (40,)
    assert sims.mean() == pytest.approx(gaussian_abs_cosine(576), rel=0.01)
    assert np.array_equal(sims, simulate_gaussian_abs_cosine(576, 64, n_sims=40, seed=0))
    sims[:] = 0.0  # the draws are remembered; a caller's copy is its own
    assert simulate_gaussian_abs_cosine(576, 64, n_sims=40, seed=0).mean() == pytest.approx(gaussian_abs_cosine(576), rel=0.01)


@pytest.mark.parametrize("d,m", [(20, 5), (8, 8), (64, 16)])
def test_bartlett_draws_match_direct_gaussian_matrices(d, m):
    """The Wishart (Bartlett) shortcut has the distribution of the statistic on real Gaussian matrices."""
    from scipy.stats import ks_2samp

    fast = simulate_gaussian_abs_cosine(d, m, n_sims=3000, seed=11)
    direct = np.atleast_1d(mean_abs_offdiag_cosine(np.random.default_rng(12).standard_normal((3000, d, m))))
    assert ks_2samp(fast, direct).pvalue > 1e-3
    # E[mean |cos|] is the pairwise E|cos| in R^d, exactly
    se = fast.std() / np.sqrt(len(fast))
    assert abs(fast.mean() - gaussian_abs_cosine(d)) < 5 * se


def test_singular_wishart_case_draws_matrices_directly():
    sims = simulate_gaussian_abs_cosine(4, 6, n_sims=2000, seed=0)  # d_model < d_head
    assert sims.shape == (2000,) and np.isfinite(sims).all()
    assert sims.mean() == pytest.approx(gaussian_abs_cosine(4), abs=5 * sims.std() / np.sqrt(2000))
    with pytest.raises(bl.InvalidInputError, match="at least 2"):
        simulate_gaussian_abs_cosine(96, 1)


def test_errors():
    with pytest.raises(bl.InvalidInputError):
        mean_abs_offdiag_cosine(np.ones((5, 1)))
    with pytest.raises(bl.NonFiniteError):
        mean_abs_offdiag_cosine(np.full((5, 3), np.nan))
    w = np.ones((5, 3))
    w[:, 1] = 0
    with pytest.raises(bl.InvalidInputError, match="all zeros"):
        mean_abs_offdiag_cosine(w)
