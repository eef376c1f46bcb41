"""Short reprs for every result (issue 26.5): headline numbers with intervals and n, a few lines,
arrays only as shape summaries, and an HTML table for notebooks.

Each repr is checked against the result's own fields (the analyses' numbers are checked against
independent computations in their own test files): the numbers it prints are the fields, rounded;
it names n; it never prints a tensor or an array body; it stays a few lines.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens._results import Result, fmt, fmt_ci, fmt_pct

MAX_LINES = 12


def _all_result_classes():
    for mod in pkgutil.walk_packages(bl.__path__, "bayes_lens."):
        if mod.name.endswith(("__main__", "cli")) or ".reporting" in mod.name:
            continue
        importlib.import_module(mod.name)
    out, todo = set(), [Result]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("bayes_lens") and sub not in out:
                out.add(sub)
                todo.append(sub)
    return sorted(out, key=lambda c: c.__name__)


def test_every_result_class_has_the_short_repr_and_a_headline():
    classes = _all_result_classes()
    assert len(classes) >= 20, [c.__name__ for c in classes]
    for cls in classes:
        # the dataclass-generated repr (every field, arrays in full) must not be the one in use
        assert cls.__repr__ is Result.__repr__, cls.__name__
        assert "_summary" in cls.__dict__, f"{cls.__name__} has no headline (_summary)"


def _check_short(res, *must_contain):
    text = repr(res)
    lines = text.splitlines()
    assert lines[0].startswith(type(res).__name__) and "summary unavailable" not in text, text
    assert len(lines) <= MAX_LINES, text
    assert "tensor(" not in text and "array(" not in text and "\n0 " not in text, text
    for piece in must_contain:
        assert piece in text, (piece, text)
    html = res._repr_html_()
    assert html.startswith("<div><b>") and html.count("<tr>") == len(res._summary()[1]) + 1, html
    assert "tensor(" not in html
    return text


@pytest.fixture(scope="module")
def geometry(tiny_module):
    prompts = [f"The number {i} is followed by" for i in range(24)]
    return bl.geometry(tiny_module, prompts, layer=1, n_boot=50, n_null=20)


@pytest.fixture(scope="module")
def tiny_module():
    from bayes_lens.adapter import has_hooked_transformer
    from bayes_lens.models.tiny import tiny_model

    return tiny_model("hooked" if has_hooked_transformer() else "bridge", gqa=True, rotary=True)


def test_geometry_reprs(geometry):
    vm, ko, af, ea = (geometry.value_manifold, geometry.key_orthogonality, geometry.attention_focusing,
                      geometry.entropy_alignment)
    text = _check_short(vm, f"n = {vm.n_prompts} prompts", fmt_pct(vm.pc1), fmt_ci(vm.pc1.ci, pct=True),
                        fmt_pct(vm.pc12.null), fmt(vm.participation_ratio),
                        f"coords ({vm.coords.shape[0]}, {vm.coords.shape[1]})")
    assert str(vm.coords[0, 0].item())[:6] not in text  # the coordinates themselves are not printed
    _check_short(ko, fmt(float(ko.layer_mean.double().mean())), fmt(ko.gaussian_baseline),
                 f"per_head ({ko.per_head.shape[0]}, {ko.per_head.shape[1]})")
    _check_short(af, f"n = {af.n_prompts} prompts", fmt_pct(af.reduction), fmt_ci(af.reduction.ci, pct=True))
    _check_short(ea, f"n = {ea.n_prompts} prompts", fmt(ea.spearman), fmt_ci(ea.spearman.ci), fmt(ea.pearson))
    _check_short(geometry, f"n = {vm.n_prompts} prompts", fmt_pct(vm.pc12), fmt(ea.spearman))


def test_formatters_match_numpy():
    x = np.float64(0.123456)
    assert fmt(x) == "0.1235" and fmt_pct(x) == "12.3%" and fmt_ci((0.1, 0.25), pct=True) == "[10.0%, 25.0%]"
    assert fmt(float("nan")) == "nan" and fmt_ci((float("nan"), float("nan"))) == ""


def test_reduced_cache_repr_shows_shapes(tiny_module):
    col = bl.collect.collect(tiny_module, ["a b c", "the cat", "one two three four"], value_layers=[0, 1],
                             attention=True)
    text = repr(col)
    assert "3 prompts" in text and "tensor(" not in text and len(text.splitlines()) == 1 + len(col)
    assert f"final_rows.v.0: (3, {col.value_rows(0).shape[1]}) float32" in text
    assert "next_token_entropy: (3,) float64" in text and "attention_entropy.last.1: (3, " in text


def test_sula_and_ablation_reprs(tiny_module):
    from bayes_lens import sula
    from bayes_lens.ablation import EntropyAxis, compare_patched

    prompts = sula.make_prompts(tiny_module, ks=(0, 1, 2, 4), n_per_k=4, seed=5)
    res = sula.evaluate(tiny_module, prompts, layer=-1, n_boot=50, seed=3)
    _check_short(res, f"n = {int(res.k.shape[0])} prompts", fmt(res.mae_bits), fmt_ci(res.mae_bits.ci),
                 fmt(res.pearson), fmt(res.bayes_ece))
    texts = ["the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp",
             "cloud chair", "the moon is a cloud", "dog cat bird tree", "apple", "a house is the river",
             "stone lamp chair"]
    axis = EntropyAxis(layer=0, progress=False).fit(tiny_module, texts)
    cmp = compare_patched(tiny_module, texts, [axis.removal()], n_random_seeds=1, n_boot=50, progress=False)
    clean = cmp.corr("clean", 0)
    _check_short(cmp, f"n = {cmp.n_prompts} prompts", fmt(clean.value), fmt_ci(clean.ci))


def test_martingale_cot_and_windtunnel_reprs():
    from bayes_lens.cot import estimate_cot_params
    from bayes_lens.martingale import (compression, falck_checks, gap, laplace, permutation_average,
                                       positional_spectrum)

    g = gap(laplace, range(10, 30, 4), n_seqs=5, n_boot=20)
    _check_short(g, f"{g.n_seqs} sequences per n", fmt(g.fit.A), fmt_ci(g.fit.A.ci), "per_n (5 rows")
    sp = positional_spectrum(laplace, seq_len=64, n_seqs=3, n_boot=10)
    _check_short(sp, f"{sp.n_seqs} sequences", fmt_pct(sp.explained_fraction))
    pa = permutation_average(laplace, seq_len=10, n_seqs=2, n_perms=8, ks=(1, 2, 4), n_boot=10)
    _check_short(pa, f"{pa.n_seqs} sequences x {pa.n_perms} orderings", fmt(pa.slope), fmt_ci(pa.slope.ci),
                 f"predictive ({pa.n_seqs}, {pa.n_perms})")
    fc = falck_checks(laplace, thetas=(0.5,), ns=(20,), ratios=(0.5,), n_paths=4, n_ref=20)
    _check_short(fc, fmt_pct(fc.fraction_inside))
    co = compression(laplace, thetas=(0.5,), seq_len=10, n_seqs=3, n_boot=10)
    last = co.curves[co.curves["n"] == co.curves["n"].max()]
    _check_short(co, f"{co.n_seqs} sequences", fmt(last[last.predictor == "laplace"].efficiency.mean(), 3))

    c = bl.cot_length(100, 0.1, 3, 5, 6)
    text = _check_short(c, fmt(c.k_star), fmt_ci(c.band), "valid", "eps_at_least_max")
    assert re.search(r"valid\s+False", text) and "not checked: n_at_least_4beta" in text
    assert "failed: eps_at_least" in text
    assert bl.cot_length(10_000, 0.1, 3, 5, 6).valid  # eps >= n^(-1/4) holds at n = 10 000
    k = np.arange(0, 30, 1.0)
    fit = estimate_cot_params(k, 0.8 + 6.0 / (k + 1.5) + 0.01 * np.random.default_rng(0).standard_normal(30),
                              n_boot=50, seed=0)
    _check_short(fit, fmt(fit.alpha), fmt_ci(fit.alpha.ci), f"{len(k)} points")

    model, task = bl.windtunnel.load("bijection")
    ev = bl.windtunnel.evaluate(model, task, n_seqs=40, seed=0)
    _check_short(ev, f"n = {ev.n} sequences", fmt(ev.mae_bits), fmt_ci(ev.mae_bits),
                 f"model_entropy_bits ({ev.n}, ")


def test_domain_controls_and_training_reprs(tiny_module):
    from bayes_lens import prompts as P
    from bayes_lens import sula

    pools = {"math": [r.text for r in P.pool("math")[:20]], "code": [r.text for r in P.pool("code")[:20]]}
    d = bl.compare_domains(tiny_module, pools, n_prompts=10, seed=0, n_boot=50, n_null=20, n_perm=50)
    _check_short(d, "n = 10 prompts each", fmt_pct(d.value_manifold["code"].pc12),
                 fmt_ci(d.pc12_diff["code"], pct=True))
    sel = d.selections["math"]
    _check_short(sel, "10 prompts", fmt(float(np.mean(sel.entropy_bits))), "entropy_bits (10,)")
    c = sula.run_controls(tiny_module, ks=(0, 1, 2), n_per_k=3, n_boot=20)
    _check_short(c, *(fmt(r.mae_bits) for r in c.results.values()))
    cfg = bl.windtunnel.TrainConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, batch_size=8)
    run = bl.windtunnel.train("bijection", cfg, steps=3, n_eval_seqs=10, progress=False)
    _check_short(run, "3 steps", fmt(run.final_mae_bits), "history (")
