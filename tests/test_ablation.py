"""Tests of the entropy-axis ablation (bayes_lens.ablation; METHODS.md §7, Paper A §4.5–4.6).

Unit tests check the maths against numpy / scikit-learn / scipy; integration tests run tiny random
models of each kind (and, briefly, the real SmolLM2-135M) and read the hook *after* the patch with a
later-registered read hook at the same point.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_lens as bl
from bayes_lens.ablation import EntropyAxis, Patch, PatchPart as _Part, compare_patched
from bayes_lens.ablation._axis import axis_from_pca as _pc1
from bayes_lens.adapter import hook_name, model_info, tokenize
from bayes_lens.models.tiny import tiny_model

TEXTS = [
    "the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp",
    "cloud chair", "the moon is a cloud", "dog cat bird tree", "apple", "a house is the river",
    "stone lamp chair", "is the cat a bird", "the apple tree", "moon river", "a dog is a cat",
]


def _n_hooks(model) -> int:
    """Hooks attached to the model's HookPoints (the bridge's own transient capture hooks on its
    wrapped layer norms are TransformerLens internals and are not counted)."""
    from transformer_lens.hook_points import HookPoint

    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in model.modules() if isinstance(m, HookPoint))


def _read(model, tokens, mask, name, fwd_hooks=()):
    """Run with ``fwd_hooks`` then a later-registered read hook at ``name``; return (logits, act)."""
    store = {}

    def rd(act, hook=None):
        store["act"] = act.detach().clone()

    # the read hook is added after the patch's: it sees the patched activation (TL's registration order)
    with torch.inference_mode(), bl.patched(model, fwd_hooks), model.hooks(fwd_hooks=[(name, rd)]):
        logits = model(tokens, attention_mask=mask)
    return logits, store["act"]


def _flat(act):
    return act.reshape(*act.shape[:2], -1) if act.ndim == 4 else act


def _random_axis(model, layers=(0,), site="v", seed=0, sigma=0.5):
    info = model_info(model)
    dim = info.kv_dim if site == "v" else info.d_model
    g = torch.Generator().manual_seed(seed)
    return EntropyAxis.from_directions(model, {layer: torch.randn(dim, generator=g) for layer in layers},
                                       site=site, sigma=sigma)


# --------------------------------------------------------------------------------------------
# unit tests (no model)
# --------------------------------------------------------------------------------------------


def test_pc1_raw_matches_sklearn():
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 12)) @ rng.normal(size=(12, 12)) + 3.0
    u, mean, _, evr = _pc1(x, "raw")
    pca = PCA(n_components=3).fit(x)
    assert abs(abs(u @ pca.components_[0]) - 1) < 1e-10
    assert np.allclose(mean, x.mean(0))
    assert evr == pytest.approx(pca.explained_variance_ratio_[0], rel=1e-10)


def test_pc1_std_maps_back_to_standardized_score():
    """With standardize='std', the raw coordinate v·u is an exact affine map of sklearn's z-scored PC1 score."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 10)) * rng.uniform(0.1, 10, size=10) + rng.normal(size=10)
    x[:, 3] = 2.0  # a zero-variance coordinate gets weight 0
    u, _, _, evr = _pc1(x, "std")
    keep = np.ones(10, bool)
    keep[3] = False
    z = (x[:, keep] - x[:, keep].mean(0)) / x[:, keep].std(0, ddof=1)
    pca = PCA(n_components=1).fit(z)
    score = pca.transform(z)[:, 0]
    assert abs(np.corrcoef(x @ u, score)[0, 1]) > 1 - 1e-10
    assert u[3] == 0.0 and np.linalg.norm(u) == pytest.approx(1.0)
    assert evr == pytest.approx(pca.explained_variance_ratio_[0], rel=1e-8)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(2, 5), st.integers(2, 8), st.integers(0, 10_000),
       st.floats(-3, 3, allow_nan=False))
def test_part_operations_are_projections(n_kv, pos, d_head, seed, lam):
    g = torch.Generator().manual_seed(seed)
    act = torch.randn(2, pos, n_kv, d_head, generator=g)
    u = torch.randn(n_kv * d_head, generator=g, dtype=torch.float64)
    u = (u / u.norm()).float()
    mk = lambda op, **kw: _Part(layer=0, hook_name="h", site="v", op=op, direction=u, **kw)  # noqa: E731
    flat = act.reshape(2, pos, -1).double()
    coord = flat @ u.double()
    rem = mk("removal", lam=1.0).apply(act)
    keep = mk("keep_only").apply(act)
    assert rem.shape == act.shape and keep.shape == act.shape
    assert torch.allclose(rem.reshape(2, pos, -1).double() @ u.double(), torch.zeros_like(coord), atol=1e-5)
    assert torch.allclose(rem + keep, act, atol=1e-5)  # removal + keep-only = identity
    part_lam = mk("removal", lam=lam).apply(act).reshape(2, pos, -1).double()
    assert torch.allclose(part_lam, flat - lam * coord[..., None] * u.double(), atol=1e-4)
    shifted = mk("shift", amount=lam).apply(act).reshape(2, pos, -1).double()
    assert torch.allclose(shifted - flat, (lam * u.double()).expand_as(flat), atol=1e-5)


# --------------------------------------------------------------------------------------------
# patches on tiny models (both kinds)
# --------------------------------------------------------------------------------------------


def test_removal_zeroes_axis_component_at_every_position(tiny):
    toks, mask = tokenize(tiny, TEXTS[:6])
    axis = _random_axis(tiny, layers=(0, 1))
    u = {k: v.double() for k, v in axis.axes_.items()}
    for layer in (0, 1):
        name = hook_name(tiny, layer, "v")
        _, clean = _read(tiny, toks, mask, name)
        _, act = _read(tiny, toks, mask, name, axis.removal(layers=layer))
        flat, cflat = _flat(act).double(), _flat(clean).double()
        assert act.shape == clean.shape
        assert (flat @ u[layer]).abs().max() < 1e-5
        assert (cflat @ u[layer]).abs().max() > 1e-2  # the test can fail: the clean component is not 0
        # independent computation on the clean activation (layer 0: its input is unpatched)
        if layer == 0:
            expected = cflat - (cflat @ u[0])[..., None] * u[0]
            assert torch.allclose(flat, expected, atol=1e-5)


def test_multi_layer_removal_one_pair_per_layer_and_run_with_hooks(tiny):
    toks, mask = tokenize(tiny, TEXTS[:4])
    axis = _random_axis(tiny, layers=(0, 1))
    patch = axis.removal()
    # one pair per layer, on the site's own hook (hook_v): plain TransformerLens runs it, no bl.attach
    assert len(patch) == 2 and [n for n, _ in patch] == [hook_name(tiny, k, "v") for k in (0, 1)]
    reads = {}

    def rd(act, hook=None):
        reads[hook.name] = _flat(act).detach().double()

    hooks = list(patch) + [(hook_name(tiny, k, "v"), rd) for k in (0, 1)]
    with torch.inference_mode():
        tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=hooks)
    assert len(reads) == 2
    for k, name in zip((0, 1), sorted(reads)):
        assert (reads[name] @ axis.axes_[k].double()).abs().max() < 1e-5
    # combination by concatenation: list(p0) + list(p1) == the two-layer patch's hooks
    p0, p1 = axis.removal(layers=0), axis.removal(layers=1)
    both = p0 + p1
    assert isinstance(both, Patch) and both.layers == (0, 1)
    assert [n for n, _ in list(p0) + list(p1)] == [n for n, _ in patch]
    with bl.patched(tiny, [p0, p1]), torch.inference_mode():
        a = tiny(toks, attention_mask=mask)
    with bl.patched(tiny, patch), torch.inference_mode():
        b = tiny(toks, attention_mask=mask)
    assert torch.equal(a, b)


