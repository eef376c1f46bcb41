"""Unit and integration tests of the model adapter (bayes_lens.adapter)."""

import pytest
import torch

import bayes_lens as bl
from bayes_lens.adapter import (
    check_hooks, hook_name, key_weights, model_info, processing, resolve_layer, resolve_layers, tokenize,
)
from bayes_lens.models.tiny import tiny_model


def test_resolve_layer_negative_and_out_of_range():
    assert resolve_layer(30, -1) == 29
    assert resolve_layer(30, 0) == 0
    with pytest.raises(bl.LayerIndexError, match="out of range"):
        resolve_layer(30, 30)
    with pytest.raises(bl.LayerIndexError):
        resolve_layer(30, -31)
    with pytest.raises(bl.LayerIndexError):
        resolve_layer(30, 1.5)


def test_resolve_layers_variants(tiny):
    assert resolve_layers(tiny, "all") == [0, 1]
    assert resolve_layers(tiny, [-1, 0, 1]) == [0, 1]
    with pytest.raises(bl.LayerIndexError):
        resolve_layers(tiny, [])


@pytest.mark.parametrize("gqa", [True, False])
def test_model_info_and_key_weights_are_per_kv_head(tiny_kind, gqa):
    model = tiny_model(tiny_kind, gqa=gqa)
    info = model_info(model)
    assert info.n_heads == 4 and info.n_kv_heads == (2 if gqa else 4)
    assert info.d_head == 16 and info.d_model == 64 and info.kind == tiny_kind
    w = key_weights(model, -1)
    assert w.shape == (info.n_kv_heads, 64, 16)
    # no repeated copies: every KV head's matrix is distinct
    for i in range(info.n_kv_heads):
        for j in range(i + 1, info.n_kv_heads):
            assert not torch.allclose(w[i], w[j])


def test_key_weights_match_hook_k(tiny):
    """W_K read by the adapter reproduces the model's own (pre-rotary) keys at hook_k."""
    toks, mask = tokenize(tiny, ["the cat is a dog"])
    name = hook_name(tiny, 0, "k")
    _, cache = tiny.run_with_cache(toks, names_filter=lambda n: n in (name, "blocks.0.hook_resid_pre"))
    k = cache[name][0]  # [pos, n_kv, d_head]
    resid = cache["blocks.0.hook_resid_pre"][0]  # [pos, d_model]
    ln = tiny.blocks[0].ln1
    gain = ln.w if hasattr(ln, "w") and isinstance(ln.w, torch.Tensor) else ln.original_component.weight
    x = resid / torch.sqrt(resid.pow(2).mean(-1, keepdim=True) + 1e-5) * gain.detach()
    w = key_weights(tiny, 0)
    pred = torch.einsum("pd,hde->phe", x, w)
    assert torch.allclose(pred, k, atol=1e-4)


def test_hook_names_exist_on_both_kinds(tiny):
    names = [hook_name(tiny, l, s) for l in (0, -1) for s in ("v", "k", "pattern", "resid_post", "resid_pre")]
    check_hooks(tiny, names)
    with pytest.raises(bl.MissingHookError, match="no hook point"):
        check_hooks(tiny, ["blocks.0.attn.hook_nonexistent"])
    with pytest.raises(bl.InvalidInputError):
        hook_name(tiny, 0, "nonsense")


def test_processing_detects_raw_and_folded(tiny_kind):
    model = tiny_model(tiny_kind)
    assert processing(model) == (False, "raw weights")


@pytest.mark.skipif(not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TL 3.x")
def test_processing_detects_folded_layer_norm():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=8, d_vocab=10,
                                  act_fn="gelu", normalization_type="LNPre")
    processed, how = processing(HookedTransformer(cfg))
    assert processed and "folded" in how


@pytest.mark.skipif(not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TL 3.x")
def test_processing_detects_centred_writing_weights_on_a_large_vocabulary():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=8, d_vocab=10_001,
                                  act_fn="gelu", normalization_type="LN", seed=0)
    model = HookedTransformer(cfg)
    assert processing(model) == (False, "raw weights")
    with torch.no_grad():
        model.embed.W_E -= model.embed.W_E.mean(-1, keepdim=True)  # what center_writing_weights does
    processed, how = processing(model)
    assert processed and how == "writing weights centred"
    with torch.no_grad():
        model.embed.W_E[0] += 1.0  # a (sampled) row off-centre: not centred
    assert processing(model) == (False, "raw weights")


def test_bridge_compatibility_mode_is_processed():
    model = tiny_model("bridge", gqa=True)
    model.enable_compatibility_mode(disable_warnings=True)
    assert processing(model)[0] is True


