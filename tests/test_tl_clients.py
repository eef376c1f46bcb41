"""bayes_lens hook points driven by code nobody here wrote: TransformerLens's own ``patching`` module,
``ActivationCache`` helpers, TL-tutorial hooks, torch autograd, ``copy.deepcopy``/``torch.save``, and
SAELens's ``HookedSAETransformer`` (TL 3.x only), on every model kind the installed TL offers.

Every number is compared with an independent computation: an out-of-place by-hand hook on TL's own
``hook_v``/``hook_resid_post`` (or on the SAE's ``hook_sae_output``), or TL's own gradients.
"""

import copy
import io

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.adapter import has_hooked_transformer, hook_name, is_bridge, model_info
from bayes_lens.models.tiny import tiny_model

SEQ = 6


def _tokens(model, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, int(model.cfg.d_vocab), (1, SEQ), generator=g)


def _axis(model, site="v", layers=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    info = model_info(model)
    dim = info.kv_dim if site == "v" else info.d_model
    layers = range(int(model.cfg.n_layers)) if layers is None else layers
    return bl.EntropyAxis.from_directions(model, {k: torch.randn(dim, generator=g) for k in layers}, site=site,
                                          sigma=0.5)


@pytest.fixture
def model(tiny_kind):
    m = tiny_model(tiny_kind, gqa=True, rotary=True)
    m.eval()
    return m


def _source(model, layer, site):
    return hook_name(model, layer, "v" if site == "v" else "resid_post")


def _by_hand(u, fn):
    """Out-of-place hook on the source site applying ``fn(flat, u)`` to the flattened activation."""
    def hook(act, hook):
        flat = act.reshape(*act.shape[:2], -1).double()
        return fn(flat, u.double().to(flat.device)).to(act.dtype).reshape(act.shape)

    return hook


def _metric(logits):
    return logits[0, -1, 3] - logits[0, -1, 5]


# --------------------------------------------------------------------------------------------
# 1. in-place and out-of-place tutorial hooks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("site", ["v", "resid_post"])
def test_in_place_tutorial_hooks_act_like_out_of_place(model, site):
    """TL's tutorial hook ``a[:, pos] = clean[hook.name][:, pos]; return a`` and ``a.zero_()`` (returning None)."""
    axis = _axis(model, site=site, layers=(0,))
    name = bl.hookpoints.axis_hook_name(site, 0)
    clean_toks, corrupt_toks = _tokens(model, 1), _tokens(model, 2)
    u = axis.axes_[0]
    with torch.no_grad(), bl.attach(model, axis=axis):
        _, clean = model.run_with_cache(clean_toks, names_filter=name)
        corrupted = model(corrupt_toks)

        def in_place(a, hook):
            a[:, 2] = clean[hook.name][:, 2]
            return a

        def out_of_place(a, hook):
            b = a.clone()
            b[:, 2] = clean[hook.name][:, 2]
            return b

        def zero_none(a, hook):
            a.zero_()

        got_in = model.run_with_hooks(corrupt_toks, fwd_hooks=[(name, in_place)])
        got_out = model.run_with_hooks(corrupt_toks, fwd_hooks=[(name, out_of_place)])
        got_zero = model.run_with_hooks(corrupt_toks, fwd_hooks=[(name, zero_none)])
        got_mul = model.run_with_hooks(corrupt_toks, fwd_hooks=[(name, lambda a, hook: 0 * a)])
    with torch.no_grad():
        c_clean = clean[name][0, 2, 0].double()
        pos_mask = torch.zeros(1, SEQ, 1, dtype=torch.float64)
        pos_mask[:, 2] = 1.0
        by_hand = model.run_with_hooks(corrupt_toks, fwd_hooks=[(_source(model, 0, site), _by_hand(
            u, lambda v, u: v + pos_mask * (c_clean - v @ u)[..., None] * u))])
        removal = model.run_with_hooks(corrupt_toks, fwd_hooks=[(_source(model, 0, site), _by_hand(
            u, lambda v, u: v - (v @ u)[..., None] * u))])
    assert (got_in - got_out).abs().max() <= 1e-6
    assert (got_in - by_hand).abs().max() <= 1e-5
    assert (got_in - corrupted).abs().max() > 1e-4  # the edit did something
    assert (got_zero - got_mul).abs().max() <= 1e-6
    assert (got_zero - removal).abs().max() <= 1e-5
    assert (got_zero - corrupted).abs().max() > 1e-4


# --------------------------------------------------------------------------------------------
# 2. transformer_lens.patching on bayes_lens points; 7. TL short names
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("site", ["v", "resid_post"])
def test_tl_generic_activation_patch_grid_matches_by_hand(model, site):
    from transformer_lens import patching

    axis = _axis(model, site=site)
    short = f"{site}_axis"
    clean_toks, corrupt_toks = _tokens(model, 3), _tokens(model, 4)
    n_layers = int(model.cfg.n_layers)
    with bl.attach(model, axis=axis, entropies=False):
        with torch.no_grad():
            _, clean = model.run_with_cache(clean_toks)
            base = float(_metric(model(corrupt_toks)))
        grid = patching.generic_activation_patch(model, corrupt_toks, clean, _metric, patching.layer_pos_patch_setter,
                                                 short, index_axis_names=("layer", "pos"))
        # TL's short-name resolution finds the points
        assert torch.equal(clean[short, 0], clean[bl.hookpoints.axis_hook_name(site, 0)])
        assert clean.stack_activation(short).shape == (n_layers, 1, SEQ, 1)
    # by hand, out of place, on TL's own source hook point
    by_hand = torch.zeros(n_layers, SEQ)
    with torch.no_grad():
        for layer in range(n_layers):
            u = axis.axes_[layer]
            c_clean = clean[short, layer][0, :, 0].double()
            for pos in range(SEQ):
                sel = torch.zeros(1, SEQ, 1, dtype=torch.float64)
                sel[:, pos] = 1.0
                fn = _by_hand(u, lambda v, u, sel=sel, cc=c_clean: v + sel * (cc[None, :] - v @ u)[..., None] * u)
                by_hand[layer, pos] = float(_metric(model.run_with_hooks(
                    corrupt_toks, fwd_hooks=[(_source(model, layer, site), fn)])))
    assert grid.shape == (n_layers, SEQ)
    torch.testing.assert_close(grid.float(), by_hand, atol=1e-4, rtol=0)
    assert (grid - base).abs().max() > 1e-4  # not a grid of no-ops


def test_tl_patching_with_points_attached_and_inside_patched(model):
    """TL 4's patching refuses any submodule in training mode; the points follow eval()/train()."""
    from transformer_lens import patching

    axis = _axis(model, layers=(0,))
    clean_toks, corrupt_toks = _tokens(model, 5), _tokens(model, 6)
    with torch.no_grad():
        _, clean = model.run_with_cache(clean_toks)
    bare = patching.get_act_patch_resid_pre(model, corrupt_toks, clean, _metric)
    with bl.attach(model, axis=axis) as att:
        assert all(not model.get_submodule(n).training for n in att.hook_names)
        attached = patching.get_act_patch_resid_pre(model, corrupt_toks, clean, _metric)
        model.train()
        assert all(model.get_submodule(n).training for n in att.hook_names)
        model.eval()
    with bl.patched(model, axis.removal()):
        inside = patching.get_act_patch_resid_pre(model, corrupt_toks, clean, _metric)
    torch.testing.assert_close(attached, bare, atol=1e-6, rtol=0)
    assert (inside - bare).abs().max() > 1e-5  # the removal is active under TL's patching


# --------------------------------------------------------------------------------------------
# 4. ordering; 8 (part). pos_slice
# --------------------------------------------------------------------------------------------


def test_derived_points_see_edits_of_their_source_and_cache_order(model):
    axis = _axis(model, layers=(0,))
    toks = _tokens(model, 7)
    v0 = hook_name(model, 0, "v")
    with torch.no_grad(), bl.attach(model, axis=axis):
        with model.hooks(fwd_hooks=[(v0, lambda a, hook: 0 * a)]):
            _, cache = model.run_with_cache(toks)
        assert cache["v_axis", 0].abs().max() == 0
        keys = list(cache.keys())
        canonical = model.hook_dict[v0].name  # a bridge also caches the alias, registered last
        assert keys.index(canonical) < keys.index("blocks.0.hook_v_axis")
        pattern0 = hook_name(model, 0, "pattern")
        with model.hooks(fwd_hooks=[(pattern0, lambda a, hook: torch.full_like(a, 0.0).tril() + torch.eye(
                a.shape[-1], dtype=a.dtype))]):
            _, ent = model.run_with_cache(toks, names_filter="blocks.0.hook_pattern_entropy")
        assert ent["blocks.0.hook_pattern_entropy"].abs().max() == 0  # one-hot rows: 0 bits
        # a hook on the source added *after* the patch sees the patched value (TL's registration order)
        with bl.patched(model, axis.removal()):
            _, inside = model.run_with_cache(toks, names_filter=v0)
    flat = inside[v0].reshape(1, SEQ, -1).double()
    assert (flat @ axis.axes_[0].double()).abs().max() < 1e-5
    assert (cache[v0].abs().max() == 0)


def test_pos_slice_cuts_the_position_axis(model):
    toks = torch.cat([_tokens(model, 8), _tokens(model, 9)])
    axis = _axis(model, layers=(1,))
    with torch.no_grad(), bl.attach(model, axis=axis):
        _, full = model.run_with_cache(toks)
        _, last = model.run_with_cache(toks, pos_slice=-1)
    for name in ("blocks.1.hook_pattern_entropy", "blocks.1.hook_v_axis", "hook_next_token_entropy"):
        assert last[name].shape[:2] == (2, 1), name
        torch.testing.assert_close(last[name], full[name][:, -1:])
    assert full["pattern_entropy", 1].shape == (2, SEQ, model.cfg.n_heads)


# --------------------------------------------------------------------------------------------
# 5. backward hooks and retain_grad
# --------------------------------------------------------------------------------------------


def test_backward_hooks_and_retain_grad_give_grad_v_dot_u(model):
    axis = _axis(model, layers=(0,))
    u = axis.axes_[0].double()
    toks = _tokens(model, 10)
    v0 = hook_name(model, 0, "v")
    grads, kept = {}, {}

    def keep(c, hook):
        c.retain_grad()
        kept["c"] = c
        return c

    with bl.attach(model, axis=axis, entropies=False):
        with model.hooks(fwd_hooks=[("blocks.0.hook_v_axis", keep)],
                         bwd_hooks=[("blocks.0.hook_v_axis", lambda g, hook: grads.__setitem__("c", g.detach().clone())),
                                    (v0, lambda g, hook: grads.__setitem__("v", g.detach().clone()))]):
            _metric(model(toks)).backward()
        model.zero_grad(set_to_none=True)
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n in (v0, "blocks.0.hook_v_axis"), incl_bwd=True,
                                        return_type="loss")
        model.zero_grad(set_to_none=True)
    # TL's own backward caching: the coordinate's gradient is the value gradient along u
    by_tl = cache[v0 + "_grad"].reshape(1, SEQ, -1).double() @ u
    torch.testing.assert_close(cache["blocks.0.hook_v_axis_grad"][..., 0].double(), by_tl, atol=1e-6, rtol=1e-5)
    expected = grads["v"].reshape(1, SEQ, -1).double() @ u
    assert grads["c"].shape == (1, SEQ, 1)
    torch.testing.assert_close(grads["c"][..., 0].double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kept["c"].grad[..., 0].double(), expected, atol=1e-6, rtol=1e-5)
    assert expected.abs().max() > 1e-6  # the gradient is not trivially zero