def test_lambda_zero_and_empty_patch_are_bitwise_noops(tiny):
    toks, mask = tokenize(tiny, TEXTS[:6])
    axis = _random_axis(tiny, layers=(0, 1))
    with torch.inference_mode():
        clean = tiny(toks, attention_mask=mask)
    for patches in ([], axis.removal(lam=0.0), [axis.removal(lam=0.0)]):
        with bl.patched(tiny, patches), torch.inference_mode():
            out = tiny(toks, attention_mask=mask)
        assert torch.equal(out, clean)
    with bl.patched(tiny, axis.removal(lam=1.0)), torch.inference_mode():
        assert not torch.equal(tiny(toks, attention_mask=mask), clean)  # a real patch does change them


def test_keep_only_leaves_only_the_axis_component(tiny):
    toks, mask = tokenize(tiny, TEXTS[:6])
    axis = _random_axis(tiny, layers=(0,))
    u = axis.axes_[0].double()
    name = hook_name(tiny, 0, "v")
    _, clean = _read(tiny, toks, mask, name)
    _, act = _read(tiny, toks, mask, name, axis.keep_only())
    flat, cflat = _flat(act).double(), _flat(clean).double()
    expected = (cflat @ u)[..., None] * u
    assert torch.allclose(flat, expected, atol=1e-5)
    resid = flat - (flat @ u)[..., None] * u
    assert resid.abs().max() < 1e-5


def test_shift_moves_by_sigma_along_axis(tiny):
    toks, mask = tokenize(tiny, TEXTS[:4])
    axis = _random_axis(tiny, layers=(0,), sigma=0.7)
    name = hook_name(tiny, 0, "v")
    _, clean = _read(tiny, toks, mask, name)
    _, act = _read(tiny, toks, mask, name, axis.shift(-2.0))
    delta = _flat(act).double() - _flat(clean).double()
    assert torch.allclose(delta, (-2.0 * 0.7 * axis.axes_[0].double()).expand_as(delta), atol=1e-5)


def test_resid_post_site(tiny):
    toks, mask = tokenize(tiny, TEXTS[:4])
    axis = _random_axis(tiny, layers=(0,), site="resid_post")
    name = hook_name(tiny, 0, "resid_post")
    assert axis.hook_name_ == name
    _, act = _read(tiny, toks, mask, name, axis.removal())
    assert act.shape[-1] == model_info(tiny).d_model
    assert (act.double() @ axis.axis_.double()).abs().max() < 1e-5


def test_random_controls_unit_orthogonal_seeded(tiny):
    axis = _random_axis(tiny, layers=(0, 1))
    dirs = []
    for seed in range(4):
        patch = axis.random_control(seed=seed)
        assert patch.is_random_control and patch.random_seed == seed and patch.layers == (0, 1)
        for layer, r in patch.directions.items():
            assert float(r.double().norm()) == pytest.approx(1.0, abs=1e-6)
            assert abs(float(r.double() @ axis.axes_[layer].double())) < 1e-6
        dirs.append(patch.directions[0])
    assert torch.equal(axis.random_control(seed=2).directions[0], dirs[2])  # same seed, same direction
    assert not torch.allclose(dirs[0], dirs[1])
    assert not torch.allclose(axis.random_control(seed=0).directions[0], axis.random_control(seed=0).directions[1])
    # same op, λ and layers as the axis patch it controls
    ctrl = axis.removal(lam=0.5, layers=1).random_like(seed=3)
    assert ctrl.kind == "removal" and ctrl.params["lam"] == 0.5 and ctrl.layers == (1,)
    # and it really removes its own direction
    toks, mask = tokenize(tiny, TEXTS[:3])
    _, act = _read(tiny, toks, mask, hook_name(tiny, 0, "v"), axis.random_control(seed=5, layers=0))
    assert (_flat(act).double() @ axis.random_direction(0, seed=5).double()).abs().max() < 1e-5


def test_exception_inside_patched_leaves_no_hooks(tiny):
    toks, mask = tokenize(tiny, TEXTS[:4])
    with torch.inference_mode():
        clean = tiny(toks, attention_mask=mask)
    before = _n_hooks(tiny)
    axis = _random_axis(tiny, layers=(0, 1))
    with pytest.raises(RuntimeError, match="boom"):
        with bl.patched(tiny, [axis.removal(), axis.shift(1.0)]):
            assert _n_hooks(tiny) > before  # the hooks really were attached
            with torch.inference_mode():
                tiny(toks, attention_mask=mask)
            raise RuntimeError("boom")
    assert _n_hooks(tiny) == before
    with torch.inference_mode():
        assert torch.equal(tiny(toks, attention_mask=mask), clean)


def test_random_control_wants_its_seed_by_name(tiny):
    """Issue 53.6: `axis.random_control(0)` was Python's bare TypeError ("takes 1 positional argument but 2
    were given"); it is a BayesLensError saying what to write instead, and so is a missing seed."""
    axis = _random_axis(tiny, layers=(0,))
    with pytest.raises(bl.InvalidInputError, match=r"use seed=0") as err:
        axis.random_control(0)
    assert "axis.random_control(seed=0)" in str(err.value)
    with pytest.raises(bl.InvalidInputError, match=r"use seed=7"):
        axis.random_control(7, op="removal")
    with pytest.raises(bl.InvalidInputError, match=r"needs a seed"):
        axis.random_control()
    assert axis.random_control(seed=0).random_seed == 0


def test_axis_removal_and_its_random_control_run_the_same_code(tiny, monkeypatch):
    """The removal along the axis and its random control hook the same hook point (hook_v) and change the
    activation with the operation table's one coordinate map and move_along (bayes_lens.interventions._ops, the
    only code that writes an activation)."""
    from bayes_lens.interventions import _ops

    toks, mask = tokenize(tiny, TEXTS[:3])
    axis = _random_axis(tiny, layers=(0,))
    calls = []
    real_move, real_map = _ops.move_along, _ops.coordinate_map

    def move(act, u, edit, **kw):
        calls.append(("move_along", kw["what"], tuple(u.shape)))
        return real_move(act, u, edit, **kw)

    def cmap(op, u, strength, ref, **kw):
        calls.append(("coordinate_map", op))
        return real_map(op, u, strength, ref, **kw)

    monkeypatch.setattr(_ops, "move_along", move)
    monkeypatch.setattr(_ops, "coordinate_map", cmap)
    for patch, op in ((axis.removal(lam=0.5), "remove"), (axis.random_control(seed=0, lam=0.5), "remove"),
                      (axis.shift(1.0), "shift"), (axis.random_control(seed=0, op="shift", sigmas=1.0), "shift")):
        calls.clear()
        with bl.patched(tiny, patch), torch.inference_mode():
            tiny(toks, attention_mask=mask)
        (part,) = patch.parts
        assert [c[0] for c in calls] == ["coordinate_map", "move_along"], (patch.label, calls)
        assert calls[0][1] == op and calls[1][2] == (model_info(tiny).kv_dim,)
        assert calls[1][1] == "the intervention at layer 0 (v)" and patch.hook_names == (hook_name(tiny, 0, "v"),)
    names = {p.hook_names for p in (axis.removal(), axis.shift(1.0), axis.keep_only(), axis.random_control(seed=0),
                                    axis.random_control(seed=0, op="keep_only"))}
    assert names == {(hook_name(tiny, 0, "v"),)}