def test_tokenize_pads_and_masks(tiny):
    prompts = ["the cat", "a dog is the tree house"]
    for side in ("left", "right"):
        toks, mask = tokenize(tiny, prompts, padding_side=side)
        assert toks.shape == mask.shape and toks.shape[0] == 2
        assert mask.sum(1).tolist() == [len(tiny.tokenizer(p)["input_ids"]) for p in prompts]
        if side == "left":
            assert mask[0, -1] == 1 and mask[0, 0] == 0
        else:
            assert mask[0, 0] == 1 and mask[0, -1] == 0


@pytest.mark.parametrize("bad,match", [([], "empty"), ([""], "empty string"), ("text", "not one string"),
                                       ([3], "expected a string")])
def test_tokenize_bad_input(tiny, bad, match):
    with pytest.raises(bl.InvalidInputError, match=match):
        tokenize(tiny, bad)


def test_tokenize_too_long(tiny):
    with pytest.raises(bl.TokenizationError, match="context"):
        tokenize(tiny, ["the " * 400])


def test_not_a_model():
    with pytest.raises(bl.InvalidInputError, match="TransformerLens model"):
        model_info(object())


def test_final_token_unembedding_gives_the_full_runs_final_logits(tiny):
    """Inside the block the model returns [batch, 1, vocab]: the full run's logits at each row's final real token."""
    from bayes_lens.adapter import final_token_unembedding, tokenize

    toks, mask = tokenize(tiny, ["the cat is a dog", "moon", "a bird is"])
    last = mask.sum(1) - 1  # right padding
    with torch.inference_mode():
        full = tiny(toks, attention_mask=mask)
        with final_token_unembedding(tiny, last):
            final = tiny(toks, attention_mask=mask)
        after = tiny(toks, attention_mask=mask)
    assert final.shape == (3, 1, full.shape[-1])
    assert torch.allclose(final[:, 0], full[torch.arange(3), last], atol=1e-6, rtol=0)
    assert torch.equal(after, full)  # slicing and the TL Unembed forward are undone on exit
    assert "forward" not in vars(tiny.unembed)