# --------------------------------------------------------------------------------------------
# 6. copies
# --------------------------------------------------------------------------------------------


def test_deepcopy_gives_a_working_attached_copy(model):
    axis = _axis(model, layers=(0,))
    toks = _tokens(model, 11)
    bare_names = sorted(model.hook_dict)
    with torch.no_grad():
        clean = model(toks)
    with bl.attach(model, axis=axis):
        twin = copy.deepcopy(model)
        with torch.no_grad():
            ablated = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: 0 * c)])
            copy_ablated = twin.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: 0 * c)])
            _, copy_cache = twin.run_with_cache(toks, names_filter=lambda n: "axis" in n or "entropy" in n)
            with model.hooks(fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: 0 * c)]):
                copy_while_original_hooked = twin(toks)
    torch.testing.assert_close(copy_ablated, ablated, atol=1e-6, rtol=0)
    assert (ablated - clean).abs().max() > 1e-4
    torch.testing.assert_close(copy_while_original_hooked, clean, atol=1e-6, rtol=0)
    assert "blocks.0.hook_v_axis" in copy_cache and "hook_next_token_entropy" in copy_cache
    bl.detach(twin)
    assert sorted(twin.hook_dict) == bare_names
    assert sorted(model.hook_dict) == bare_names


def _pickles(m) -> object:
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_pickling_works_as_for_the_bare_model(model):
    axis = _axis(model, layers=(0,))
    toks = _tokens(model, 12)
    try:
        _pickles(model)
        bare_error = None
    except Exception as err:  # noqa: BLE001 - what the bare model does is the reference
        bare_error = type(err)
    with bl.attach(model, axis=axis):
        with torch.no_grad():
            ablated = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: 0 * c)])
        if bare_error is not None:
            with pytest.raises(bare_error):
                _pickles(model)
            assert is_bridge(model)  # a HookedTransformer pickles
            return
        loaded = _pickles(model)
    with torch.no_grad():
        again = loaded.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_v_axis", lambda c, hook: 0 * c)])
    torch.testing.assert_close(again, ablated, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------
# 8. SAELens at the same hook (TL 3.x only: sae-lens pins transformer-lens < 4)
# --------------------------------------------------------------------------------------------


def _sae_model():
    sae_lens = pytest.importorskip("sae_lens")
    from sae_lens.saes.sae import SAEMetadata

    base = tiny_model("hooked", gqa=True, rotary=True)
    m = sae_lens.HookedSAETransformer(base.cfg)
    m.load_state_dict(base.state_dict(), strict=False)
    m.tokenizer = base.tokenizer
    m.eval()
    g = torch.Generator().manual_seed(0)

    def sae(hook):
        s = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=m.cfg.d_model, d_sae=16,
                                                            metadata=SAEMetadata(hook_name=hook)))
        with torch.no_grad():
            for p in s.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        return s

    return m, sae


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
@pytest.mark.parametrize("order", ["attach_first", "sae_first"])
def test_sae_at_the_same_hook_is_followed(order):
    m, make_sae = _sae_model()
    sae = make_sae("blocks.1.hook_resid_post")
    axis = _axis(m, site="resid_post", layers=(1,))
    u = axis.axes_[1]
    toks = _tokens(m, 13)
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    if order == "sae_first":
        m.add_sae(sae)
    att = bl.attach(m, axis=axis)
    if order == "attach_first":
        m.add_sae(sae)
    try:
        with torch.no_grad():
            logits, cache = m.run_with_cache(toks)
            ablated = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post_axis", lambda c, hook: 0 * c)])
    finally:
        att.detach()
    with torch.no_grad():
        m.add_sae(sae) if not m.acts_to_saes else None
        by_hand = m.run_with_hooks(toks, fwd_hooks=[(out_name, _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u))])
        sae_only = m(toks)
    assert "blocks.1.hook_resid_post_axis" in cache
    expected = cache[out_name].double() @ u.double()
    torch.testing.assert_close(cache["blocks.1.hook_resid_post_axis"][..., 0].double(), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, sae_only, atol=1e-6, rtol=0)
    torch.testing.assert_close(ablated, by_hand, atol=1e-5, rtol=0)
    assert (ablated - sae_only).abs().max() > 1e-4


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
def test_sae_removed_while_attached_and_sae_at_another_hook():
    m, make_sae = _sae_model()
    axis = _axis(m, site="resid_post", layers=(1,))
    toks = _tokens(m, 14)
    with torch.no_grad(), bl.attach(m, axis=axis):
        m.add_sae(make_sae("blocks.1.hook_resid_post"))
        m.add_sae(make_sae("blocks.0.hook_resid_post"))
        m.reset_saes(["blocks.1.hook_resid_post"])
        _, cache = m.run_with_cache(toks)
    # back on TL's fresh HookPoint; the other SAE and the entropy points share one cache
    expected = cache["blocks.1.hook_resid_post"].double() @ axis.axes_[1].double()
    torch.testing.assert_close(cache["blocks.1.hook_resid_post_axis"][..., 0].double(), expected, atol=1e-5, rtol=0)
    assert "blocks.0.hook_resid_post.hook_sae_acts_post" in cache and "blocks.0.hook_pattern_entropy" in cache


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
@pytest.mark.parametrize("route", ["run_with_hooks", "run_with_hooks_with_saes"])
def test_sae_spliced_after_attach_is_followed_on_the_first_pass(route):
    """Issue 32 §3: TL's run_with_hooks (and SAELens's run_with_hooks_with_saes, which splices the SAE and
    then calls it) runs ``forward`` directly, past any hook on the model itself: the splice must be
    followed on that very pass. The zero-ablated coordinate equals the by-hand removal on hook_sae_output."""
    m, make_sae = _sae_model()
    sae = make_sae("blocks.1.hook_resid_post")
    axis = _axis(m, site="resid_post", layers=(1,))
    u = axis.axes_[1]
    toks = _tokens(m, 15)
    zero = [("blocks.1.hook_resid_post_axis", lambda c, hook: 0 * c)]
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    with torch.no_grad():
        by_hand = m.run_with_hooks_with_saes(
            toks, saes=[sae], fwd_hooks=[(out_name, _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u))])
        sae_only = m.run_with_saes(toks, saes=[sae])
        with bl.attach(m, axis=axis):
            if route == "run_with_hooks":
                m.add_sae(sae)  # no forward pass between the splice and the hooked run
                ablated = m.run_with_hooks(toks, fwd_hooks=zero)
                m.reset_saes()
            else:
                ablated = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=zero)
            again = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=zero)
            bare = m.run_with_hooks(toks, fwd_hooks=zero)  # the SAE is gone again: back on TL's hook point
    assert float((by_hand - sae_only).abs().max()) > 1e-2
    torch.testing.assert_close(ablated, by_hand, atol=1e-5, rtol=0)
    torch.testing.assert_close(again, by_hand, atol=1e-5, rtol=0)
    no_sae = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post",
                                                _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u))])
    torch.testing.assert_close(bare, no_sae, atol=1e-5, rtol=0)


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
def test_analyses_read_a_site_an_sae_replaced_at_its_output():
    """Issue 32 §3: with an SAE already spliced at the axis's source, from_directions, fit and
    compare_patched work (they raised MissingHookError while attach and patched handled the model): the
    site is read, and patched, at the SAE's hook_sae_output, what flows on. Checked against a numpy PCA of
    the cached SAE output and against by-hand hooks on it."""
    m, make_sae = _sae_model()
    m.add_sae(make_sae("blocks.1.hook_resid_post"))
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    prompts = [f"the {w} is {i}" for i, w in enumerate(["cat", "dog", "sun", "moon", "tree", "car", "book", "cup"])]
    fixed = _axis(m, site="resid_post", layers=(1,))  # from_directions
    axis = bl.EntropyAxis(layer=1, site="resid_post", standardize="raw", progress=False).fit(m, prompts)
    toks, mask = bl.adapter.tokenize(m, prompts)
    last = mask.sum(1) - 1
    with torch.no_grad():
        _, cache = m.run_with_cache(toks, attention_mask=mask)
    x = cache[out_name][torch.arange(len(prompts)), last].double().numpy()
    x = x - x.mean(0)
    pc1 = np.linalg.svd(x, full_matrices=False)[2][0]
    assert abs(float(pc1 @ axis.axis_.double().numpy())) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(axis.means_[1].double().numpy(),
                               cache[out_name][torch.arange(len(prompts)), last].double().mean(0).numpy(), atol=1e-5)
    # the random control acts on the site itself (not a coordinate point): at the SAE output too
    control = axis.random_control(seed=0)
    r = control.directions[1].double()
    with torch.no_grad(), bl.patched(m, control):
        got = m(toks, attention_mask=mask)
        want = m.run_with_hooks(toks, attention_mask=mask,
                                fwd_hooks=[(out_name, _by_hand(r, lambda v, u: v - (v @ u)[..., None] * u))])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    cmp = bl.compare_patched(m, prompts, {"fitted": axis.removal(), "given": fixed.removal()}, n_boot=20,
                             n_random_seeds=1, progress=False)
    assert cmp.conditions[:3] == ("clean", "fitted", "given") and len(cmp.conditions) == 4
    assert cmp.corr("clean", 1).value == pytest.approx(axis.entropy_correlation_[1], abs=1e-6)
    assert cmp.corr("fitted", 1).value == 0.0 and cmp.table.query("condition == 'fitted'")["degenerate"].any()