@pytest.mark.parametrize("op,kw", [("removal", {"lam": 1.0}), ("removal", {"lam": 0.5}),
                                   ("removal", {"lam": 1.0, "center": True}), ("shift", {"sigmas": -1.5})])
def test_patch_equals_the_same_operation_on_the_coordinate_hook_point(tiny, op, kw):
    """A removal / shift (a hook on hook_v) gives the numbers of the same coordinate operation as a user's hook
    on the attached axis coordinate hook point (hook_v_axis), and both equal v − λ((v − μ)·u)u / v + sσu
    computed here, logits included."""
    toks, mask = tokenize(tiny, TEXTS[:5])
    g = torch.Generator().manual_seed(3)
    dim = model_info(tiny).kv_dim
    axis = EntropyAxis.from_directions(tiny, {0: torch.randn(dim, generator=g), 1: torch.randn(dim, generator=g)},
                                       sigma=0.4, means={0: torch.randn(dim, generator=g),
                                                         1: torch.randn(dim, generator=g)})
    patch = getattr(axis, op)(**kw)
    assert patch.hook_names == (hook_name(tiny, 0, "v"), hook_name(tiny, 1, "v"))
    on_point = [(axis.coord_hook_names_[p.layer], lambda c, hook, p=p: p.coordinate_op(c)) for p in patch.parts]
    name = hook_name(tiny, 0, "v")
    _, clean = _read(tiny, toks, mask, name)
    via_site, act_site = _read(tiny, toks, mask, name, patch)
    with bl.attach(tiny, axis=axis, entropies=False):
        via_point, act_point = _read(tiny, toks, mask, name, on_point)
    assert torch.allclose(act_point, act_site, atol=1e-6, rtol=0)
    assert torch.allclose(via_point, via_site, atol=1e-6, rtol=0)
    u, mu = axis.axes_[0].double(), axis.means_[0].double()
    v = _flat(clean).double()
    if op == "shift":
        expected = v + (-1.5 * 0.4) * u
    else:
        c = (v - mu) @ u if kw.get("center") else v @ u
        expected = v - kw["lam"] * c[..., None] * u
    assert torch.allclose(_flat(act_site).double(), expected, atol=1e-5)
    assert not torch.allclose(_flat(act_site).double(), v, atol=1e-3)  # the patch does something


# --------------------------------------------------------------------------------------------
# fitting
# --------------------------------------------------------------------------------------------


def _final_values_by_hand(model, texts, layer, site="v"):
    """Final-real-token activations and next-token entropies, read one prompt at a time (no padding)."""
    name = hook_name(model, layer, site)
    rows, ents = [], []
    for t in texts:
        toks, _ = tokenize(model, [t])
        with torch.inference_mode():
            logits, cache = model.run_with_cache(toks, names_filter=lambda n: n == name)
        rows.append(_flat(cache[name])[0, -1].double().numpy())
        p = torch.softmax(logits[0, -1].double(), -1).numpy()
        ents.append(float(-(p * np.log2(np.where(p > 0, p, 1))).sum()))
    return np.stack(rows), np.array(ents)


@pytest.mark.parametrize("standardize", ["std", "raw"])
def test_fit_matches_independent_pca(tiny, standardize):
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    axis = EntropyAxis(layer=-1, standardize=standardize, progress=False, batch_size=5).fit(tiny, TEXTS)
    assert axis.layer_ == 1 and axis.hook_name_ == hook_name(tiny, 1, "v") and axis.site_ == "v"
    x, ent = _final_values_by_hand(tiny, TEXTS, 1)
    if standardize == "raw":
        w = PCA(1).fit(x).components_[0]
    else:
        scaler = StandardScaler().fit(x)
        w = PCA(1).fit(scaler.transform(x)).components_[0] / scaler.scale_
        w /= np.linalg.norm(w)
    u = axis.axis_.double().numpy()
    assert abs(abs(u @ w) - 1) < 1e-4
    coord = x @ u
    assert np.corrcoef(coord, ent)[0, 1] >= 0  # signed by the model's entropy
    assert axis.entropy_correlation_[1] == pytest.approx(np.corrcoef(coord, ent)[0, 1], abs=1e-4)
    assert axis.sigma_[1] == pytest.approx(coord.std(ddof=1), rel=1e-4)
    assert axis.entropy_kind_ == "next_token"
    assert axis.model_meta_["processed"] is False and "torch" in axis.versions_


def test_fit_multi_layer_and_bad_params(tiny):
    axis = EntropyAxis(layer=[0, -1], progress=False).fit(tiny, TEXTS)
    assert axis.layers_ == (0, 1) and set(axis.axes_) == {0, 1}
    with pytest.raises(bl.InvalidInputError, match="single-layer"):
        axis.axis_
    with pytest.raises(bl.InvalidInputError, match="sign_by='bayes'"):
        EntropyAxis(sign_by="bayes", progress=False).fit(tiny, TEXTS)
    with pytest.raises(bl.InvalidInputError, match="site"):
        EntropyAxis(site="mlp", progress=False).fit(tiny, TEXTS)
    with pytest.raises(bl.InvalidInputError, match="standardize"):
        EntropyAxis(standardize="zscore", progress=False).fit(tiny, TEXTS)
    with pytest.raises(bl.LayerIndexError, match="out of range"):  # the paper's silent no-op, made loud
        EntropyAxis(layer=2, progress=False).fit(tiny, TEXTS)
    with pytest.raises(bl.InvalidInputError, match="not fitted"):
        EntropyAxis().removal()


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(tiny):
    info = model_info(tiny)
    n_before = _n_hooks(tiny)
    with pytest.raises(bl.InvalidInputError, match="dimension"):
        EntropyAxis.from_directions(tiny, {0: torch.ones(info.kv_dim + 1)})
    with pytest.raises(bl.NonFiniteError, match="NaN"):
        EntropyAxis.from_directions(tiny, {0: torch.tensor([float("nan")] + [1.0] * (info.kv_dim - 1))})
    with pytest.raises(bl.InvalidInputError, match="zero"):
        EntropyAxis.from_directions(tiny, {0: torch.zeros(info.kv_dim)})
    axis = _random_axis(tiny, layers=(0,))
    with pytest.raises(bl.LayerIndexError, match="not fitted on layer 1"):
        axis.removal(layers=1)
    with pytest.raises(bl.LayerIndexError, match="out of range"):
        axis.removal(layers=7)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(bl.InvalidInputError, match="finite"):
            axis.removal(lam=bad)
        with pytest.raises(bl.InvalidInputError, match="finite"):
            axis.shift(bad)
    # a non-finite axis that slipped in (e.g. edited by hand) is refused when a patch is built
    axis.axes_[0] = torch.full_like(axis.axes_[0], float("inf"))
    with pytest.raises(bl.NonFiniteError):
        axis.removal()
    # shift without σ
    with pytest.raises(bl.InvalidInputError, match="σ"):
        EntropyAxis.from_directions(tiny, {0: torch.ones(info.kv_dim)}).shift(1.0)
    # an axis of the wrong dimension for the model it is applied to
    other = tiny_model(model_info(tiny).kind, gqa=False)  # 4 KV heads instead of 2
    foreign = _random_axis(other, layers=(0,))
    with pytest.raises(bl.InvalidInputError, match="dimension"):
        with bl.patched(tiny, foreign.removal()):
            pass
    # the raw hook fn also refuses a mismatched activation at run time
    toks, mask = tokenize(tiny, ["the cat"])
    with pytest.raises(bl.InvalidInputError, match="dimension"):
        with tiny.hooks(fwd_hooks=list(foreign.keep_only())), torch.inference_mode():
            tiny(toks, attention_mask=mask)
    assert _n_hooks(tiny) == n_before
    with pytest.raises(bl.InvalidInputError, match="pair"):
        with bl.patched(tiny, [("blocks.0.attn.hook_v", 3)]):
            pass
    with pytest.raises(bl.MissingHookError):
        with bl.patched(tiny, [("blocks.9.attn.hook_v", lambda a, hook: a)]):
            pass


