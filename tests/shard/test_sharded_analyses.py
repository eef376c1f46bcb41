"""Every analysis inside ``bl.shard.sharded`` equals its one-process result (issue 27: scaling is the runner's).

``test_analysis_engines.py`` covers the analyses that had ``engine=`` before; this file covers those
that had none (``value_manifold``, ``attention_focusing``, ``entropy_alignment``, ``compare_domains``,
``martingale.predictive``, ``martingale.permutation_average``), that one collection asked for by two
analyses is stored once (the second reads the first one's folder, no file is rewritten), and that a
damaged merged file or shard file raises the documented error. Shards are batch-aligned
(``batch_size=4``, ``LocalEngine(n_shards=2)``), so every number is compared exactly
(``torch.equal`` / ``np.array_equal``, or the results' ``to_dict()`` to 1e-12).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bayes_lens as bl
import bayes_lens.shard as sh
from bayes_lens.models.tiny import tiny_model
from test_shard import assert_same_result  # tests/shard is on sys.path (pytest's rootdir-less import)

PROMPTS = [f"the cat {i} is a {'dog ' * (i % 4)}tree" for i in range(14)]  # 4 batches of 4 -> 2 shards


def assert_same(a, b, tol=1e-12):
    """Two to_dict() trees equal: numbers to ``tol`` (bit-level by default), arrays elementwise."""
    assert_same_result(a, b, tol)


def folders(d: Path) -> dict:
    """{analysis label: [finished shard count per collection folder]}."""
    out = {}
    for f in sorted(p for p in Path(d).iterdir() if p.is_dir()):
        out.setdefault(f.name.rsplit("-", 1)[0], []).append(len(list(f.glob("shard-*.json"))))
    return out


def mtimes(d: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in Path(d).rglob("*") if p.is_file()}


@pytest.fixture
def model(tiny_kind):
    return tiny_model(tiny_kind)


ENG = dict(engine=sh.LocalEngine(n_shards=2))


# ------------------------------------------------------------------- (a) each analysis equals one process


def test_geometry_parts_sharded_equal_one_process(model, tmp_path):
    kw = dict(n_boot=50, seed=3, batch_size=4, progress=False)
    ref_vm = bl.value_manifold(model, PROMPTS, layer=1, n_null=20, **kw)
    ref_af = bl.attention_focusing(model, PROMPTS, **kw)
    ref_ea = bl.entropy_alignment(model, PROMPTS, layer=1, n_perm=50, **kw)
    with sh.sharded(model, shard_dir=tmp_path, **ENG) as m:
        vm = bl.value_manifold(m, PROMPTS, layer=1, n_null=20, **kw)
        af = bl.attention_focusing(m, PROMPTS, **kw)
        ea = bl.entropy_alignment(m, PROMPTS, layer=1, n_perm=50, **kw)
    # value_manifold and entropy_alignment read the same collection (layer 1 rows + next-token entropy):
    # stored once, under the first analysis that asked for it; attention_focusing asks for another one
    assert folders(tmp_path) == {"attention_focusing": [2], "value_manifold": [2]}
    assert torch.equal(vm.coords, ref_vm.coords)
    assert_same(vm.to_dict(), ref_vm.to_dict())
    assert_same(af.to_dict(), ref_af.to_dict())
    assert_same(ea.to_dict(), ref_ea.to_dict())
    # and the one-process numbers are the reduced cache's (an independent read of the merged rows)
    rc = sh.merge(next(tmp_path.glob("value_manifold-*")), PROMPTS)
    x = rc.value_rows(1).double().numpy()
    lam = np.linalg.eigvalsh(np.corrcoef(x[:, x.std(0) > 0], rowvar=False))  # PCA of z-scored rows (METHODS §1)
    assert np.isclose(vm.pc1.value, lam[-1] / lam.sum(), atol=1e-9, rtol=0)


def test_compare_domains_sharded_equals_one_process(tiny_kind, tmp_path):
    pools = {"a": [f"the cat {i} sat on the {'mat ' * (i % 3)}" for i in range(20)],
             "b": [f"{i} plus {i % 7} is" for i in range(20)]}
    kw = dict(n_prompts=10, seed=1, layer=1, n_boot=20, n_null=10, n_perm=20, batch_size=4, progress=False)
    ref = bl.compare_domains(tiny_model(tiny_kind), pools, **kw)
    # a fresh model object: the prompt scores are cached per model, and the scoring must run sharded too
    with sh.sharded(tiny_model(tiny_kind), shard_dir=tmp_path, **ENG) as m:
        res = bl.compare_domains(m, pools, **kw)
    got = folders(tmp_path)
    assert sorted(got) == ["compare_domains", "prompts"] and len(got["compare_domains"]) == 2
    assert all(n >= 1 for ns in got.values() for n in ns)
    for d in pools:
        assert res.selections[d].prompts == ref.selections[d].prompts
        assert torch.equal(res.value_manifold[d].coords, ref.value_manifold[d].coords)
    assert_same(res.to_dict(), ref.to_dict())


def test_martingale_predictive_and_permutation_average_sharded_equal_one_process(model, tmp_path):
    seqs = np.random.default_rng(0).integers(0, 2, size=(9, 7))
    p_ref, m_ref = bl.martingale.predictive(model, seqs, return_mass=True, include_next=True, batch_size=4)
    kw = dict(seq_len=6, n_seqs=4, n_perms=4, ks=(1, 2), seed=2, n_partitions=5, n_boot=20, batch_size=4, progress=False)
    ref_perm = bl.martingale.permutation_average(model, **kw)
    with sh.sharded(model, shard_dir=tmp_path, **ENG) as m:
        p_sh, m_sh = bl.martingale.predictive(m, seqs, return_mass=True, include_next=True, batch_size=4)
        perm = bl.martingale.permutation_average(m, **kw)
    # predictive's collection, and the permutation average's own plus its rescoring pass (another batch size:
    # the numerical floor), which goes through the runner as a plain predictive
    got = folders(tmp_path)
    assert got["permutation_average"] == [2] and len(got["predictive"]) == 2 and sorted(got) == [
        "permutation_average", "predictive"]
    assert np.isfinite(p_ref[:, 1:]).all() and ((p_ref[:, 1:] > 0) & (p_ref[:, 1:] < 1)).all()
    assert np.array_equal(p_sh, p_ref) and np.array_equal(m_sh, m_ref)
    assert np.array_equal(perm.predictive, ref_perm.predictive)
    assert_same(perm.to_dict(), ref_perm.to_dict())
    # the model's predictive is the renormalized two-token softmax of its own logits (independent of the runner)
    texts = [bl.martingale.DEFAULT_TEMPLATE.render(s) for s in seqs[:1]]
    toks, mask = bl.adapter.tokenize(model, texts)
    logits = model(toks, attention_mask=mask)
    direct = bl.martingale.predictive_from_logits(model, seqs[:1], logits, toks)
    np.testing.assert_allclose(p_sh[:1, :-1], direct, atol=1e-6, rtol=0)


# ------------------------------------------------------------------- (b) one collection, stored once


def test_a_collection_two_analyses_ask_for_is_stored_once(model, tmp_path):
    items = bl.sula.make_prompts(model, ks=(0, 2, 8), n_per_k=5, seed=1)
    kw = dict(layer=1, n_boot=20, seed=2, batch_size=4, progress=False)
    with sh.sharded(model, shard_dir=tmp_path, **ENG) as m:
        res = bl.sula.evaluate(m, items, **kw)
    assert folders(tmp_path) == {"sula.evaluate": [2]}
    before = mtimes(tmp_path)
    # another analysis, another block, the same collection (layer-1 rows and the two labels' log-probs):
    # read from the folder that holds it; nothing is run or written again
    with sh.sharded(model, shard_dir=tmp_path, engine="local") as m:
        axis = bl.EntropyAxis(layer=1, batch_size=4, progress=False).fit(m, items)
        again = bl.sula.evaluate(m, items, **kw)
    assert mtimes(tmp_path) == before and folders(tmp_path) == {"sula.evaluate": [2]}
    ref = bl.EntropyAxis(layer=1, batch_size=4, progress=False).fit(model, items)
    assert torch.equal(axis.axes_[1], ref.axes_[1]) and axis.sigma_ == ref.sigma_
    assert torch.equal(again.model_p_first, res.model_p_first)
    # other settings are another collection (another folder), even for the same analysis
    with sh.sharded(model, shard_dir=tmp_path, **ENG) as m:
        bl.sula.evaluate(m, items, **{**kw, "layer": 0})
    assert folders(tmp_path) == {"sula.evaluate": [2, 2]}


# ------------------------------------------------------------------- (c) damage raises the documented error


def test_damaged_merged_file_and_damaged_shard_raise_their_errors(model, tmp_path):
    kw = dict(layer=1, n_boot=20, n_null=10, seed=0)
    with sh.sharded(model, shard_dir=tmp_path / "study", **ENG) as m:
        rc = bl.collect.collect(m, PROMPTS, value_layers=[1], batch_size=4, progress=False)
    ref = bl.collect.collect(model, PROMPTS, value_layers=[1], batch_size=4, progress=False)
    assert sorted(rc) == sorted(ref) and all(torch.equal(rc[k], ref[k]) for k in ref)
    # the merged cache, saved and loaded, is what every analysis accepts
    path = rc.save(tmp_path / "merged.safetensors", {"study": "t"})
    loaded = bl.ReducedCache.load(path)
    assert_same(bl.value_manifold(loaded, **kw).to_dict(), bl.value_manifold(ref, **kw).to_dict())
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[-5] ^= 0x01  # the last tensor's bytes
    path.write_bytes(bytes(damaged))
    with pytest.raises(bl.CheckpointError, match="does not match its SHA-256"):
        bl.ReducedCache.load(path)
    with pytest.raises(bl.CheckpointError, match="does not match its SHA-256"):
        bl.value_manifold(bl.ReducedCache.load(path), **kw)
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(bl.CheckpointError, match="cannot read"):
        bl.ReducedCache.load(path)
    # a damaged shard of the study: merging it is refused, status lists it, and the next analysis that asks for
    # this collection (same folder) redoes that shard only and gets the one-process numbers
    (folder,) = (tmp_path / "study").iterdir()
    shard = folder / "shard-00001.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(sh.ShardIntegrityError, match="shard-00001.safetensors' does not match the SHA-256"):
        sh.merge(folder, PROMPTS)
    first = (folder / "shard-00000.safetensors").stat().st_mtime_ns
    with sh.sharded(model, shard_dir=tmp_path / "study", **ENG) as m:
        vm = bl.value_manifold(m, PROMPTS, batch_size=4, progress=False, **kw)
    assert [p.name for p in (tmp_path / "study").iterdir()] == [folder.name]
    assert (folder / "shard-00000.safetensors").stat().st_mtime_ns == first
    assert shard.read_bytes() != bytes(raw)
    assert_same(vm.to_dict(), bl.value_manifold(ref, **kw).to_dict())
    assert sh.status(folder)["damaged"] == [] and len(sh.merge(folder, PROMPTS)["final_rows.v.1"]) == 14


def test_hooks_already_on_the_model_are_refused_not_silently_ignored(model, tmp_path):
    """A patch attached around the call (bl.patched) is in no shard folder's name: inside ``sharded`` it would
    silently read the clean run's shards. It is refused; the same patch as ``fwd_hooks`` runs and differs."""
    items = bl.sula.make_prompts(model, ks=(0, 2, 8), n_per_k=4, seed=1)
    axis = bl.EntropyAxis(layer=1, batch_size=4, progress=False).fit(model, items)
    kw = dict(layer=1, n_boot=20, batch_size=4, progress=False)
    with bl.patched(model, axis.removal()):
        ref_patched = bl.sula.evaluate(model, items, **kw)  # outside sharded: the patch applies
    with sh.sharded(model, shard_dir=tmp_path, **ENG) as m:
        clean = bl.sula.evaluate(m, items, **kw)
        # the removal hooks hook_v itself (the bridge may name its canonical point: blocks.1.attn.v.hook_out)
        with pytest.raises(sh.ShardEngineError, match=r"hooks attached to the model at \['blocks\.1\.attn\.[a-z_.]*'\]"):
            with bl.patched(m, axis.removal()):
                bl.sula.evaluate(m, items, **kw)
        patched = bl.sula.evaluate(m, items, fwd_hooks=list(axis.removal()), **kw)
    assert not torch.equal(patched.model_p_first, clean.model_p_first)
    assert torch.equal(patched.model_p_first, ref_patched.model_p_first)
    assert len(folders(tmp_path)["sula.evaluate"]) == 2


@pytest.mark.parametrize("bad", [None, "default", 3])
def test_sharded_refuses_what_is_not_a_model_or_spec(tmp_path, bad):
    """Issue 32: ``sharded(None, ...)`` yielded None (the analysis then failed on a None model)."""
    with pytest.raises(bl.InvalidInputError, match="TransformerLens model .* or a bl.shard.ModelSpec"):
        with sh.sharded(bad, shard_dir=tmp_path):
            pass
    assert not any(tmp_path.iterdir())
