"""SULA (bayes_lens.sula): exact posteriors, generator, controls, label validation, evaluation.

Numbers are checked against independent computations: scipy's binomial pmf and the paper's closed
form, brute-force likelihood products, simulation, per-prompt unbatched forward passes, sklearn PCA.
"""

import json
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

import bayes_lens as bl
from bayes_lens.metrics.stats import child_rngs
from bayes_lens.metrics import bootstrap_ci
from bayes_lens.models.tiny import tiny_tokenizer

sula = bl.sula
PAPER_ENTROPIES = {0: 1.000, 1: 0.469, 2: 0.258, 4: 0.078, 8: 0.008}


def _h(x):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num(-x * np.log2(x)) + np.nan_to_num(-(1 - x) * np.log2(1 - x))


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


# ------------------------------------------------------------------ exact posterior


@pytest.mark.parametrize("k", sorted(PAPER_ENTROPIES))
def test_expected_bayes_entropy_reproduces_paper_table(k):
    # independent: the paper's closed form P(y|D) = 1/(1 + ((1-p)/p)^(2m-k)), m ~ Binomial(k, p)
    p = 0.9
    m = np.arange(k + 1)
    post = 1.0 / (1.0 + ((1 - p) / p) ** (2 * m - k))
    want = float(np.sum(binom.pmf(m, k, p) * _h(post)))
    got = sula.expected_bayes_entropy_bits(k, p=p)
    assert got == pytest.approx(want, abs=1e-12)
    assert round(got, 3) == PAPER_ENTROPIES[k]


def test_generator_matches_exact_entropies_within_sampling_error(tok):
    n = 2000
    prompts = sula.make_prompts(tok, ks=tuple(PAPER_ENTROPIES), n_per_k=n, seed=123)
    for k in PAPER_ENTROPIES:
        h = np.array([it.bayes_entropy_bits for it in prompts if it.k == k])
        exact = sula.expected_bayes_entropy_bits(k)
        se = h.std(ddof=1) / math.sqrt(n) if k else 0.0
        assert abs(h.mean() - exact) <= 4 * se + 1e-12, (k, h.mean(), exact, se)
    # the generative model itself: labels agree with the hidden label at rate p, hidden label ~ prior
    agree = [lab == it.hidden_label for it in prompts for lab in it.example_labels]
    assert abs(np.mean(agree) - 0.9) < 4 * math.sqrt(0.09 / len(agree))
    skewed = sula.make_prompts(tok, ks=(0,), n_per_k=4000, prior=0.3, seed=1)
    first = np.mean([it.hidden_label == 0 for it in skewed])
    assert abs(first - 0.3) < 4 * math.sqrt(0.21 / 4000)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=12), st.floats(0.51, 0.99), st.floats(0.05, 0.95))
def test_bayes_posterior_equals_brute_force_likelihoods(labels, p, prior):
    like_first = prior * np.prod([p if lab == 0 else 1 - p for lab in labels])
    like_second = (1 - prior) * np.prod([p if lab == 1 else 1 - p for lab in labels])
    want = like_first / (like_first + like_second)
    assert sula.bayes_posterior(labels, p=p, prior=prior) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_bayes_posterior_rows_and_closed_form():
    rows = np.array([[0, 0, 1, 0], [1, 1, 1, 1], [0, 1, 0, 1]])
    got = sula.bayes_posterior(rows, p=0.9)
    want = [sula.bayes_posterior(r.tolist(), p=0.9) for r in rows]
    np.testing.assert_allclose(got, want)
    assert sula.bayes_posterior([], p=0.9, prior=0.3) == pytest.approx(0.3)
    assert sula.bayes_posterior([0], p=0.9) == pytest.approx(0.9)
    assert sula.bayes_posterior(torch.tensor([1, 1]), p=0.9) == pytest.approx(0.01 / 0.82)


# ------------------------------------------------------------------ generator