# --------------------------------------------------------------------------------------------
# save / load
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_save_load_round_trip(tiny, tmp_path, suffix):
    axis = EntropyAxis(layer=[0, 1], standardize="raw", progress=False).fit(tiny, TEXTS)
    path = axis.save(tmp_path / f"axis{suffix}")
    assert path.exists() and path.suffix == suffix
    raw = path.read_bytes()
    assert b"pickle" not in raw
    loaded = EntropyAxis.load(path, tiny)
    assert loaded.layers_ == axis.layers_ and loaded.site_ == axis.site_
    assert loaded.get_params() == {**axis.get_params(), "progress": True}
    for k in axis.layers_:
        assert torch.equal(loaded.axes_[k], axis.axes_[k])
        assert torch.equal(loaded.means_[k], axis.means_[k])
        assert loaded.sigma_[k] == axis.sigma_[k]
        assert loaded.entropy_correlation_[k] == axis.entropy_correlation_[k]
    assert loaded.model_meta_ == axis.model_meta_ and loaded.versions_ == axis.versions_
    assert loaded.hook_names_ == axis.hook_names_ and loaded.entropy_kind_ == axis.entropy_kind_
    toks, mask = tokenize(tiny, TEXTS[:4])
    with torch.inference_mode():
        with bl.patched(tiny, axis.removal()):
            a = tiny(toks, attention_mask=mask)
        with bl.patched(tiny, loaded.removal()):
            b = tiny(toks, attention_mask=mask)
    assert torch.equal(a, b)


def test_load_refuses_other_shapes_and_warns_on_basis(tiny, tmp_path):
    axis = _random_axis(tiny, layers=(1,))
    path = axis.save(tmp_path / "a.safetensors")
    other = tiny_model(model_info(tiny).kind, gqa=False)
    with pytest.raises(bl.CheckpointError, match="dimension"):
        EntropyAxis.load(path, other)
    one_layer = tiny_model(model_info(tiny).kind, n_layers=1)
    with pytest.raises(bl.CheckpointError, match="layers"):
        EntropyAxis.load(path, one_layer)
    # another basis (processed weights) warns, or refuses with strict=True
    meta = dict(axis.model_meta_, processed=True, processing="layer norm folded")
    axis.model_meta_ = meta
    path2 = axis.save(tmp_path / "b.npz")
    with pytest.warns(UserWarning, match="basis"):
        EntropyAxis.load(path2, tiny)
    with pytest.raises(bl.CheckpointError, match="basis"):
        EntropyAxis.load(path2, tiny, strict=True)
    with pytest.warns(UserWarning, match="basis"):
        with bl.patched(tiny, axis.removal()):
            pass
    bad = tmp_path / "junk.safetensors"
    bad.write_bytes(b"not a file")
    with pytest.raises(bl.CheckpointError):
        EntropyAxis.load(bad)
    with pytest.raises(bl.CheckpointError, match="no axis file"):
        EntropyAxis.load(tmp_path / "missing.npz")


def _rewrite_axis(path, edit):
    """Rewrite a saved .safetensors axis with ``edit(meta, tensors)`` applied (a hand-edited file)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["bayes_lens_entropy_axis"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(meta, tensors)
    save_file(tensors, str(path), metadata={"bayes_lens_entropy_axis": json.dumps(meta)})


def _times_ten_sigma(meta, tensors):
    meta["sigma"] = {k: 10 * v for k, v in meta["sigma"].items()}


def _flip_correlation(meta, tensors):
    meta["entropy_correlation"] = {k: -v for k, v in meta["entropy_correlation"].items()}


def _older_version(meta, tensors):
    meta["format_version"] = 2


def _flip_tensor_as_format_1(meta, tensors):
    # a format-3 file turned into "format 1" (metadata checksum removed) with one tensor damaged:
    # its per-tensor checksums are still there, so they must be checked
    del meta["metadata_sha256"]
    meta["format_version"] = 1
    tensors["axis.1"][0] += 0.5


@pytest.mark.parametrize("edit", [_times_ten_sigma, _flip_correlation, _older_version, _flip_tensor_as_format_1])
def test_edited_axis_metadata_refuses_to_load(tiny, tmp_path, edit):
    """Issue 25: the metadata (σ, correlations, format version) is under the checksum too."""
    axis = EntropyAxis(layer=[0, 1], standardize="raw", progress=False).fit(tiny, TEXTS)
    assert all(np.isfinite(v) and v != 0 for v in axis.entropy_correlation_.values())
    path = axis.save(tmp_path / "a.safetensors")
    EntropyAxis.load(path, tiny)  # the untouched file loads
    _rewrite_axis(path, edit)
    with pytest.raises(bl.CheckpointError, match="SHA-256"):
        EntropyAxis.load(path, tiny)


def test_edited_axis_metadata_refuses_to_load_npz(tiny, tmp_path):
    path = _random_axis(tiny, layers=(1,), sigma=0.7).save(tmp_path / "a.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays.pop("__meta__")))
    meta["sigma"]["1"] *= 10
    np.savez(path, __meta__=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(bl.CheckpointError, match="metadata .* does not match its SHA-256"):
        EntropyAxis.load(path, tiny)


@pytest.mark.parametrize("version", [1, 2])
def test_older_axis_formats_load_only_when_trusted(tiny, tmp_path, version):
    """Issue 32: an axis file whose checksums were removed and whose version was set back to 1 or 2 loaded
    with only the legacy warning, σ ×10 included. Nothing tells it from a genuine old file, so formats 1 and 2
    are refused unless the caller passes trust_unverified=True (then loaded with a warning; format 2's tensor
    checksums are still checked), and saving it again writes format 3."""
    axis = _random_axis(tiny, layers=(1,), sigma=0.7)
    path = axis.save(tmp_path / "a.safetensors")

    def as_old(meta, tensors):
        del meta["metadata_sha256"]
        meta["format_version"] = version
        if version == 1:
            del meta["sha256"]
        meta["sigma"] = {k: 10 * v for k, v in meta["sigma"].items()}  # unnoticed by any checksum

    _rewrite_axis(path, as_old)
    with pytest.raises(bl.CheckpointError, match=rf"format {version}.*trust_unverified=True"):
        EntropyAxis.load(path, tiny)
    with pytest.warns(UserWarning, match=rf"format {version}.*trust_unverified=True"):
        loaded = EntropyAxis.load(path, tiny, trust_unverified=True)
    assert loaded.sigma_[1] == pytest.approx(7.0) and torch.equal(loaded.axes_[1], axis.axes_[1])
    again = loaded.save(tmp_path / "b.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EntropyAxis.load(again, tiny).sigma_[1] == pytest.approx(7.0)
    if version == 2:  # the tensor checksums a format-2 file carries are checked even when trusted
        _rewrite_axis(path, lambda meta, tensors: tensors["axis.1"].mul_(-1))
        with pytest.raises(bl.CheckpointError, match="does not match its SHA-256"):
            EntropyAxis.load(path, tiny, trust_unverified=True)


def test_axis_save_on_a_full_disk_is_a_write_error_and_keeps_the_old_file(tiny, tmp_path, monkeypatch):
    import errno

    import safetensors.torch
    from safetensors import SafetensorError

    axis = _random_axis(tiny, layers=(1,), sigma=0.7)
    path = axis.save(tmp_path / "a.safetensors")
    before = path.read_bytes()

    def full_disk(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(bl.WriteError, match=r"a.safetensors.*No space left on device; the disk is full"):
        _random_axis(tiny, layers=(1,), seed=1).save(path)
    monkeypatch.undo()

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(np, "savez", read_only)
    with pytest.raises(bl.WriteError, match="the file system is read-only"):
        axis.save(tmp_path / "b.npz")
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors"]
    (tmp_path / "c.safetensors").mkdir()
    with pytest.raises(bl.WriteError, match="it is a folder"):
        axis.save(tmp_path / "c.safetensors")


KILLED_SAVE = """
import os, sys, torch
import safetensors.torch
import bayes_lens as bl
from bayes_lens.models.tiny import tiny_model

