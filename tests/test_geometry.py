"""Tests of bayes_lens.geometry: the four metrics against independent computations, on tiny and real models."""

import json
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from scipy.stats import spearmanr
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import bayes_lens as bl
from bayes_lens.adapter import hook_name, key_weights, tokenize
from bayes_lens.models.tiny import tiny_model

PROMPTS = [
    "the cat is a dog", "a bird", "the moon and the river and the stone", "apple chair cloud",
    "the house is a tree", "dog", "the lamp is a lamp and a chair", "stone river moon bird cat",
    "query is the apple", "the tree",
]
FAST = dict(n_boot=200, progress=False)


def _alone_cache(model, prompt):
    toks, _ = tokenize(model, [prompt])
    with torch.inference_mode():
        logits, cache = model.run_with_cache(toks)
    return cache, logits[0, -1]


def _reference(model, prompts, layer):
    """Unpadded per-prompt reads: value rows, per-head final-row entropies, next-token entropy."""
    vals, heads, ents = [], [], []
    for p in prompts:
        cache, last = _alone_cache(model, p)
        vals.append(cache[hook_name(model, layer, "v")][0, -1].reshape(-1).double().numpy())
        heads.append([scipy_entropy(cache[hook_name(model, l, "pattern")][0, :, -1].double().numpy(), base=2, axis=-1)
                      for l in range(model.cfg.n_layers)])
        ents.append(scipy_entropy(torch.softmax(last.double(), -1).numpy(), base=2))
    return np.array(vals), np.array(heads), np.array(ents)


def test_value_manifold_matches_sklearn(tiny):
    vm = bl.value_manifold(tiny, PROMPTS, layer=-1, padding_side="left", **FAST)
    x, _, _ = _reference(tiny, PROMPTS, -1)
    kv = tiny.cfg.n_key_value_heads * tiny.cfg.d_head
    assert vm.dim == kv and x.shape[1] == kv
    ref = PCA().fit(StandardScaler().fit_transform(x))
    assert vm.pc1.value == pytest.approx(ref.explained_variance_ratio_[0], abs=1e-5)
    assert vm.pc12.value == pytest.approx(ref.explained_variance_ratio_[:2].sum(), abs=1e-5)
    assert vm.coords.shape == (len(PROMPTS), min(10, len(PROMPTS)))
    scores = ref.transform(StandardScaler().fit_transform(x))[:, 0]
    assert min(np.abs(vm.coords[:, 0].numpy() - s * scores).max() for s in (1, -1)) < 1e-3
    assert vm.pc1.ci[0] <= vm.pc1.value <= vm.pc1.ci[1] and vm.pc12.ci[0] <= vm.pc12.value <= vm.pc12.ci[1]
    assert vm.participation_ratio.ci[0] <= vm.participation_ratio.value <= vm.participation_ratio.ci[1]
    assert 0 < vm.pc1.null < vm.pc12.null < 1 and vm.pc1.null_interval[0] <= vm.pc1.null <= vm.pc1.null_interval[1]
    pct = bl.value_manifold(tiny, PROMPTS, ci_method="percentile", **FAST)
    assert pct.pc1.ci[1] - pct.pc1.ci[0] == pytest.approx(vm.pc1.ci[1] - vm.pc1.ci[0], rel=1e-9)
    assert pct.pc1.ci[0] == pytest.approx(vm.pc1.ci[0] + vm.bootstrap_bias[0], abs=1e-12)
    # seeded: same seed, same numbers
    again = bl.value_manifold(tiny, PROMPTS, padding_side="left", **FAST)
    assert again.pc1.ci == vm.pc1.ci and again.pc12.null == vm.pc12.null
    # each headline Estimate says how its interval was made, over how many prompts, and carries its null
    for est in (vm.pc1, vm.pc12, vm.participation_ratio):
        assert est.n == len(PROMPTS) and est.ci_method.startswith("95% recentred percentile bootstrap")
    assert pct.pc1.ci_method.startswith("95% percentile bootstrap")
    df = vm.to_dataframe().set_index("statistic")
    assert df.loc["pc12_explained_variance_fraction", ["value", "ci_low", "ci_high", "null_mean"]].tolist() == [
        vm.pc12.value, *vm.pc12.ci, vm.pc12.null]
    assert json.loads(json.dumps(vm.to_dict()))["pc12"]["ci_low"] == pytest.approx(vm.pc12.ci_low)