def test_items_carry_their_posterior_and_render_the_template(tok):
    prompts = sula.make_prompts(tok, ks=(0, 2, 3), n_per_k=4, seed=7)
    assert prompts.labels == ("dax", "lug") and len(prompts) == 12
    for it in prompts:
        assert isinstance(it, str) and it.text == str(it)
        assert len(it.example_labels) == len(it.words) == it.k
        assert it.bayes_p_first == pytest.approx(sula.bayes_posterior(it.example_labels, p=0.9))
        assert it.bayes_entropy_bits == pytest.approx(float(_h(it.bayes_p_first)))
        shown = [prompts.labels[i] for i in it.example_labels]
        if it.k == 0:
            assert it.text == "query:"
        else:
            want = ", ".join(f"{w}: {lab}" for w, lab in zip(it.words, shown)) + ". query:"
            assert it.text == want
            assert all(w in sula.CARRIER_WORDS for w in it.words)
    is_form = sula.make_prompts(tok, ks=(2,), n_per_k=1, seed=7, template="is")[0]
    w, lab = is_form.words, [("dax", "lug")[i] for i in is_form.example_labels]
    assert is_form.text == f"{w[0]} is {lab[0]}. {w[1]} is {lab[1]}. query is"
    custom = sula.SulaTemplate(example="{word} -> {label}", sep="; ", end=" | ", query="{query} ->")
    c = sula.make_prompts(tok, ks=(1,), n_per_k=1, seed=7, template=custom, query_word=None)[0]
    assert c.text == f"{c.words[0]} -> {('dax', 'lug')[c.example_labels[0]]} | {c.query_word} ->"
    assert c.query_word in sula.CARRIER_WORDS


def test_seed_determinism(tok):
    a = sula.make_prompts(tok, ks=(1, 4), n_per_k=20, seed=3)
    b = sula.make_prompts(tok, ks=(1, 4), n_per_k=20, seed=3)
    c = sula.make_prompts(tok, ks=(1, 4), n_per_k=20, seed=4)
    assert [x.as_dict() for x in a] == [x.as_dict() for x in b]
    assert [x.as_dict() for x in a] != [x.as_dict() for x in c]


def test_prompt_set_is_a_sequence_of_strings_that_slices_and_pickles(tok):
    prompts = sula.make_prompts(tok, ks=(0, 1), n_per_k=3, seed=0)
    sub = prompts[1:4]
    assert isinstance(sub, sula.SulaPrompts) and sub.labels == prompts.labels and len(sub) == 3
    back = pickle.loads(pickle.dumps(prompts))
    assert back.labels == prompts.labels and [x.as_dict() for x in back] == [x.as_dict() for x in prompts]
    assert all(type(t) is str for t in prompts.texts)
    with pytest.raises(AttributeError):
        prompts[0].k = 5
    assert list(prompts.to_dataframe().columns)[:3] == ["text", "k", "condition"]


# ------------------------------------------------------------------ controls