model = tiny_model(sys.argv[2])
dim = bl.adapter.model_info(model).kv_dim
axis = bl.EntropyAxis.from_directions(model, {0: torch.ones(dim)}, sigma=1.0)


def killed(tensors, filename, metadata=None):
    open(filename, "wb").write(b"partial")
    os.kill(os.getpid(), 9)  # SIGKILL in the middle of the write


safetensors.torch.save_file = killed
axis.save(sys.argv[1])
"""


def test_killed_axis_save_leaves_a_temporary_file_the_next_save_removes(tmp_path):
    """Issue 25: a SIGKILL inside axis.save left a .tmp file that nothing cleaned."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tiny = tiny_model("hooked" if bl.adapter.has_hooked_transformer() else "bridge")

    script = tmp_path / "killed_save.py"
    script.write_text(KILLED_SAVE)
    path = tmp_path / "axis.safetensors"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script), str(path), model_info(tiny).kind], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    left = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".axis.safetensors.") and not path.exists()
    _random_axis(tiny, layers=(0,)).save(path)  # the next save of that file removes the dead writer's temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["axis.safetensors", "killed_save.py"]
    EntropyAxis.load(path, tiny)


# --------------------------------------------------------------------------------------------
# compare_patched
# --------------------------------------------------------------------------------------------


def test_compare_patched_strings(tiny):
    from bayes_lens.metrics.stats import bootstrap_ci, pearson

    axis = EntropyAxis(layer=0, progress=False).fit(tiny, TEXTS)
    cmp = compare_patched(tiny, TEXTS, [axis.removal(), axis.shift(1.0)], n_random_seeds=2, n_boot=200,
                          seed=3, progress=False)
    t = cmp.table
    assert cmp.readout_layers == (0, 1) and not cmp.calibration
    assert set(t["condition"]) == {"clean", "removal λ=1 @L0", "shift +1σ @L0",
                                   "random ⟂ removal λ=1 @L0", "random ⟂ shift +1σ @L0"}
    assert (t.loc[t["condition"].str.startswith("random"), "n_seeds"] == 2).all()
    clean = t[t["condition"] == "clean"]
    assert (clean["diff_from_clean"] == 0).all()

    def row(cond, metric, layer):
        d = t[(t["condition"] == cond) & (t["metric"] == metric) & (t["readout_layer"] == layer)]
        assert len(d) == 1
        return d.iloc[0]

    # independent: clean coordinate at layer 0 = (v - mean)·u with v read by hand; its correlation and CI
    x, ent = _final_values_by_hand(tiny, TEXTS, 0)
    coord = (x - axis.means_[0].double().numpy()) @ axis.axes_[0].double().numpy()
    r = row("clean", "axis_entropy_corr", 0)
    assert r["value"] == pytest.approx(pearson(coord, ent), abs=1e-4)
    assert r["value"] == pytest.approx(axis.entropy_correlation_[0], abs=1e-4)
    lo, hi = bootstrap_ci(pearson, coord, ent, n_boot=200, seed=3)
    assert (r["value_ci_low"], r["value_ci_high"]) == pytest.approx((lo, hi), abs=1e-3)
    # removal at the patched layer: the coordinate is gone
    rem = row("removal λ=1 @L0", "axis_entropy_corr", 0)
    assert rem["degenerate"] and rem["value"] == 0.0
    assert row("removal λ=1 @L0", "coordinate_std_ratio", 0)["value"] < 1e-4
    # a shift leaves the coordinate's spread and correlation at the patched layer unchanged
    sh = row("shift +1σ @L0", "coordinate_std_ratio", 0)
    assert sh["value"] == pytest.approx(1.0, abs=1e-4)
    # a random removal keeps most of the axis coordinate
    rnd = row("random ⟂ removal λ=1 @L0", "coordinate_std_ratio", 0)
    assert rnd["value"] == pytest.approx(1.0, abs=1e-4) and not rnd["degenerate"]
    for _, rr in t[t["condition"] != "clean"].iterrows():
        if np.isfinite(rr["diff_ci_low"]) and not rr["degenerate"]:
            assert rr["diff_ci_low"] - 1e-9 <= rr["diff_from_clean"] <= rr["diff_ci_high"] + 1e-9
    import json

    d = json.loads(json.dumps(cmp.to_dict(), allow_nan=False))
    assert d["readout_layers"] == [0, 1] and isinstance(d["table"], list)
    assert {r["readout_layer"] for r in d["table"]} == {0, 1}  # no calibration rows for plain strings
    assert cmp.to_dataframe().equals(t)
    fig = cmp.plot()
    assert len(fig.data) >= 5


def test_sula_fit_and_compare_match_sula_evaluate(tiny):
    """(Layer 1: at layer 0 the final token ':' is the same in every prompt, so hook_v is constant.)
    On SULA items the axis is signed by the model's label entropy, and compare_patched's calibration
    numbers equal bl.sula.evaluate run with the same patch as fwd_hooks."""
    from bayes_lens.metrics.stats import pearson

    prompts = bl.sula.make_prompts(tiny, ks=(0, 2, 8), n_per_k=4, seed=1)
    axis = EntropyAxis(layer=1, progress=False).fit(tiny, prompts)
    assert axis.entropy_kind_ == "labels"
    ev_clean = bl.sula.evaluate(tiny, prompts, layer=1, n_boot=20, progress=False)
    x, _ = _final_values_by_hand(tiny, [it.text for it in prompts], 1)
    coord = (x - axis.means_[1].double().numpy()) @ axis.axes_[1].double().numpy()
    h = ev_clean.model_entropy_bits.numpy()
    assert pearson(coord, h) >= 0 and axis.entropy_correlation_[1] == pytest.approx(pearson(coord, h), abs=1e-4)
    bayes_axis = EntropyAxis(layer=1, sign_by="bayes", progress=False).fit(tiny, prompts)
    assert bayes_axis.entropy_correlation_[1] == pytest.approx(
        abs(pearson(coord, prompts.bayes_entropy_bits)), abs=1e-4)

    patch = axis.removal(lam=0.5)
    cmp = compare_patched(tiny, prompts, [patch], n_random_seeds=1, n_boot=100, progress=False)
    assert cmp.calibration and cmp.entropy_kind == "labels"
    ev_patch = bl.sula.evaluate(tiny, prompts, layer=1, fwd_hooks=list(patch), n_boot=20, progress=False)
    t = cmp.table.set_index(["condition", "metric"])
    for cond, ev in (("clean", ev_clean), (patch.label, ev_patch)):
        assert t.loc[(cond, "sula_mae_bits"), "value"] == pytest.approx(ev.mae_bits.value, abs=1e-9)
        assert t.loc[(cond, "sula_pearson"), "value"] == pytest.approx(ev.pearson.value, abs=1e-9)
    assert t.loc[(patch.label, "sula_mae_bits"), "diff_from_clean"] == pytest.approx(
        ev_patch.mae_bits.value - ev_clean.mae_bits.value, abs=1e-9)
    # the paired bootstrap resamples within k (SULA's count per k is fixed): the clean MAE's interval by hand
    k = prompts.k
    rng = np.random.default_rng(0)  # compare_patched's seed
    idx = np.empty((100, k.size), dtype=np.int64)
    for kv in np.unique(k):
        rows = np.flatnonzero(k == kv)
        idx[:, rows] = rows[rng.integers(0, rows.size, size=(100, rows.size))]
    hb = prompts.bayes_entropy_bits
    lo, hi = np.quantile(np.abs(h[idx] - hb[idx]).mean(1), [0.025, 0.975])
    assert (t.loc[("clean", "sula_mae_bits"), "value_ci_low"], t.loc[("clean", "sula_mae_bits"), "value_ci_high"]) \
        == pytest.approx((lo, hi), abs=1e-6)
    bayes_rows = cmp.table[(cmp.table["metric"] == "axis_entropy_corr") & (cmp.table["entropy"] == "bayes")]
    assert len(bayes_rows) == 3 * len(cmp.readout_layers)  # clean, the patch, its random control
    assert set(cmp.summary()["metric"]) == {"axis_entropy_corr", "sula_mae_bits", "sula_pearson"}