def test_readme_tl_patching_example_runs_on_the_real_model(smol):
    """The TL-patching block of docs/hookpoints.md (linked from the README), as written, on SmolLM2 with the
    quickstart's SULA items and axis."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "hookpoints.md").read_text(encoding="utf-8")
    section = re.search(r"^## Hook points under TransformerLens's own code\s*$(.*?)(?=^## |\Z)", text, re.S | re.M)
    block = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)[0]
    items = bl.sula.make_prompts(smol, n_per_k=12)
    layer = smol.cfg.n_layers // 2
    axis = _axis(smol, layers=(layer,))
    ns = {"bl": bl, "torch": torch, "model": smol, "items": items, "layer": layer, "axis": axis}
    with torch.no_grad():
        exec(compile(block, "docs/hookpoints.md", "exec"), ns)
        corrupted = ns["entropy"](smol(ns["corrupt_toks"]))
    per_pos = ns["per_pos"]
    assert per_pos.shape == (ns["corrupt_toks"].shape[1],)
    assert (per_pos - corrupted).abs().max() > 1e-6  # patching the coordinate changes the entropy somewhere


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
@pytest.mark.parametrize("route", ["run_with_saes", "run_with_hooks_with_saes", "add_sae_first"])
def test_patched_reaches_the_activation_an_sae_replaced(route):
    """bl.patched around SAELens's own calls (the SAE spliced inside run_with_saes / run_with_hooks_with_saes, after the
    block began, or before it with add_sae) removes the axis from what flows on, the SAE's hook_sae_output: the same
    logits as a hook written by hand there, and nothing left on the model or the SAE afterwards."""
    m, make_sae = _sae_model()
    sae = make_sae("blocks.1.hook_resid_post")
    axis = _axis(m, site="resid_post", layers=(1,))
    u = axis.axes_[1]
    toks = _tokens(m, 13)
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    by_hand_fn = _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u)
    with torch.no_grad():
        plain = m.run_with_saes(toks, saes=[sae])
        want = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=[(out_name, by_hand_fn)])
        if route == "add_sae_first":
            m.add_sae(sae)
            try:
                with bl.patched(m, axis.removal()):
                    got = m(toks)
            finally:
                m.reset_saes()
        else:
            with bl.patched(m, axis.removal()):
                got = getattr(m, route)(toks, saes=[sae])
        after = m.run_with_saes(toks, saes=[sae])
    assert (got - plain).abs().max() > 1e-4  # it acted (the release before this fix left it a no-op)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(after, plain, atol=0, rtol=0)  # nothing left behind
    assert not m.embed._forward_pre_hooks


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
@pytest.mark.parametrize("maker", ["fit", "subspace_patch"])
@pytest.mark.parametrize("route", ["add_sae_then_list", "saes_in_the_call"])
def test_a_patch_iterated_where_an_sae_replaced_its_hook_reaches_the_sae_output(route, maker):
    """Issue 52 §3: the docstring's fwd_hooks=list(patch) raised TransformerLens's raw TypeError ('Expected a module
    with add_hook') wherever an SAE sat at the patch's hook point. A patch made on the model names the SAE's
    hook_sae_output when iterated while the SAE is spliced: add_sae, then run_with_hooks(fwd_hooks=list(patch)); or
    run_with_hooks_with_saes(saes=[sae], fwd_hooks=patch), which iterates it after the splice. Both equal a hook
    written by hand at hook_sae_output; the SAE gone, list(patch) is the hook point's own name again."""
    m, make_sae = _sae_model()
    sae = make_sae("blocks.1.hook_resid_post")
    if maker == "fit":
        axis = _axis(m, site="resid_post", layers=(1,))
        patch, u = axis.removal(), axis.axes_[1]
    else:
        u = torch.nn.functional.normalize(torch.randn(m.cfg.d_model, generator=torch.Generator().manual_seed(3)),
                                          dim=0)
        patch = bl.ablation.subspace_patch(m, 1, u[:, None].numpy(), site="resid_post")
    toks = _tokens(m, 19)
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    remove = _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u)
    with torch.no_grad():
        plain = m.run_with_saes(toks, saes=[sae])
        want = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=[(out_name, remove)])
        if route == "add_sae_then_list":
            m.add_sae(sae)
            try:
                assert [n for n, _ in patch] == [out_name] == [patch[0][0]]
                got = m.run_with_hooks(toks, fwd_hooks=list(patch))
            finally:
                m.reset_saes()
        else:
            got = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=patch)
            with pytest.raises(TypeError, match="add_hook"):  # a list made before the call splices the SAE
                m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=list(patch))
        after = m.run_with_saes(toks, saes=[sae])
        no_sae = m.run_with_hooks(toks, fwd_hooks=list(patch))
        by_hand_no_sae = m.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post", remove)])
    assert (got - plain).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(after, plain, atol=0, rtol=0)  # nothing left behind
    assert list(patch) == list(zip(patch.hook_names, [fn for _, fn in patch]))  # back on the hook point's name
    torch.testing.assert_close(no_sae, by_hand_no_sae, atol=1e-5, rtol=0)


