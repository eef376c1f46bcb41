"""Tests of bl.steering (METHODS.md §16): the planted prior-shift and evidence-scaling directions recovered on
every model kind, the fit against an independent least-squares fit, the null rates of the verdicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.steering import fit_terms, null_rates

from conftest import KINDS


@pytest.fixture(autouse=True)
def _no_grad():
    """Each test without autograd, restored after it (a module-level set_grad_enabled(False) leaked into the
    wind-tunnel training tests that run later in the same process)."""
    with torch.no_grad():
        yield


def _kinds():
    """hooked (TL 3), the TL 3 bridge, the TL 4 bridge: whichever the installed TransformerLens offers."""
    return KINDS


@pytest.fixture(scope="module", params=_kinds())
def planted_run(request):
    model, truth = bl.models.tiny.steering_model(request.param)
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=8, seed=0)
    res = bl.steering(model, items, layer=0, alphas=(-2, -1, 0, 1, 2), alpha_unit="raw", directions=("contrast",),
                      user={"prior": truth.prior_direction, "evidence": truth.evidence_direction}, n_boot=300,
                      n_null=20, seed=0)
    return model, truth, items, res


def test_planted_prior_shift_passes_the_equivalence_test(planted_run):
    _, truth, _, res = planted_run
    assert res.verdict("prior") == "shifts the prior"
    ba, bi = res.beta("prior", "beta_alpha"), res.beta("prior", "beta_int")
    assert ba.ci_low - 1e-6 <= truth.beta_alpha_prior <= ba.ci_high + 1e-6
    assert bi.ci_low - 1e-6 <= 0.0 <= bi.ci_high + 1e-6           # planted β_int = 0 inside its interval
    row = res.table.set_index("direction").loc["prior"]
    assert row["equivalence"] == "equivalent" and row["beta_int_ci_high"] < row["margin"]
    # the unsteered model is exact Bayes: β_e = 1, β_0 = 0
    assert abs(res.evidence_weight.value - 1.0) < 1e-5 and abs(res.clean_intercept.value) < 1e-5


def test_planted_evidence_scaling_is_detected(planted_run):
    _, truth, _, res = planted_run
    assert res.verdict("evidence") == "reweights evidence"
    bi, ba = res.beta("evidence", "beta_int"), res.beta("evidence", "beta_alpha")
    assert bi.ci_low - 1e-6 <= truth.beta_int_evidence <= bi.ci_high + 1e-6
    assert bi.ci_low > 0.1
    assert ba.ci_low - 1e-6 <= 0.0 <= ba.ci_high + 1e-6             # planted β_α = 0 inside its interval
    # evidence weight at the grid's ends: 1 ± 2·β_int
    row = res.table.set_index("direction").loc["evidence"]
    assert row["evidence_weight_at_alpha_max"] == pytest.approx(1 + 2 * truth.beta_int_evidence, abs=1e-5)
    assert row["evidence_weight_at_alpha_min"] == pytest.approx(1 - 2 * truth.beta_int_evidence, abs=1e-5)


def test_fitted_betas_equal_an_independent_least_squares_fit(planted_run):
    from sklearn.linear_model import LinearRegression

    _, truth, items, res = planted_run
    llr_direct = np.array([np.log(it.posterior[0] / it.posterior[1]) for it in items])   # uniform prior: LLR = log-odds
    for name in ("prior", "evidence", "contrast"):
        g = res.grid[res.grid["direction"] == name]
        np.testing.assert_allclose(g["llr_bayes_nats"].to_numpy()[:len(items)], llr_direct, atol=1e-12)
        a, e, y = g["alpha"].to_numpy(), g["llr_bayes_nats"].to_numpy(), g["log_odds_nats"].to_numpy()
        X = np.c_[np.ones_like(a), a, e, a * e]
        want = np.linalg.lstsq(X, y, rcond=None)[0]
        sk = LinearRegression().fit(X[:, 1:], y)
        row = res.table.set_index("direction").loc[name]
        got = np.array([row[t] for t in ("beta_0", "beta_alpha", "beta_e", "beta_int")])
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(got, np.r_[sk.intercept_, sk.coef_], atol=1e-6)
    # the crossover: the α that cancels one net example, −β_e·λ/(β_α + β_int·λ); for the prior direction −1
    assert res.nats_per_example == pytest.approx(np.log(9.0))
    assert res.table.set_index("direction").loc["prior", "crossover_alpha"] == pytest.approx(-1.0, abs=1e-5)


def test_the_grid_matches_steering_written_with_plain_hooks(planted_run):
    """The log-odds at α = 1 along the prior direction, recomputed with TransformerLens hooks written here."""
    model, truth, items, res = planted_run
    u = truth.prior_direction
    texts = [str(it) for it in items[:6]]
    ids = bl.tasks.answer_token_ids(model, items[0].answers)

    def add(act, hook):
        return act + u.to(act.dtype)

    got = []
    for t in texts:
        toks = model.to_tokens(t)
        logits = model.run_with_hooks(toks, fwd_hooks=[(truth.hook_name, add)])[0, -1].double()
        lp = torch.log_softmax(logits, -1)
        got.append(float(lp[ids[0]] - lp[ids[1]]))
    g = res.grid[(res.grid["direction"] == "prior") & (res.grid["alpha"] == 1.0)]
    np.testing.assert_allclose(g["log_odds_nats"].to_numpy()[:6], got, atol=1e-4)


def test_resumed_grid_equals_the_whole_pass_route(monkeypatch):
    """At resid_post each steered pass resumes from the clean stream kept after the layer (only the later blocks
    run); with the resume refused (its one-batch check made to fail) every pass runs whole: the same log-odds."""
    from bayes_lens import collect as bc

    model, truth = bl.models.tiny.steering_model(KINDS[0])
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=6, seed=0)
    kw = dict(layer=0, alphas=(-1, 0, 1), alpha_unit="raw", directions=("contrast", "haar"), n_random=1,
              user={"prior": truth.prior_direction}, n_boot=20, n_null=0, seed=0, batch_size=5)
    calls = []
    real = bc.collect

    def spy(*a, **k):
        calls.append(k.get("resume"))
        return real(*a, **k)

    monkeypatch.setattr(bc, "collect", spy)
    resumed = bl.steering(model, items, **kw)
    assert len(calls) == 7 and calls[0] is None and all(c is not None for c in calls[1:])
    monkeypatch.setattr(bc.KeptStream, "check", lambda self, *a, **k: "refused in this test")
    calls.clear()
    whole = bl.steering(model, items, **kw)
    assert len(calls) == 7 and all(c is None for c in calls)
    np.testing.assert_allclose(resumed.grid["log_odds_nats"], whole.grid["log_odds_nats"], atol=1e-5)
    np.testing.assert_allclose(resumed.table["beta_int"], whole.table["beta_int"], atol=1e-5)


def test_null_rates_at_the_design_n():
    """β_int = 0 exactly (and |β_int| = margin) in simulated log-odds at 12 prompts per k: the bare β_int test fires
    near its nominal 5% and the prior-shift verdict near its nominal 2.5% (METHODS.md §16 records the numbers)."""
    items = bl.sula.make_prompts(bl.models.tiny.tiny_tokenizer(), ks=(0, 1, 2, 4, 8), n_per_k=12, seed=0)
    llr = np.array([np.log(it.posterior[0] / it.posterior[1]) for it in items])
    ks = np.array([it.k for it in items])
    r = null_rates((-1, -0.5, 0, 0.5, 1), llr, ks, beta=(0.0, 1.0, 0.8, 0.0), margin=0.08, n_null=200, n_boot=300,
                   seed=1)
    assert r["fpr_int_test"] <= 0.10
    assert r["fpr_prior_shift"] <= 0.07
    assert r["fpr_reweights"] <= r["fpr_int_test"]


def test_fit_terms_recovers_known_coefficients_and_checks_shapes():
    rng = np.random.default_rng(0)
    llr, a = rng.normal(size=20), np.array([-1.0, 0.0, 2.0])
    y = 0.3 - 1.5 * a[None, :] + 0.7 * llr[:, None] + 0.2 * a[None, :] * llr[:, None]
    np.testing.assert_allclose(fit_terms(a, llr, y), [0.3, -1.5, 0.7, 0.2], atol=1e-10)
    with pytest.raises(bl.InvalidInputError, match="log_odds must be"):
        fit_terms(a, llr, y.T)


def test_categorical_task_and_bad_inputs(tiny):
    items = bl.tasks.categorical_prompts(tiny, n_symbols=3, ks=(0, 2, 4, 8), n_per_k=8, seed=0)
    res = bl.steering(tiny, items, layer=1, alphas=(-0.5, 0, 0.5), directions=("contrast", "haar", "norm_matched",
                      "shuffled_contrast", "entropy"), n_random=2, folds=2, n_boot=50, n_null=0)
    assert set(res.table["direction"]) == {"contrast", "entropy", "shuffled_contrast", "norm_matched", "haar 0",
                                           "haar 1"}
    assert set(res.table["verdict"]) <= {"shifts the prior", "reweights evidence", "no effect", "inconclusive"}
    # label₁ against the rest: LLR = logit posterior − logit prior, the prior 1/3
    post = np.array([it.posterior[0] for it in items])
    want = np.log(post / (1 - post)) - np.log(0.5)
    np.testing.assert_allclose(res.grid[res.grid["direction"] == "contrast"]["llr_bayes_nats"].to_numpy()[:len(items)],
                               want, atol=1e-12)
    df = res.to_dataframe()
    assert {"direction", "term", "value", "ci_low", "ci_high", "units"} <= set(df.columns)
    assert "Steering as a prior" in repr(res)
    with pytest.raises(bl.InvalidInputError, match="hold 0"):
        bl.steering(tiny, items, alphas=(-1, 1))
    with pytest.raises(bl.InvalidInputError, match="directions"):
        bl.steering(tiny, items, directions=("nonsense",))
    with pytest.raises(bl.InvalidInputError, match="entries"):
        bl.steering(tiny, items, directions=(), user=np.ones(3))


def test_plot_draws_one_line_per_alpha(planted_run):
    pytest.importorskip("plotly")
    _, _, _, res = planted_run
    fig = res.plot("evidence")
    lines = [t for t in fig.data if t.mode == "lines" and t.name.startswith("fit")]
    assert len(lines) == len(res.alphas)


def test_bl_steering_is_callable_and_a_module():
    import types

    import bayes_lens.steering as mod

    assert isinstance(bl.steering, types.ModuleType) and bl.steering is mod and callable(bl.steering)
