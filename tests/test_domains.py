"""Tests of bl.compare_domains (METHODS.md §5): numbers against independent computations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from scipy.stats import spearmanr
from sklearn.decomposition import PCA

import bayes_lens as bl
from bayes_lens import prompts as P
from bayes_lens.domains import _diff_ci
from bayes_lens.errors import BayesLensError, InvalidInputError

FAST = dict(n_boot=200, n_null=40, n_perm=200)


def _pools(k=20):
    return {"math": [r.text for r in P.pool("math")[:k]],
            "philosophy": [r.text for r in P.pool("philosophy")[:k]],
            "code": [r.text for r in P.pool("code")[:k]]}


def _independent(model, prompts):
    """Final-token hook_v of the last layer and next-token entropy, one unpadded prompt at a time."""
    name = bl.adapter.hook_name(model, -1, "v")
    vals, ents = [], []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([model.tokenizer(p, add_special_tokens=False)["input_ids"]])
            logits, cache = model.run_with_cache(ids, names_filter=lambda n: n == name)
            vals.append(cache[name][0, -1].reshape(-1).double().numpy())
            ents.append(scipy_entropy(torch.softmax(logits[0, -1].double(), -1).numpy(), base=2))
    return np.stack(vals), np.array(ents)


def _sk_stats(x):
    z = (x - x.mean(0)) / x.std(0)
    p = PCA().fit(z)
    lam = p.explained_variance_
    return p.explained_variance_ratio_[0], p.explained_variance_ratio_[:2].sum(), lam.sum() ** 2 / (lam ** 2).sum(), p.transform(z)[:, 0]


@pytest.fixture(scope="module")
def comparison():
    from bayes_lens.adapter import has_hooked_transformer
    from bayes_lens.models.tiny import tiny_model

    model = tiny_model("hooked" if has_hooked_transformer() else "bridge", gqa=True, rotary=True)
    return model, bl.compare_domains(model, _pools(), n_prompts=10, seed=0, **FAST)


def test_table_matches_independent_pca_and_entropies(comparison):
    model, cmp = comparison
    df = cmp.to_dataframe()
    assert df["domain"].tolist() == ["math", "philosophy", "code"]
    assert cmp.reference == "math"  # no "mixed": the first domain
    for _, row in df.iterrows():
        sel = cmp.selections[row["domain"]]
        assert np.bincount(sel.quintile, minlength=5).tolist() == [2] * 5
        x, ent = _independent(model, list(sel.prompts))
        pc1, pc12, pr, coord = _sk_stats(x)
        assert row["pc1_fraction"] == pytest.approx(pc1, abs=1e-6)
        assert row["pc12_fraction"] == pytest.approx(pc12, abs=1e-6)
        assert row["participation_ratio_dims"] == pytest.approx(pr, rel=1e-6)
        np.testing.assert_allclose(sel.entropy_bits, ent, atol=1e-4)
        rho = spearmanr(coord, ent).statistic
        assert row["alignment_abs_rho"] == pytest.approx(abs(rho), abs=1e-6)
        assert row["pc1_ci_low"] <= row["pc1_fraction"] <= row["pc1_ci_high"]
        assert row["pc12_ci_low"] <= row["pc12_fraction"] <= row["pc12_ci_high"]
        assert row["n_prompts"] == 10 and row["pool_size"] == 20
    ref = df.set_index("domain").loc["math"]
    for _, row in df.iterrows():
        assert row["pc12_diff_vs_reference"] == pytest.approx(row["pc12_fraction"] - ref["pc12_fraction"])
        assert row["pc12_diff_ci_low"] <= row["pc12_diff_vs_reference"] <= row["pc12_diff_ci_high"]
        assert row["participation_ratio_diff_vs_reference"] == pytest.approx(
            row["participation_ratio_dims"] - ref["participation_ratio_dims"])


def test_same_numbers_as_geometry(comparison):
    """compare_domains measures each domain exactly as bl.geometry does (same seeds)."""
    model, cmp = comparison
    sel = cmp.selections["philosophy"]
    geo = bl.geometry(model, list(sel.prompts), seed=0, progress=False, **FAST)
    vm = cmp.value_manifold["philosophy"]
    assert vm.pc12.value == pytest.approx(geo.value_manifold.pc12.value)
    assert vm.pc12.ci == pytest.approx(geo.value_manifold.pc12.ci)
    assert vm.pc12.null == pytest.approx(geo.value_manifold.pc12.null)
    assert cmp.attention_focusing["philosophy"].reduction.value == pytest.approx(geo.attention_focusing.reduction.value)
    assert abs(cmp.entropy_alignment["philosophy"].spearman.value) == pytest.approx(abs(geo.entropy_alignment.spearman.value))


def test_collapses_dict_plot(comparison):
    _, cmp = comparison
    for d in cmp.domains:
        assert cmp.collapses(d) == (cmp.pc12_diff[d].ci_low > 0)
        e, vm, ref = cmp.pc12_diff[d], cmp.value_manifold[d], cmp.value_manifold[cmp.reference]
        assert e.value == pytest.approx(vm.pc12.value - ref.pc12.value, abs=1e-12)
        assert e.null == 0.0 and e.n == vm.n_prompts and "of the difference" in e.ci_method
    assert not cmp.collapses("math")  # the reference never differs from itself
    with pytest.raises(InvalidInputError, match="unknown domain"):
        cmp.collapses("law")
    json.dumps(cmp.to_dict())
    pytest.importorskip("plotly")
    fig = cmp.plot()
    assert sum(t.type == "bar" for t in fig.data) == 5
    # the Gaussian-null markers: one colour in every panel, the colour of their (single) legend entry
    nulls = [t for t in fig.data if t.type == "scatter"]
    assert len(nulls) == 3 and len({t.marker.color for t in nulls}) == 1
    assert [t.showlegend for t in nulls] == [True, False, False]
    np.testing.assert_allclose(np.asarray(nulls[1].y, float), cmp.to_dataframe()["null_pc12_fraction"].to_numpy(float))
    # every panel's title says what it measures and in what units; no rotated y-axis titles, which ran
    # into the neighbouring panel's tick labels (issue 37.3)
    titles = [a.text for a in fig.layout.annotations]
    assert len(titles) == 5 and "% of variance" in titles[0] and "effective dims" in titles[2]
    assert not any(fig.layout[f"yaxis{'' if i == 1 else i}"].title.text for i in range(1, 6))


def test_deterministic(comparison):
    model, cmp = comparison
    again = bl.compare_domains(model, {"math": _pools()["math"], "code": _pools()["code"]}, n_prompts=10, seed=0, **FAST)
    a, b = cmp.to_dataframe().set_index("domain"), again.to_dataframe().set_index("domain")
    for d in ("math", "code"):
        assert cmp.selections[d].prompts == again.selections[d].prompts
    assert a.loc["code", "pc12_fraction"] == b.loc["code", "pc12_fraction"]
    assert a.loc["code", "pc12_diff_ci_low"] == b.loc["code", "pc12_diff_ci_low"]


def test_diff_ci_formula():
    rng = np.random.default_rng(0)
    bd, br = rng.normal(0.6, 0.05, 2000), rng.normal(0.5, 0.05, 2000)
    d = bd - br
    lo, hi = _diff_ci(bd, br, 0.1, "percentile")
    assert (lo, hi) == pytest.approx(tuple(np.quantile(d, [0.025, 0.975])))
    lo2, hi2 = _diff_ci(bd, br, 0.2, "recentered")
    assert lo2 == pytest.approx(0.2 + lo - np.median(d)) and hi2 == pytest.approx(0.2 + hi - np.median(d))
    # a difference of N(0.1, 0.05²·2) has a CI of about ±1.96·0.0707
    assert hi - lo == pytest.approx(2 * 1.96 * 0.05 * np.sqrt(2), rel=0.1)


@pytest.mark.parametrize("domains, msg", [
    (("mixed", "maths"), "unknown domain 'maths'"),
    (("mixed", "mixed"), "listed twice"),
    ("math", "not one string"),
    ((), "domains is empty"),
])
def test_bad_domains(comparison, domains, msg):
    model, _ = comparison
    with pytest.raises(InvalidInputError, match=msg):
        bl.compare_domains(model, domains, n_prompts=10)


def test_bad_pools_and_reference(comparison):
    model, _ = comparison
    with pytest.raises(BayesLensError, match="has 4 prompts but n_prompts=10"):
        bl.compare_domains(model, {"small": ["a b c", "d e f", "g h i", "j k l"]}, n_prompts=10)
    with pytest.raises(InvalidInputError, match="duplicate"):
        bl.compare_domains(model, {"dup": ["a b c", "a b c", "d e f"]}, n_prompts=2)
    with pytest.raises(InvalidInputError, match="is empty"):
        bl.compare_domains(model, {"empty": ["a b c", "", "d e f"]}, n_prompts=2)
    with pytest.raises(InvalidInputError, match="reference 'mixed'"):
        bl.compare_domains(model, {"a": ["x y", "z w", "q r"]}, n_prompts=3, reference="mixed")


@pytest.mark.real
def test_smol_two_small_domains(smol):
    pools = {"math": [r.text for r in P.pool("math")[:15]], "philosophy": [r.text for r in P.pool("philosophy")[:15]]}
    cmp = bl.compare_domains(smol, pools, n_prompts=10, seed=0, **FAST)
    df = cmp.to_dataframe().set_index("domain")
    x, ent = _independent(smol, list(cmp.selections["math"].prompts))
    pc1, pc12, pr, _ = _sk_stats(x)
    assert df.loc["math", "pc12_fraction"] == pytest.approx(pc12, abs=1e-3)
    assert df.loc["math", "n_prompts"] == 10
    # a trained model's value manifold is far more concentrated than Gaussian noise of the same n × d
    assert (df["pc12_fraction"] > df["null_pc12_high"]).all()


def test_pr_difference_label_carries_the_population_caveat(comparison):
    """The per-domain PR label says when its interval describes the same-n statistic only; the difference
    of two PRs inherits each one's low bias (≈ PR²/n; in simulation the difference's interval covered the
    population difference in 0 of 60 data sets at n = 40), so its label says so too, naming the domains'
    n and sample PR, and claims coverage only when both domains' PR intervals do."""
    from types import SimpleNamespace

    from bayes_lens.domains import _pr_diff_caveat
    from bayes_lens.metrics.pca import pr_interval_covers_population

    _, cmp = comparison
    for d in cmp.domains:
        if d == cmp.reference:
            continue
        label = cmp.pr_diff[d].ci_method
        assert "does not cover the population PR difference" in label
        assert f"n = {cmp.value_manifold[d].n_prompts}" in label
        assert "does not cover the population PR" in cmp.value_manifold[d].participation_ratio.ci_method
        assert "does not cover" not in cmp.pc12_diff[d].ci_method  # PC differences: no PR caveat
    # the rule, on stand-ins: both basic intervals at n >= 10·PR cover, one short domain does not
    def vm(n, pr, dim=64):
        return SimpleNamespace(n_prompts=n, dim=dim, n_constant_dims=0, participation_ratio=SimpleNamespace(value=pr))
    assert pr_interval_covers_population(200, 64, "basic", 8.0)
    assert "approximately covers" in _pr_diff_caveat(vm(200, 8.0), vm(300, 12.0), "basic")
    short = _pr_diff_caveat(vm(200, 8.0), vm(40, 12.0), "basic")
    assert "does not cover" in short and "n = 40, sample PR 12.0" in short and "n = 200" not in short
    assert "does not cover" in _pr_diff_caveat(vm(200, 8.0), vm(300, 12.0), "recentered")
