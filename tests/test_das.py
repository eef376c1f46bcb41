"""DAS rows of bl.localize (bayes_lens/ablation/_das.py, METHODS.md §13 "DAS rows"): TransformerLens 4.3's
fit_das, cross-fitted, scored by localize's own removal and swap, beside its controls (norm-matched placebo,
arbitrary labels, an untrained copy); on TransformerLens 3.9 a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.errors import InvalidInputError, MissingExtraError


def _has_interchange() -> bool:
    try:
        bl.adapter.interchange()
    except MissingExtraError:
        return False
    return True


needs_das = pytest.mark.skipif(not _has_interchange(), reason="DAS needs TransformerLens 4.3's interchange module")


@pytest.mark.skipif(_has_interchange(), reason="this TransformerLens has the interchange module")
def test_without_transformer_lens_4_3_das_is_refused_with_a_clear_error():
    """TL 3.9 has no tools.analysis.interchange: the adapter and localize say that DAS needs TransformerLens 4.3."""
    with pytest.raises(MissingExtraError, match=r"TransformerLens >= 4\.3"):
        bl.adapter.interchange()
    model = bl.models.tiny.tiny_model("bridge")
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=4)
    with pytest.raises(MissingExtraError, match=r"fit_das"):
        bl.localize(model, items, layers=[0], ranks=(1,), estimators=(bl.ablation.DAS(),), n_random=20, folds=2,
                    n_boot=10, n_null=0, progress=False)


def test_das_settings_are_checked():
    with pytest.raises(InvalidInputError):
        bl.ablation.DAS(rank=0)
    with pytest.raises(InvalidInputError):
        bl.ablation.DAS(lr=0.0)
    assert bl.ablation.DAS(rank=2).names == ("DAS k=2", "DAS k=2 placebo", "DAS k=2 arbitrary labels",
                                             "DAS k=2 untrained model")
    assert bl.ablation.DAS(controls=False).names == ("DAS k=1",)


@needs_das
def test_das_needs_the_residual_site():
    model, planted = bl.models.tiny.planted_model("bridge")
    items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4), n_per_k=4)
    with pytest.raises(InvalidInputError, match="resid_post"):
        bl.localize(model, items, layers=[1], site="v", ranks=(1,), estimators=(bl.ablation.DAS(),), n_random=20,
                    folds=2, n_boot=10, n_null=0, progress=False)


@pytest.fixture(scope="module")
def planted_das():
    """One localize call with a DAS row on the planted model (TL 4.3 bridge), and what it ran on."""
    if not _has_interchange():
        pytest.skip("DAS needs TransformerLens 4.3's interchange module")
    model, planted = bl.models.tiny.planted_model("bridge")
    items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4, 8), n_per_k=8)
    loc = bl.localize(model, items, layers=[planted.layer], ranks=(1,), estimators=("ridge", bl.ablation.DAS(rank=1)),
                      target="log_odds", bases={"mediator": planted.mediator.numpy(),
                                                "readout_only": planted.readout_only.numpy()},
                      n_random=20, folds=4, n_boot=100, n_null=10, progress=False)
    return model, planted, items, loc


def test_das_on_the_planted_model_finds_the_used_direction_and_beats_its_controls(planted_das):
    """Ground truth: DAS's row clears family-wise against its Haar null and lies above every one of its controls; its
    held-out interchange accuracy is ≈ 1 while arbitrary-label DAS stays near chance. DAS on an untrained copy does
    not clear the band (per test, unadjusted). Controls carry no verdict and stay out of Holm's family. Arbitrary-label
    DAS *does* move the output more than a random direction here (it leans on the one direction that moves it, the
    expressivity Arora et al. 2024 warn of), which is why a DAS row must also beat its controls."""
    _, _, _, loc = planted_das
    t = loc.to_dataframe().set_index("subspace")
    das = t.loc["DAS k=1"]
    assert das["kind"] == "das" and das["null"] == "haar"
    assert das["verdict"] == "readout and mediator (both)" and das["mediator"]
    assert das["removal_p_holm"] <= 0.05 and das["swap_p_holm"] <= 0.05
    assert das["removal_beats_controls"] is True and das["swap_beats_controls"] is True
    assert das["das_accuracy"] >= 0.9
    arb, untrained, placebo = (t.loc[f"DAS k=1 {c}"] for c in ("arbitrary labels", "untrained model", "placebo"))
    for c in (arb, untrained, placebo):
        assert c["kind"] == "control" and c["control_of"] == "DAS k=1" and c["null"] == "haar"
        assert c["verdict"] == "" and not c["mediator"] and np.isnan(c["removal_p_holm"])
        assert c["delta_mae_ci_high"] < das["delta_mae_ci_low"] and c["swap_ci_high"] < das["swap_ci_low"]
    assert not untrained["removal_per_test"] and not untrained["swap_per_test"]
    assert untrained["delta_mae_ci_low"] < untrained["band_high"]
    assert arb["das_accuracy"] <= 0.7
    # the family: ridge axis, frame k=1, the two planted bases and the DAS row, removal and swap
    assert loc.n_tests == 2 * 5 and "DAS row" in loc.rule and "controls" in loc.rule
    assert (t.loc["mediator", "verdict"] == "readout and mediator (both)"
            and t.loc["readout_only", "verdict"] == "readout only")
    row = loc.layers_table.iloc[0]
    assert row["das_subspace"] == "DAS k=1" and 0 <= row["das_angle_deg"] <= 90
    assert row["das_cos2"] == pytest.approx(np.cos(np.radians(row["das_angle_deg"])) ** 2)


def test_das_fold_bases_are_orthonormal_and_their_removal_is_the_tables(planted_das):
    """Recomputed by hand: the fold bases (TL's fit_das, refit here with the run's folds, donors and seeds) are
    orthonormal and lie mostly along the planted mediator, inside the plane of the mediator and its unread copy (the
    copy carries the same coordinate, so an interchange may read the donor's value off it: DAS's basis is not
    identified there); the table's Δ MAE of the DAS row equals
    each prompt run alone through TL's run_with_hooks with v − BBᵀv at every position, B its fold's basis."""
    from bayes_lens.ablation._das import das_fits
    from bayes_lens.estimators import fold_ids

    model, planted, items, loc = planted_das
    n = len(items)
    fid = fold_ids(n, 4, seed=0, strata=np.array([it.k for it in items]))
    donors = bl.ablation.swap_donors(items, seed=0)
    ids = list(bl.sula.label_token_ids(model, items[0].labels))
    fits = das_fits(model, planted.layer, [it.text for it in items], [it.posterior for it in items], donors, fid, ids,
                    bl.ablation.DAS(rank=1), seed=0, batch_size=bl.collect.RunOptions().batch_size)
    bases = fits[0]["fold_bases"]
    med = planted.mediator.double().numpy()
    med /= np.linalg.norm(med)
    ro = planted.readout_only.double().numpy()
    ro /= np.linalg.norm(ro)
    for b in bases.values():
        assert np.allclose(b.T @ b, np.eye(1), atol=1e-10)
        assert abs(float(b[:, 0] @ med)) > 0.7 and float(b[:, 0] @ med) ** 2 + float(b[:, 0] @ ro) ** 2 > 0.7

    def label_entropy(logits):
        p = torch.softmax(torch.log_softmax(logits[0, -1].double(), -1)[ids], -1).numpy()
        return float(-(p * np.log2(p)).sum())

    clean_h, patched_h = [], []
    for i, it in enumerate(items):
        toks = model.to_tokens(it.text)
        u = torch.tensor(bases[int(fid[i])][:, 0])

        def remove(act, hook, u=u):
            a = act.double()
            return (a - (a @ u)[..., None] * u).to(act.dtype)

        with torch.no_grad():
            clean_h.append(label_entropy(model(toks)))
            patched_h.append(label_entropy(model.run_with_hooks(toks, fwd_hooks=[(planted.hook_name, remove)])))
    bayes = np.array([it.entropy_bits for it in items])
    want = np.abs(np.array(patched_h) - bayes).mean() - np.abs(np.array(clean_h) - bayes).mean()
    got = loc.to_dataframe().set_index("subspace").loc["DAS k=1", "delta_mae_bits"]
    assert got == pytest.approx(want, abs=2e-4)


def test_the_das_rows_swap_is_transformer_lens_interchange(planted_das):
    """The table's swap score of the DAS row equals TL's own SubspaceInterchange (the interchange fit_das trains),
    applied by hand at each prompt's final position with its fold's basis and its donor's clean row (one prompt per
    run_with_hooks): bits closer to the donor's output, KL(q_j ‖ p_i) − KL(q_j ‖ p_i^swapped), averaged."""
    from bayes_lens.ablation._das import das_fits
    from bayes_lens.estimators import fold_ids
    from bayes_lens.metrics.calibration import kl_categorical_bits

    model, planted, items, loc = planted_das
    ic = bl.adapter.interchange()
    n = len(items)
    fid = fold_ids(n, 4, seed=0, strata=np.array([it.k for it in items]))
    donors = bl.ablation.swap_donors(items, seed=0)
    ids = list(bl.sula.label_token_ids(model, items[0].labels))
    bases = das_fits(model, planted.layer, [it.text for it in items], [it.posterior for it in items], donors, fid, ids,
                     bl.ablation.DAS(rank=1, controls=False), seed=0,
                     batch_size=bl.collect.RunOptions().batch_size)[0]["fold_bases"]
    name = planted.hook_name
    rows, clean = [], []
    with torch.no_grad():
        for it in items:
            logits, cache = model.run_with_cache(model.to_tokens(it.text), names_filter=lambda h: h == name)
            rows.append(cache[name][0, -1])
            clean.append(torch.softmax(logits[0, -1, ids].double(), -1).numpy())
        swapped = []
        for i, it in enumerate(items):
            step = ic.SubspaceInterchange(torch.tensor(bases[int(fid[i])], dtype=torch.float32))

            def swap(act, hook, step=step, src=rows[donors[i]]):
                act = act.clone()
                act[:, -1] = step(act[:, -1], src[None])
                return act

            out = model.run_with_hooks(model.to_tokens(it.text), fwd_hooks=[(name, swap)])
            swapped.append(torch.softmax(out[0, -1, ids].double(), -1).numpy())
    clean, swapped = np.array(clean), np.array(swapped)
    move = kl_categorical_bits(clean[donors], clean, eps=1e-9) - kl_categorical_bits(clean[donors], swapped, eps=1e-9)
    got = loc.to_dataframe().set_index("subspace").loc["DAS k=1", "swap_bits"]
    assert got == pytest.approx(float(np.mean(move)), rel=1e-3)
