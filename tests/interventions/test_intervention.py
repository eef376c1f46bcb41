"""bl.interventions.Intervention: its TransformerLens pairs against hooks written by hand here, on every model kind;
its spec, digest and renumbering; the runner applying lists of them (whole and resumed passes)."""

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.errors import InvalidInputError
from bayes_lens.interventions import Intervention, orthonormal

KINDS = ["hooked", "bridge"]
TEXTS = ["w1: dax, w2: wug. query:", "the cat sat on a mat", "one two three four"]


def _model(kind):
    if kind == "hooked":
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:
            pytest.skip("HookedTransformer is TransformerLens 3.x only")
    return bl.models.tiny.tiny_model(kind)


def _tokens(model):
    # equal-length prompts: without a runner's batch "final" is the tensor's last position
    toks = model.to_tokens(TEXTS[1:2] * 3)
    return toks


def _by_hand(op, h, B, s, src, positions):
    """The operation table's formula, written out with torch on [b, pos, d] float64, at ``positions``."""
    h = h.double()
    out = h.clone()
    P = B @ B.T if B is not None else None
    pos = range(h.shape[1]) if positions == "all" else [h.shape[1] - 1] if positions == "final" else positions
    for b in range(h.shape[0]):
        r = None if src is None else (src[b] if src.ndim == 2 else src)
        for t in pos:
            x = h[b, t]
            if op == "remove":
                y = x - s * (P @ x)
            elif op == "mean" or op == "resample":
                y = x - s * (P @ (x - r))
            elif op == "swap":
                y = x + s * (P @ (r - x))
            elif op == "shift":
                y = x + s * (B[:, 0] if r is None else r)
            else:  # keep_only
                y = P @ x if r is None else r + P @ (x - r)
            out[b, t] = y
    return out