def test_value_manifold_variants(tiny):
    info = bl.adapter.model_info(tiny)
    expanded = bl.value_manifold(tiny, PROMPTS, expand_kv=True, **FAST)
    assert expanded.dim == info.n_heads * info.d_head and expanded.expand_kv
    resid = bl.value_manifold(tiny, PROMPTS, site="resid_post", layer=0, **FAST)
    assert resid.dim == info.d_model and resid.hook_name == "blocks.0.hook_resid_post"
    with pytest.raises(bl.InvalidInputError, match="site"):
        bl.value_manifold(tiny, PROMPTS, site="mlp", **FAST)
    with pytest.raises(bl.InvalidInputError, match="ci_method"):
        bl.value_manifold(tiny, PROMPTS, ci_method="bca", **FAST)


def test_attention_focusing_matches_scipy(tiny):
    af = bl.attention_focusing(tiny, PROMPTS, padding_side="left", **FAST)
    _, heads, _ = _reference(tiny, PROMPTS, -1)  # [n, L, H]
    np.testing.assert_allclose(af.head_entropy_bits.numpy(), heads.mean(0), atol=1e-5)
    curve = heads.mean(2).mean(0)
    np.testing.assert_allclose(af.layer_entropy_bits.numpy(), curve, atol=1e-5)
    assert af.reduction.value == pytest.approx((curve[0] - curve[-1]) / curve[0], abs=1e-5)
    assert af.n_rises == int((np.diff(curve) > 0).sum())
    lengths = [tokenize(tiny, [p])[0].shape[1] for p in PROMPTS]
    assert af.uniform_entropy_bits == pytest.approx(np.mean(np.log2(lengths)))
    assert np.all(af.layer_entropy_ci[:, 0].numpy() <= curve + 1e-9)
    assert np.all(af.layer_entropy_ci[:, 1].numpy() >= curve - 1e-9)


def test_depth_spearman_against_scipy():
    from bayes_lens._geometry._focusing import focusing_from_entropies as _focusing_from

    rng = np.random.default_rng(0)
    ent = rng.random((12, 6, 4)) + np.linspace(3, 1, 6)[None, :, None]
    af = _focusing_from(ent, uniform=3.0, positions="last", seed=0, n_boot=100)
    curve = ent.mean(2).mean(0)
    assert af.depth_spearman.value == pytest.approx(spearmanr(np.arange(6), curve)[0])
    assert af.depth_spearman.ci[0] <= af.depth_spearman.ci[1]


def test_entropy_alignment_matches_scipy(tiny):
    ea = bl.entropy_alignment(tiny, PROMPTS, n_perm=200, **FAST)
    x, _, ents = _reference(tiny, PROMPTS, -1)
    pc1 = PCA(1).fit_transform(StandardScaler().fit_transform(x))[:, 0]
    assert ea.abs_spearman == pytest.approx(abs(spearmanr(pc1, ents)[0]), abs=1e-9)
    assert ea.abs_pearson == pytest.approx(abs(np.corrcoef(pc1, ents)[0, 1]), abs=1e-4)
    np.testing.assert_allclose(ea.entropy_bits.numpy(), ents, atol=1e-5)
    assert 0 < ea.spearman_pvalue <= 1 and ea.spearman.ci[0] <= ea.spearman.ci[1]


@pytest.mark.parametrize("side", ["left", "right"])
def test_cache_path_equals_streaming_path(tiny, side):
    toks, mask = tokenize(tiny, PROMPTS, padding_side=side)
    with torch.inference_mode():
        logits, cache = tiny.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())
    s_vm = bl.value_manifold(tiny, PROMPTS, padding_side=side, batch_size=4, **FAST)
    c_vm = bl.value_manifold(cache, attention_mask=mask, **FAST)
    for f in ("pc1", "pc12", "participation_ratio"):
        c, s = getattr(c_vm, f), getattr(s_vm, f)
        assert (c.value, *c.ci, c.null) == pytest.approx((s.value, *s.ci, s.null), abs=1e-5)
    torch.testing.assert_close(c_vm.coords, s_vm.coords, atol=1e-4, rtol=1e-4)
    for positions in ("last", "all"):
        s_af = bl.attention_focusing(tiny, PROMPTS, positions=positions, padding_side=side, batch_size=4, **FAST)
        c_af = bl.attention_focusing(cache, positions=positions, attention_mask=mask, **FAST)
        torch.testing.assert_close(c_af.head_entropy_bits, s_af.head_entropy_bits, atol=1e-5, rtol=1e-5)
        assert c_af.uniform_entropy_bits == pytest.approx(s_af.uniform_entropy_bits)
    s_ea = bl.entropy_alignment(tiny, PROMPTS, padding_side=side, n_perm=100, **FAST)
    c_ea = bl.entropy_alignment(cache, attention_mask=mask, logits=logits, n_perm=100, **FAST)
    assert c_ea.spearman.value == pytest.approx(s_ea.spearman.value, abs=1e-6)
    assert c_ea.pearson.value == pytest.approx(s_ea.pearson.value, abs=1e-4)
    # a reduced cache is a third source with the same numbers
    col = bl.collect.collect(tiny, PROMPTS, value_layers=[-1], attention=True, progress=False)
    assert bl.value_manifold(col, **FAST).pc1.value == pytest.approx(s_vm.pc1.value, abs=1e-5)
    assert bl.entropy_alignment(col, n_perm=100, **FAST).spearman.value == pytest.approx(s_ea.spearman.value, abs=1e-6)


