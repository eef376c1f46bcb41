"""Every analysis from a standard TransformerLens cache equals the streaming path (≤ 1e-6).

A user runs ``model.run_with_cache(tokens, attention_mask=mask, names_filter=f)`` (the full cache, or
one filtered by ``bl.hook_filter``) and hands the ``(logits, cache)`` pair to the analyses; the
streaming path runs the same prompts through the runner. One batch of right-padded prompts on both
sides, so the forward passes are the same computation.
"""

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.adapter import tokenize

TEXTS = [
    "the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp",
    "cloud chair", "the moon is a cloud", "dog cat bird tree", "apple",
]
FAST = dict(n_boot=100, seed=0)
TOL = 1e-6


def _pair(model, texts, names_filter=None, **kw):
    toks, mask = tokenize(model, texts)
    with torch.inference_mode():
        logits, cache = model.run_with_cache(toks, attention_mask=mask, names_filter=names_filter, **kw)
    return (logits, cache), toks, mask


def _close(a, b, tol=TOL):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    assert np.allclose(a, b, atol=tol, equal_nan=True), float(np.nanmax(np.abs(a - b)))


@pytest.mark.parametrize("filtered", [False, True])
def test_geometry_metrics_from_full_and_filtered_caches(tiny, filtered):
    stream = bl.geometry(tiny, TEXTS, batch_size=len(TEXTS), n_null=20, n_perm=100, progress=False, **FAST)
    pair, toks, mask = _pair(tiny, TEXTS, bl.hook_filter() if filtered else None)
    for kw in (dict(attention_mask=mask), dict(tokens=toks)):
        vm = bl.value_manifold(pair, n_null=20, **kw, **FAST)
        af = bl.attention_focusing(pair, **kw, **FAST)
        ea = bl.entropy_alignment(pair, n_perm=100, **kw, **FAST)
        geo = bl.geometry(pair, n_null=20, n_perm=100, **kw, **FAST)
        for got in (vm, geo.value_manifold):
            _close(got.pc1.value, stream.value_manifold.pc1.value)
            _close(got.pc12.ci, stream.value_manifold.pc12.ci)
            _close(got.participation_ratio.value, stream.value_manifold.participation_ratio.value, 1e-5)
        for got in (af, geo.attention_focusing):
            _close(got.layer_entropy_bits, stream.attention_focusing.layer_entropy_bits)
            _close(got.reduction.value, stream.attention_focusing.reduction.value)
        for got in (ea, geo.entropy_alignment):
            _close(got.spearman.value, stream.entropy_alignment.spearman.value)
            _close(got.pearson.ci, stream.entropy_alignment.pearson.ci)
            _close(got.entropy_bits, stream.entropy_alignment.entropy_bits)


def test_attention_from_the_small_pattern_entropy_hook_point(tiny):
    stream = bl.attention_focusing(tiny, TEXTS, batch_size=len(TEXTS), progress=False, **FAST)
    stream_all = bl.attention_focusing(tiny, TEXTS, positions="all", batch_size=len(TEXTS), progress=False, **FAST)
    with bl.attach(tiny):
        pair, toks, mask = _pair(tiny, TEXTS, bl.hook_filter(sites=("pattern_entropy",)))
    assert not any(k.endswith("hook_pattern") for k in pair[1].keys())
    _close(bl.attention_focusing(pair, tokens=toks, **FAST).layer_entropy_bits, stream.layer_entropy_bits)
    _close(bl.attention_focusing(pair, tokens=toks, positions="all", **FAST).layer_entropy_bits,
           stream_all.layer_entropy_bits)


def test_sula_evaluate_from_a_cache(tiny):
    items = bl.sula.make_prompts(tiny, ks=(0, 1, 2, 4), n_per_k=4, seed=1, p=0.8, prior=0.3)
    stream = bl.sula.evaluate(tiny, items, layer=-1, batch_size=len(items), progress=False, **FAST)
    pair, toks, mask = _pair(tiny, items.texts, bl.hook_filter(tiny, layers=[-1], sites=("v",)))
    cached = bl.sula.evaluate(pair, items, layer=-1, attention_mask=mask, **FAST)
    for col in ("mae_bits", "mae_bits_ci_low", "pearson", "ece", "brier", "bayes_ece", "label_mass",
                "mae_ignore_evidence_bits"):
        _close(cached.table[col], stream.table[col])
    _close(cached.model_p_first, stream.model_p_first)
    _close(cached.geometry["pearson"], stream.geometry["pearson"], 1e-5)
    with pytest.raises(bl.InvalidInputError, match="SULA items"):
        bl.sula.evaluate(pair)