def test_control_posteriors(tok):
    kw = dict(ks=(0, 1, 2, 4, 8), n_per_k=30, seed=11)
    main = sula.make_prompts(tok, **kw)
    ctl = {c: sula.make_prompts(tok, control=c, **kw) for c in sula.CONTROLS}
    # paired: every condition has the same hidden labels, words and k
    for c, pr in ctl.items():
        assert [it.hidden_label for it in pr] == [it.hidden_label for it in main], c
        assert [it.words for it in pr] == [it.words for it in main], c
        assert all(it.condition == c for it in pr)
    # lexical remap: another (disjoint) single-token pair, same generative model
    remap = ctl["lexical_remap"]
    assert set(remap.labels).isdisjoint(main.labels) and remap.labels == ("mip", "zorb")
    for a, b in zip(remap, main):
        assert a.example_labels == b.example_labels
        assert a.bayes_p_first == pytest.approx(sula.bayes_posterior(a.example_labels))
        assert a.text == b.text.replace(" dax", " mip").replace(" lug", " zorb")
    # shuffled labels: coin flips unrelated to y -> posterior = prior, 1 bit
    for it in ctl["shuffled_labels"]:
        assert it.bayes_p_first == 0.5 and it.bayes_entropy_bits == 1.0
        assert ", ".join(f"{w}: {('dax', 'lug')[i]}" for w, i in zip(it.words, it.example_labels)) in it.text
    big = sula.make_prompts(tok, ks=(8,), n_per_k=500, seed=2, control="shuffled_labels")
    agree = np.mean([lab == it.hidden_label for it in big for lab in it.example_labels])
    assert abs(agree - 0.5) < 4 * math.sqrt(0.25 / 4000)
    # evidence removed: placeholders, no label shown -> 1 bit
    for it in ctl["evidence_removed"]:
        assert it.bayes_entropy_bits == 1.0
        assert " dax" not in it.text and " lug" not in it.text
        assert it.text.count(": ?") == it.k
    # carriers masked: the evidence stays, so the posterior is the main task's
    for a, b in zip(ctl["carriers_masked"], main):
        assert a.bayes_p_first == b.bayes_p_first
        assert not any(w in a.text for w in sula.CARRIER_WORDS)
        assert a.text.count("___:") == a.k
    # a prior other than 1/2: no-evidence controls return the prior
    skew = sula.make_prompts(tok, ks=(4,), n_per_k=5, prior=0.3, control="evidence_removed")
    assert all(it.bayes_p_first == 0.3 for it in skew)


# ------------------------------------------------------------------ labels


def test_single_token_labels_on_the_tiny_tokenizer(tok):
    assert sula.make_prompts(tok, ks=(1,), n_per_k=1).labels == ("dax", "lug")
    assert sula.make_prompts(tok, ks=(1,), n_per_k=1, labels=("zorb", "kep")).labels == ("zorb", "kep")
    # 'tuv' and 'gax' are not whole tokens in the tiny tokenizer
    with pytest.raises(bl.TokenizationError, match="'tuv' is not a single token"):
        sula.make_prompts(tok, labels=("tuv", "dax"))
    # all eight paper candidates: exactly the six the tiny tokenizer keeps whole come first
    chosen = sula._task.choose_labels(tok, 6)
    assert chosen == ("dax", "lug", "mip", "zorb", "wug", "kep")
    # brute force: every candidate and CVC word that encodes to one token with its leading space
    import itertools

    cvc = ["".join(t) for t in itertools.product("bcdfghjklmnprstvwz", "aeiou", "bcdfghjklmnprstvwz")]
    valid = {w for w in sula.CANDIDATE_LABELS + tuple(cvc) if len(tok.encode(" " + w)) == 1}
    assert {"cat", "dog", "lam", "bir"} <= valid  # whole words and BPE prefixes (' lam' of ' lamp')
    assert set(sula._task.choose_labels(tok, len(valid))) == valid
    with pytest.raises(bl.TokenizationError, match="found only"):
        sula._task.choose_labels(tok, len(valid) + 1)
    for bad in [("dax", "dax"), ("dax",), "dax", ("dax", " lug"), ("dax", "")]:
        with pytest.raises(bl.InvalidInputError):
            sula.make_prompts(tok, labels=bad)


@pytest.mark.real
def test_single_token_labels_on_smollm2(smol):
    tk = smol.tokenizer
    prompts = sula.make_prompts(smol, ks=(1,), n_per_k=2)
    remap = sula.make_prompts(smol, ks=(1,), n_per_k=2, control="lexical_remap")
    for lab in prompts.labels + remap.labels:
        ids = tk.encode(" " + lab, add_special_tokens=False)
        assert len(ids) == 1 and tk.decode(ids) == " " + lab
        # and the token is the one that follows ':' inside a prompt
        assert tk.encode("x: " + lab, add_special_tokens=False)[-1] == ids[0]
    assert set(prompts.labels).isdisjoint(remap.labels)
    # Paper A's labels split into two tokens on SmolLM2
    with pytest.raises(bl.TokenizationError, match="not a single token"):
        sula.make_prompts(smol, labels=("dax", "lug"))


