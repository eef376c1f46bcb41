"""Tests of bl.cot_length (Paper B Theorem 4.5) and the estimation of α, k₀, B_opt."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.cot import estimate_cot_params
from bayes_lens.errors import InvalidInputError


def test_paper_worked_examples_natural_log_and_log2():
    assert bl.cot_length(100, 0.1, 3, 5, 6).k_star == pytest.approx(12.1, abs=0.05)
    assert bl.cot_length(100, 0.1, 3, 5, 6, log_base=2).k_star == pytest.approx(17.5, abs=0.05)
    assert bl.cot_length(1000, 0.1, 3, 5, 6).k_star == pytest.approx(38.4, abs=0.05)
    assert bl.cot_length(1000, 0.1, 3, 5, 6, log_base=2).k_star == pytest.approx(55.4, abs=0.05)


def test_formula_and_band_against_direct_computation():
    n, eps, h, a, g, mb, beta = 500, 0.3, 2.0, 4.0, 3.0, 1.0, 2.0
    r = bl.cot_length(n, eps, h, a, g, m_b=mb, beta=beta, vocab_size=49152)
    k = math.sqrt(a * n / (h * g)) * math.log(1 / eps)
    c2 = 4 * (1 + mb / a + beta / h)
    xi = c2 * math.sqrt(math.log(n) / n)
    assert r.k_star == pytest.approx(k, rel=1e-12)
    assert r.c2 == pytest.approx(c2) and r.xi_bound == pytest.approx(xi)
    assert r.band == pytest.approx((max(0, k * (1 - xi)), k * (1 + xi)))
    assert r.checks["n_at_least_4beta_log_n_over_h_cot"] is True
    assert r.checks["eps_at_least_max(n^-1/4, 1/V)"] is True  # 500^-1/4 = 0.21 <= 0.3
    json.dumps(r.to_dict())


def test_validity_checks():
    r = bl.cot_length(100, 0.1, 3, 5, 6)
    assert r.valid is False  # the paper's own example has eps < n^-1/4
    assert r.checks["eps_at_least_max(n^-1/4, 1/V)"] is False
    assert bl.cot_length(10000, 0.2, 3, 5, 6).valid is True
    assert bl.cot_length(100, 0.6, 3, 5, 6).checks["eps_at_most_half"] is False
    assert bl.cot_length(20, 0.5, 1, 5, 6, beta=10).checks["n_at_least_4beta_log_n_over_h_cot"] is False


@pytest.mark.parametrize("kwargs", [dict(n=1), dict(eps=0), dict(eps=1.5), dict(h_cot=0), dict(alpha=-1),
                                    dict(gap=0), dict(log_base=1), dict(log_base="ten"), dict(log_base=-2)])
def test_bad_input(kwargs):
    args = dict(n=100, eps=0.1, h_cot=3, alpha=5, gap=6)
    args.update(kwargs)
    log_base = args.pop("log_base", "e")
    with pytest.raises(InvalidInputError):
        bl.cot_length(args["n"], args["eps"], args["h_cot"], args["alpha"], args["gap"], log_base=log_base)


def test_estimate_recovers_known_constants():
    alpha, k0, b_opt = 6.0, 1.5, 0.8
    k = np.arange(0, 30, 1.0)
    rng = np.random.default_rng(0)
    B = b_opt + alpha / (k + k0) + 0.01 * rng.standard_normal(k.size)
    fit = estimate_cot_params(k, B, n_boot=300, seed=0)
    assert fit.alpha.value == pytest.approx(alpha, rel=0.1)
    assert fit.k0.value == pytest.approx(k0, rel=0.1)
    assert fit.b_opt.value == pytest.approx(b_opt, abs=0.05)
    assert fit.gap.value == pytest.approx(alpha / k0, rel=0.1)
    assert fit.alpha.ci[0] <= alpha <= fit.alpha.ci[1]
    assert fit.b_opt.ci[0] <= b_opt <= fit.b_opt.ci[1]
    ks = fit.k_star(100, 0.1, 3)
    assert ks.k_star == pytest.approx(bl.cot_length(100, 0.1, 3, fit.alpha.value, fit.gap.value).k_star)
    json.dumps(fit.to_dict())


def test_estimate_bad_input():
    with pytest.raises(InvalidInputError, match="4 distinct"):
        estimate_cot_params([0, 1, 2], [3, 2, 1])
    with pytest.raises(InvalidInputError, match=">= 0"):
        estimate_cot_params([-1, 1, 2, 3], [3, 2, 1, 0.5])


def test_results_plot():
    pytest.importorskip("plotly")
    assert len(bl.cot_length(100, 0.1, 3, 5, 6).plot().data) == 1
    k = np.arange(8.0)
    fit = estimate_cot_params(k, 1 + 3 / (k + 1), n_boot=20)
    assert len(fit.plot().data) == 2 and len(fit.to_dataframe()) == 4
