"""Tests of bayes_lens.collect: batched, padded, mask-aware collection against unpadded references."""

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

import bayes_lens as bl
from bayes_lens.adapter import hook_name, tokenize
from bayes_lens.collect import Batch, collect, forward_batches
from bayes_lens.reduced import ReducedCache

PROMPTS = [
    "the cat is a dog",
    "a bird",
    "the moon and the river and the stone and the lamp",
    "apple chair cloud",
    "the house is a tree",
]


def _alone(model, prompt):
    """Unpadded single-prompt reference: (cache, logits) from TransformerLens itself."""
    toks, _ = tokenize(model, [prompt])
    with torch.inference_mode():
        logits, cache = model.run_with_cache(toks)
    return cache, logits[0, -1]


@pytest.mark.parametrize("side", ["right", "left"])
def test_collect_matches_unpadded_references(tiny, side):
    col = collect(tiny, PROMPTS, value_layers="all", resid_layers=[-1], attention=True,
                  token_ids=[5, 7], batch_size=3, padding_side=side, progress=False)
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    kv_dim = tiny.cfg.n_key_value_heads * tiny.cfg.d_head
    assert col.attention_entropy_bits().shape == (len(PROMPTS), n_layers, n_heads)
    for i, p in enumerate(PROMPTS):
        cache, last_logits = _alone(tiny, p)
        for layer in range(n_layers):
            v = cache[hook_name(tiny, layer, "v")][0, -1].reshape(-1)
            assert col.value_rows(layer).shape == (len(PROMPTS), kv_dim)
            torch.testing.assert_close(col.value_rows(layer)[i], v.float(), atol=1e-5, rtol=1e-4)
            pat = cache[hook_name(tiny, layer, "pattern")][0, :, -1].double().numpy()  # [heads, k]
            ref = scipy_entropy(pat, base=2, axis=-1)
            np.testing.assert_allclose(col.attention_entropy_bits()[i, layer].numpy(), ref, atol=1e-5)
        r = cache[hook_name(tiny, -1, "resid_post")][0, -1]
        torch.testing.assert_close(col.value_rows(n_layers - 1, "resid_post")[i], r.float(), atol=1e-4, rtol=1e-4)
        probs = torch.softmax(last_logits.double(), -1).numpy()
        assert col.next_token_entropy_bits()[i].item() == pytest.approx(scipy_entropy(probs, base=2), abs=1e-5)
        np.testing.assert_allclose(col.token_logprobs()[i].numpy(), np.log(probs[[5, 7]]), atol=1e-5)
        assert int(col.n_tokens[i]) == tokenize(tiny, [p])[0].shape[1]