def _axis_arrays(model, prompts, layers, batch_size):
    """Final-token values ({layer: [n, d]}) and the next-token entropy, read by plain TL hooks and numpy."""
    from types import SimpleNamespace

    texts = list(getattr(prompts, "texts", prompts))
    toks, mask = tokenize(model, texts)
    names = [f"blocks.{k}.attn.hook_v" for k in layers]
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, attention_mask=mask, names_filter=lambda n: n in names)
    last = mask.sum(1) - 1  # right padding
    rows = torch.arange(len(texts))
    values = {k: cache[f"blocks.{k}.attn.hook_v"][rows, last].flatten(1).double().numpy() for k in layers}
    p = torch.softmax(logits[rows, last].double(), -1).numpy()
    if hasattr(prompts, "labels"):  # SULA items: the entropy over the two labels, renormalized
        ids = list(bl.sula.label_token_ids(model, prompts.labels))
        p = p[:, ids] / p[:, ids].sum(-1, keepdims=True)
    return SimpleNamespace(values=values, model_entropy=-(p * np.log2(np.where(p > 0, p, 1))).sum(-1))


def test_entropy_axis_fit_from_model_cache_and_arrays(tiny):
    items = bl.sula.make_prompts(tiny, ks=(0, 1, 2, 4), n_per_k=4, seed=2)
    # SULA items (label entropy) at the last layer; plain strings (next-token entropy) at two layers
    for prompts, layer, texts in ((items, [-1], items.texts), (TEXTS, [0, -1], TEXTS)):
        layers = [k % tiny.cfg.n_layers for k in layer]
        a = bl.EntropyAxis(layer=layer, progress=False, batch_size=len(texts)).fit(tiny, prompts)
        pair, toks, mask = _pair(tiny, texts, bl.hook_filter(sites=("v",)))
        b = bl.EntropyAxis(layer=layer).fit(pair, prompts, attention_mask=mask)
        data = _axis_arrays(tiny, prompts, layers, len(texts))
        c = bl.EntropyAxis(layer=layer).fit(data.values, data.model_entropy, model=tiny)
        for other in (b, c):
            for k in layers:
                _close(other.axes_[k], a.axes_[k])
                _close(other.sigma_[k], a.sigma_[k], 1e-5)
        assert b.entropy_kind_ == a.entropy_kind_ and c.entropy_kind_ == "given"
    assert a.entropy_kind_ == "next_token"
    # arrays without a model: non-negative layers only
    d = bl.EntropyAxis(layer=1).fit(data.values[1], data.model_entropy)
    _close(d.axis_, a.axes_[1])
    with pytest.raises(bl.LayerIndexError, match="model="):
        bl.EntropyAxis(layer=-1).fit(data.values[1], data.model_entropy)
    with pytest.raises(bl.InvalidInputError, match="entropy"):
        bl.EntropyAxis(layer=1).fit(data.values[1], data.model_entropy[:-1])


def test_compare_patched_from_caches_equals_streaming(tiny):
    items = bl.sula.make_prompts(tiny, ks=(0, 1, 2, 4), n_per_k=4, seed=3)
    axis = bl.EntropyAxis(layer=1, progress=False, batch_size=len(items)).fit(tiny, items)
    stream = bl.compare_patched(tiny, items, {"removed": axis.removal()}, n_random_seeds=2, n_boot=100,
                                batch_size=len(items), progress=False)
    f = bl.hook_filter(tiny, layers=[1], sites=("v",))
    clean, toks, mask = _pair(tiny, items.texts, f)
    with bl.patched(tiny, axis.removal()):
        removed, _, _ = _pair(tiny, items.texts, f)
    rand = []
    for s in range(2):
        with bl.patched(tiny, axis.random_control(seed=s)):
            rand.append(_pair(tiny, items.texts, f)[0])
    group = next(c for c in stream.conditions if c.startswith("random"))
    cached = bl.compare_patched(items, clean=clean, patched={"removed": removed, group: rand}, axis=axis,
                                attention_mask=mask, n_boot=100)
    assert cached.conditions == stream.conditions
    assert cached.readout_layers == stream.readout_layers
    for cond in stream.conditions:
        for layer in stream.readout_layers:
            _close(cached.corr(cond, layer).value, stream.corr(cond, layer).value)
            _close(cached.corr(cond, layer).ci, stream.corr(cond, layer).ci)
        _close(cached.calibration_value(cond).value, stream.calibration_value(cond).value)
        if cond != "clean":
            _close(cached.calibration_delta(cond).ci, stream.calibration_delta(cond).ci)
    # typed accessors: unknown condition is a clear error, not a silently missing number
    with pytest.raises(bl.InvalidInputError, match="unknown condition"):
        stream.corr("axis removed", 1)
    with pytest.raises(bl.InvalidInputError, match="clean="):
        bl.compare_patched(items, clean=clean)


