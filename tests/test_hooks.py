"""Tests of bayes_lens.hooks: metric-hook builders, reductions and hook_filter."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import entropy as scipy_entropy

import bayes_lens as bl
from bayes_lens.adapter import hook_name, tokenize
from bayes_lens.hooks import (
    attention_entropy_hooks, final_rows, final_token_hooks, hook_filter, last_index, pattern_entropy_bits,
)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.sampled_from(["left", "right"]))
def test_last_index_left_and_right(lengths, side):
    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        if side == "right":
            mask[i, :n] = 1
        else:
            mask[i, width - n:] = 1
    expect = [n - 1 if side == "right" else width - 1 for n in lengths]
    assert last_index(mask).tolist() == expect


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 4))
def test_uniform_attention_over_t_keys_is_log2_t(t, heads):
    pattern = torch.zeros(1, heads, t, t)
    for q in range(t):
        pattern[0, :, q, : q + 1] = 1.0 / (q + 1)
    h = pattern_entropy_bits(pattern, positions="last")
    np.testing.assert_allclose(h.numpy(), np.full((1, heads), np.log2(t)), atol=1e-9)
    h_all = pattern_entropy_bits(pattern, positions="all")
    np.testing.assert_allclose(h_all.numpy(), np.full((1, heads), np.mean(np.log2(np.arange(1, t + 1)))), atol=1e-9)


def test_pattern_entropy_ignores_pad_keys_and_matches_scipy():
    rng = np.random.default_rng(0)
    raw = rng.random((2, 3, 5, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pattern = torch.tensor(raw)
    h = pattern_entropy_bits(pattern, mask)
    np.testing.assert_allclose(h[0].numpy(), scipy_entropy(raw[0, :, 4, 2:], base=2, axis=-1), atol=1e-12)
    np.testing.assert_allclose(h[1].numpy(), scipy_entropy(raw[1, :, 4, :], base=2, axis=-1), atol=1e-12)


def test_final_rows_and_errors():
    act = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    rows = final_rows(act, mask)
    assert torch.equal(rows, torch.stack([act[0, 1], act[1, 3]]))
    with pytest.raises(bl.InvalidInputError, match="attention_mask has shape"):
        final_rows(act, torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(bl.InvalidInputError, match="no real token"):
        final_rows(act, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    act[1, 3, 0] = float("inf")
    with pytest.raises(bl.NonFiniteError):
        final_rows(act, mask)
    with pytest.raises(bl.InvalidInputError, match="positions"):
        pattern_entropy_bits(torch.ones(1, 1, 2, 2), positions="first")


def test_hook_builders_with_run_with_hooks(tiny):
    prompts = ["the cat is a dog", "a bird"]
    toks, mask = tokenize(tiny, prompts, padding_side="left")
    values, ents = {}, {}
    hooks = (final_token_hooks(tiny, [-1], out=values, attention_mask=mask)
             + attention_entropy_hooks(tiny, [0], out=ents, attention_mask=mask))
    assert all(isinstance(n, str) and callable(f) for n, f in hooks)
    with torch.inference_mode():
        tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=hooks)
        _, cache = tiny.run_with_cache(tokenize(tiny, prompts[1:])[0])
    last = tiny.cfg.n_layers - 1
    assert values[last][0].shape == (2, tiny.cfg.n_key_value_heads * tiny.cfg.d_head)
    ref = cache[hook_name(tiny, -1, "v")][0, -1].reshape(-1)
    torch.testing.assert_close(values[last][0][1], ref, atol=1e-5, rtol=1e-4)
    pat = cache[hook_name(tiny, 0, "pattern")][0, :, -1].double().numpy()
    np.testing.assert_allclose(ents[0][0][1].numpy(), scipy_entropy(pat, base=2, axis=-1), atol=1e-5)
    with pytest.raises(bl.InvalidInputError, match="out must be a dict"):
        final_token_hooks(tiny, [-1], out=[])
    with pytest.raises(bl.LayerIndexError):
        attention_entropy_hooks(tiny, [99], out={})


def test_hook_filter(tiny):
    f = hook_filter()
    assert f("blocks.12.attn.hook_v") and f("blocks.0.attn.hook_pattern")
    assert not f("blocks.0.attn.hook_attn_scores") and not f("blocks.0.hook_resid_post")
    assert hook_filter(sites=("resid_post",))("blocks.3.hook_resid_post")
    g = hook_filter(tiny, layers=[-1])
    last = tiny.cfg.n_layers - 1
    assert g(f"blocks.{last}.attn.hook_v") and not g("blocks.0.attn.hook_v")
    toks, _ = tokenize(tiny, ["the cat"])
    _, cache = tiny.run_with_cache(toks, names_filter=f)
    assert sorted(cache.keys()) == sorted(
        [hook_name(tiny, l, s) for l in range(tiny.cfg.n_layers) for s in ("v", "pattern")])
    with pytest.raises(bl.InvalidInputError, match="unknown site"):
        hook_filter(sites=("bogus",))
    with pytest.raises(bl.InvalidInputError):
        hook_filter(layers=[0])
    assert bl.hook_filter is hook_filter


def test_pad_query_rows_are_ignored_even_if_nan():
    """positions='all' never reads a pad query row (some backends leave them NaN)."""
    pattern = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    pattern[0, :, :2] = float("nan")  # left-padded rows 0 and 1
    for q in (2, 3):
        pattern[0, :, q, 2: q + 1] = 1.0 / (q - 1)
    mask = torch.tensor([[0, 0, 1, 1]])
    h = pattern_entropy_bits(pattern, mask, positions="all")
    np.testing.assert_allclose(h.numpy(), np.full((1, 2), 0.5), atol=1e-12)  # mean of log2(1), log2(2)
