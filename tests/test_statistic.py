"""Sufficient-statistic decoding and patching (bl.ablation.patch_statistic; Paper B v3, METHODS.md §13).

Ground truth: the planted model (bl.models.tiny.planted_model) computes its posterior from the net
evidence n₁ − n₂ alone, so moving the decoded evidence to a donor's value must give the donor's exact
posterior; a random direction of the same length must not.
"""

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.errors import InvalidInputError


def _planted(kind):
    if kind == "hooked":
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:
            pytest.skip("HookedTransformer is TransformerLens 3.x only")
    return bl.models.tiny.planted_model(kind)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_patched_evidence_gives_the_exact_posterior_of_the_patched_count(kind):
    model, planted = _planted(kind)
    items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4, 8), n_per_k=6)
    res = bl.ablation.patch_statistic(model, items, layer=planted.layer, n_random=6, folds=3, n_boot=200, n_null=10)
    assert res.decode_r2[0].value > 0.99
    assert res.follows
    assert res.kl_after_bits.value < 1e-3                       # the posterior of the donor's count, exactly
    assert res.move_bits.ci_low > 1.0
    assert res.move_bits.null_interval[1] < 0.2 * res.move_bits.value   # a random direction of that length does not
    t = res.to_dataframe()
    # the score is KL(q_donor ‖ p_clean) − KL(q_donor ‖ p_patched), recomputed here with scipy
    from scipy.stats import entropy

    q = np.array([it.posterior for it in items])[t["donor"]]
    assert t["kl_before_bits"].iloc[3] == pytest.approx(entropy(q[3], _clean_posterior(model, items)[3], base=2),
                                                         abs=1e-6)


def _clean_posterior(model, items):
    import torch

    ids = bl.sula.label_token_ids(model, items[0].labels)
    out = []
    for it in items:
        with torch.no_grad():
            lp = torch.log_softmax(model(model.to_tokens(it.text))[0, -1].double(), -1)[list(ids)]
        out.append(torch.softmax(lp, -1).numpy())
    return np.array(out)


@pytest.mark.parametrize("kind", ["hooked", "bridge"])
def test_resumed_and_whole_pass_patches_agree(kind):
    """The shift runs through the one intervention runner: on the stream kept by the clean pass (resume=True)
    or as a hook in a whole pass (resume=False), with the same numbers."""
    import warnings

    model, planted = _planted(kind)
    items = bl.sula.make_prompts(model, labels=planted.labels, ks=(0, 1, 2, 4), n_per_k=4)
    kw = dict(layer=planted.layer, n_random=2, folds=2, n_boot=50, n_null=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = bl.ablation.patch_statistic(model, items, resume=True, **kw)
    slow = bl.ablation.patch_statistic(model, items, resume=False, **kw)
    np.testing.assert_allclose(fast.to_dataframe()["move_bits"], slow.to_dataframe()["move_bits"], atol=2e-4)
    np.testing.assert_allclose(fast.random_move_bits, slow.random_move_bits, atol=2e-4)


def test_sula_statistic_is_the_net_evidence_of_the_exact_posterior():
    model = bl.models.tiny.tiny_model("bridge")
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4, 8), n_per_k=4)
    s = bl.ablation.sufficient_statistic(items)[:, 0]
    p = np.array([it.bayes_p_first for it in items])
    np.testing.assert_allclose(np.log(p / (1 - p)), s * np.log(9), atol=1e-9)   # logit P(L1 | D) = (n1 − n2) log 9


def test_categorical_counts_patch_runs():
    model = bl.models.tiny.tiny_model("bridge")
    items = bl.tasks.categorical_prompts(model, n_symbols=3, ks=(0, 2, 4, 8), n_per_k=5, seed=0)
    s = bl.ablation.sufficient_statistic(items)
    assert s.shape == (len(items), 3) and np.all(s.sum(1) == [it.k for it in items])
    res = bl.ablation.patch_statistic(model, items, layer=1, n_random=2, folds=2, n_boot=50, n_null=0)
    assert len(res.decode_r2) == 3 and np.isfinite(res.move_bits.value)


def test_patch_statistic_refuses_bad_input():
    model = bl.models.tiny.tiny_model("bridge")
    items = bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=4)
    with pytest.raises(InvalidInputError, match="statistic"):
        bl.ablation.patch_statistic(model, items, layer=0, statistic=np.zeros((3, 1)))
    with pytest.raises(InvalidInputError, match="exact posteriors"):
        bl.ablation.patch_statistic(model, ["plain"] * 16, layer=0)
    with pytest.raises(InvalidInputError, match="sufficient statistic"):
        bl.ablation.sufficient_statistic(["plain"])


def test_methods_8b_names_patch_statistic_as_built():
    """Issue 52 §13: METHODS §8b said sufficient-statistic patching was "not built" while §13 and patch_statistic
    build it; §8b now points to it (and the one-step KL's interval is stated as the ~91% it covers)."""
    from pathlib import Path

    text = (Path(bl.__file__).parent / "data" / "METHODS.md").read_text()
    s8b = text[text.index("## 8b."):text.index("## 9.")]
    assert callable(bl.ablation.patch_statistic) and "`bl.ablation.patch_statistic`" in s8b
    built_elsewhere = s8b[s8b.index("**Built elsewhere:**"):s8b.index("**Not built here:**")]
    assert "sufficient-statistic" in built_elsewhere
    assert "sufficient" not in s8b[s8b.index("**Not built here:**"):]
    assert "about **91%** of the time, not\n  95%" in s8b