# ------------------------------------------------------------------ bad input


def test_bad_input_errors(tok):
    for p in (0.5, 1.0, 0.3, 1.2, True, "0.9"):
        with pytest.raises(bl.InvalidInputError, match=r"\(0.5, 1\)"):
            sula.make_prompts(tok, p=p)
    with pytest.raises(bl.InvalidInputError, match="ks is empty"):
        sula.make_prompts(tok, ks=())
    with pytest.raises(bl.InvalidInputError, match="k must be a non-negative integer, got -1"):
        sula.make_prompts(tok, ks=(0, -1))
    with pytest.raises(bl.InvalidInputError, match="non-negative integer"):
        sula.make_prompts(tok, ks=(1.5,))
    with pytest.raises(bl.InvalidInputError, match="repeated"):
        sula.make_prompts(tok, ks=(1, 1))
    with pytest.raises(bl.InvalidInputError, match="n_per_k"):
        sula.make_prompts(tok, n_per_k=0)
    with pytest.raises(bl.InvalidInputError, match="prior"):
        sula.make_prompts(tok, prior=1.0)
    with pytest.raises(bl.InvalidInputError, match="control"):
        sula.make_prompts(tok, control="bogus")
    with pytest.raises(bl.InvalidInputError, match="template"):
        sula.make_prompts(tok, template="nope")
    with pytest.raises(bl.InvalidInputError, match="whitespace"):
        sula.SulaTemplate(query="{query}: ")
    with pytest.raises(bl.InvalidInputError, match="tokenizer"):
        sula.make_prompts(object())
    with pytest.raises(bl.InvalidInputError, match="0 \\(first label\\) or 1"):
        sula.bayes_posterior([0, 2])
    with pytest.raises(bl.InvalidInputError):
        sula.expected_bayes_entropy_bits(-1)


# ------------------------------------------------------------------ evaluation on a model


def _reference_forward(model, item, ids, layer):
    """One prompt, unbatched, unpadded: label log-probs and final-token hook_v (independent path)."""
    tokens, _ = bl.adapter.tokenize(model, [item.text])
    name = bl.adapter.hook_name(model, layer, "v")
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    lp = torch.log_softmax(logits[0, -1].double(), -1)[list(ids)]
    return lp.numpy(), cache[name][0, -1].double().flatten().numpy()


