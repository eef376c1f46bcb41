"""Wind-tunnel task generators: exact Bayes posteriors checked against independent computations."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_lens as bl
from bayes_lens.windtunnel import BijectionTask, HMMTask, hmm_forward, make_task
from bayes_lens.windtunnel.tasks import _quantize_rows


@settings(max_examples=25, deadline=None)
@given(V=st.integers(2, 12), n=st.integers(1, 20), seed=st.integers(0, 10_000))
def test_bijection_sequences_and_bayes_entropy(V, n, seed):
    task = BijectionTask(V=V)
    b = task.sample(n, seed=seed)
    assert b.tokens.shape == (n, 2 * V)
    words = [t.split() for t in task.to_text(b.tokens)]
    for row, probs, ent in zip(words, b.bayes_probs, b.bayes_entropy_bits):
        xs, ys = row[0::2], row[1::2]
        assert sorted(xs) == sorted(f"x{i}" for i in range(1, V + 1))  # every input once
        assert sorted(ys) == sorted(f"y{i}" for i in range(1, V + 1))  # a bijection
        for k in range(V):
            # independent count: outputs not yet revealed before y_{k+1}
            unseen = set(range(1, V + 1)) - {int(y[1:]) for y in ys[:k]}
            expected = np.array([1.0 / len(unseen) if j + 1 in unseen else 0.0 for j in range(V)])
            np.testing.assert_allclose(probs[k], expected, atol=1e-12)
            assert ent[k] == pytest.approx(math.log2(V - k), abs=1e-12)
    np.testing.assert_allclose(task.bayes_entropy_bits(), [math.log2(V - k) for k in range(V)])
    # the token after each target position is the answer, and it is one of the answer ids
    assert np.isin(b.targets, b.answer_ids).all()


def test_seeded_and_text_round_trip():
    task = BijectionTask(V=6)
    a, b, c = task.sample(8, seed=3), task.sample(8, seed=3), task.sample(8, seed=4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    np.testing.assert_array_equal(task.from_text(task.to_text(a.tokens)), a.tokens)
    hmm = HMMTask(S=3, V=4, K=6, Q=5)
    h = hmm.sample(5, seed=1)
    np.testing.assert_array_equal(hmm.from_text(hmm.to_text(h.tokens)), h.tokens)


def test_quantize_rows_largest_remainder():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=200)
    for Q in (1, 3, 8, 20):
        c = _quantize_rows(p, Q)
        assert (c.sum(-1) == Q).all() and (c >= 0).all()
        assert (np.abs(c - p * Q) < 1).all()


def _brute_force_predictive(T, E, obs):
    """P(o_{t+1} | o_1..t) by summing over every hidden path (uniform initial state)."""
    S, V = E.shape
    K = len(obs)
    out = np.zeros((K, V))
    for t in range(K):
        joint = np.zeros(V)
        for path in itertools.product(range(S), repeat=t + 1):
            p = 1.0 / S
            for i, s in enumerate(path):
                if i:
                    p *= T[path[i - 1], s]
                if i < t:
                    p *= E[s, obs[i]]
            joint += p * E[path[-1]]
        out[t] = joint / joint.sum()
    return out


@pytest.mark.parametrize("S,V,K", [(2, 2, 5), (3, 2, 4), (2, 3, 5)])
def test_hmm_forward_matches_brute_force(S, V, K):
    task = HMMTask(S=S, V=V, K=K, Q=6, alpha=0.7)
    b = task.sample(6, seed=S * 10 + V)
    T, E, obs = task.parse(b.tokens)
    np.testing.assert_allclose(T.sum(-1), 1) and np.testing.assert_allclose(E.sum(-1), 1)
    for i in range(6):
        bf = _brute_force_predictive(T[i], E[i], obs[i])
        np.testing.assert_allclose(b.bayes_probs[i], bf, atol=1e-12)
        ent = -(np.where(bf > 0, bf * np.log2(np.where(bf > 0, bf, 1)), 0)).sum(-1)
        np.testing.assert_allclose(b.bayes_entropy_bits[i], ent, atol=1e-12)
    np.testing.assert_allclose(hmm_forward(T, E, obs), b.bayes_probs, atol=1e-12)


def test_hmm_sampler_matches_its_posterior():
    """Law of total probability: E[P_Bayes(o_t = v | past)] equals the frequency of o_t = v."""
    task = HMMTask(S=3, V=3, K=5, Q=4)
    b = task.sample(20_000, seed=7)
    obs = task.parse(b.tokens)[2]
    for t in range(task.K):
        freq = np.bincount(obs[:, t], minlength=task.V) / len(obs)
        np.testing.assert_allclose(b.bayes_probs[:, t].mean(0), freq, atol=0.015)
    # the realised symbol always has positive Bayes probability (no impossible observations)
    p_real = np.take_along_axis(b.bayes_probs, obs[..., None], -1)[..., 0]
    assert (p_real > 0).all()


def test_hmm_layout():
    task = HMMTask(S=2, V=3, K=4, Q=4)
    b = task.sample(1, seed=0)
    words = task.to_text(b.tokens)[0].split()
    assert words[0] == "T" and words[1 + 4] == "E" and words[2 + 4 + 6] == "O"
    assert len(words) == task.seq_len == 3 + 4 + 6 + 4
    assert all(w.startswith("o") for w in words[-4:])
    np.testing.assert_array_equal(b.target_positions, np.arange(12, 16))


@pytest.mark.parametrize("call, match", [
    (lambda: BijectionTask(V=1), r"V must be an integer >= 2, got 1"),
    (lambda: HMMTask(S=1), r"S must be an integer >= 2, got 1"),
    (lambda: HMMTask(V=1), r"V must be an integer >= 2, got 1"),
    (lambda: HMMTask(K=0), r"K must be a positive integer, got 0"),
    (lambda: HMMTask(alpha=-1), "positive"),
    (lambda: make_task("coinflip"), "unknown wind-tunnel task"),
    (lambda: make_task("bijection", W=3), "bad parameters"),
    (lambda: BijectionTask(V=4).sample(0, seed=0), r"n_seqs must be a positive integer, got 0"),
    (lambda: BijectionTask(V=4).sample(3, seed=-1), "seed"),
    (lambda: BijectionTask(V=2.5), "integer"),
])
def test_bad_input(call, match):
    with pytest.raises(bl.InvalidInputError, match=match):
        call()
