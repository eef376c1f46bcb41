"""bl.attach: bayes_lens's own named hook points in hook_dict and caches, on both model kinds."""

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

import bayes_lens as bl
from bayes_lens.adapter import hook_name, model_info, tokenize

TEXTS = ["the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp"]


def _axis(model, layers=(0, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = model_info(model).kv_dim
    return bl.EntropyAxis.from_directions(model, {k: torch.randn(dim, generator=g) for k in layers}, sigma=0.5)


def _names(model):
    return list(model.hook_dict)


def test_hook_points_appear_while_attached_and_vanish_after(tiny):
    axis = _axis(tiny)
    before_names = _names(tiny)
    before_modules = [n for n, _ in tiny.named_modules()]
    before_objects = {k: id(v) for k, v in tiny.hook_dict.items()}
    toks, mask = tokenize(tiny, TEXTS)
    n_layers = tiny.cfg.n_layers
    expected = ([f"blocks.{k}.hook_v_axis" for k in (0, 1)]
                + [f"blocks.{k}.hook_pattern_entropy" for k in range(n_layers)] + ["hook_next_token_entropy"])
    with bl.attach(tiny, axis=axis) as att:
        assert sorted(att.hook_names) == sorted(expected)
        for name in expected:
            assert name in tiny.hook_dict
        _, cache = tiny.run_with_cache(toks, attention_mask=mask, names_filter=lambda n: n in expected)
        assert sorted(cache.keys()) == sorted(expected)
        assert cache["blocks.0.hook_v_axis"].shape == (*toks.shape, 1)
        assert cache["blocks.1.hook_pattern_entropy"].shape == (len(TEXTS), toks.shape[1], tiny.cfg.n_heads)
        assert cache["hook_next_token_entropy"].shape == (*toks.shape, 1)
        # names_filter is respected: a filter for one name caches one name
        _, one = tiny.run_with_cache(toks, attention_mask=mask, names_filter="blocks.1.hook_v_axis")
        assert list(one.keys()) == ["blocks.1.hook_v_axis"]
    assert _names(tiny) == before_names
    assert [n for n, _ in tiny.named_modules()] == before_modules
    assert {k: id(v) for k, v in tiny.hook_dict.items()} == before_objects


def test_attached_with_nothing_hooked_leaves_logits_equal(tiny):
    toks, mask = tokenize(tiny, TEXTS)
    with torch.inference_mode():
        clean = tiny(toks, attention_mask=mask)
        with bl.attach(tiny, axis=_axis(tiny)):
            attached = tiny(toks, attention_mask=mask)
    assert (attached - clean).abs().max() <= 1e-6


def test_exception_inside_attach_detaches(tiny):
    before = _names(tiny)
    with pytest.raises(RuntimeError, match="boom"):
        with bl.attach(tiny, axis=_axis(tiny)):
            assert "hook_next_token_entropy" in tiny.hook_dict
            raise RuntimeError("boom")
    assert _names(tiny) == before
    # nested attach is refused clearly, and the failed attach leaves nothing behind
    with bl.attach(tiny):
        inner_before = _names(tiny)
        with pytest.raises(bl.InvalidInputError, match="already"):
            bl.attach(tiny)
        assert _names(tiny) == inner_before
    assert _names(tiny) == before


def _by_hand(u, fn):
    """A plain out-of-place hook on hook_v that applies ``fn`` to the flattened value vectors (float64)."""
    def hook(act, hook):
        flat = act.reshape(*act.shape[:2], -1).double()
        return fn(flat, u.to(flat.device)).to(act.dtype).reshape(act.shape)

    return hook


def test_zero_ablating_axis_hook_point_is_projection_removal(tiny):
    """Zero-ablation of hook_v_axis = axis.removal() (λ = 1) = the by-hand v − (v·u)u on hook_v."""
    axis = _axis(tiny, layers=(0,))
    u = axis.axes_[0].double()
    toks, mask = tokenize(tiny, TEXTS)
    v_name = hook_name(tiny, 0, "v")
    with torch.inference_mode():
        by_hand = tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[
            (v_name, _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u))])
        with bl.attach(tiny, axis=axis):
            ablated_logits = tiny.run_with_hooks(
                toks, attention_mask=mask, fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: torch.zeros_like(c))])
        with bl.patched(tiny, axis.removal()):
            removal_logits = tiny(toks, attention_mask=mask)
    assert (ablated_logits - by_hand).abs().max() <= 1e-5
    assert (ablated_logits - removal_logits).abs().max() <= 1e-6
    # and the removal really changes the model (the test can fail)
    assert (ablated_logits - tiny(toks, attention_mask=mask)).abs().max() > 1e-4