def test_cache_errors(tiny):
    toks, mask = tokenize(tiny, PROMPTS)
    _, cache = tiny.run_with_cache(toks, attention_mask=mask, names_filter=lambda n: n.endswith("hook_pattern"))
    with pytest.raises(bl.MissingHookError, match="hook_filter"):
        bl.value_manifold(cache, attention_mask=mask, **FAST)
    _, full = tiny.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())
    with pytest.raises(bl.MissingHookError, match="logits"):
        bl.entropy_alignment(full, attention_mask=mask, **FAST)
    with pytest.raises(bl.InvalidInputError, match="attention_mask"):
        bl.attention_focusing(cache, attention_mask=mask[:, :-1], **FAST)
    # prompts beside a cache are not run, only counted against its rows
    with pytest.raises(bl.InvalidInputError, match=f"holds {len(PROMPTS)} prompts but 2 were given"):
        bl.value_manifold(full, PROMPTS[:2], attention_mask=mask, **FAST)
    assert bl.value_manifold(full, PROMPTS, attention_mask=mask, **FAST).pc1 == \
        bl.value_manifold(full, attention_mask=mask, **FAST).pc1


def test_prompt_permutation_invariance(tiny):
    perm = [3, 0, 9, 1, 7, 2, 8, 5, 4, 6]
    a = bl.geometry(tiny, PROMPTS, **FAST, n_null=50, n_perm=50)
    b = bl.geometry(tiny, [PROMPTS[i] for i in perm], **FAST, n_null=50, n_perm=50)
    assert b.value_manifold.pc1.value == pytest.approx(a.value_manifold.pc1.value, abs=1e-6)
    assert b.value_manifold.participation_ratio.value == pytest.approx(a.value_manifold.participation_ratio.value, rel=1e-5)
    torch.testing.assert_close(b.attention_focusing.layer_entropy_bits, a.attention_focusing.layer_entropy_bits)
    assert abs(b.entropy_alignment.spearman.value) == pytest.approx(abs(a.entropy_alignment.spearman.value), abs=1e-9)
    torch.testing.assert_close(b.value_manifold.coords[:, 0].abs(), a.value_manifold.coords[perm, 0].abs(),
                               atol=1e-4, rtol=1e-4)


def test_key_orthogonality_brute_force_and_baselines(tiny):
    ko = bl.key_orthogonality(tiny, n_sims=50)
    info = bl.adapter.model_info(tiny)
    assert ko.per_head.shape == (info.n_layers, info.n_kv_heads)
    for layer in range(info.n_layers):
        w = key_weights(tiny, layer).double().numpy()
        for h in range(info.n_kv_heads):
            u = w[h] / np.linalg.norm(w[h], axis=0)
            c = np.abs(u.T @ u)
            ref = (c.sum() - np.trace(c)) / (c.shape[0] * (c.shape[0] - 1))
            assert float(ko.per_head[layer, h]) == pytest.approx(ref, abs=1e-10)
    np.testing.assert_allclose(ko.layer_mean.numpy(), ko.per_head.numpy().mean(1))
    assert ko.gaussian_baseline == pytest.approx(bl.metrics.keys.gaussian_abs_cosine(info.d_model))
    assert ko.paper_baseline == pytest.approx(np.sqrt(2 / (np.pi * info.d_head)))
    assert ko.gaussian_simulated_interval[0] <= ko.gaussian_simulated_mean <= ko.gaussian_simulated_interval[1]
    assert ko.reference_layer_mean is None and ko.ratio_to_reference is None
    same = bl.key_orthogonality(tiny, reference=tiny, n_sims=10)
    np.testing.assert_allclose(same.ratio_to_reference.numpy(), 1.0)
    other = bl.key_orthogonality(tiny, reference=tiny_model(bl.adapter.model_info(tiny).kind, seed=5), n_sims=10)
    assert not torch.allclose(other.reference_layer_mean, other.layer_mean)
    df = ko.to_dataframe()
    assert len(df) == info.n_layers * info.n_kv_heads and "mean_abs_cosine" in df


