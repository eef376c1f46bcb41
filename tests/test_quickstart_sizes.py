"""Quickstart-sized defaults (issue 16.2): seeded scoring subsamples of the shipped pools, nested for
one seed so the entropy cache is reused; the full pools one argument away; gap's short default ns."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens import prompts as P
from bayes_lens.errors import InvalidInputError


@pytest.fixture(scope="module")
def tiny():
    from bayes_lens.models.tiny import tiny_model

    return tiny_model("bridge", gqa=True, rotary=True)


def test_subsample_is_a_seeded_permutation_prefix():
    a = P.subsample_index(1100, 150, seed=3)
    b = P.subsample_index(1100, 200, seed=3)
    ref = np.random.default_rng(3).permutation(1100)
    np.testing.assert_array_equal(b, np.sort(ref[:200]))
    assert set(a) <= set(b) and len(a) == 150 and len(set(b)) == 200
    assert P.subsample_index(240, 400, seed=0) is None and P.subsample_index(240, None, seed=0) is None
    assert not np.array_equal(P.subsample_index(1100, 200, seed=4), b)


def test_mixed_scores_a_subsample_and_the_full_pool_is_one_argument_away(tiny):
    assert inspect.signature(P.mixed).parameters["pool_size"].default == P.DEFAULT_POOL_SIZE == 200
    sel = P.select(tiny, "mixed", n_prompts=20, seed=1, pool_size=200)
    shipped = P.pool("mixed")
    assert sel.pool_entropy_bits.shape == (200,) and sel.pool_quintile.shape == (200,)
    # pool_index counts positions in the whole shipped pool
    assert all(shipped[i].text == t for i, t in zip(sel.pool_index, sel.prompts))
    assert set(sel.pool_index) <= set(P.subsample_index(len(shipped), 200, seed=1))
    assert P.mixed(tiny, n_prompts=20, seed=1) == list(sel.prompts)
    full = P.select(tiny, "mixed", n_prompts=20, seed=1)  # select() defaults to the whole pool
    assert full.pool_entropy_bits.shape == (len(shipped),)
    # scores of the subsample are the full pool's scores at those positions (same model, same texts)
    np.testing.assert_allclose(sel.pool_entropy_bits, full.pool_entropy_bits[P.subsample_index(1100, 200, seed=1)])
    assert P.mixed(tiny, n_prompts=20, seed=1, pool_size=None) == list(full.prompts)


def test_pool_size_checks_and_user_pools(tiny):
    with pytest.raises(InvalidInputError):
        P.select(tiny, "math", n_prompts=10, pool_size=0)
    # a pool_size below n still draws n (the subsample grows to n)
    assert len(P.select(tiny, "math", n_prompts=12, seed=0, pool_size=5).pool_entropy_bits) == 12
    # user pools are never subsampled
    user = [r.text for r in P.pool("math")[:40]]
    assert len(P.select(tiny, user, n_prompts=10, pool_size=20).pool_entropy_bits) == 40


def test_compare_domains_scores_subsamples(tiny):
    from bayes_lens.domains import DEFAULT_POOL_SIZE

    assert inspect.signature(bl.compare_domains).parameters["pool_size"].default == DEFAULT_POOL_SIZE == 150
    cmp = bl.compare_domains(tiny, ("mixed", "math"), n_prompts=10, seed=2, pool_size=30, n_boot=20, n_null=5, n_perm=20,
                             progress=False)
    for d in ("mixed", "math"):
        assert len(cmp.selections[d].pool_entropy_bits) == 30
    # the mixed candidates are among those bl.prompts.mixed(seed=2) scores: its cache serves them
    assert set(cmp.selections["mixed"].pool_index) <= set(P.subsample_index(1100, P.DEFAULT_POOL_SIZE, seed=2))


def test_gap_default_ns_is_short():
    ns = inspect.signature(bl.martingale.gap).parameters["ns"].default
    assert list(ns) == list(range(10, 42, 4)) and len(ns) >= 3
