"""Tests of the shipped prompt pools and the entropy-stratified selection (METHODS.md §5)."""

from __future__ import annotations

import collections
import gc
import importlib.util
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_lens as bl
from bayes_lens import prompts as P
from bayes_lens.errors import BayesLensError, InvalidInputError

ROOT = Path(__file__).resolve().parents[1]


def _read(name):
    path = resources.files("bayes_lens").joinpath("data", "prompts", f"{name}.jsonl")
    with path.open("r", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------
# The shipped pools
# ---------------------------------------------------------------------------------------------
def test_pool_sizes_kinds_and_schema():
    mixed = _read("mixed")
    assert len(mixed) >= 1000
    counts = collections.Counter(r["kind"] for r in mixed)
    assert set(counts) == set(P.MIXED_KINDS)
    assert min(counts.values()) >= 200
    for name in ("math", "code", "philosophy"):
        assert len(_read(name)) >= 200
    for name in P.POOLS:
        for r in _read(name):
            assert set(r) == {"text", "domain", "kind", "source"}
            assert r["domain"] == name
            assert r["source"] in ("written", "generated")
            assert isinstance(r["text"], str) and r["text"].strip() == r["text"].rstrip() and r["text"].strip()
        # pool() returns the same records, as PromptRecord
        recs = P.pool(name)
        assert [r.text for r in recs] == [r["text"] for r in _read(name)]
        assert all(isinstance(r, P.PromptRecord) for r in recs)


def test_pools_unique_within_and_across():
    all_texts = [r["text"] for name in P.POOLS for r in _read(name)]
    norm = [" ".join(t.lower().split()) for t in all_texts]
    assert len(set(norm)) == len(norm)


def test_pools_end_mid_thought():
    for name in P.POOLS:
        for r in _read(name):
            if r["kind"] == "code" or name == "code":
                continue
            assert not r["text"].endswith((".", "!", "?")), r["text"]


def test_pool_articles_agree_with_the_next_word():
    """'a annelid' / 'A empiricist' were generator slips; 'a is' (a variable) and 'a utilitarian' are fine."""
    import re

    bad = re.compile(r"\b(?:[Aa] [aeio][a-z]{2,}|[Aa]n [b-df-hj-np-tv-z][a-z]+)")
    slips = [m.group(0) for name in P.POOLS for r in _read(name) for m in bad.finditer(r["text"])]
    assert slips == []


def test_pool_files_are_small():
    for name in P.POOLS:
        path = resources.files("bayes_lens").joinpath("data", "prompts", f"{name}.jsonl")
        assert len(path.read_bytes()) < 300_000


def test_pool_returns_a_copy():
    a = P.pool("math")
    a.clear()
    assert len(P.pool("math")) >= 200


@pytest.mark.real
def test_pool_token_lengths_on_smollm2(smol):
    tok = smol.tokenizer
    for name in P.POOLS:
        lengths = np.array([len(tok(r["text"], add_special_tokens=False)["input_ids"]) for r in _read(name)])
        assert lengths.min() >= 8 and lengths.max() <= 60, name
        assert lengths.std() > 3, f"{name}: lengths should vary"


@pytest.mark.real
def test_builder_reproduces_shipped_files(tmp_path):
    """The generator is deterministic and the committed files are its output."""
    pytest.importorskip("gguf")
    spec = importlib.util.spec_from_file_location("build_prompt_pools", ROOT / "tools" / "build_prompt_pools.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_prompt_pools"] = mod
    spec.loader.exec_module(mod)
    try:
        sizes = mod.build(tmp_path)
    finally:
        sys.modules.pop("build_prompt_pools", None)
    for name in P.POOLS:
        shipped = resources.files("bayes_lens").joinpath("data", "prompts", f"{name}.jsonl").read_bytes()
        assert (tmp_path / f"{name}.jsonl").read_bytes() == shipped, name
        assert sizes[name] == len(_read(name))


# ---------------------------------------------------------------------------------------------
# Pure selection logic (no model)
# ---------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 20, allow_nan=False), min_size=5, max_size=200))
def test_quintiles_are_rank_based_and_balanced(values):
    ent = np.array(values)
    q = P._quintile_ids(ent)
    sizes = np.bincount(q, minlength=5)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == ent.size
    # independent: rank by (entropy, position), cut ranks at the array_split boundaries
    ranks = np.empty(ent.size, int)
    ranks[sorted(range(ent.size), key=lambda i: (ent[i], i))] = np.arange(ent.size)
    bounds = np.cumsum([ent.size // 5 + (1 if k < ent.size % 5 else 0) for k in range(5)])
    expected = np.searchsorted(bounds, ranks, side="right")
    np.testing.assert_array_equal(q, expected)
    for k in range(4):  # quintiles are ordered in entropy
        if sizes[k] and sizes[k + 1]:
            assert ent[q == k].max() <= ent[q == k + 1].min()


@given(st.integers(1, 500))
def test_per_quintile_remainder_goes_to_lowest_quintiles(n):
    per = P._per_quintile(n)
    assert sum(per) == n
    assert per == sorted(per, reverse=True) and max(per) - min(per) <= 1


# ---------------------------------------------------------------------------------------------
# Selection with the tiny model
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_hooked():
    from bayes_lens.adapter import has_hooked_transformer
    from bayes_lens.models.tiny import tiny_model

    return tiny_model("hooked" if has_hooked_transformer() else "bridge", gqa=True, rotary=True)


def _user_pool(n=60):
    """A slice of the mixed pool covering every kind, as records."""
    recs = P.pool("mixed")
    by_kind = collections.defaultdict(list)
    for r in recs:
        by_kind[r.kind].append(r)
    out = []
    for i in range(n):
        out.append(by_kind[P.MIXED_KINDS[i % 5]][i // 5])
    return out


def _entropy_independent(model, texts):
    """Final-token next-token entropy, one unpadded prompt at a time, via scipy."""
    from scipy.stats import entropy

    out = []
    with torch.no_grad():
        for t in texts:
            ids = model.tokenizer(t, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids]), return_type="logits")[0, -1].double()
            p = torch.softmax(logits, -1).numpy()
            out.append(entropy(p, base=2))
    return np.array(out)


def test_selection_is_stratified_and_matches_independent_entropies(tiny_hooked):
    model = tiny_hooked
    P.clear_cache()
    pool = _user_pool(60)
    sel = P.select(model, pool, n_prompts=20, seed=3)
    texts = [r.text for r in pool]
    ref = _entropy_independent(model, texts)
    np.testing.assert_allclose(sel.pool_entropy_bits, ref, atol=1e-4)
    # quintiles by rank, independently
    order = np.argsort(ref, kind="stable")
    ref_q = np.empty(60, int)
    for k, chunk in enumerate(np.array_split(order, 5)):
        ref_q[chunk] = k
    np.testing.assert_array_equal(sel.pool_quintile, ref_q)
    assert np.bincount(sel.quintile, minlength=5).tolist() == [4, 4, 4, 4, 4]
    np.testing.assert_array_equal(sel.quintile, ref_q[sel.pool_index])
    assert list(sel.prompts) == [texts[i] for i in sel.pool_index]
    assert len(set(sel.prompts)) == 20
    df = sel.to_dataframe()
    assert list(df.columns) == ["pool", "prompt", "kind", "quintile", "entropy_bits", "pool_index"]
    assert df.groupby("quintile").size().tolist() == [4, 4, 4, 4, 4]
    json.dumps(sel.to_dict())
    # edges separate the quintiles
    for k, e in enumerate(sel.quintile_edges_bits):
        assert ref[ref_q == k].max() <= e <= ref[ref_q == k + 1].min()


def test_selection_deterministic_for_a_seed(tiny_hooked, monkeypatch):
    model = tiny_hooked
    pool = [r.text for r in _user_pool(40)]
    P.clear_cache()
    a = P.select(model, pool, n_prompts=15, seed=7)
    P.clear_cache()  # recompute from scratch: still identical
    b = P.select(model, pool, n_prompts=15, seed=7)
    assert a.prompts == b.prompts
    np.testing.assert_array_equal(a.entropy_bits, b.entropy_bits)
    others = {P.select(model, pool, n_prompts=15, seed=s).prompts for s in range(8, 12)}
    assert any(o != a.prompts for o in others)  # the seed matters
    # mixed()/domain() return plain strings, equal to select()'s prompts
    assert P.domain(model, pool, n_prompts=15, seed=7) == list(a.prompts)


def test_remainder_and_plot(tiny_hooked):
    sel = P.select(tiny_hooked, [r.text for r in _user_pool(40)], n_prompts=13, seed=0)
    assert np.bincount(sel.quintile, minlength=5).tolist() == [3, 3, 3, 2, 2]
    pytest.importorskip("plotly")
    fig = sel.plot()
    assert len(fig.data) == 2


def test_whole_pool_when_n_equals_size(tiny_hooked):
    pool = [r.text for r in _user_pool(25)]
    sel = P.select(tiny_hooked, pool, n_prompts=25, seed=0)
    assert sorted(sel.prompts) == sorted(pool)


def test_kind_balance_round_robin(tiny_hooked):
    pool = _user_pool(60)  # 12 of each kind
    sel = P.select(tiny_hooked, pool, n_prompts=25, seed=1, balance_kinds=True)
    kinds = np.array([r.kind for r in pool])
    for k in range(5):
        avail = collections.Counter(kinds[sel.pool_quintile == k])
        got = collections.Counter(np.array(sel.kinds)[sel.quintile == k])
        # round robin: a kind may get fewer than another only if it ran out in this quintile
        for a in avail:
            for b in avail:
                if got[a] + 1 < got[b]:
                    assert got[a] == avail[a]
    # over the whole selection, no kind is left out when each quintile offers it
    assert set(sel.kinds) <= set(P.MIXED_KINDS)


def test_cache_per_model_and_text(tiny_hooked, monkeypatch):
    import bayes_lens.collect as C

    P.clear_cache()
    calls = []
    real = C.collect

    def counting(model, prompts, **kw):
        calls.append(len(prompts))
        return real(model, prompts, **kw)

    monkeypatch.setattr(C, "collect", counting)
    pool = [r.text for r in _user_pool(30)]
    P.select(tiny_hooked, pool, n_prompts=10, seed=0)
    assert calls == [30]
    P.select(tiny_hooked, pool, n_prompts=10, seed=1)  # same pool, new seed: no forward pass
    P.select(tiny_hooked, pool[:20] + ["A brand new prompt that nobody has seen before"], n_prompts=10, seed=0)
    assert calls == [30, 1]  # only the new text ran
    P.select(tiny_hooked, pool, n_prompts=10, seed=0, cache=False)
    assert calls == [30, 1, 30]


def test_cache_dies_with_the_model():
    from bayes_lens.models.tiny import tiny_model

    m = tiny_model("bridge", gqa=True, rotary=True)
    P.entropies(m, ["The cat sat on the mat and then", "Once upon a time there was a"])
    assert m in P._CACHE
    n_before = len(P._CACHE)
    del m
    gc.collect()
    assert len(P._CACHE) == n_before - 1


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_unknown_pool_name(tiny_hooked):
    with pytest.raises(InvalidInputError, match="unknown prompt pool 'maths'"):
        P.pool("maths")
    with pytest.raises(BayesLensError, match="shipped pools"):
        P.domain(tiny_hooked, "poetry")


def test_pool_smaller_than_n(tiny_hooked):
    with pytest.raises(InvalidInputError, match="has 3 prompts but n_prompts=5"):
        P.select(tiny_hooked, ["a b c d", "e f g h", "i j k l"], n_prompts=5)
    with pytest.raises(InvalidInputError, match="has 240 prompts but n_prompts=241"):
        P.domain(tiny_hooked, "math", n_prompts=241)


@pytest.mark.parametrize("pool, msg", [
    (["one two three", "four five", "one two three"], "duplicate prompt"),
    (["one two three", "", "four five six"], "item 1 is empty"),
    (["one two three", "   ", "four five six"], "item 1 is empty"),
    (["one two three", 3, "four five six"], "item 1 is a int"),
    ([{"txt": "no text key"}], "item 0 is a dict"),
    ([], "pool is empty"),
    (42, "a pool must be"),
])
def test_bad_pools(tiny_hooked, pool, msg):
    with pytest.raises(InvalidInputError, match=msg):
        P.select(tiny_hooked, pool, n_prompts=1)


@pytest.mark.parametrize("n", [0, -3, 2.5, True, "75"])
def test_bad_n(tiny_hooked, n):
    with pytest.raises(InvalidInputError, match="n_prompts must be a positive integer"):
        P.select(tiny_hooked, ["one two", "three four"], n_prompts=n)


def test_user_records_keep_kinds(tiny_hooked):
    pool = [{"text": f"Item number {i} in the list is", "kind": "a" if i % 2 else "b"} for i in range(10)]
    sel = P.select(tiny_hooked, pool, n_prompts=5, seed=0, balance_kinds=True)
    assert set(sel.kinds) <= {"a", "b"} and sel.pool_name == "user"


def test_mixed_balances_kinds_by_default(tiny_hooked):
    pool = _user_pool(50)  # 10 of each of the five kinds
    got = P.mixed(tiny_hooked, n_prompts=10, seed=2, pool=pool)
    sel = P.select(tiny_hooked, pool, n_prompts=10, seed=2, balance_kinds=True)
    assert got == list(sel.prompts) and sel.balance_kinds
    plain = P.select(tiny_hooked, pool, n_prompts=10, seed=2)
    assert not plain.balance_kinds  # a user pool draws plainly unless asked
    # with 2 prompts per quintile, round robin never takes two of one kind in a quintile
    for k in range(5):
        ks = [kd for kd, q in zip(sel.kinds, sel.quintile) if q == k]
        avail = set(np.array([r.kind for r in pool])[sel.pool_quintile == k])
        assert len(set(ks)) == min(2, len(avail))


def test_public_names():
    assert bl.prompts is P
    assert callable(bl.prompts.mixed) and callable(bl.prompts.domain) and callable(bl.prompts.pool)


# ---------------------------------------------------------------------------------------------
# SmolLM2 on a small slice
# ---------------------------------------------------------------------------------------------
@pytest.mark.real
def test_smol_slice_entropies_and_strata(smol):
    pool = [r.text for r in P.pool("math")[:10]] + [r.text for r in P.pool("mixed")[::110]]
    sel = P.select(smol, pool, n_prompts=10, seed=0)
    ref = _entropy_independent(smol, pool)
    np.testing.assert_allclose(sel.pool_entropy_bits, ref, atol=2e-3)
    assert np.bincount(sel.quintile, minlength=5).tolist() == [2, 2, 2, 2, 2]
    # the pools do span low and high uncertainty on a real model
    assert ref.min() < 2.0 and ref.max() > 5.0


def test_subsample_and_picks_use_independent_streams(tiny_hooked):
    """The scoring subsample (default_rng(seed)) and the per-quintile picks (the seed's spawned child,
    SeedSequence(seed).spawn(1)[0]) are independent streams, not one: the picks do not reuse the numbers
    the subsample drew. Checked against the draws made here with numpy directly."""
    seed = 11
    (pick_ss,) = np.random.SeedSequence(seed).spawn(1)
    expected = np.sort(np.random.default_rng(seed).permutation(1100)[:150])
    np.testing.assert_array_equal(P.subsample_index(1100, 150, seed=seed), expected)
    # a user pool (no subsample): the picks are rng.choice per quintile from the pick stream
    pool = [r.text for r in _user_pool(40)]
    sel = P.select(tiny_hooked, pool, n_prompts=10, seed=seed)
    rng = np.random.default_rng(pick_ss)
    want = []
    for k in range(5):
        cand = np.flatnonzero(sel.pool_quintile == k)
        want.extend(sorted(int(i) for i in rng.choice(cand, size=2, replace=False)))
    np.testing.assert_array_equal(sel.pool_index, want)
    # the one-stream draw the picks used before (the subsample's own generator) gives other picks
    same = np.random.default_rng(seed)
    old = []
    for k in range(5):
        cand = np.flatnonzero(sel.pool_quintile == k)
        old.extend(sorted(int(i) for i in same.choice(cand, size=2, replace=False)))
    assert old != want
