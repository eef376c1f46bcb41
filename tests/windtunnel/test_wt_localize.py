"""Readout or mediator on the shipped wind tunnel (METHODS.md §13): wind-tunnel prompts as task items with the
exact posterior, the hypothesis frame, and ``bl.localize`` against the wind tunnel's P4b pattern."""

import itertools
import math

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.windtunnel import BijectionTask, HMMTask


def test_task_prompts_bijection_closed_form():
    V = 6
    task = BijectionTask(V=V)
    items = bl.windtunnel.task_prompts(task, 30, seed=4)
    batch = task.sample(30, seed=4)
    assert items.task == "windtunnel-bijection" and items.answers == tuple(f"y{j}" for j in range(1, V + 1))
    for i, it in enumerate(items):
        words = it.text.split()
        assert words[-1].startswith("x") and len(words) % 2 == 1
        revealed = {int(w[1:]) for w in words[1::2]}
        assert it.k == len(revealed) == len(words) // 2
        unseen = set(range(1, V + 1)) - revealed
        expected = [1.0 / len(unseen) if j in unseen else 0.0 for j in range(1, V + 1)]
        np.testing.assert_allclose(it.posterior, expected, atol=1e-12)
        assert it.entropy_bits == pytest.approx(math.log2(V - it.k), abs=1e-12)
        assert it.prior_posterior == pytest.approx((1.0 / V,) * V)
        # the text is the sequence's own prefix, and the outcome the output that follows it
        assert task.to_text(batch.tokens[i, : len(words)])[0] == it.text
        nxt = task.vocab[int(batch.tokens[i, len(words)])]
        assert it.answers[it.outcome] == nxt and it.posterior[it.outcome] > 0
    np.testing.assert_array_equal(np.bincount(items.k), np.full(V, 5))  # stratified: every position n/K times
    texts, h, pos = bl.windtunnel.geometry_prompts(task, 30, seed=4)  # the geometry suite's prompts: the same cut
    assert texts == items.texts and np.array_equal(h, items.entropy_bits) and np.array_equal(pos, items.k + 1)


def _brute_force_predictive(T, E, obs):
    """P(o_{t+1} = v | o_1..o_t) by summing over every hidden path (uniform initial state)."""
    S, V = E.shape
    t = len(obs)
    joint = np.zeros(V)
    for path in itertools.product(range(S), repeat=t + 1):
        p = 1.0 / S
        for j in range(t):
            p *= E[path[j], obs[j]] * T[path[j], path[j + 1]]
        joint += p * E[path[t]]
    return joint / joint.sum()


def test_task_prompts_hmm_brute_force():
    task = HMMTask(S=3, V=3, K=5, Q=8, alpha=0.7)
    items = bl.windtunnel.task_prompts(task, 15, seed=2)
    S, V = task.S, task.V
    for it in items:
        words = it.text.split()
        assert len(words) == task.prefix_len + it.k and words[-1] in ("O", *it.answers)
        p = [int(w[1:]) / task.Q for w in words if w.startswith("p")]
        T, E = np.array(p[: S * S]).reshape(S, S), np.array(p[S * S:]).reshape(S, V)
        obs = [int(w[1:]) - 1 for w in words[task.prefix_len:]]
        np.testing.assert_allclose(it.posterior, _brute_force_predictive(T, E, obs), atol=1e-12)
        np.testing.assert_allclose(it.prior_posterior, E.mean(0), atol=1e-12)
    assert items.answers == ("o1", "o2", "o3")


def test_task_prompts_tokenize_to_the_task_ids():
    """The wind-tunnel model's own tokenizer reads each prompt back to the sequence's token ids (no BOS), and
    each answer is one token: the text route ``localize`` takes is the token route the model was trained on."""
    model, task = bl.windtunnel.load("bijection")
    items = bl.windtunnel.task_prompts(task, 20, seed=1)
    batch = task.sample(20, seed=1)
    ids = bl.adapter.encode_prompts(model, items.texts)
    for i, row in enumerate(ids):
        assert row == batch.tokens[i, : len(row)].tolist()
    assert bl.tasks.answer_token_ids(model, items.answers) == tuple(int(a) for a in batch.answer_ids)


def test_hypothesis_frame_is_the_answer_embedding_span():
    model, task = bl.windtunnel.load("bijection")
    w = bl.windtunnel.read_checkpoint(bl.windtunnel.shipped_path("bijection")).weights  # Hugging Face names
    ans = task.sample(1, seed=0).answer_ids
    for side, raw in (("embedding", w["model.embed_tokens.weight"][ans] * w["model.layers.0.input_layernorm.weight"]),
                      ("unembedding", w["lm_head.weight"][ans] * w["model.norm.weight"])):
        q = bl.windtunnel.hypothesis_frame(model, task, side=side)
        assert q.shape == (model.cfg.d_model, task.V)
        np.testing.assert_allclose(q.T @ q, np.eye(task.V), atol=1e-10)
        a = raw.double().numpy().T
        proj = a @ np.linalg.pinv(a)  # the projector onto the span, by pseudo-inverse
        np.testing.assert_allclose(q @ q.T, proj, atol=1e-8)
    with pytest.raises(bl.InvalidInputError, match="side"):
        bl.windtunnel.hypothesis_frame(model, task, side="values")
    with pytest.raises(bl.InvalidInputError, match="vocabulary"):
        bl.windtunnel.hypothesis_frame(model, BijectionTask(V=4))