def test_final_token_unembedding_undoes_itself_on_error(tiny_kind):
    from bayes_lens.adapter import final_token_unembedding

    m = tiny_model(tiny_kind)
    before = dict(m.unembed._forward_pre_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        with final_token_unembedding(m, torch.tensor([0])):
            raise RuntimeError("boom")
    assert dict(m.unembed._forward_pre_hooks) == before and "forward" not in vars(m.unembed)


def test_has_hooks_sees_tl_hooks_plain_torch_hooks_and_backward_hooks():
    from transformer_lens.hook_points import HookPoint

    from bayes_lens.adapter import has_hooks

    hp = HookPoint()
    assert not has_hooks(hp)
    hp.add_hook(lambda a, hook: None)
    assert has_hooks(hp) and has_hooks(hp, "fwd") and not has_hooks(hp, "bwd")
    hp.remove_hooks("fwd")
    assert not has_hooks(hp)
    handle = hp.register_forward_hook(lambda m, i, o: None)  # a plain PyTorch hook: HookPoints run it too
    assert has_hooks(hp, "fwd") and not has_hooks(hp, "bwd")
    handle.remove()
    hp.add_hook(lambda g, hook: None, dir="bwd")
    assert has_hooks(hp, "bwd") and not has_hooks(hp, "fwd") and has_hooks(hp)


@pytest.mark.parametrize("site,match", [("hook_v", "pass site='v'"), ("hook_resid_post", "pass site='resid_post'"),
                                        (["v"], "a single string"), ("k", r"one of \['v', 'resid_post'\]"),
                                        (3, "got 3")])
def test_check_site_is_the_one_site_check(site, match):
    from bayes_lens.adapter import VECTOR_SITES, check_site
    from bayes_lens.errors import InvalidInputError

    assert [check_site(s) for s in VECTOR_SITES] == list(VECTOR_SITES)
    with pytest.raises(InvalidInputError, match=match):
        check_site(site)
    with pytest.raises(InvalidInputError, match=match):
        bl.EntropyAxis(layer=0, site=site).fit({0: torch.zeros(4, 3)}, torch.arange(4.0))


def test_hook_resolver_follows_a_hook_point_replaced_after_its_table_was_read(tiny_kind):
    # the name table is read once per model (issue 24); a point swapped since (as SAELens splices) is not served stale
    from transformer_lens.hook_points import HookPoint

    from bayes_lens.adapter import HookResolver, added_hooks, hook_name

    model = tiny_model(tiny_kind, gqa=True, rotary=True)
    name = hook_name(model, 0, "resid_post")
    old = HookResolver(model)(name)
    parent, attr = old.name.rsplit(".", 1)
    new = HookPoint()
    new.name = old.name
    setattr(model.get_submodule(parent), attr, new)
    assert HookResolver(model)(name) is new
    seen = []
    with added_hooks(model, [(name, lambda act, hook=None: seen.append(act.shape))]):
        model(torch.tensor([[1, 2, 3]]))
    assert seen == [torch.Size([1, 3, model.cfg.d_model])]
    with pytest.raises(bl.MissingHookError, match="hook_nonexistent"):
        HookResolver(model)("blocks.0.hook_nonexistent")


# ------------------------------------------------------------------ running the blocks after a layer


def _kept_and_whole(model, layer, texts, later=None):
    """(tokens, mask, the stream after ``layer``, whole-pass logits, the whole pass's resid_post at ``later``)
    from one plain TransformerLens run_with_hooks (no bayes_lens runner)."""
    from bayes_lens.adapter import encode_prompts, pad_batch

    toks, mask = pad_batch(model, encode_prompts(model, texts), padding_side="right")
    kept = {}
    hooks = [(hook_name(model, layer, "resid_post"), lambda a, hook: kept.__setitem__("x", a.detach().clone()))]
    if later is not None:
        hooks.append((hook_name(model, later, "resid_post"), lambda a, hook: kept.__setitem__("y", a.detach().clone())))
    with torch.inference_mode():
        logits = model.run_with_hooks(toks, attention_mask=mask, fwd_hooks=hooks, return_type="logits")
    return toks, mask, kept["x"], logits, kept.get("y")


_TEXTS = ["The cat sat on the mat and", "2 + 2 =", "A longer prompt with several words in it, to pad the rest"]


@pytest.mark.parametrize("layer", [0, 1])
def test_run_from_layer_equals_the_whole_pass_and_skips_the_earlier_blocks(tiny, layer):
    """adapter.run_from_layer from the stream kept after ``layer`` gives TransformerLens's whole-pass logits at every
    real position (right padding), fires the later blocks' hooks with the whole pass's values, and does not run the
    earlier blocks' attention (on both bridges too: their own start_at_layer runs them or is absent)."""
    from bayes_lens.adapter import run_from_layer

    n = model_info(tiny).n_layers
    later = layer + 1 if layer + 1 < n else None
    toks, mask, x, whole, y = _kept_and_whole(tiny, layer, _TEXTS, later)
    seen, attn = {}, []
    handles = [tiny.blocks[j].attn.register_forward_pre_hook(lambda m, a, j=j: attn.append(j)) for j in range(n)]
    try:
        hooks = [] if later is None else [(hook_name(tiny, later, "resid_post"),
                                           lambda a, hook: seen.__setitem__("y", a.detach().clone()))]
        with torch.inference_mode(), bl.adapter.added_hooks(tiny, hooks):
            got = run_from_layer(tiny, x, layer, toks, mask)
    finally:
        for h in handles:
            h.remove()
    real = mask.bool()
    torch.testing.assert_close(got[real], whole[real], atol=1e-5, rtol=1e-5)
    assert attn == list(range(layer + 1, n))
    if later is not None:
        torch.testing.assert_close(seen["y"][real], y[real], atol=1e-5, rtol=1e-5)
    # an edited stream: the result is the whole pass with that edit hooked at the layer (TL's own hook route)
    bump = torch.zeros_like(x)
    bump[:, :, 0] = 3.0
    with torch.inference_mode():
        edited = tiny.run_with_hooks(toks, attention_mask=mask, return_type="logits",
                                     fwd_hooks=[(hook_name(tiny, layer, "resid_post"), lambda a, hook: a + bump)])
        mine = run_from_layer(tiny, x + bump, layer, toks, mask)
    torch.testing.assert_close(mine[real], edited[real], atol=1e-5, rtol=1e-5)


def test_run_from_layer_puts_every_block_back_when_a_hook_raises(tiny):
    """A hook that raises inside the resumed forward leaves no block passing its input on afterwards."""
    from bayes_lens.adapter import run_from_layer

    toks, mask, x, whole, _ = _kept_and_whole(tiny, 0, _TEXTS)

    def boom(a, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), torch.inference_mode(), \
            bl.adapter.added_hooks(tiny, [(hook_name(tiny, 1, "resid_post"), boom)]):
        run_from_layer(tiny, x, 0, toks, mask)
    for block in tiny.blocks:
        inner = getattr(block, "original_component", None)
        assert inner is None or "forward" not in vars(inner)
    with torch.inference_mode():
        again = tiny(toks, attention_mask=mask, return_type="logits")
    torch.testing.assert_close(again[mask.bool()], whole[mask.bool()])