def test_conditions_group_random_controls_over_seeds(tiny):
    from bayes_lens.ablation._compare import _conditions

    axis = _random_axis(tiny, layers=(0, 1))
    conds = _conditions([axis.removal(), axis.random_control(seed=0), axis.keep_only(layers=1)], 3)
    labels = [c.label for c in conds]
    assert labels == ["removal λ=1 @L0,1", "random ⟂ removal λ=1 @L0,1", "keep-only @L1", "random ⟂ keep-only @L1"]
    assert conds[1].seeds == (0, 1, 2) and conds[1].is_random and conds[3].seeds == (0, 1, 2)
    assert conds[3].layers == (1,) and all(p.kind == "keep_only" for p in conds[3].patches)
    assert _conditions({"mine": list(axis.removal())}, 3)[0].kind == "hooks"


def test_compare_patched_bad_input(tiny):
    axis = _random_axis(tiny, layers=(0,))
    with pytest.raises(bl.InvalidInputError, match="calibration"):
        compare_patched(tiny, TEXTS, [axis.removal()], calibration=True, progress=False)
    with pytest.raises(bl.InvalidInputError, match="no patches"):
        compare_patched(tiny, TEXTS, [], progress=False)
    with pytest.raises(bl.InvalidInputError, match="pairs"):
        compare_patched(tiny, TEXTS, list(axis.removal()), progress=False)
    with pytest.raises(bl.InvalidInputError, match="no axis"):
        compare_patched(tiny, TEXTS, {"raw": list(axis.removal())}, progress=False)


# --------------------------------------------------------------------------------------------
# the real model (SmolLM2-135M), briefly
# --------------------------------------------------------------------------------------------


def test_smollm2_removal_and_noop(smol):
    texts = ["The capital of France is", "2 + 2 =", "Once upon a time", "The cat sat on the",
             "import numpy as", "Water boils at", "My favourite colour is", "The opposite of hot is"]
    axis = EntropyAxis(layer=[15, -1], progress=False).fit(smol, texts)
    assert axis.layers_ == (15, 29) and axis.axes_[29].shape == (192,)
    toks, mask = tokenize(smol, texts[:2])
    name = hook_name(smol, 15, "v")
    clean_logits, _ = _read(smol, toks, mask, name)
    _, act = _read(smol, toks, mask, name, axis.removal())
    flat = _flat(act).double()
    assert (flat @ axis.axes_[15].double()).abs().max() < 1e-4  # every position, padding included
    with bl.patched(smol, axis.removal(lam=0.0)), torch.inference_mode():
        assert torch.equal(smol(toks, attention_mask=mask), clean_logits)


def test_effect_reads_the_geometry_downstream_of_the_patch(tiny):
    """cmp.effect(): clean vs patched ρ at the first layer after the patch (not at the patched layer, where
    a removed coordinate is 0 by construction), checked against values read by hand under the patch."""
    from bayes_lens.ablation import AblationEffect
    from bayes_lens.metrics.stats import pearson

    axis = EntropyAxis(layer=0, progress=False).fit(tiny, TEXTS)
    cmp = compare_patched(tiny, TEXTS, {"axis removed": axis.removal()}, n_random_seeds=1, n_boot=200, seed=3,
                          progress=False)
    eff = cmp.effect()
    assert isinstance(eff, AblationEffect) and eff.condition == "axis removed"
    assert eff.patched_layers == (0,) and eff.downstream_layer == 1 and eff.last_layer == 1
    assert eff.random_condition == "random ⟂ removal λ=1 @L0" and eff.calibration is None
    # independent: the layer-1 axis fitted on the clean run, the patched values and entropies read by hand
    ref = EntropyAxis(layer=1, progress=False).fit(tiny, TEXTS)
    u, mu = ref.axes_[1].double().numpy(), ref.means_[1].double().numpy()
    x_clean, h_clean = _final_values_by_hand(tiny, TEXTS, 1)
    with bl.patched(tiny, axis.removal()):
        x_rem, h_rem = _final_values_by_hand(tiny, TEXTS, 1)
    clean_r, rem_r = pearson((x_clean - mu) @ u, h_clean), pearson((x_rem - mu) @ u, h_rem)
    assert eff.corr[("clean", 1)].value == pytest.approx(clean_r, abs=1e-4)
    assert eff.corr[("axis removed", 1)].value == pytest.approx(rem_r, abs=1e-4)
    assert eff.corr_delta[1].value == pytest.approx(rem_r - clean_r, abs=1e-4)
    assert eff.at_patched.value == pytest.approx(axis.entropy_correlation_[0], abs=1e-4)
    df = eff.to_dataframe()
    assert list(df["readout_layer"]) == [1] and df["delta"].iloc[0] == pytest.approx(rem_r - clean_r, abs=1e-4)
    # the sentence states the numbers it was computed from, and the classification follows the rule
    text = eff.sentence
    assert f"{clean_r:+.2f} → {rem_r:+.2f}" in text and "layer 1" in text
    d = eff.corr_delta[1]
    expect = ("unchanged" if not d.excludes(0.0) else
              "breaks" if abs(rem_r) < 0.5 * abs(clean_r) else "weakens" if abs(rem_r) < abs(clean_r)
              else "strengthens")
    assert eff.geometry == expect
    assert str(eff).splitlines()[-1] == text and "geometry" in repr(eff)
    with pytest.raises(bl.InvalidInputError, match=r"condition \(a patched condition\) must be one of \[.*\], got 'clean'"):
        cmp.effect("clean")
    late = compare_patched(tiny, TEXTS, [EntropyAxis(layer=1, progress=False).fit(tiny, TEXTS).removal()],
                           n_random_seeds=0, n_boot=50, progress=False)
    with pytest.raises(bl.InvalidInputError, match="no readout layer after"):
        late.effect()