def _final_rows_and_posteriors(model, items, layer, basis=None):
    """TL's own run_with_hooks, one prompt length at a time: the final-token resid_post rows at ``layer`` and
    the posterior over the answers, with the span of ``basis`` projected out at every position when given."""
    hook = bl.adapter.hook_name(model, layer, "resid_post")
    ans = list(bl.tasks.answer_token_ids(model, items.answers))
    q = None if basis is None else torch.as_tensor(np.linalg.qr(basis)[0], dtype=torch.float32)
    rows, post = np.zeros((len(items), model.cfg.d_model)), np.zeros((len(items), len(ans)))
    lengths = np.array([len(t.split()) for t in items.texts])
    for n in np.unique(lengths):
        idx = np.flatnonzero(lengths == n)
        toks = torch.as_tensor(bl.adapter.encode_prompts(model, [items.texts[i] for i in idx]))
        kept = {}

        def edit(x, hook):
            if q is not None:
                x = x - (x @ q) @ q.T
            kept["x"] = x[:, -1].detach().double().numpy()
            return x

        with torch.no_grad():
            logits = model.run_with_hooks(toks, fwd_hooks=[(hook, edit)])
        rows[idx] = kept["x"]
        post[idx] = torch.softmax(logits[:, -1, ans].double(), -1).numpy()
    return rows, post


def _entropy(p):
    return -(np.where(p > 0, p * np.log2(np.clip(p, 1e-300, None)), 0.0)).sum(-1)


def test_localize_on_the_shipped_wind_tunnel_shows_the_p4b_pattern():
    """P4b (the wind tunnel, METHODS.md §13): the entropy axis is readable, removing it leaves calibration where it
    was, removing the frame does not. Here at layer 2 of the shipped bijection model (V = 10, 3 layers, d 64):
    the ridge axis's held-out R² (checked against sklearn's own cross-fitted ridge on TL's rows) is high, its
    removal moves the MAE by under 0.01 bits, inside the rank-1 random band's reach; the rank-20 frame's removal
    is far above its random band. The user basis's Δ MAE and the clean MAE are recomputed with TL's
    run_with_hooks (one basis, no cross-fitting)."""
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model, task = bl.windtunnel.load("bijection")
    items = bl.windtunnel.task_prompts(task, 100, seed=3)
    layer = 2
    unemb = bl.windtunnel.hypothesis_frame(model, task, side="unembedding")
    loc = bl.localize(model, items, layers=[layer], ranks=(20,), bases={"answer unembedding": unemb}, n_random=8,
                      folds=5, n_boot=200, n_null=20, seed=0, progress=False)
    t = loc.to_dataframe().set_index("subspace")
    bayes = items.entropy_bits

    # clean rows and MAE from TL directly
    x, p_clean = _final_rows_and_posteriors(model, items, layer)
    clean_mae = np.abs(_entropy(p_clean) - bayes).mean()
    assert loc.layers_table["clean_mae_bits"].iloc[0] == pytest.approx(clean_mae, abs=1e-4)
    assert clean_mae < 0.05  # the trained wind tunnel is near Bayes (P4b's baseline: 0.0067 bits)

    # readable: held-out R² of the ridge axis, and sklearn's cross-fitted ridge on the same rows agrees
    ridge = t.loc["ridge axis"]
    folds = StratifiedKFold(5, shuffle=True, random_state=0).split(x, items.k)
    pred = cross_val_predict(make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 4, 15))), x, bayes,
                             cv=list(folds))
    r2_sk = 1 - ((bayes - pred) ** 2).sum() / ((bayes - bayes.mean()) ** 2).sum()
    assert r2_sk > 0.8 and ridge["r2"] > 0.8 and bool(ridge["readable"])
    assert ridge["r2"] == pytest.approx(r2_sk, abs=0.05)

    # the axis's removal leaves calibration where it was (P4b: −0.001 bits)
    assert abs(ridge["delta_mae_bits"]) < 0.01
    assert not bool(ridge["removal_matters"])
    # the frame's removal is far above its random band (P4b: +0.745 bits for the rank-20 frame)
    frame = t.loc["frame k=20"]
    haar = t[(t["kind"] == "random") & (t["rank"] == 20) & (t["null"] == "haar")]["delta_mae_bits"]
    assert frame["delta_mae_ci_low"] > np.quantile(haar, 0.975) and frame["delta_mae_bits"] > 0.1
    # against the null that matches how the frame was chosen (20 random directions of the rows' own covariance, a
    # third of the 64-dimensional stream) the frame's removal is not remarkable: the P4b pattern rests on a Haar band
    assert frame["null"] == "cov" and frame["delta_mae_ci_low"] < frame["band_high"] and not frame["removal_matters"]
    assert frame["delta_mae_bits"] > 20 * abs(ridge["delta_mae_bits"])

    # the span the answer logits read is a mediator too (the wind tunnel's tied frame, on the output side)
    un = t.loc["answer unembedding"]
    assert un["delta_mae_ci_low"] > un["band_high"] and un["delta_mae_bits"] > 0.1
    # the user basis's removal, recomputed with TL's run_with_hooks
    _, p_patched = _final_rows_and_posteriors(model, items, layer, basis=unemb)
    delta = np.abs(_entropy(p_patched) - bayes).mean() - clean_mae
    assert t.loc["answer unembedding", "delta_mae_bits"] == pytest.approx(delta, abs=1e-4)
    # the random band is the spread of the same rank's random rows
    rnd = t[(t["kind"] == "random") & (t["rank"] == 20) & (t["null"] == frame["null"])]["delta_mae_bits"]
    assert frame["null"] == "cov" and frame["band_high"] == pytest.approx(np.quantile(rnd, 0.975), abs=1e-12)
