"""bl.confidence (METHODS.md §15): the neuron screen, total vs frozen-scale direct effects, the axis join.

Ground truth: bl.models.tiny.confidence_model plants an entropy neuron (w_out in W_U's exact null space) and a
logit neuron (w_out along W_U's top singular direction); every figure is recomputed here with numpy/scipy.
"""

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import log_softmax

import bayes_lens as bl
from bayes_lens._confidence import null_space, null_space_overlap
from bayes_lens.models.tiny import confidence_model

KINDS = ["hooked", "bridge"] if bl.adapter.has_hooked_transformer() else ["bridge"]


def _np(t):
    return t.detach().double().cpu().numpy()


def _entropy_bits(logits):
    lp = log_softmax(logits, axis=-1)
    return -(np.exp(lp) * lp).sum(-1) / np.log(2)


@pytest.fixture(autouse=True)
def _no_grad():
    """Each test without autograd, restored after it (a module-level set_grad_enabled(False) leaked into the
    wind-tunnel training tests that run later in the same process)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module", params=KINDS)
def planted(request):
    return confidence_model(request.param)


@pytest.fixture(scope="module")
def result(planted):
    model, p = planted
    items = bl.sula.make_prompts(model, n_per_k=4, seed=0)
    return bl.confidence(model, items, neurons=[p.logit_neuron], n_candidates=3, n_random_neurons=6,
                         n_random_axes=1, n_random=100, n_boot=300, progress=False)


def test_screen_agrees_with_numpy(planted):
    model, p = planted
    scr = bl.screen_neurons(model, n_random=50)
    wu = _np(model.W_U)                                   # [d, V]
    g = _np(model.ln_final.w)
    w = _np(model.blocks[p.layer].mlp.W_out)              # [d_mlp, d]
    a = (wu * g[:, None]).T                               # [V, d]: what each logit reads (RMSNorm: no centring)
    k = max(1, round(0.01 * model.cfg.d_model))
    n_basis = np.linalg.svd(a)[2][-k:].T                  # bottom-k right singular vectors
    norms = np.linalg.norm(w, axis=1)
    cos = (w / norms[:, None]) @ (a / np.linalg.norm(a, axis=1, keepdims=True)).T
    rho = np.linalg.norm(w @ n_basis, axis=1) ** 2 / norms ** 2
    t = scr.table.set_index("neuron")
    np.testing.assert_allclose(t["out_norm"], norms, rtol=1e-6)
    np.testing.assert_allclose(t["logit_var"], cos.var(axis=1), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(t["null_fraction"], rho, rtol=1e-5, atol=1e-9)
    # the Haar null of ρ_k is Beta(k/2, (d − k)/2); the flag threshold its 1 − α/d_mlp quantile
    d = model.cfg.d_model
    thr = scr.bands.set_index("metric").loc["null_fraction", "flag_threshold"]
    assert thr == pytest.approx(stats.beta.ppf(1 - 0.05 / w.shape[0], k / 2, (d - k) / 2))
    # the ground truth: the entropy neuron ranks first and is the only null-space neuron; the logit neuron is not
    assert scr.top(1) == [p.entropy_neuron]
    assert t.loc[p.entropy_neuron, "null_fraction"] > 0.999
    assert not t.loc[p.logit_neuron, "null_space"] and t["null_space"].sum() == 1
    assert t.loc[p.logit_neuron, "logit_var"] == t["logit_var"].max()


def test_planted_entropy_neuron_found_and_logit_neuron_not_flagged(planted, result):
    model, p = planted
    assert result.entropy_neurons == (p.entropy_neuron,)
    e = result.effects
    med = e[(e.metric == "d_entropy_bits") & (e.path == "mediated") & e.role.isin(["candidate", "requested", "random"])]
    order = med.assign(a=med.value.abs()).sort_values("a", ascending=False).neuron.tolist()
    assert order[0] == str(p.entropy_neuron)               # first by total − direct
    e_dir = result.effect(p.entropy_neuron, path="direct")
    e_tot = result.effect(p.entropy_neuron, path="total")
    assert abs(e_dir.value) < 1e-3 * abs(e_tot.value) and e_tot.excludes(0.0)
    l_dir, l_med = result.effect(p.logit_neuron, path="direct"), result.effect(p.logit_neuron, path="mediated")
    assert str(p.logit_neuron) in set(result.effects.neuron)
    assert abs(result.effect(p.logit_neuron, "top1_agreement", "direct").value) <= 1.0
    assert l_dir.value != 0.0 and p.logit_neuron not in result.entropy_neurons
    assert np.isfinite(l_med.value)
    assert result.verdict in ("yes", "no", "undecided") and "norm" in result.answer
    df = result.to_dataframe()
    assert {"screen", "effect", "axis"} == set(df.section) and "value" in df


def test_effects_agree_with_numpy(planted, result):
    """Total and direct ΔH of the mean-ablated entropy and logit neurons, from the clean cache with numpy:
    x' = x + (μ_j − a_j)·w_out_j at the final token; total logits g⊙x'/s(x') W_U, direct g⊙x'/s(x) W_U."""
    model, p = planted
    toks, mask = bl.adapter.tokenize(model, list(result.texts))
    L = p.layer
    _, cache = model.run_with_cache(toks, attention_mask=mask,
                                    names_filter=lambda n: n in (f"blocks.{L}.hook_resid_post", f"blocks.{L}.mlp.hook_post"))
    last = mask.sum(1) - 1
    rows = torch.arange(len(last))
    x = _np(cache[f"blocks.{L}.hook_resid_post"][rows, last])
    act = _np(cache[f"blocks.{L}.mlp.hook_post"][rows, last])
    wu, g, w = _np(model.W_U), _np(model.ln_final.w), _np(model.blocks[L].mlp.W_out)
    eps = model.cfg.eps
    scale = lambda v: np.sqrt((v ** 2).mean(-1, keepdims=True) + eps)  # noqa: E731
    h0 = _entropy_bits((g * x / scale(x)) @ wu)
    for j in (p.entropy_neuron, p.logit_neuron):
        x1 = x + (act[:, j].mean() - act[:, j])[:, None] * w[j][None, :]
        tot = _entropy_bits((g * x1 / scale(x1)) @ wu) - h0
        dirc = _entropy_bits((g * x1 / scale(x)) @ wu) - h0
        assert result.effect(j, path="total").value == pytest.approx(tot.mean(), abs=2e-5, rel=2e-3)
        assert result.effect(j, path="direct").value == pytest.approx(dirc.mean(), abs=2e-5, rel=2e-3)
        assert result.effect(j, path="mediated").value == pytest.approx((tot - dirc).mean(), abs=3e-5, rel=3e-3)


def test_axis_overlap_agrees_with_numpy_and_haar_null(planted, result):
    model, p = planted
    nb, _, _ = null_space(model)
    u = np.random.default_rng(0).standard_normal(model.cfg.d_model)
    u /= np.linalg.norm(u)
    val, how = null_space_overlap(u, nb)
    assert val == pytest.approx(float(((nb.T @ u) ** 2).sum()), rel=1e-9)
    assert ("TransformerLens" in how) == (bl.adapter.projection_kernel() is not None)
    ov = result.axis_overlap
    d, k = model.cfg.d_model, nb.shape[1]
    assert ov.null == pytest.approx(k / d) and ov.null_interval[1] == pytest.approx(stats.beta.ppf(0.975, k / 2, (d - k) / 2))
    # the planted null direction has overlap 1; the logit direction ≈ 0
    assert null_space_overlap(_np(p.null_direction), nb)[0] == pytest.approx(1.0, abs=1e-8)
    assert null_space_overlap(_np(p.logit_direction), nb)[0] < 1e-8


def test_axis_rule_false_yes_rate_on_haar_directions():
    """The rule's "yes" needs the overlap above the Haar 97.5% point: on 4,000 Haar directions that fires in
    2.5% of them (binomial ± 0.8%), which bounds the false-yes rate whatever the share does."""
    rng = np.random.default_rng(1)
    d, k = 64, 2
    nb = np.linalg.qr(rng.standard_normal((d, k)))[0]
    hi = stats.beta.ppf(0.975, k / 2, (d - k) / 2)
    u = rng.standard_normal((4000, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    rate = np.mean([null_space_overlap(v, nb)[0] > hi for v in u[:400]] + list(((u[400:] @ nb) ** 2).sum(1) > hi))
    assert 0.017 <= rate <= 0.033


def test_null_space_flag_family_wise_rate_on_random_models():
    """Random (Haar-like) MLP columns: the Bonferroni ρ_k flag fires in at most a few of 12 random layers
    (nominal family-wise rate 5%: expected 0.6)."""
    flagged = 0
    for seed in range(12):
        model = bl.models.tiny.tiny_model(KINDS[0], seed=seed)
        flagged += int(bl.screen_neurons(model, n_random=10, seed=seed).table["null_space"].any())
    assert flagged <= 3


def test_layernorm_models_screen_inside_the_centred_space():
    model = bl.models.tiny.tiny_model(KINDS[0], family="gpt2")
    scr = bl.screen_neurons(model, n_random=20)
    assert scr.d == model.cfg.d_model - 1                 # 1^⊥: the constant direction is removed by the centring
    assert np.isfinite(scr.table["null_fraction"]).all() and scr.table["null_fraction"].between(0, 1).all()


def test_null_space_svd_is_kept_per_model_and_redone_when_the_weights_change():
    """One SVD per model and k (``bl.confidence`` and ``bl.screen_neurons`` share it; Gemma's takes a minute),
    recomputed when the unembedding is edited in place: the bottom singular vector then matches numpy's SVD of
    the edited A = W_Uᵀ·diag(g) (an RMSNorm model: C = I), not the kept one."""
    model, _ = confidence_model(KINDS[-1])
    first = null_space(model, 1)
    assert null_space(model, 1) is first and null_space(model, k=2) is not first
    assert bl.screen_neurons(model, n_random=10).table.shape[0] > 0 and null_space(model, 1) is first
    w = next(p for n, p in model.named_parameters() if ("unembed" in n or "lm_head" in n) and p.ndim == 2)
    w.data.add_(0.5 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
    again = null_space(model, 1)
    assert again is not first
    a = (bl.adapter.unembedding(model) * bl.adapter.final_norm(model).gain[:, None]).T
    v = np.linalg.svd(a, full_matrices=False)[2][-1]
    assert abs(abs(float(v @ again[0][:, 0])) - 1) < 1e-8 and abs(float(v @ first[0][:, 0])) < 0.999


def test_gemma_gain_is_one_plus_w_on_a_bridge():
    model = bl.models.tiny.tiny_model("bridge", family="gemma3")
    norm = bl.adapter.final_norm(model)
    np.testing.assert_allclose(norm.gain, 1.0 + _np(model.ln_final.w))
    assert "1 + w" in norm.gain_rule


def test_bad_inputs_say_what_to_do(planted):
    model, _ = planted
    with pytest.raises(bl.InvalidInputError, match="axis"):
        bl.confidence(model, axis="lda")
    with pytest.raises(bl.InvalidInputError, match="at least 4"):
        bl.confidence(model, ["a b", "c"])


@pytest.mark.real
def test_smollm2_one_neuron_against_numpy():
    model = bl.load_model()
    L = model.cfg.n_layers - 1
    scr = bl.screen_neurons(model, n_random=20)
    j = scr.top(1)[0]
    wu, g, w = _np(model.W_U), _np(model.ln_final.w), _np(model.blocks[L].mlp.W_out)[j]
    a = (wu * g[:, None]).T
    k = max(1, round(0.01 * model.cfg.d_model))
    nb = np.linalg.svd(a, full_matrices=False)[2][-k:].T
    cos = (a @ w) / (np.linalg.norm(a, axis=1) * np.linalg.norm(w))
    row = scr.table.set_index("neuron").loc[j]
    assert row.out_norm == pytest.approx(np.linalg.norm(w), rel=1e-6)
    assert row.logit_var == pytest.approx(cos.var(), rel=1e-4)
    assert row.null_fraction == pytest.approx(np.linalg.norm(nb.T @ w) ** 2 / np.linalg.norm(w) ** 2, rel=1e-4, abs=1e-9)
    texts = ["The capital of France is Paris", "Two plus two equals four", "The cat sat on the mat",
             "Water boils at one hundred degrees", "The sun rises in the east", "Bees make honey from nectar"]
    res = bl.confidence(model, texts, n_candidates=1, n_random_neurons=1, n_random_axes=1, n_random=20, n_boot=50,
                        progress=False)
    toks, mask = bl.adapter.tokenize(model, list(res.texts))
    _, cache = model.run_with_cache(toks, attention_mask=mask,
                                    names_filter=lambda n: n in (f"blocks.{L}.hook_resid_post", f"blocks.{L}.mlp.hook_post"))
    last = mask.sum(1) - 1
    rows = torch.arange(len(last))
    x = _np(cache[f"blocks.{L}.hook_resid_post"][rows, last])
    act = _np(cache[f"blocks.{L}.mlp.hook_post"][rows, last])
    scale = lambda v: np.sqrt((v ** 2).mean(-1, keepdims=True) + model.cfg.eps)  # noqa: E731
    x1 = x + (act[:, j].mean() - act[:, j])[:, None] * w[None, :]
    h0 = _entropy_bits((g * x / scale(x)) @ wu)
    tot = _entropy_bits((g * x1 / scale(x1)) @ wu) - h0
    dirc = _entropy_bits((g * x1 / scale(x)) @ wu) - h0
    assert res.effect(j, path="total").value == pytest.approx(tot.mean(), abs=2e-4, rel=1e-2)
    assert res.effect(j, path="direct").value == pytest.approx(dirc.mean(), abs=2e-4, rel=1e-2)


def test_the_answer_prints_a_small_norm_share_to_two_significant_digits():
    """Gemma's share (0.034%) printed as "only 0% (95% CI 0% to 0%)": a zero the record did not hold. The answer
    keeps two significant digits below 10% and whole percents above."""
    from types import SimpleNamespace

    from bayes_lens._confidence import _answer, _pct

    assert [_pct(x) for x in (0.00034269, 0.0112, 0.5, -0.0004, 1.25)] == ["0.034%", "1.1%", "50%", "-0.04%", "125%"]
    overlap = SimpleNamespace(value=1e-4, null_interval=(0.0, 0.02))
    share = SimpleNamespace(value=0.00034269, ci=(0.00029685, 0.00040986))
    verdict, sentence = _answer(overlap, share, "ridge")
    assert verdict == "no" and "only 0.034% (95% CI 0.03% to 0.041%)" in sentence