def test_effect_sentence_rules_on_sula_items(tiny):
    """With SULA items the effect adds the calibration change, and 'survives' means |Δ MAE| < 1% of clean."""
    prompts = bl.sula.make_prompts(tiny, ks=(0, 2, 8), n_per_k=4, seed=1)
    # fitted on varied texts: at layer 0 every SULA prompt ends in the same token, so its values there are constant
    axis = EntropyAxis(layer=0, progress=False).fit(tiny, TEXTS)
    cmp = compare_patched(tiny, prompts, {"axis removed": axis.removal()}, axis=axis, n_random_seeds=1, n_boot=100,
                          progress=False)
    eff = cmp.effect()
    clean, d, rd = eff.calibration
    assert clean.value == pytest.approx(cmp.calibration_value("clean").value)
    assert d.value == pytest.approx(cmp.calibration_delta("axis removed").value)
    assert rd is not None and rd.value == pytest.approx(cmp.calibration_delta(eff.random_condition).value)
    # the rule, written out here on the two paired intervals: inside ±1% of the clean MAE and ±0.01 in r
    r_clean, dr, _ = eff.calibration_corr
    assert dr.value == pytest.approx(cmp.calibration_delta("axis removed", "corr").value)
    m = 0.01 * clean.value
    inside = [-m < d.ci[0] and d.ci[1] < m, -0.01 < dr.ci[0] and dr.ci[1] < 0.01]
    outside = [d.ci[0] > m or d.ci[1] < -m, dr.ci[0] > 0.01 or dr.ci[1] < -0.01]
    expected = "changes" if any(outside) else "survives" if all(inside) else "inconclusive"
    assert eff.calibration_verdict == expected
    assert eff.calibration_survives == {"survives": True, "changes": False}.get(expected)
    words = {"survives": "calibration survives", "changes": "calibration changes",
             "inconclusive": "whether calibration survives is inconclusive"}
    assert words[expected] in eff.sentence and "equivalence test" in eff.sentence
    assert f"{d.value:+.4f}" in eff.sentence and f"{dr.value:+.4f}" in eff.sentence


def _effect_with_calibration(mae, d_mae, d_r, n=60):
    """An AblationEffect with given calibration numbers (value, (lo, hi)) and a neutral geometry part."""
    from bayes_lens.ablation import AblationEffect

    est = lambda v, ci=(float("nan"), float("nan")): bl.Estimate(v, ci, "paired percentile bootstrap", n=n)
    corr = {("clean", 2): est(0.1, (0.0, 0.2)), ("x", 2): est(0.1, (0.0, 0.2))}
    return AblationEffect(condition="x", patched_layers=(1,), downstream_layer=2, last_layer=2, corr=corr,
                          corr_delta={2: est(0.0, (-0.1, 0.1))}, random_condition=None, random_corr_delta={},
                          calibration=(est(mae), est(*d_mae), None), n_prompts=n,
                          calibration_corr=(est(-0.07), est(*d_r), None))


def test_calibration_survives_is_an_equivalence_test_not_a_point_estimate():
    """The README's SmolLM2 case: Δ MAE −0.8% of the clean MAE with the interval [−1.75%, +0.12%] does
    not exclude a change over 1%, so it is inconclusive (the old rule printed "survives"); so is a
    correlation change +0.0085 [−0.0016, +0.0203] against the absolute ±0.01 margin."""
    clean = 0.457
    eff = _effect_with_calibration(clean, (-0.008 * clean, (-0.0175 * clean, 0.0012 * clean)), (0.0005, (-0.002, 0.003)))
    assert eff.mae_test.outcome == "inconclusive" and eff.corr_test.outcome == "equivalent"
    assert eff.calibration_verdict == "inconclusive" and eff.calibration_survives is None
    # n that would decide it, by hand: the lower end is 0.95% of clean from the estimate, the margin 0.2%
    assert eff.mae_test.n_to_decide == math.ceil(60 * (0.0095 / 0.002) ** 2)
    assert "inconclusive" in eff.sentence and "survives:" not in eff.sentence
    text = str(eff)
    assert "overlapping the equivalence margin ±1.0%: inconclusive" in text, text
    from bayes_lens.metrics.stats import about

    assert f"about n = {about(eff.mae_test.n_to_decide)} if" in text   # 1354 -> "1,400": two significant figures
    # the correlation half alone can decide "inconclusive" ...
    eff = _effect_with_calibration(clean, (0.0, (-0.001, 0.001)), (0.0085, (-0.0016, 0.0203)))
    assert (eff.mae_test.outcome, eff.corr_test.outcome, eff.calibration_verdict) == \
        ("equivalent", "inconclusive", "inconclusive")
    # ... and "changes"
    eff = _effect_with_calibration(clean, (0.0, (-0.001, 0.001)), (0.05, (0.03, 0.07)))
    assert eff.calibration_verdict == "changes" and eff.calibration_survives is False
    eff = _effect_with_calibration(clean, (0.0, (-0.001, 0.001)), (0.0, (-0.004, 0.005)))
    assert eff.calibration_verdict == "survives" and eff.calibration_survives is True
    assert "calibration survives (equivalence test" in eff.sentence
    # margins are the caller's to state
    assert _effect_with_calibration(clean, (0.0, (-0.001, 0.001)), (0.0085, (-0.0016, 0.0203))) \
        .corr_test.margin == 0.01


def test_effect_refuses_a_bad_margin(tiny):
    cmp = compare_patched(tiny, TEXTS, [EntropyAxis(layer=0, progress=False).fit(tiny, TEXTS).removal()],
                          n_random_seeds=0, n_boot=20, progress=False)
    for bad in (0, -0.01, float("nan"), "1%"):
        with pytest.raises(bl.InvalidInputError, match="mae_margin"):
            cmp.effect(mae_margin=bad)


# --------------------------------------------------------------------------------------------
# issue 32 §3: several axes in one patch; the Patch's TransformerLens pairs
# --------------------------------------------------------------------------------------------


def test_compare_patched_reads_a_sum_of_patches_of_two_axes(tiny):
    """``compare_patched(model, items, [a1.removal() + a2.removal()])`` failed with "no axis to read". Each
    patched layer is now read with the axis patched there: the clean correlations are each axis's own
    (checked against values read by hand), and both coordinates are removed."""
    from bayes_lens.metrics.stats import pearson

    a0 = EntropyAxis(layer=0, progress=False).fit(tiny, TEXTS)
    a1 = EntropyAxis(layer=1, progress=False).fit(tiny, TEXTS)
    both = a0.removal() + a1.removal()
    assert both.axis is None and both.axes == (a0, a1) and both.layers == (0, 1)
    cmp = compare_patched(tiny, TEXTS, [both], n_boot=50, progress=False)
    assert cmp.conditions == ("clean", both.label) and cmp.axis_layers == (0, 1)
    for layer, ax in ((0, a0), (1, a1)):
        x, ent = _final_values_by_hand(tiny, TEXTS, layer)
        coord = (x - ax.means_[layer].double().numpy()) @ ax.axes_[layer].double().numpy()
        assert cmp.corr("clean", layer).value == pytest.approx(pearson(coord, ent), abs=1e-4)
        r = cmp.table.query(f"condition == '{both.label}' and metric == 'coordinate_std_ratio'")
        assert float(r[r["readout_layer"] == layer]["value"].iloc[0]) < 1e-4
    # the same patch in bl.patched: hook_v at each layer, read after the patch, has no component along its axis
    toks, mask = tokenize(tiny, TEXTS[:4])
    for layer, ax in ((0, a0), (1, a1)):
        _, act = _read(tiny, toks, mask, hook_name(tiny, layer, "v"), both)
        assert float((_flat(act).double() @ ax.axes_[layer].double()).abs().max()) < 1e-5