def test_evaluate_against_unbatched_reference(tiny):
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    prompts = sula.make_prompts(tiny, ks=(0, 1, 2, 4), n_per_k=4, seed=5)
    res = sula.evaluate(tiny, prompts, layer=-1, batch_size=3, n_boot=200, seed=3)
    ids = [tiny.tokenizer.encode(" " + lab, add_special_tokens=False)[0] for lab in prompts.labels]
    ref = [_reference_forward(tiny, it, ids, 1) for it in prompts]
    lp = np.array([r[0] for r in ref])
    p_ref = np.exp(lp[:, 0]) / np.exp(lp).sum(1)
    np.testing.assert_allclose(res.model_p_first.numpy(), p_ref, atol=2e-5)
    np.testing.assert_allclose(res.model_label_mass.numpy(), np.exp(lp).sum(1), rtol=2e-4)
    np.testing.assert_allclose(res.model_entropy_bits.numpy(), _h(p_ref), atol=1e-4)
    np.testing.assert_allclose(res.bayes_p_first.numpy(), [it.bayes_p_first for it in prompts])
    # table rows against numpy on the per-prompt arrays
    hm, hb, k = res.model_entropy_bits.numpy(), res.bayes_entropy_bits.numpy(), res.k.numpy()
    y = (res.hidden_label.numpy() == 0).astype(float)
    pm = res.model_p_first.numpy()
    assert list(res.table["k"]) == [0, 1, 2, 4, "all"]
    for gi, (_, row) in enumerate(res.table.iterrows()):
        sel = np.ones_like(k, bool) if row["k"] == "all" else k == row["k"]
        assert row["n"] == sel.sum()
        assert row["mae_bits"] == pytest.approx(np.abs(hm[sel] - hb[sel]).mean())
        assert row["brier"] == pytest.approx(np.mean((pm[sel] - y[sel]) ** 2))
        assert row["label_mass"] == pytest.approx(res.model_label_mass.numpy()[sel].mean())
        # each k group bootstraps with its own child stream of the seed (independent random streams)
        stream = child_rngs(len(res.table) + 3, seed=3)[gi]
        if row["k"] != "all":
            lo, hi = bootstrap_ci(lambda a, b: np.abs(a - b).mean(), hm[sel], hb[sel], n_boot=200, seed=stream)
        else:  # all prompts: resampled within k (the count per k is fixed), each k's rows redrawn by hand
            idx = np.empty((200, k.size), dtype=np.int64)
            for kv in np.unique(k):
                rows = np.flatnonzero(k == kv)
                idx[:, rows] = rows[stream.integers(0, rows.size, size=(200, rows.size))]
            assert np.all(k[idx] == k)
            lo, hi = np.quantile(np.abs(hm[idx] - hb[idx]).mean(1), [0.025, 0.975])
        assert (row["mae_bits_ci_low"], row["mae_bits_ci_high"]) == pytest.approx((lo, hi))
        assert row["mae_ignore_evidence_bits"] == pytest.approx(np.abs(1 - hb[sel]).mean())
    assert res.mae_bits.value == pytest.approx(np.abs(hm - hb).mean())
    assert res.pearson.value == pytest.approx(np.corrcoef(hm, hb)[0, 1])
    assert res.entropy_slope_bits_per_example.value == pytest.approx(np.polyfit(k, hm, 1)[0])
    lo, hi = res.entropy_slope_bits_per_example.ci
    assert lo <= res.entropy_slope_bits_per_example.value <= hi
    allrow = res.table[res.table["k"].astype(str) == "all"].iloc[0]
    assert res.mae_bits.ci == (allrow["mae_bits_ci_low"], allrow["mae_bits_ci_high"])
    assert res.mae_bits.null == allrow["mae_ignore_evidence_bits"] and res.mae_bits.n == len(k)
    assert res.kl_bits.ci == (allrow["kl_bits_ci_low"], allrow["kl_bits_ci_high"]) and res.pearson.null == 0.0
    # geometry: PC1 of standardized final-token values, against sklearn
    vals = np.array([r[1] for r in ref])
    z = StandardScaler().fit_transform(vals[:, vals.std(0) > 0])
    pc1 = PCA(n_components=1).fit_transform(z)[:, 0]
    assert abs(np.corrcoef(pc1, res.pc1.numpy())[0, 1]) > 0.999
    assert res.rho_pc1_bayes.value == pytest.approx(np.corrcoef(res.pc1.numpy(), hb)[0, 1])
    assert res.rho_k_pc1.value == pytest.approx(np.corrcoef(k, res.pc1.numpy())[0, 1])
    assert {"pc1_vs_bayes_entropy", "pc1_vs_model_entropy", "k_vs_pc1",
            "pc1_vs_bayes_entropy_within_k"} <= set(res.geometry["pair"])