CASES = [("remove", "all", 1.0, None), ("remove", "final", 0.5, None), ("mean", "all", 1.0, "fixed"),
         ("resample", "all", 1.0, "rows"), ("swap", "final", 1.0, "rows"), ("swap", "all", 0.5, "fixed"),
         ("shift", "final", 2.0, None), ("shift", "all", 1.0, "rows"), ("keep_only", "all", 1.0, None),
         ("keep_only", (1, 2), 1.0, "fixed")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op,positions,strength,source", CASES)
def test_pairs_equal_a_hand_written_hook_in_plain_transformer_lens(kind, op, positions, strength, source):
    """model.run_with_hooks(toks, fwd_hooks=iv.pairs(model)) - no bayes_lens runner, nothing attached - gives the
    logits of a hook written here from the formula, at resid_post and at hook_v (flattened over KV heads)."""
    model = _model(kind)
    toks = _tokens(model)
    rng = np.random.default_rng(3)
    for site, hook in (("resid_post", "blocks.0.hook_resid_post"), ("v", "blocks.0.attn.hook_v")):
        d = model.cfg.d_model if site == "resid_post" else bl.adapter.model_info(model).kv_dim
        B = orthonormal(rng.normal(size=(d, 2)))
        src = None if source is None else rng.normal(size=d) if source == "fixed" else rng.normal(size=(3, d))
        basis = None if (op == "shift" and src is not None) else (B[:, :1] if op == "shift" else B)
        iv = Intervention(layer=0, site=site, basis=basis, op=op, positions=positions, source=src, strength=strength)
        Bt = None if basis is None else torch.tensor(np.asarray(iv.basis, dtype=np.float64))
        St = None if src is None else torch.tensor(np.asarray(iv.source, dtype=np.float64))

        def by_hand(act, hook=None):
            flat = act.reshape(act.shape[0], act.shape[1], -1)
            return _by_hand(op, flat, Bt, strength, St, positions).to(act.dtype).reshape(act.shape)

        with torch.inference_mode():
            got = model.run_with_hooks(toks, fwd_hooks=iv.pairs(model))
            want = model.run_with_hooks(toks, fwd_hooks=[(hook, by_hand)])
            clean = model(toks)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
        assert not torch.allclose(got, clean, atol=1e-4), (op, site)  # it did something
        assert iv.pairs(model)[0][0] in (hook, bl.adapter.hook_name(model, 0, site))


@pytest.mark.parametrize("kind", KINDS)
def test_the_runner_applies_a_prompt_restricted_list_by_batch(kind):
    """collect(..., interventions=[a, b]) with a on prompts {0, 2} and b on {1}: each prompt gets its own, in the
    runner's length-sorted, padded batches - equal to a hand hook that knows the batch's prompt numbers."""
    model = _model(kind)
    texts = TEXTS
    d = model.cfg.d_model
    rng = np.random.default_rng(0)
    B1, B2 = orthonormal(rng.normal(size=(d, 1))), orthonormal(rng.normal(size=(d, 3)))
    donors = rng.normal(size=(3, d))
    a = Intervention(layer=1, site="resid_post", basis=B1, op="remove", prompts=[0, 2])
    b = Intervention(layer=1, site="resid_post", basis=B2, op="swap", positions="final", source=donors, prompts=[1])
    got = bl.collect.collect(model, texts, resid_layers=[1], interventions=[a, b], batch_size=2, progress=False)

    def factory(batch):
        def fn(act, hook=None):
            out = act.clone()
            for r, i in enumerate(batch.indices.tolist()):
                if i in (0, 2):
                    P = torch.tensor(B1 @ B1.T, dtype=act.dtype)
                    out[r] = act[r] - act[r] @ P
                else:
                    t = int(batch.last_index[r])
                    P = torch.tensor(B2 @ B2.T, dtype=act.dtype)
                    x = act[r, t]
                    out[r, t] = x + (torch.tensor(donors[i], dtype=act.dtype) - x) @ P
            return out
        return [("blocks.1.hook_resid_post", fn)]

    want = bl.collect.collect(model, texts, resid_layers=[1], fwd_hooks=factory, batch_size=2, progress=False)
    torch.testing.assert_close(got["final_rows.resid_post.1"], want["final_rows.resid_post.1"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.next_token_entropy_bits(), want.next_token_entropy_bits(), atol=1e-5, rtol=1e-5)


def test_spec_round_trips_and_the_digest_names_every_field():
    d = 8
    B = orthonormal(np.random.default_rng(0).normal(size=(d, 2)))
    src = np.random.default_rng(1).normal(size=(5, d))
    iv = Intervention(layer=2, site="v", basis=B, op="swap", positions="final", source=src, strength=0.5,
                      prompts=[1, 3], label="x")
    import json

    back = Intervention.from_spec(json.loads(json.dumps(iv.spec())))
    assert back.digest() == iv.digest() and back.label == "x"
    assert np.array_equal(back.basis, iv.basis) and np.array_equal(back.source, iv.source)
    changed = [iv.with_(strength=1.0), iv.with_(positions="all"), iv.with_(prompts=[1]), iv.with_(layer=1),
               iv.with_(source=src + 1e-3), iv.with_(basis=orthonormal(B[:, ::-1] + 1e-3)), iv.with_(op="resample"),
               iv.with_(site="resid_post")]
    assert len({c.digest() for c in changed} | {iv.digest()}) == len(changed) + 1
    assert iv.with_(label="other").digest() == iv.digest()  # a label is a name, not what it does


def test_renumbered_follows_the_prompts_into_another_order():
    d = 4
    src = np.arange(5 * d, dtype=float).reshape(5, d)
    iv = Intervention(layer=0, site="resid_post", basis=np.eye(d)[:, :1], op="resample", source=src, prompts=[0, 3])
    order = [3, 0, 4, 1, 2]  # run position j holds prompt order[j]
    r = iv.renumbered(order)
    assert np.array_equal(r.source, src[order])
    assert r.prompts.tolist() == [0, 1]  # prompts 3 and 0 now run at positions 0 and 1


def test_bad_interventions_are_refused_with_the_fix():
    d = 6
    with pytest.raises(InvalidInputError, match="orthonormal"):
        Intervention(layer=0, site="resid_post", basis=np.ones((d, 2)))
    with pytest.raises(InvalidInputError, match="dependent columns"):
        orthonormal(np.ones((d, 2)))
    with pytest.raises(InvalidInputError, match="needs source"):
        Intervention(layer=0, site="resid_post", basis=np.eye(d)[:, :1], op="mean")
    with pytest.raises(InvalidInputError, match="op"):
        Intervention(layer=0, site="resid_post", basis=np.eye(d)[:, :1], op="zero")
    with pytest.raises(InvalidInputError, match="non-negative"):
        Intervention(layer=-1, site="resid_post", basis=np.eye(d)[:, :1])
    with pytest.raises(InvalidInputError, match="positions"):
        Intervention(layer=0, site="resid_post", basis=np.eye(d)[:, :1], positions="last")
    with pytest.raises(InvalidInputError, match="finite"):
        Intervention(layer=0, site="resid_post", basis=np.full((d, 1), np.nan))
    model = bl.models.tiny.tiny_model("bridge")
    iv = Intervention(layer=5, site="resid_post", basis=np.eye(model.cfg.d_model)[:, :1])
    with pytest.raises(InvalidInputError, match="layers"):
        bl.collect.collect(model, TEXTS, interventions=[iv], progress=False)
    with pytest.raises(InvalidInputError, match="dimension"):
        bl.collect.collect(model, TEXTS, interventions=[Intervention(layer=0, site="resid_post", basis=np.eye(d)[:, :1])],
                           progress=False)
    with pytest.raises(InvalidInputError, match="Intervention objects"):
        bl.collect.collect(model, TEXTS, interventions=["remove"], progress=False)


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_equals_the_whole_pass(kind):
    """collect(..., resume=kept) from the clean pass's kept stream after layer 0 gives the whole pass's numbers
    on every kind (the bridges by passing blocks 0..L's input on, adapter.run_from_layer)."""
    model = _model(kind)
    d = model.cfg.d_model
    iv = Intervention(layer=0, site="resid_post", basis=orthonormal(np.random.default_rng(2).normal(size=(d, 2))))
    keeper = bl.collect.StreamKeeper(model, [0])
    clean = bl.collect.collect(model, TEXTS, token_ids=[1, 2], fwd_hooks=keeper, progress=False)
    kept = keeper.stream(0, len(TEXTS))
    why = kept.check([1, 2], clean.token_logprobs().double().numpy())
    assert why is None  # every kind resumes, both bridges included
    whole = bl.collect.collect(model, TEXTS, token_ids=[1, 2], resid_layers=[1], interventions=[iv], progress=False)
    resumed = bl.collect.collect(model, TEXTS, token_ids=[1, 2], resid_layers=[1], interventions=[iv], resume=kept,
                                 progress=False)
    torch.testing.assert_close(resumed.token_logprobs(), whole.token_logprobs(), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(resumed["final_rows.resid_post.1"], whole["final_rows.resid_post.1"], atol=2e-5,
                               rtol=1e-5)
    with pytest.raises(InvalidInputError, match="below"):
        early = Intervention(layer=0, site="v", basis=np.eye(bl.adapter.model_info(model).kv_dim)[:, :1])
        bl.collect.collect(model, TEXTS, interventions=[early], resume=kept, progress=False)


# ------------------------------------------------------------------ per-prompt positions

PER_PROMPT = ((1, 3), (), (0, 2, 4))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op,source", [("remove", None), ("resample", "rows"), ("mean", "fixed")])
def test_per_prompt_positions_equal_a_hand_written_hook(kind, op, source):
    """positions=((1, 3), (), (0, 2, 4)) edits exactly those positions of prompts 0, 1 (none) and 2: plain
    model.run_with_hooks with iv.pairs(model) equals a hook written here that edits only them, at resid_post and
    hook_v; through the runner (length-sorted, padded batches, prompts renumbered by Batch.indices) too."""
    model = _model(kind)
    toks = _tokens(model)
    rng = np.random.default_rng(5)
    for site, hook in (("resid_post", "blocks.0.hook_resid_post"), ("v", "blocks.0.attn.hook_v")):
        d = model.cfg.d_model if site == "resid_post" else bl.adapter.model_info(model).kv_dim
        B = orthonormal(rng.normal(size=(d, 2)))
        src = None if source is None else rng.normal(size=d) if source == "fixed" else rng.normal(size=(3, d))
        iv = Intervention(layer=0, site=site, basis=B, op=op, positions=PER_PROMPT, source=src)
        Bt = torch.tensor(B)
        St = None if src is None else torch.tensor(np.asarray(iv.source, dtype=np.float64))

        def by_hand(act, hook=None):
            flat = act.reshape(act.shape[0], act.shape[1], -1).double()
            out = flat.clone()
            for b, ps in enumerate(PER_PROMPT):
                r = None if St is None else (St[b] if St.ndim == 2 else St)
                for t in ps:
                    x = flat[b, t]
                    out[b, t] = x - Bt @ (Bt.T @ x) if r is None else x - Bt @ (Bt.T @ (x - r))
            return out.to(act.dtype).reshape(act.shape)

        with torch.inference_mode():
            got = model.run_with_hooks(toks, fwd_hooks=iv.pairs(model))
            want = model.run_with_hooks(toks, fwd_hooks=[(hook, by_hand)])
            clean = model(toks)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], clean[1], atol=1e-6, rtol=0)  # prompt 1 has no positions: untouched
        assert not torch.allclose(got[0], clean[0], atol=1e-4)
        torch.testing.assert_close(got[0, :1], clean[0, :1], atol=1e-6, rtol=0)  # before its first position: clean
    # the runner: prompts of other lengths in sorted batches, each prompt's own positions by its number
    texts = TEXTS
    d = model.cfg.d_model
    B = orthonormal(rng.normal(size=(d, 2)))
    iv = Intervention(layer=0, site="resid_post", basis=B, op="remove", positions=PER_PROMPT)
    got = bl.collect.collect(model, texts, resid_layers=[1], interventions=[iv], batch_size=2, progress=False)

    def factory(batch):
        def fn(act, hook=None):
            out = act.clone()
            P = torch.tensor(B @ B.T, dtype=act.dtype)
            for r, i in enumerate(batch.indices.tolist()):
                for t in PER_PROMPT[i]:
                    out[r, t] = act[r, t] - act[r, t] @ P
            return out
        return [("blocks.0.hook_resid_post", fn)]

    want = bl.collect.collect(model, texts, resid_layers=[1], fwd_hooks=factory, batch_size=2, progress=False)
    torch.testing.assert_close(got.next_token_entropy_bits(), want.next_token_entropy_bits(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["final_rows.resid_post.1"], want["final_rows.resid_post.1"], atol=1e-5, rtol=1e-5)
    clean = bl.collect.collect(model, texts, resid_layers=[1], batch_size=2, progress=False)
    assert not torch.allclose(got.next_token_entropy_bits(), clean.next_token_entropy_bits(), atol=1e-5)


def test_per_prompt_positions_spec_digest_renumbered_and_refusals():
    """The per-prompt form survives spec/from_spec (same digest), differs in digest from the shared form and from
    other positions, follows the prompts through renumbered(), and is refused when malformed or out of range."""
    d = 8
    B = orthonormal(np.random.default_rng(0).normal(size=(d, 2)))
    iv = Intervention(layer=0, site="resid_post", basis=B, positions=[[3, 1, 1], [], np.array([2])])
    assert iv.positions == ((1, 3), (), (2,))
    back = Intervention.from_spec(iv.spec())
    assert back.positions == iv.positions and back.digest() == iv.digest()
    import json

    assert Intervention.from_spec(json.loads(json.dumps(iv.spec()))).digest() == iv.digest()
    assert iv.digest() != iv.with_(positions=((1, 3), (), (4,))).digest()
    assert Intervention(layer=0, site="resid_post", basis=B, positions=((1, 3),)).digest() != \
        Intervention(layer=0, site="resid_post", basis=B, positions=(1, 3)).digest()
    assert iv.renumbered([2, 0]).positions == ((2,), (1, 3))
    assert len(iv.renumbered([1]).prompts) == 0  # a shard holding only prompt 1 changes nothing
    assert "per-prompt" in repr(iv)
    with pytest.raises(InvalidInputError, match="mixes"):
        Intervention(layer=0, site="resid_post", basis=B, positions=[1, (2, 3)])
    with pytest.raises(InvalidInputError, match="no position"):
        Intervention(layer=0, site="resid_post", basis=B, positions=[(), ()])
    with pytest.raises(InvalidInputError, match="non-negative|each per-prompt position"):
        Intervention(layer=0, site="resid_post", basis=B, positions=[(-1,)])
    act = torch.zeros(3, 4, d)
    with pytest.raises(InvalidInputError, match="position 9"):
        Intervention(layer=0, site="resid_post", basis=B, positions=((9,), (), ())).apply(act)
    with pytest.raises(InvalidInputError, match="per-prompt positions for 3 prompts"):
        iv.apply(torch.zeros(1, 4, d), indices=[5])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [2, 64])
def test_stacked_conditions_equal_one_whole_pass_each(kind, rows):
    """collect_each over a kept stream (conditions stacked up to ``rows`` rows a pass; the final-position swaps on
    one position where the kind's key-value cache allows) equals one whole patched collect per condition: the
    answers' log-probabilities and a later layer's final rows."""
    from bayes_lens.collect import StreamKeeper, collect, collect_each

    model = _model(kind)
    d = model.cfg.d_model
    rng = np.random.default_rng(3)
    texts = TEXTS + ["a b c d e f g", "w1: wug. query:", "x"]
    keeper = StreamKeeper(model, [0])
    collect(model, texts, token_ids=[1, 2], fwd_hooks=keeper, batch_size=4, progress=False)
    kept = keeper.stream(0, len(texts))
    donors = torch.tensor(rng.normal(size=(len(texts), d)), dtype=torch.float32)
    removals = [[Intervention(layer=0, site="resid_post", basis=orthonormal(rng.normal(size=(d, k))))] for k in (1, 2, 3)]
    swaps = [[Intervention(layer=0, site="resid_post", basis=orthonormal(rng.normal(size=(d, k))), op="swap",
                           positions="final", source=donors)] for k in (1, 2, 3)]
    reads = [bl.reads.FinalRows(1, "resid_post")]
    got = collect_each(model, texts, removals, resume=kept, token_ids=[1, 2], reads=reads, batch_size=4, rows=rows,
                       progress=False)
    got_s = collect_each(model, texts, swaps, resume=kept, token_ids=[1, 2], batch_size=4, rows=rows, progress=False)
    assert kept.final_position_ok()  # every kind: TL's frozen cache, or the bridge's transformers cache
    for conds, outs, rd in ((removals, got, reads), (swaps, got_s, None)):
        for c, rc in zip(conds, outs):
            ref = collect(model, texts, token_ids=[1, 2], reads=rd, interventions=c, batch_size=4, progress=False)
            torch.testing.assert_close(rc.token_logprobs(), ref.token_logprobs(), atol=2e-5, rtol=1e-5)
            if rd:
                torch.testing.assert_close(rc.value_rows(1, "resid_post"), ref.value_rows(1, "resid_post"),
                                           atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_final_position_route_runs_every_prompt_length_of_a_batch_in_one_call(kind):
    """Prompts of different lengths (a one-token prompt among them) share one prefix cache and one final-position
    call per batch, each row masked to its own prefix: the last block runs once per batch (rows given), and
    every swap's log-probabilities equal a whole patched pass per condition (TransformerLens's hooks)."""
    from bayes_lens.collect import StreamKeeper, collect, collect_each

    model = _model(kind)
    d = model.cfg.d_model
    rng = np.random.default_rng(5)
    texts = ["x", "the cat sat on a mat and then it ran to the barn", "one two", "w1: dax, w2: wug. query:"]
    keeper = StreamKeeper(model, [0])
    collect(model, texts, token_ids=[1, 2], fwd_hooks=keeper, batch_size=4, progress=False)
    kept = keeper.stream(0, len(texts))
    assert len(torch.unique(kept.batches[0][0].last_index)) == 4
    assert kept.final_position_ok() and kept.final_delta < 1e-4
    swaps = [[Intervention(layer=0, site="resid_post", basis=orthonormal(rng.normal(size=(d, k))), op="swap",
                           positions="final", source=torch.tensor(rng.normal(size=(len(texts), d)),
                                                                  dtype=torch.float32))] for k in (1, 2, 3)]
    calls = []
    handle = model.blocks[-1].register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        got = collect_each(model, texts, swaps, resume=kept, token_ids=[1, 2], batch_size=4, progress=False)
    finally:
        handle.remove()
    assert len(calls) == 1
    for c, rc in zip(swaps, got):
        ref = collect(model, texts, token_ids=[1, 2], interventions=c, batch_size=4, progress=False)
        torch.testing.assert_close(rc.token_logprobs(), ref.token_logprobs(), atol=2e-5, rtol=1e-5)


def test_the_final_position_route_holds_on_the_real_model(smol):
    """On SmolLM2 (the default kind of the installed TransformerLens) the final-position route reproduces the
    whole-prompt resume, and a swap through it equals the whole patched pass (TransformerLens's hooks)."""
    from bayes_lens.collect import StreamKeeper, collect, collect_each

    texts = ["The capital of France is", "One, two, three, four,", "Bayes' rule says that the posterior"]
    layer = 20
    keeper = StreamKeeper(smol, [layer])
    collect(smol, texts, token_ids=[1, 2], fwd_hooks=keeper, progress=False)
    kept = keeper.stream(layer, len(texts))
    assert kept.final_position_ok() and kept.final_delta < 1e-4
    d = smol.cfg.d_model
    rng = np.random.default_rng(0)
    iv = Intervention(layer=layer, site="resid_post", basis=orthonormal(rng.normal(size=(d, 2))), op="swap",
                      positions="final", source=torch.tensor(rng.normal(size=(len(texts), d)), dtype=torch.float32))
    got = collect_each(smol, texts, [[iv]], resume=kept, token_ids=[1, 2], progress=False)[0]
    ref = collect(smol, texts, token_ids=[1, 2], interventions=[iv], progress=False)
    torch.testing.assert_close(got.token_logprobs(), ref.token_logprobs(), atol=1e-4, rtol=0)