def test_key_orthogonality_names_the_layer_with_bad_weights():
    model = tiny_model("hooked" if bl.adapter.has_hooked_transformer() else "bridge", seed=1)
    info = bl.adapter.model_info(model)
    bad = info.n_layers - 1
    w = bl.adapter.key_weights(model, bad).clone()
    w[0, 0, 0] = float("nan")
    real = bl.adapter.key_weights

    def patched(m, layer, *, info=None):
        return w if layer == bad else real(m, layer, info=info)

    import unittest.mock

    with unittest.mock.patch.object(bl.adapter, "key_weights", patched):
        with pytest.raises(bl.NonFiniteError, match=f"layer {bad}:.*NaN"):
            bl.key_orthogonality(model, n_sims=5)


@pytest.mark.skipif(not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TL 3.x")
def test_orthonormal_keys_give_zero_and_processed_weights_warn():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model = tiny_model("hooked", gqa=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in model.blocks:
            w = block.attn._W_K  # [n_kv, d_model, d_head]
            for h in range(w.shape[0]):
                q, _ = torch.linalg.qr(torch.randn(w.shape[1], w.shape[2], generator=g))
                w[h] = q
    ko = bl.key_orthogonality(model, n_sims=10)
    assert float(ko.per_head.abs().max()) < 1e-6
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=8, d_vocab=10,
                                  act_fn="gelu", normalization_type="LNPre")
    processed = HookedTransformer(cfg)
    with pytest.warns(UserWarning, match="processed"):
        bl.key_orthogonality(processed, n_sims=10)
    with pytest.raises(bl.InvalidInputError, match="processed"):
        bl.key_orthogonality(processed, n_sims=10, on_processed="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bl.key_orthogonality(processed, n_sims=10, on_processed="ignore")


def test_geometry_result_api(tiny):
    geo = bl.geometry(tiny, PROMPTS, **FAST, n_null=50, n_perm=50)
    df = geo.to_dataframe()
    assert set(df["metric"]) == {"value_manifold", "key_orthogonality", "attention_focusing", "entropy_alignment"}
    assert "entropy_bits" in df.columns
    json.dumps(geo.to_dict())
    for part in (geo, geo.value_manifold, geo.key_orthogonality, geo.attention_focusing, geo.entropy_alignment):
        assert len(part.plot().data) > 0
    # the 2 × 2 figure keeps every panel's axis titles and its baselines (notebook 01's figure had neither)
    fig = geo.plot()
    for i in range(1, 5):
        suffix = "" if i == 1 else str(i)
        assert fig.layout[f"xaxis{suffix}"].title.text and fig.layout[f"yaxis{suffix}"].title.text
    lines = {(sh.yref, round(float(sh.y0), 9)) for sh in fig.layout.shapes}
    assert ("y", round(geo.value_manifold.pc1.null, 9)) in lines          # the Gaussian null of PC1
    assert ("y2", round(float(geo.key_orthogonality.gaussian_baseline), 9)) in lines
    assert ("y3", round(float(geo.attention_focusing.uniform_entropy_bits), 9)) in lines  # uniform attention
    with pytest.raises(Exception):
        geo.value_manifold.pc1 = 0.5  # frozen
    # geometry's pieces equal the individual metrics
    vm = bl.value_manifold(tiny, PROMPTS, **FAST, n_null=50)
    assert geo.value_manifold.pc12.value == pytest.approx(vm.pc12.value, abs=1e-9) and geo.value_manifold.pc12.ci == vm.pc12.ci


def test_bad_input(tiny):
    with pytest.raises(bl.InvalidInputError, match="empty"):
        bl.geometry(tiny, [], **FAST)
    with pytest.raises(bl.InvalidInputError, match="at least 3"):
        bl.value_manifold(tiny, PROMPTS[:2], **FAST)
    with pytest.raises(bl.InvalidInputError, match="at least 3"):
        bl.entropy_alignment(tiny, PROMPTS[:2], **FAST)
    with pytest.raises(bl.TokenizationError, match="context"):
        bl.geometry(tiny, PROMPTS + ["the " * 300], **FAST)
    with pytest.raises(bl.LayerIndexError, match="out of range"):
        bl.value_manifold(tiny, PROMPTS, layer=tiny.cfg.n_layers, **FAST)
    with pytest.raises(bl.LayerIndexError):
        bl.geometry(tiny, PROMPTS, layer=-tiny.cfg.n_layers - 1, **FAST)
    with pytest.raises(bl.InvalidInputError, match="prompts are required"):
        bl.attention_focusing(tiny, **FAST)
    with pytest.raises(bl.InvalidInputError, match="positions"):
        bl.attention_focusing(tiny, PROMPTS, positions="first", **FAST)
    with pytest.raises(bl.InvalidInputError, match="weight metric"):
        bl.key_orthogonality(bl.collect.collect(tiny, PROMPTS, value_layers=[0], progress=False))


def test_non_finite_activations(tiny_kind):
    model = tiny_model(tiny_kind)
    info = bl.adapter.model_info(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and p.shape[-1] == info.d_model and p.shape[0] == info.n_kv_heads * info.d_head:
                p.fill_(float("nan"))  # HF v_proj / k_proj layout on the bridge
        if info.kind == "hooked":
            model.blocks[-1].attn._W_V.fill_(float("nan"))
    with pytest.raises(bl.NonFiniteError, match="NaN"):
        bl.value_manifold(model, PROMPTS, **FAST)


def test_hooked_and_bridge_agree(tiny_pair):
    hooked, bridge = tiny_pair
    a = bl.geometry(hooked, PROMPTS, **FAST, n_null=50, n_perm=50)
    b = bl.geometry(bridge, PROMPTS, **FAST, n_null=50, n_perm=50)
    _assert_same_geometry(a, b)


def _assert_same_geometry(a, b, atol=1e-4):
    for f in ("pc1", "pc12", "participation_ratio"):
        assert getattr(a.value_manifold, f).value == pytest.approx(getattr(b.value_manifold, f).value, abs=atol * max(
            1, abs(getattr(a.value_manifold, f).value)))
    torch.testing.assert_close(a.value_manifold.coords[:, :2].abs(), b.value_manifold.coords[:, :2].abs(),
                               atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(a.attention_focusing.head_entropy_bits, b.attention_focusing.head_entropy_bits,
                               atol=atol, rtol=0)
    assert a.attention_focusing.reduction.value == pytest.approx(b.attention_focusing.reduction.value, abs=atol)
    assert a.entropy_alignment.spearman.value == pytest.approx(b.entropy_alignment.spearman.value, abs=atol)
    assert a.entropy_alignment.pearson.value == pytest.approx(b.entropy_alignment.pearson.value, abs=atol)
    torch.testing.assert_close(a.key_orthogonality.per_head, b.key_orthogonality.per_head, atol=1e-6, rtol=0)


SMOL_PROMPTS = [
    "The capital of France is", "def add(a, b):\n    return", "Once upon a time, there was a",
    "What is the chemical symbol for gold?", "2 + 2 =", "The stock market fell sharply after",
    "I think, therefore", "The weather today is", "Photosynthesis is the process by which plants",
    "SELECT name FROM users WHERE", "Who painted the Mona Lisa?", "Thank you very much for",
]


@pytest.fixture(scope="module")
def smol_geometry(smol):
    return bl.geometry(smol, SMOL_PROMPTS, n_boot=200, n_null=50, n_perm=100, progress=False)


def test_smol_gqa_shapes(smol_geometry):
    geo = smol_geometry
    assert geo.value_manifold.dim == 3 * 64 and geo.value_manifold.n_prompts == len(SMOL_PROMPTS)
    assert tuple(geo.key_orthogonality.per_head.shape) == (30, 3)
    assert tuple(geo.attention_focusing.head_entropy_bits.shape) == (30, 9)
    ph = geo.key_orthogonality.per_head
    assert len({round(float(v), 10) for v in ph.flatten()}) == ph.numel()  # no repeated heads
    assert geo.key_orthogonality.gaussian_baseline == pytest.approx(0.0332, abs=5e-4)
    assert geo.key_orthogonality.paper_baseline == pytest.approx(0.0997, abs=1e-4)
    assert not geo.key_orthogonality.processed


def test_smol_hooked_and_bridge_agree(smol, smol_bridge, smol_geometry):
    if smol is smol_bridge:
        pytest.skip("only one model kind on TransformerLens 4.x")
    b = bl.geometry(smol_bridge, SMOL_PROMPTS, n_boot=200, n_null=50, n_perm=100, progress=False)
    _assert_same_geometry(smol_geometry, b)