def test_evaluate_applies_fwd_hooks_and_removes_them(tiny):
    prompts = sula.make_prompts(tiny, ks=(1, 2), n_per_k=3, seed=0)
    clean = sula.evaluate(tiny, prompts, n_boot=20)
    name = bl.adapter.hook_name(tiny, -1, "v")

    def zero_v(v, hook):
        return torch.zeros_like(v)

    patched = sula.evaluate(tiny, prompts, n_boot=20, fwd_hooks=[(name, zero_v)])
    assert not np.allclose(patched.model_p_first.numpy(), clean.model_p_first.numpy())
    again = sula.evaluate(tiny, prompts, n_boot=20)
    np.testing.assert_array_equal(again.model_p_first.numpy(), clean.model_p_first.numpy())

    def boom(v, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        sula.evaluate(tiny, prompts, n_boot=20, fwd_hooks=[(name, boom)])
    after = sula.evaluate(tiny, prompts, n_boot=20)
    np.testing.assert_array_equal(after.model_p_first.numpy(), clean.model_p_first.numpy())


def test_evaluate_inputs_and_outputs(tiny):
    prompts = sula.make_prompts(tiny, ks=(0, 2), n_per_k=3, seed=0)
    with pytest.raises(bl.InvalidInputError, match="SULA item"):
        sula.evaluate(tiny, ["w: dax. query:"])
    with pytest.raises(bl.LayerIndexError):
        sula.evaluate(tiny, prompts, layer=5)
    res = sula.evaluate(tiny, list(prompts), n_boot=10)  # a plain list of items works too
    assert res.labels == ("dax", "lug") and res.condition == "main"
    json.dumps(res.to_dict())
    long = res.to_dataframe()
    assert {"condition", "k", "metric", "value", "ci_low", "ci_high"} <= set(long.columns)
    assert "mae_bits" in set(long["metric"])
    assert len(res.per_prompt()) == len(prompts)
    fig = res.plot()
    assert len(fig.data) >= 4


def test_run_controls_one_table(tiny):
    rc = sula.run_controls(tiny, ks=(0, 2), n_per_k=4, n_boot=20)
    assert list(dict.fromkeys(rc.table["condition"])) == ["main", *sula.CONTROLS]
    no_ev = rc.table[rc.table["condition"].isin(["shuffled_labels", "evidence_removed"])]
    np.testing.assert_allclose(no_ev["h_bayes_mean_bits"], 1.0)
    assert set(rc.labels["lexical_remap"]).isdisjoint(rc.labels["main"])
    assert rc["carriers_masked"].bayes_p_first.tolist() == rc["main"].bayes_p_first.tolist()
    json.dumps(rc.to_dict())
    assert set(rc.to_dataframe()["condition"]) == {"main", *sula.CONTROLS}
    fig = rc.plot()
    # entropy (model, Bayes) and PC1 per condition; the reliability diagram of the main task only (a control's
    # Bayes posterior is ½ everywhere: its one or two filled bins drew a stray vertical line), plus the diagonal
    assert len(fig.data) == 5 * 3 + 1 + 1
    rel = [t for t in fig.data if t.name.endswith("reliability")]
    assert [t.name for t in rel] == ["main: reliability"]
    main_rel = rc["main"].reliability
    np.testing.assert_allclose(np.asarray(rel[0].x, float), main_rel["mean_predicted"].to_numpy(float))
    # the legend sits below the panels, inside the figure
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y < 0


@pytest.mark.real
def test_evaluate_on_smollm2(smol):
    prompts = sula.make_prompts(smol, ks=(0, 8), n_per_k=3, seed=0)
    res = sula.evaluate(smol, prompts, n_boot=50, batch_size=6)
    ids = [smol.tokenizer.encode(" " + lab, add_special_tokens=False)[0] for lab in prompts.labels]
    for i in (0, 5):
        lp, _ = _reference_forward(smol, prompts[i], ids, smol.cfg.n_layers - 1)
        assert res.model_p_first[i].item() == pytest.approx(np.exp(lp[0]) / np.exp(lp).sum(), abs=1e-4)
    assert 0 < res.label_mass.value <= 1 and np.isfinite(res.mae_bits.value)