def test_attention_positions_all_is_mean_over_real_query_rows(tiny):
    col = collect(tiny, PROMPTS, attention=True, attention_positions="all", batch_size=5,
                  padding_side="left", progress=False)
    for i, p in enumerate(PROMPTS):
        cache, _ = _alone(tiny, p)
        for layer in range(tiny.cfg.n_layers):
            pat = cache[hook_name(tiny, layer, "pattern")][0].double().numpy()  # [h, q, k]
            ref = np.mean([scipy_entropy(pat[:, q, : q + 1], base=2, axis=-1) for q in range(pat.shape[1])], axis=0)
            np.testing.assert_allclose(col.attention_entropy_bits()[i, layer].numpy(), ref, atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_invariance_alone_vs_batched(tiny, side):
    short = "the cat"
    batch = [PROMPTS[2], short, PROMPTS[0] + " " + PROMPTS[2]]
    kw = dict(value_layers="all", attention=True, progress=False, padding_side=side)
    alone = collect(tiny, [short], **kw)
    batched = collect(tiny, batch, batch_size=3, **kw)
    for layer in alone.layers("v"):
        torch.testing.assert_close(batched.value_rows(layer)[1], alone.value_rows(layer)[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batched.attention_entropy_bits()[1], alone.attention_entropy_bits()[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batched.next_token_entropy_bits()[1], alone.next_token_entropy_bits()[0], atol=1e-5, rtol=1e-4)


def test_merge_of_shards_equals_one_run(tiny):
    kw = dict(value_layers=[-1], resid_layers=[0], attention=True, token_ids=[3], batch_size=2, progress=False)
    whole = collect(tiny, PROMPTS, **kw)
    merged = ReducedCache.merge([collect(tiny, PROMPTS[:2], **kw), collect(tiny, PROMPTS[2:], **kw)])
    assert merged.n_prompts == whole.n_prompts == len(PROMPTS)
    for layer in whole.layers("v"):
        torch.testing.assert_close(merged.value_rows(layer), whole.value_rows(layer), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(merged.attention_entropy_bits(), whole.attention_entropy_bits(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(merged.token_logprobs(), whole.token_logprobs(), atol=1e-5, rtol=1e-4)
    assert torch.equal(merged.n_tokens, whole.n_tokens)
    other = collect(tiny, PROMPTS[:2], value_layers=[0], progress=False)
    with pytest.raises(bl.InvalidInputError, match="cannot merge"):
        ReducedCache.merge([whole, other])
    with pytest.raises(bl.InvalidInputError):
        ReducedCache.merge([])


@pytest.mark.parametrize("side", ["right", "left"])
def test_forward_batches_fields(tiny, side):
    batches = list(forward_batches(tiny, PROMPTS, batch_size=2, padding_side=side, progress=False, logits="all"))
    assert [b.indices.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    for b in batches:
        assert isinstance(b, Batch) and b.logits.dtype == torch.float32
        assert b.logits.shape[:2] == b.tokens.shape == b.attention_mask.shape
        lengths = b.attention_mask.sum(1)
        expect = lengths - 1 if side == "right" else torch.full_like(lengths, b.tokens.shape[1] - 1)
        assert torch.equal(b.last_index, expect)
        assert not b.logits.requires_grad
    # the final logits of a padded row equal the prompt's unpadded logits
    _, ref = _alone(tiny, PROMPTS[1])
    torch.testing.assert_close(batches[0].final_logits()[1], ref.float(), atol=1e-4, rtol=1e-4)
    # logits="final" (the default) computes the unembedding at the final real token only: same numbers
    final = list(forward_batches(tiny, PROMPTS, batch_size=2, padding_side=side, progress=False))
    for f, b in zip(final, batches):
        assert f.logits.shape == (b.tokens.shape[0], b.logits.shape[-1])
        torch.testing.assert_close(f.final_logits(), b.final_logits(), atol=1e-5, rtol=1e-5)


def test_run_order_batches_keep_each_prompt_and_its_global_number(tiny):
    """order=run_order(prompts): batches of similar length, each row the prompt its index names (as
    tokenized alone, with its own logits), fewer pad positions; collect runs that order and returns
    every row in the prompts' order, also to a per-batch hook factory (global numbers)."""
    prompts = ["a", PROMPTS[2], "the", PROMPTS[2] + " and a dog", "cat", PROMPTS[0], "moon"]
    order = bl.collect.run_order(prompts)
    assert [len(prompts[i]) for i in order] == sorted(len(p) for p in prompts)
    assert bl.collect.run_order([prompts[i] for i in order]) == list(range(len(prompts)))  # stable: a fixed point
    batches = list(forward_batches(tiny, prompts, batch_size=2, progress=False, order=order, start_index=10))
    assert [i - 10 for b in batches for i in b.indices.tolist()] == order
    for b in batches:
        for row, i in enumerate(b.indices.tolist()):
            alone = tokenize(tiny, [prompts[i - 10]])[0][0]
            assert torch.equal(b.tokens[row, : len(alone)], alone) and int(b.attention_mask[row].sum()) == len(alone)
            torch.testing.assert_close(b.final_logits()[row], _alone(tiny, prompts[i - 10])[1].float(), atol=1e-4, rtol=1e-4)
    as_given = list(forward_batches(tiny, prompts, batch_size=2, progress=False))
    assert [b.indices.tolist() for b in as_given] == [[0, 1], [2, 3], [4, 5], [6]]
    assert sum(b.tokens.numel() for b in batches) < sum(b.tokens.numel() for b in as_given)
    with pytest.raises(bl.InvalidInputError, match="permutation"):
        next(forward_batches(tiny, prompts, order=[0, 0, 1, 2, 3, 4, 5]))
    seen = []

    def factory(batch):
        seen.append(batch.indices.tolist())
        return []

    col = collect(tiny, prompts, value_layers=[0], token_ids=[3], batch_size=2, fwd_hooks=factory, progress=False)
    assert [i for b in seen for i in b] == order
    for i, p in enumerate(prompts):
        one = collect(tiny, [p], value_layers=[0], token_ids=[3], progress=False)
        torch.testing.assert_close(col.value_rows(0)[i], one.value_rows(0)[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(col.token_logprobs()[i], one.token_logprobs()[0], atol=1e-5, rtol=1e-4)
    assert col.n_tokens.tolist() == [tokenize(tiny, [p])[0].shape[1] for p in prompts]
    assert col.indices.tolist() == list(range(len(prompts)))


def test_bad_input_errors(tiny):
    with pytest.raises(bl.InvalidInputError, match="empty"):
        collect(tiny, [], value_layers=[-1], progress=False)
    with pytest.raises(bl.InvalidInputError, match="single string"):
        collect(tiny, "the cat", progress=False)
    with pytest.raises(bl.TokenizationError, match="context"):
        collect(tiny, ["the cat"] + ["the" * 400], value_layers=[-1], progress=False)
    with pytest.raises(bl.LayerIndexError, match="out of range"):
        collect(tiny, PROMPTS, value_layers=[tiny.cfg.n_layers], progress=False)
    with pytest.raises(bl.InvalidInputError, match="batch_size"):
        list(forward_batches(tiny, PROMPTS, batch_size=0))
    with pytest.raises(bl.InvalidInputError, match="padding_side"):
        list(forward_batches(tiny, PROMPTS, padding_side="middle"))
    with pytest.raises(bl.InvalidInputError, match="attention_positions"):
        collect(tiny, PROMPTS, attention=True, attention_positions="first", progress=False)
    with pytest.raises(bl.InvalidInputError, match="token_ids"):
        collect(tiny, PROMPTS, token_ids=[10 ** 7], progress=False)


def test_non_finite_activations_raise_and_hooks_are_removed(tiny):
    name = hook_name(tiny, -1, "v")

    def poison_for(batch):  # NaN in the row of prompt 3 only, wherever the runner batches it
        def poison(v, hook=None):
            rows = (batch.indices == 3).nonzero().flatten()
            if len(rows):
                v = v.clone()
                v[rows.to(v.device)] = float("nan")
            return v
        return [(name, poison)]

    with pytest.raises(bl.NonFiniteError, match=r"prompt\(s\) \[3\]"):
        collect(tiny, PROMPTS, value_layers=[-1], fwd_hooks=poison_for, batch_size=2, progress=False)
    # the poison hook was removed on the error: the same run without it is clean
    col = collect(tiny, PROMPTS, value_layers=[-1], batch_size=2, progress=False)
    assert torch.isfinite(col.value_rows(tiny.cfg.n_layers - 1)).all()


def test_user_hooks_run_before_metric_hooks(tiny):
    """A patch passed in fwd_hooks is what the metric hooks read (ablation relies on this)."""
    name = hook_name(tiny, 0, "v")
    col = collect(tiny, PROMPTS, value_layers=[0], fwd_hooks=[(name, lambda v, hook=None: v * 0 + 2.0)],
                  progress=False)
    assert torch.all(col.value_rows(0) == 2.0)


def test_smol_gqa_and_padding_invariance(smol):
    prompts = ["The capital of France is", "Hi", "def f(x):\n    return x * 2\n\nprint(f("]
    kw = dict(value_layers=[0, -1], attention=True, progress=False)
    right = collect(smol, prompts, padding_side="right", **kw)
    left = collect(smol, prompts, padding_side="left", **kw)
    alone = collect(smol, prompts[1:2], **kw)
    assert right.value_rows(29).shape == (3, 3 * 64)
    assert right.attention_entropy_bits().shape == (3, 30, 9)
    for col in (right, left):
        for layer in (0, 29):
            torch.testing.assert_close(col.value_rows(layer)[1], alone.value_rows(layer)[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(col.attention_entropy_bits()[1], alone.attention_entropy_bits()[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(col.next_token_entropy_bits()[1], alone.next_token_entropy_bits()[0], atol=1e-4, rtol=1e-4)


def test_collect_reads_hook_dict_once_per_model_and_still_refuses_a_missing_one(tiny, monkeypatch):
    # issue 24: on a TL 3.9 bridge every hook_dict / hook_names() read rebuilds all aliases (~15 ms on SmolLM2):
    # the runner reads the name table once per model, and never the slow full list when every name resolves
    slow, reads = [], []
    real_names, real_read = bl.adapter.hook_names, bl.adapter.HookResolver._read
    from bayes_lens.adapter import _hooks as hooks_facet  # where check_hooks looks hook_names up

    for owner in (bl.adapter, hooks_facet):
        monkeypatch.setattr(owner, "hook_names", lambda m: slow.append(1) or real_names(m))
    monkeypatch.setattr(bl.adapter.HookResolver, "_read", lambda self: reads.append(1) or real_read(self))
    tiny.__dict__.pop(hooks_facet._NAME_TABLE, None)
    prompts = PROMPTS * 2
    col = collect(tiny, prompts, value_layers=[-1], attention=True, batch_size=2, progress=False)
    assert -(-len(prompts) // 2) >= 3 and len(reads) == 1 and not slow
    assert col.attention_entropy_bits().shape[0] == len(prompts)
    again = collect(tiny, prompts, value_layers=[-1], attention=True, batch_size=2, progress=False)
    assert len(reads) == 1 and not slow
    assert torch.equal(again.attention_entropy_bits(), col.attention_entropy_bits())
    # a name the model lacks, added per batch, is still refused by name before any forward pass
    ran = []
    with pytest.raises(bl.MissingHookError, match=r"blocks\.0\.hook_nonexistent"):
        collect(tiny, prompts, value_layers=[-1], batch_size=2, progress=False,
                fwd_hooks=lambda batch: [("blocks.0.hook_nonexistent", lambda act, hook=None: ran.append(1))])
    assert not ran


def test_reduced_cache_constructor_checks_its_counts():
    """Issue 32: ReducedCache accepted 2-D or negative n_tokens and indices of the wrong length."""
    rows = {"final_rows.v.0": torch.zeros(3, 4)}
    ok = ReducedCache(rows, n_tokens=[3, 1, 2], indices=[5, 6, 7])
    assert ok.n_tokens.dtype == torch.long and ok.indices.tolist() == [5, 6, 7]
    for kw, match in [(dict(n_tokens=torch.ones(3, 1, dtype=torch.long)), "n_tokens must be 1-D"),
                      (dict(n_tokens=[3, -1, 2]), "n_tokens must be non-negative"),
                      (dict(n_tokens=[3, 1.5, 2]), "n_tokens must hold whole numbers"),
                      (dict(n_tokens=["a", "b", "c"]), "n_tokens must be a 1-D tensor"),
                      (dict(n_tokens=[3, 1, 2], indices=[0, 1]), "indices has 2 entries but n_tokens 3"),
                      (dict(n_tokens=[3, 1, 2], indices=[[0, 1, 2]]), "indices must be 1-D"),
                      (dict(n_tokens=[3, 1, 2], indices=[0, -1, 2]), "indices must be non-negative")]:
        with pytest.raises(bl.InvalidInputError, match=match):
            ReducedCache(rows, **kw)


def test_reduced_cache_save_checks_its_metadata(tiny, tmp_path):
    """Issue 32: rc.save accepted non-string metadata (stored as str() of it) and an override of "format"
    (the file then claimed another format)."""
    rc = collect(tiny, PROMPTS, value_layers=[-1], progress=False)
    for meta, match in [({"k": 3}, "dict of strings to strings"), ({1: "x"}, "dict of strings to strings"),
                        (["k"], "dict of strings to strings"), ({"format": "mine/9"}, r"may not set \['format'\]"),
                        ({"attention_positions": "all"}, "may not set"), ({"metadata_sha256": "0"}, "may not set")]:
        with pytest.raises(bl.InvalidInputError, match=match):
            rc.save(tmp_path / "rc.safetensors", meta)
    assert not (tmp_path / "rc.safetensors").exists()
    rc.save(tmp_path / "rc.safetensors", {"note": "kept"})
    assert torch.equal(ReducedCache.load(tmp_path / "rc.safetensors")["final_rows.v.1"],
                       rc["final_rows.v.1"])


def test_earlier_releases_hook_name_keys_still_read(tmp_path):
    """Reduced-cache keys are read keys now; the hook-name keys of earlier releases read with a
    DeprecationWarning, and a file saved with them (format /1) loads under today's keys."""
    import warnings

    from bayes_lens._files import save_checked_safetensors
    from bayes_lens.reduced import canonical_key

    g = torch.Generator().manual_seed(0)
    old = {"blocks.2.attn.hook_v": torch.randn(3, 4, generator=g), "blocks.2.hook_resid_post": torch.randn(3, 5, generator=g),
           "blocks.0.hook_pattern_entropy": torch.rand(3, 2, dtype=torch.float64, generator=g),
           "hook_next_token_entropy": torch.rand(3, dtype=torch.float64, generator=g),
           "hook_token_logprobs": torch.randn(3, 2, dtype=torch.float64, generator=g)}
    new = {"final_rows.v.2": "blocks.2.attn.hook_v", "final_rows.resid_post.2": "blocks.2.hook_resid_post",
           "attention_entropy.all.0": "blocks.0.hook_pattern_entropy", "next_token_entropy": "hook_next_token_entropy",
           "token_logprobs": "hook_token_logprobs"}
    assert {canonical_key(o, "all") for o in old} == set(new)
    path = save_checked_safetensors(tmp_path / "old.safetensors",
                                    {**old, "n_tokens": torch.tensor([3, 1, 2]), "indices": torch.arange(3)},
                                    {"attention_positions": "all", "format": "bayes-lens-reduced-cache/1"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading an old file is not deprecated: it just reads
        rc = ReducedCache.load(path)
        part = ReducedCache.load(path, names=["blocks.2.attn.hook_v"])
    assert set(rc) == set(new) and rc.attention_positions == "all" and list(part) == ["final_rows.v.2"]
    for key, legacy in new.items():
        assert torch.equal(rc[key], old[legacy]) and legacy in rc
        with pytest.warns(DeprecationWarning, match=f"{legacy!r} is now {key!r}"):
            assert torch.equal(rc[legacy], old[legacy])
    torch.testing.assert_close(rc.attention_entropy_bits(), old["blocks.0.hook_pattern_entropy"][:, None])
    with pytest.warns(DeprecationWarning, match="is now 'final_rows.v.2'"):
        built = ReducedCache({"blocks.2.attn.hook_v": old["blocks.2.attn.hook_v"]}, n_tokens=[3, 1, 2])
    assert list(built) == ["final_rows.v.2"]
    with pytest.raises(KeyError, match="not in this reduced cache"):
        rc["blocks.7.attn.hook_v"]
    with pytest.raises(bl.InvalidInputError, match="attention_positions='last' but the attention entropies held"):
        ReducedCache({"attention_entropy.all.0": old["blocks.0.hook_pattern_entropy"]}, n_tokens=[3, 1, 2],
                     attention_positions="last")
