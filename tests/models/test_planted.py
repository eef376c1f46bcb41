"""The planted model (bayes_lens.models.tiny.planted_model): its ground truth holds on every model kind.

Checked against independent computations: the exact posterior from the example labels by the closed
form logit = (n₁ − n₂)·log 9 (numpy, not bl.sula), entropies by numpy, ablations by TransformerLens
hooks written here (and through bl.EntropyAxis patches), probes by scikit-learn, and the effect of
removing a random direction against the linear prediction the construction implies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens import adapter
from bayes_lens.models.tiny import PLANTED_RMS_EPS, PlantedDirections, planted_model

KINDS = (["hooked"] if adapter.has_hooked_transformer() else []) + ["bridge"]
LOG9 = float(np.log(9.0))


@pytest.fixture(scope="module")
def prompts():
    from bayes_lens.models.tiny import tiny_tokenizer

    return bl.sula.make_prompts(tiny_tokenizer(), ks=(0, 1, 2, 4, 8), n_per_k=20, seed=7)


@pytest.fixture(scope="module", params=KINDS)
def built(request, prompts):
    model, planted = planted_model(request.param)
    tokens, mask = adapter.tokenize(model, prompts.texts)
    last = mask.sum(1) - 1
    return model, planted, tokens, last


def _evidence(prompts) -> np.ndarray:
    """n₁ − n₂ of each prompt, from its example labels (0 = first label)."""
    return np.array([len(it.example_labels) - 2 * sum(it.example_labels) for it in prompts], dtype=np.float64)


def _entropy_bits(p) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-15, 1 - 1e-15)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def _bayes_p(prompts) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_evidence(prompts) * LOG9))


def _final_logits(model, tokens, last, hooks=()):
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(hooks)) if hooks else model(tokens)
    return logits[torch.arange(len(last)), last].double()


def _p_first(logits, planted) -> np.ndarray:
    a, b = planted.label_ids
    return torch.sigmoid(logits[:, a] - logits[:, b]).numpy()


def _remove(u):
    u = u.float()

    def hook(x, hook):
        flat = x.reshape(*x.shape[:2], -1)
        return (flat - (flat @ u)[..., None] * u).reshape(x.shape)

    return hook


def _mae(p, prompts) -> float:
    return float(np.abs(_entropy_bits(p) - _entropy_bits(_bayes_p(prompts))).mean())


def _site(model, tokens, last, name) -> np.ndarray:
    got = {}

    def grab(x, hook):
        got["x"] = x.detach().clone()

    _final_logits(model, tokens, last, [(name, grab)])
    return got["x"][torch.arange(len(last)), last].double().numpy()


# --------------------------------------------------------------------------------------------------
# the ground truth itself


def test_planted_directions_are_orthonormal_and_described(built):
    model, planted, _, _ = built
    assert isinstance(planted, PlantedDirections)
    assert planted.layer == 0 and planted.site == "resid_post" and planted.hook_name == "blocks.0.hook_resid_post"
    assert planted.hook_name in model.hook_dict and planted.v_hook_name in model.hook_dict
    for a, b in ((planted.mediator, planted.readout_only), (planted.v_mediator, planted.v_readout_only)):
        assert a.dtype == torch.float32 and abs(float(a.norm()) - 1) < 1e-6 and abs(float(b.norm()) - 1) < 1e-6
        assert abs(float(a @ b)) < 1e-6
    assert planted.mediator.shape == (model.cfg.d_model,)
    assert planted.v_mediator.shape == (model.cfg.n_key_value_heads * model.cfg.d_head,)
    assert planted.labels == ("dax", "lug") and model.cfg.default_prepend_bos
    # no token's unembedding reads the readout-only direction (exact zeros); the labels' difference
    # reads the mediator with gain log 9 per unit (the final RMSNorm is the identity: gain √ε, ε ≫ x²)
    w_u = model.W_U.detach().double()
    assert float((planted.readout_only.double() @ w_u).abs().max()) == 0.0
    diff = planted.mediator.double() @ (w_u[:, planted.label_ids[0]] - w_u[:, planted.label_ids[1]])
    assert float(diff) == pytest.approx(LOG9 / planted.evidence_scale, rel=1e-5)
    assert model.cfg.eps == PLANTED_RMS_EPS


def test_the_site_holds_the_evidence_on_both_directions(built, prompts):
    model, planted, tokens, last = built
    x = _site(model, tokens, last, planted.hook_name)
    ev = _evidence(prompts)
    for u in (planted.mediator, planted.readout_only):
        c = x @ u.double().numpy()
        # c = evidence_scale·(n₁ − n₂)·R/(R + T − 1), R = e¹⁰ the sink's weight: within 0.2%
        assert np.allclose(c, planted.evidence_scale * ev, rtol=2e-3, atol=1e-4), np.abs(c - ev).max()


# --------------------------------------------------------------------------------------------------
# (a) calibration


def test_posterior_is_the_exact_bayesian_one(built, prompts):
    model, planted, tokens, last = built
    logits = _final_logits(model, tokens, last)
    a, b = planted.label_ids
    log_odds = (logits[:, a] - logits[:, b]).numpy()
    ev = _evidence(prompts)
    assert np.abs(log_odds - ev * LOG9).max() < 0.05          # at |n₁ − n₂| = 8 the exact value is 17.6
    # and bl.sula agrees: calibration MAE of entropies tiny, its interval too, far below the evidence-blind one
    res = bl.sula.evaluate(model, prompts, n_boot=200, seed=0)
    assert res.mae_bits.value == pytest.approx(_mae(_p_first(logits, planted), prompts), abs=1e-4)
    assert res.mae_bits.value < 2e-3 and res.mae_bits.ci_high < 5e-3
    assert res.mae_bits.null > 0.3                               # always answering ½
    assert res.pearson.value > 0.999
    assert res.label_mass.value > 0.95


# --------------------------------------------------------------------------------------------------
# (b) ablations


def test_removing_the_mediator_sets_the_posterior_to_the_prior(built, prompts):
    model, planted, tokens, last = built
    clean = _final_logits(model, tokens, last)
    out = _final_logits(model, tokens, last, [(planted.hook_name, _remove(planted.mediator))])
    p = _p_first(out, planted)
    assert np.abs(p - 0.5).max() < 1e-3
    mae_clean, mae_removed = _mae(_p_first(clean, planted), prompts), _mae(p, prompts)
    assert mae_removed > 0.3 and mae_removed > 100 * mae_clean
    # the same at hook_v, before the head sums the label tokens' values
    out_v = _final_logits(model, tokens, last, [(planted.v_hook_name, _remove(planted.v_mediator))])
    assert np.abs(_p_first(out_v, planted) - 0.5).max() < 1e-3


def test_removing_the_readout_only_copy_changes_no_logit(built):
    model, planted, tokens, last = built
    with torch.no_grad():
        clean = model(tokens)
        out = model.run_with_hooks(tokens, fwd_hooks=[(planted.hook_name, _remove(planted.readout_only))])
        out_v = model.run_with_hooks(tokens, fwd_hooks=[(planted.v_hook_name, _remove(planted.v_readout_only))])
    assert float((out - clean).abs().max()) < 1e-5     # every position, every token
    assert float((out_v - clean).abs().max()) < 1e-5
    # the copy was there to remove: the site's coordinate on it is the evidence
    x = _site(model, tokens, last, planted.hook_name)
    assert np.abs(x @ planted.readout_only.double().numpy()).max() > 4


def test_a_random_direction_changes_little_and_as_the_construction_predicts(built, prompts):
    model, planted, tokens, last = built
    clean = _final_logits(model, tokens, last)
    a, b = planted.label_ids
    x = _site(model, tokens, last, planted.hook_name)
    m = planted.mediator.double().numpy()
    mae_clean = _mae(_p_first(clean, planted), prompts)
    mae_med = _mae(np.full(len(prompts), 0.5), prompts)
    rng = np.random.default_rng(0)
    deltas = []
    for _ in range(20):
        v = rng.standard_normal(model.cfg.d_model)
        v /= np.linalg.norm(v)
        out = _final_logits(model, tokens, last, [(planted.hook_name, _remove(torch.tensor(v)))])
        log_odds = (out[:, a] - out[:, b]).numpy()
        # nothing downstream reads the mediator but the unembedding, and the norms are linear: the
        # log-odds after the removal are those of the mediator coordinate that is left
        predicted = (clean[:, a] - clean[:, b]).numpy() - LOG9 / planted.evidence_scale * (x @ v) * (v @ m)
        assert np.abs(log_odds - predicted).max() < 1e-3
        deltas.append(_mae(_p_first(out, planted), prompts) - mae_clean)
    deltas = np.abs(deltas)
    assert np.median(deltas) < 0.02 * (mae_med - mae_clean)
    assert deltas.max() < 0.25 * (mae_med - mae_clean)


def test_entropy_axis_patches_act_as_the_hooks(built, prompts):
    """bl.EntropyAxis.from_directions at both sites: removal of the mediator / readout-only copy, and
    a random control orthogonal to the mediator, through bl.patched."""
    model, planted, tokens, last = built
    clean = _final_logits(model, tokens, last)
    for site, med, ro, name in (("resid_post", planted.mediator, planted.readout_only, planted.hook_name),
                                ("v", planted.v_mediator, planted.v_readout_only, planted.v_hook_name)):
        ax_med = bl.EntropyAxis.from_directions(model, {planted.layer: med}, site=site)
        ax_ro = bl.EntropyAxis.from_directions(model, {planted.layer: ro}, site=site)
        assert ax_med.hook_name_ == name
        with torch.no_grad(), bl.patched(model, ax_med.removal()):
            out_med = model(tokens)[torch.arange(len(last)), last].double()
        with torch.no_grad(), bl.patched(model, ax_ro.removal()):
            out_ro = model(tokens)[torch.arange(len(last)), last].double()
        hooked = _final_logits(model, tokens, last, [(name, _remove(med))])
        assert torch.allclose(out_med, hooked, atol=1e-4)
        assert np.abs(_p_first(out_med, planted) - 0.5).max() < 1e-3
        assert float((out_ro - clean).abs().max()) < 1e-5
        rand = ax_med.random_control(seed=3)
        with torch.no_grad(), bl.patched(model, rand):
            out_rand = model(tokens)[torch.arange(len(last)), last].double()
        assert _mae(_p_first(out_rand, planted), prompts) < 0.25 * _mae(np.full(len(prompts), 0.5), prompts)


# --------------------------------------------------------------------------------------------------
# (c) probes


def test_a_linear_probe_reads_the_log_odds_from_both_directions(built, prompts):
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score
    from sklearn.model_selection import KFold, cross_val_predict

    model, planted, tokens, last = built
    x = _site(model, tokens, last, planted.hook_name)
    target = _evidence(prompts) * LOG9                      # the Bayes log-odds
    h_bayes = _entropy_bits(_bayes_p(prompts))
    folds = KFold(5, shuffle=True, random_state=0)
    shuffled = np.random.default_rng(1).permutation(target)
    for u in (planted.mediator, planted.readout_only):
        c = (x @ u.double().numpy())[:, None]
        held_out = cross_val_predict(LinearRegression(), c, target, cv=folds)
        assert r2_score(target, held_out) > 0.999
        null = cross_val_predict(LinearRegression(), c, shuffled, cv=folds)
        assert r2_score(shuffled, null) < 0.1                  # the shuffled-target null reads nothing
        # the entropy is an even function of the evidence: monotone in |c|, not linear in c
        from scipy.stats import spearmanr

        assert spearmanr(np.abs(c[:, 0]), h_bayes).statistic < -0.95
        lin = cross_val_predict(LinearRegression(), c, h_bayes, cv=folds)
        assert r2_score(h_bayes, lin) < 0.2


# --------------------------------------------------------------------------------------------------
# (d) the same weights in both kinds, and bad input


@pytest.mark.skipif(not adapter.has_hooked_transformer(), reason="HookedTransformer needs TransformerLens 3.x")
def test_hooked_and_bridge_give_the_same_logits(prompts):
    hooked, ph = planted_model("hooked", seed=2)
    bridge, pb = planted_model("bridge", seed=2)
    tokens, mask = adapter.tokenize(hooked, prompts.texts)
    assert torch.equal(tokens, adapter.tokenize(bridge, prompts.texts)[0])
    with torch.no_grad():
        lh, lb = hooked(tokens), bridge(tokens)
    real = mask.bool()
    assert torch.allclose(lh[real], lb[real], atol=1e-4, rtol=0)
    for f in ("mediator", "readout_only", "v_mediator", "v_readout_only"):
        assert torch.equal(getattr(ph, f), getattr(pb, f))
    other, po = planted_model("bridge", seed=3)
    assert not torch.equal(po.mediator, pb.mediator)            # the seed draws the rotation


@pytest.mark.skipif(adapter.has_hooked_transformer(), reason="TransformerLens 4.x has no HookedTransformer")
def test_hooked_kind_needs_transformer_lens_3():
    with pytest.raises(bl.ModelLoadError, match="TransformerLens 3"):
        planted_model("hooked")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kind="gpt"), bl.InvalidInputError, "kind"),
    (dict(layer=2), bl.InvalidInputError, "layer"),
    (dict(labels=("dax", "dax")), bl.InvalidInputError, "differ"),
    (dict(labels=("dax", "blorptang")), bl.TokenizationError, "single token"),
    (dict(p=0.5), bl.InvalidInputError, "p must"),
    (dict(prior=1.0), bl.InvalidInputError, "prior"),
    (dict(d_head=15), bl.InvalidInputError, "even"),
    (dict(n_heads=3), bl.InvalidInputError, "even"),
    (dict(evidence_scale=0), bl.InvalidInputError, "evidence_scale"),
])
def test_bad_input(kwargs, error, match):
    kwargs = dict(kwargs)
    kind = kwargs.pop("kind", "bridge")
    with pytest.raises(error, match=match):
        planted_model(kind, **kwargs)