@pytest.mark.skipif(not has_hooked_transformer(), reason="SAELens needs TransformerLens 3.x")
@pytest.mark.parametrize("route", ["run_with_hooks_with_saes", "add_sae_then_run_with_hooks", "sae_elsewhere"])
def test_patch_pairs_reach_an_sae_replaced_hook_in_plain_sae_lens_calls(route):
    """Issue 52 §3: model.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=list(patch)) raises TypeError inside
    TransformerLens (the SAE's wrapper sits at the patch's hook name and has no add_hook) before any bayes_lens code
    runs; patch.pairs(model, saes=[sae]) names the SAE's hook_sae_output instead and gives the logits of a hook
    written by hand there - the SAE spliced by SAELens inside the call, or before it with add_sae (then
    patch.pairs(model) finds it) - and, with the SAE at another hook, the same pairs as list(patch)."""
    m, make_sae = _sae_model()
    axis = _axis(m, site="resid_post", layers=(1,))
    patch = axis.removal()
    u = axis.axes_[1]
    toks = _tokens(m, 17)
    remove = _by_hand(u, lambda v, u: v - (v @ u)[..., None] * u)
    if route == "sae_elsewhere":
        sae = make_sae("blocks.0.hook_resid_post")
        assert patch.pairs(m, saes=[sae]) == list(patch)
        with torch.no_grad():
            got = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=patch.pairs(m, saes=[sae]))
            want = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=[("blocks.1.hook_resid_post", remove)])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        return
    sae = make_sae("blocks.1.hook_resid_post")
    out_name = "blocks.1.hook_resid_post.hook_sae_output"
    with torch.no_grad():
        plain = m.run_with_saes(toks, saes=[sae])
        want = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=[(out_name, remove)])
        with pytest.raises(TypeError, match="add_hook"):  # TL's own error on the replaced name: why pairs() exists
            m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=list(patch))
        if route == "add_sae_then_run_with_hooks":
            m.add_sae(sae)
            try:
                pairs = patch.pairs(m)
                got = m.run_with_hooks(toks, fwd_hooks=pairs)
            finally:
                m.reset_saes()
        else:
            pairs = patch.pairs(m, saes=[sae])
            got = m.run_with_hooks_with_saes(toks, saes=[sae], fwd_hooks=pairs)
        after = m.run_with_saes(toks, saes=[sae])
    assert [n for n, _ in pairs] == [out_name]
    assert (got - plain).abs().max() > 1e-4
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(after, plain, atol=0, rtol=0)  # nothing left behind
    with pytest.raises(bl.BayesLensError, match="saes="):
        patch.pairs(m, saes=["not an sae"])