def test_cache_forms_dict_grad_logits_and_errors(tiny):
    stream = bl.value_manifold(tiny, TEXTS, batch_size=len(TEXTS), n_null=20, progress=False, **FAST)
    (logits, cache), toks, mask = _pair(tiny, TEXTS, bl.hook_filter())
    # a plain dict of tensors with model=, and an ActivationCache with logits=
    _close(bl.value_manifold(dict(cache.items()), model=tiny, attention_mask=mask, n_null=20, **FAST).pc1.value,
           stream.pc1.value)
    ea = bl.entropy_alignment(cache, logits=logits.clone().requires_grad_(True), attention_mask=mask, n_perm=50,
                              **FAST)
    assert np.isfinite(ea.spearman.value)
    with pytest.raises(bl.InvalidInputError, match="model="):
        bl.value_manifold(dict(cache.items()), attention_mask=mask, **FAST)
    # a padded batch without mask or tokens is refused (reading pads as tokens changes every number)
    with pytest.raises(bl.InvalidInputError, match="tokens="):
        bl.value_manifold((logits, cache), **FAST)
    # a cache made with remove_batch_dim=True is refused, not read as if positions were prompts
    one, _ = tokenize(tiny, TEXTS[:1])
    with torch.inference_mode():
        _, flat = tiny.run_with_cache(one, names_filter=bl.hook_filter(), remove_batch_dim=True)
    with pytest.raises(bl.InvalidInputError, match="remove_batch_dim"):
        bl.value_manifold(flat, **FAST)
    # a missing hook names itself and the names_filter to use
    with torch.inference_mode():
        _, only_pattern = tiny.run_with_cache(toks, attention_mask=mask, names_filter=lambda n: n.endswith("pattern"))
    with pytest.raises(bl.MissingHookError, match=r"hook_v.*hook_filter"):
        bl.value_manifold(only_pattern, attention_mask=mask, **FAST)


def test_mask_from_tokens_matches_the_runner_mask(tiny):
    toks, mask = tokenize(tiny, TEXTS)
    assert torch.equal(bl.adapter.mask_from_tokens(tiny, toks), mask)
    left, lmask = tokenize(tiny, TEXTS, padding_side="left")
    assert torch.equal(bl.adapter.mask_from_tokens(tiny, left, padding_side="left"), lmask)


def test_missing_hook_error_says_what_the_cache_holds(tiny):
    """Issue 37.5: "the cache has no X" also says which hook names, at which layers, the cache does hold,
    so the fix (a wider names_filter, or another layer=) is visible at once."""
    import re

    toks, mask = tokenize(tiny, TEXTS)
    n = tiny.cfg.n_layers
    with torch.inference_mode():
        _, cache = tiny.run_with_cache(toks, attention_mask=mask,
                                       names_filter=lambda name: name == f"blocks.{n - 1}.attn.hook_v")
    held = [k for k in cache.keys()]   # on a bridge, the alias and the canonical name of the one activation
    assert held and all(k.startswith(f"blocks.{n - 1}.") for k in held)
    with pytest.raises(bl.MissingHookError) as info:
        bl.value_manifold(cache, layer=0, attention_mask=mask, **FAST)
    msg = str(info.value)
    assert "the cache has no 'blocks.0.attn.hook_v'" in msg
    said = re.search(r"\(it holds (.*?)\); make it with", msg).group(1)
    assert said.split(", ") == [f"blocks.{{{n - 1}}}.{k.split('.', 2)[2]}" for k in held]
    # several layers are shown as ranges; an empty cache says so
    assert bl.adapter.cache_contents({f"blocks.{k}.attn.hook_v": 0 for k in (0, 1, 2, 5)} | {"hook_embed": 0}) == \
        "blocks.{0-2,5}.attn.hook_v, hook_embed"
    assert bl.adapter.cache_contents({}) == "nothing"
    many = {f"hook_{i}": 0 for i in range(10)}
    assert bl.adapter.cache_contents(many).endswith("hook_7 and 2 more")