def test_two_axes_at_one_layer_in_one_patch_apply_in_order(tiny):
    """A sum of removals of two axes fitted at one layer hooks hook_v twice: a's removal, then b's (it was
    refused while removals went through one axis coordinate hook point per layer)."""
    a = _random_axis(tiny, layers=(1,), seed=0)
    b = _random_axis(tiny, layers=(1,), seed=1)
    toks, mask = tokenize(tiny, TEXTS[:2])
    name = hook_name(tiny, 1, "v")
    _, clean = _read(tiny, toks, mask, name)
    _, act = _read(tiny, toks, mask, name, a.removal() + b.removal())
    ua, ub = a.axes_[1].double(), b.axes_[1].double()
    v = _flat(clean).double()
    v = v - (v @ ua)[..., None] * ua
    v = v - (v @ ub)[..., None] * ub
    assert torch.allclose(_flat(act).double(), v, atol=1e-5)
    assert _n_hooks(tiny) == 0 and "blocks.1.hook_v_axis" not in tiny.hook_dict


def _by_hand_hook(op, u, *, lam=1.0, amount=0.0, mean=None):
    """The patch's arithmetic from scratch on TransformerLens's ``hook_v`` ``[batch, pos, head, d_head]``, in
    float64: x ← x − λ((x − μ)·u)u, x ← x + amount·u or x ← μ + ((x − μ)·u)u on each position's row x.
    """
    def hook(act, hook=None):
        x = act.reshape(*act.shape[:2], -1).double()
        uu = u.to(x.device).double()
        mu = torch.zeros_like(uu) if mean is None else mean.to(x.device).double()
        c = ((x - mu) * uu).sum(-1, keepdim=True)
        if op == "removal":
            y = x - lam * c * uu
        elif op == "shift":
            y = x + amount * uu
        else:
            y = mu + c * uu
        return y.to(act.dtype).reshape(act.shape)
    return hook


@pytest.mark.parametrize("make", ["removal", "removal_half_centred", "shift", "keep_only", "random", "random_shift"])
def test_patch_pairs_work_in_plain_transformer_lens_without_attach(tiny, make):
    """Every patch's pairs hook the site itself: ``model.run_with_hooks(tokens, fwd_hooks=list(patch))`` on a
    model nobody attached to equals ``bl.patched`` (HookedTransformer and TransformerBridge alike) and a plain TL
    hook that does the arithmetic from scratch here."""
    g = torch.Generator().manual_seed(5)
    dim = model_info(tiny).kv_dim
    axis = EntropyAxis.from_directions(tiny, {1: torch.randn(dim, generator=g)}, sigma=0.7,
                                       means={1: torch.randn(dim, generator=g)})
    patch = {"removal": lambda: axis.removal(), "removal_half_centred": lambda: axis.removal(0.5, center=True),
             "shift": lambda: axis.shift(-2.0), "keep_only": lambda: axis.keep_only(),
             "random": lambda: axis.random_control(seed=3),
             "random_shift": lambda: axis.random_control(seed=3, op="shift", sigmas=-2.0)}[make]()
    (part,) = patch.parts
    assert patch.hook_names == (hook_name(tiny, 1, "v"),) and not any("axis" in n for n, _ in patch)
    u = part.direction
    by_hand = {"removal": _by_hand_hook("removal", u), "shift": _by_hand_hook("shift", u, amount=-2.0 * 0.7),
               "removal_half_centred": _by_hand_hook("removal", u, lam=0.5, mean=axis.means_[1]),
               "keep_only": _by_hand_hook("keep_only", u), "random": _by_hand_hook("removal", u),
               "random_shift": _by_hand_hook("shift", u, amount=-2.0 * 0.7)}[make]
    toks, mask = tokenize(tiny, TEXTS[:4])
    with torch.inference_mode():
        clean = tiny(toks, attention_mask=mask)
        with bl.patched(tiny, patch):
            want = tiny(toks, attention_mask=mask)
        assert not any("axis" in n for n in tiny.hook_dict)  # nothing attached, before or after
        got = tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=list(patch))
        with tiny.hooks(fwd_hooks=list(patch)):
            got_ctx = tiny(toks, attention_mask=mask)
        ref = tiny.run_with_hooks(toks, attention_mask=mask, fwd_hooks=[(hook_name(tiny, 1, "v"), by_hand)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ctx, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    assert (got - clean).abs().max() > 1e-3  # the patch does something (the test can fail)
    assert _n_hooks(tiny) == 0


def test_treatment_and_control_take_the_same_route_and_hook_order(tiny):
    """The axis removal and its random control hook the same hook point with the same function, and sit in the
    same place relative to a user's own hooks on it (TransformerLens's registration order): the patch sees the
    edit of a user hook added before it, and a user hook added after sees the patched value — for both."""
    axis = _random_axis(tiny, layers=(1,))
    name = hook_name(tiny, 1, "v")
    toks, mask = tokenize(tiny, TEXTS[:3])
    treat, control = axis.removal(), axis.random_control(seed=0)
    assert treat.hook_names == control.hook_names == (name,)
    assert treat[0][1].__func__ is control[0][1].__func__  # PatchPart.hook_fn: one function for both
    _, clean = _read(tiny, toks, mask, name)
    v = _flat(clean).double()
    for patch in (treat, control):
        u = patch.parts[0].direction.double()
        seen = {}

        def before(act, hook):  # a user's edit, added before the patch
            seen["before"] = _flat(act).detach().double().clone()
            return act * 2.0

        def after(act, hook):  # a user's read, added after the patch
            seen["after"] = _flat(act).detach().double().clone()

        with torch.inference_mode(), tiny.hooks(fwd_hooks=[(name, before)]), bl.patched(tiny, patch), \
                tiny.hooks(fwd_hooks=[(name, after)]):
            tiny(toks, attention_mask=mask)
        assert torch.allclose(seen["before"], v, atol=1e-6), patch.label
        w = 2.0 * v  # the patch acted on the user's edit, and the later hook saw the patch's result
        assert torch.allclose(seen["after"], w - (w @ u)[..., None] * u, atol=1e-5), patch.label
    assert _n_hooks(tiny) == 0


def test_an_axis_fitted_on_another_model_is_refused_when_applied(tmp_path, tiny_kind):
    """Issue 52 §2 (a regression of the one-route change): an axis fitted on a 3-layer model, saved and loaded without
    model=, must not act on a 2-layer model through bl.patched or compare_patched: the patch carries its model's
    fingerprint and the check names the difference."""
    from bayes_lens.models.tiny import tiny_model

    three, two = tiny_model(tiny_kind, n_layers=3), tiny_model(tiny_kind, n_layers=2)
    items = bl.sula.make_prompts(three, ks=(0, 2), n_per_k=4)
    axis = bl.EntropyAxis(layer=1).fit(three, items)
    path = axis.save(tmp_path / "axis")
    loaded = bl.EntropyAxis.load(path)
    with pytest.raises(bl.InvalidInputError, match="3 there, 2 here"):
        with bl.patched(two, loaded.removal()):
            pass
    with pytest.raises(bl.InvalidInputError, match="fitted on another model"):
        bl.compare_patched(two, items, [loaded.removal()], n_boot=20, n_random_seeds=1)
    with bl.patched(three, loaded.removal()):  # its own model still takes it
        pass