def test_coordinate_is_v_dot_u_and_hooks_can_shift_it(tiny):
    axis = _axis(tiny, layers=(1,))
    u = axis.axes_[1].double()
    toks, mask = tokenize(tiny, TEXTS)
    v_name = hook_name(tiny, 1, "v")
    with torch.inference_mode(), bl.attach(tiny, axis=axis, entropies=False):
        _, cache = tiny.run_with_cache(toks, attention_mask=mask, names_filter=[v_name, "blocks.1.hook_v_axis"])
        coord = cache["blocks.1.hook_v_axis"].double()[..., 0]
        v = cache[v_name].reshape(*toks.shape, -1).double()
        assert (coord - v @ u).abs().max() <= 1e-5
        shifted = tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[
            ("blocks.1.hook_v_axis", lambda c, hook: c + 2.0)])
    with torch.inference_mode():
        by_hand = tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[
            (v_name, _by_hand(u, lambda v, u: v + 2.0 * u))])
        clean = tiny(toks, attention_mask=mask)
    assert (shifted - by_hand).abs().max() <= 1e-5
    assert (shifted - clean).abs().max() > 1e-4


def test_entropy_hook_points_match_independent_computation(tiny):
    toks, mask = tokenize(tiny, TEXTS)
    with torch.inference_mode(), bl.attach(tiny):
        logits, cache = tiny.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter(
            sites=("pattern", "pattern_entropy", "next_token_entropy")))
    pat = cache[hook_name(tiny, 1, "pattern")].double().numpy()
    ent = cache["blocks.1.hook_pattern_entropy"].transpose(1, 2).numpy()
    np.testing.assert_allclose(ent, scipy_entropy(np.clip(pat, 0, None), base=2, axis=-1), atol=1e-9)
    probs = torch.softmax(logits.double(), -1).numpy()
    np.testing.assert_allclose(cache["hook_next_token_entropy"][..., 0].numpy(), scipy_entropy(probs, base=2, axis=-1),
                               atol=1e-6)


def test_hook_filter_covers_bayes_lens_hook_points(tiny):
    f = bl.hook_filter(sites=("v", "v_axis", "pattern_entropy", "next_token_entropy"))
    assert f("blocks.3.hook_v_axis") and f("blocks.0.hook_pattern_entropy") and f("hook_next_token_entropy")
    assert not f("blocks.0.attn.hook_pattern")
    g = bl.hook_filter(tiny, layers=[-1], sites=("v_axis",))
    assert g(f"blocks.{tiny.cfg.n_layers - 1}.hook_v_axis") and not g("blocks.0.hook_v_axis")
    with pytest.raises(bl.InvalidInputError, match="not one string"):
        bl.hook_filter(sites="v")


def test_attach_refuses_a_foreign_axis(tiny):
    from bayes_lens.models.tiny import tiny_model

    other = tiny_model(model_info(tiny).kind, gqa=False)
    before = _names(tiny)
    with pytest.raises(bl.InvalidInputError, match="dimension"):
        bl.attach(tiny, axis=_axis(other, layers=(0,)))
    assert _names(tiny) == before
    with pytest.raises(bl.InvalidInputError, match="fitted"):
        bl.attach(tiny, axis=bl.EntropyAxis())
