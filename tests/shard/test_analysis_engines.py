"""``bl.shard.sharded`` (issue 13, issue 27): an analysis run in shards equals the one-process analysis.

Each analysis (``sula.evaluate``, ``EntropyAxis.fit``, ``compare_patched``, ``martingale.gap``,
``geometry``) is run once in one process and once inside ``with bl.shard.sharded(model, engine=...,
shard_dir=...)``, where the runner sends every ``collect`` through
:func:`bayes_lens.shard.collect_sharded` with 2-3 shards. Batch-aligned shards: every
per-prompt array ``torch.equal`` and every statistic equal to 1e-6; shards batched differently from
the reference (other padding widths): within 1e-5. ``torchrun --nproc_per_node 2`` (gloo) gives every
rank the one-process result. Bad engine arguments raise their BayesLensError subclass before any
compute. (The analyses that had no ``engine=`` before are in ``test_sharded_analyses.py``.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import bayes_lens as bl
import bayes_lens.shard as sh
from bayes_lens.ablation import EntropyAxis, compare_patched
from bayes_lens.models.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[2]
TINY = "bayes_lens.models.tiny:tiny_model"
SULA_TENSORS = ("model_p_first", "model_entropy_bits", "model_label_mass", "pc1", "bayes_p_first", "k")


def assert_same(a, b, tol=1e-6, skip=()):
    """Two to_dict() trees equal: numbers to ``tol``, everything else exactly; keys containing a word of
    ``skip`` are not compared."""
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            if not any(w in str(k) for w in skip):
                assert_same(a[k], b[k], tol, skip)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, tol, skip)
    elif isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool):
        assert np.isclose(float(a), float(b), atol=tol, rtol=0, equal_nan=True), (a, b)
    else:
        assert a == b


def assert_frames(a: pd.DataFrame, b: pd.DataFrame, tol=1e-6):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if pd.api.types.is_numeric_dtype(a[col]) and not pd.api.types.is_bool_dtype(a[col]):
            np.testing.assert_allclose(x.astype(float), y.astype(float), atol=tol, rtol=0, err_msg=col)
        else:
            assert [str(v) for v in x] == [str(v) for v in y], col


def n_shard_files(folder: Path) -> dict:
    """{collection subfolder: number of finished shards}."""
    return {d.name.rsplit("-", 1)[0] + "/" + d.name: len(list(d.glob("shard-*.json")))
            for d in sorted(folder.iterdir()) if d.is_dir()}


@pytest.fixture
def model(tiny_kind):
    return tiny_model(tiny_kind)


@pytest.fixture
def items(model):
    return bl.sula.make_prompts(model, ks=(0, 2, 8), n_per_k=5, seed=1)  # 15 prompts


# ------------------------------------------------------------------------------------------- SULA


def test_sula_sharded_equals_one_process(model, items, tmp_path):
    kw = dict(layer=1, n_boot=50, seed=2, batch_size=4, progress=False)
    ref = bl.sula.evaluate(model, items, **kw)
    with sh.sharded(model, engine=sh.LocalEngine(n_shards=3), shard_dir=tmp_path) as m:
        assert m is model  # a model object is used as it is
        res = bl.sula.evaluate(m, items, **kw)
    folders = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert len(folders) == 1 and folders[0].name.startswith("sula.evaluate-")
    assert len(list(folders[0].glob("shard-*.json"))) == 3  # 4 batches -> 3 shards on batch boundaries
    for name in SULA_TENSORS:
        assert torch.equal(getattr(res, name), getattr(ref, name)), name
    assert_same(res.to_dict(), ref.to_dict())
    assert_frames(res.table, ref.table)
    assert_frames(res.geometry, ref.geometry)
    # a rerun resumes: nothing is run again, no file changes, the same numbers
    before = {p: p.stat().st_mtime_ns for p in folders[0].iterdir()}
    with sh.sharded(model, engine="local", shard_dir=tmp_path) as m:  # the plan keeps 3 shards
        again = bl.sula.evaluate(m, items, **kw)
    assert {p: p.stat().st_mtime_ns for p in folders[0].iterdir()} == before
    assert torch.equal(again.model_p_first, ref.model_p_first)


def test_sula_unaligned_shards_within_1e5(model, items, tmp_path):
    kw = dict(layer=1, n_boot=50, seed=2, progress=False)
    ref = bl.sula.evaluate(model, items, batch_size=4, **kw)
    with sh.sharded(model, engine=sh.LocalEngine(n_shards=2), shard_dir=tmp_path) as m:
        res = bl.sula.evaluate(m, items, batch_size=3, **kw)
    for name in SULA_TENSORS:
        np.testing.assert_allclose(getattr(res, name).numpy(), getattr(ref, name).numpy(), atol=1e-5, rtol=0)
    # rank statistics are left out: Bayes entropies tie within each k, and PC1 scores that are equal in
    # one run differ by ~1e-7 in the other, so ties break differently (a jump, not a drift)
    assert_same(res.to_dict(), ref.to_dict(), tol=1e-5, skip=("spearman",))


# ------------------------------------------------------------------------- axis + compare_patched


def test_axis_and_compare_patched_sharded_equal_one_process(model, items, tmp_path):
    axis = EntropyAxis(layer=1, batch_size=4, progress=False).fit(model, items)
    eng = sh.LocalEngine(n_shards=2)
    with sh.sharded(model, engine=eng, shard_dir=tmp_path) as m:
        sharded_axis = EntropyAxis(layer=1, batch_size=4, progress=False).fit(m, items)
    assert torch.equal(sharded_axis.axes_[1], axis.axes_[1]) and torch.equal(sharded_axis.means_[1], axis.means_[1])
    assert sharded_axis.sigma_ == axis.sigma_
    assert sharded_axis.removal().digest() == axis.removal().digest()

    patches = [axis.removal(lam=0.5), axis.keep_only()]
    kw = dict(n_random_seeds=1, n_boot=50, seed=1, batch_size=4, progress=False)
    ref = compare_patched(model, items, patches, **kw)
    with sh.sharded(model, engine=eng, shard_dir=tmp_path) as m:
        res = compare_patched(m, items, patches, **kw)
    assert res.conditions == ref.conditions and len(ref.conditions) == 5  # clean, 2 patches, 2 random groups
    assert_frames(res.table, ref.table)
    exact = (res.table["value"].to_numpy() == ref.table["value"].to_numpy()) | ref.table["value"].isna().to_numpy()
    assert exact.all()  # batch-aligned: the very same numbers
    counts = n_shard_files(tmp_path)
    # one collection per condition and seed; the clean run is the collection the axis was fitted on (same prompts,
    # layer and label tokens), so it is read from the axis's folder, not stored twice
    assert sorted(k.split("/")[0] for k in counts) == ["axis"] + ["compare_patched"] * 4
    assert set(counts.values()) == {2}


def test_patches_on_an_engine_with_remote_workers_are_refused_first(model, items, tmp_path):
    class Remote:  # an engine whose workers are other processes (as Ray's): runs nothing here
        name = "remote"

        def world_size(self):
            return 2

        def run(self, *a, **k):
            raise AssertionError("must not run")

    axis = EntropyAxis(layer=1, batch_size=4, progress=False).fit(model, items)
    with pytest.raises(sh.ShardEngineError, match="compare_patched with patches cannot run on the 'remote' engine"):
        with sh.sharded(model, engine=Remote(), shard_dir=tmp_path) as m:
            compare_patched(m, items, [axis.removal()], progress=False)
    with pytest.raises(sh.ShardEngineError, match="sula.evaluate with patches cannot run on the 'ray' engine"):
        with sh.sharded(model, engine=sh.RayEngine(2), shard_dir=tmp_path) as m:
            bl.sula.evaluate(m, items, fwd_hooks=list(axis.removal()))
    with pytest.raises(sh.ShardEngineError, match="fwd_hooks"):
        sh.collect_sharded(model, items.texts, tmp_path / "x", engine=sh.RayEngine(2), task="t",
                           fwd_hooks=list(axis.removal()))
    assert not any(tmp_path.iterdir())  # refused before any compute or file


def test_plain_function_hooks_are_refused_in_sharded_runs(model, items, tmp_path):
    """Two closures of one function would share a shard folder: a rerun must not reuse the other's shards."""
    name = "blocks.1.attn.hook_v"

    def scale(factor):
        def fn(act, hook=None):
            return act * factor
        return fn

    with pytest.raises(sh.ShardEngineError, match="plain functions"):
        with sh.sharded(model, engine="local", shard_dir=tmp_path) as m:
            bl.sula.evaluate(m, items, fwd_hooks=[(name, scale(0.5))], layer=1, progress=False)
    with pytest.raises(sh.ShardEngineError, match="per-batch hook factory"):
        with sh.sharded(model, shard_dir=tmp_path) as m:
            bl.collect.collect(m, items.texts, fwd_hooks=lambda batch: [(name, scale(0.5))])
    assert not any(tmp_path.iterdir())
    # without shards, plain hooks run as before (and change the result)
    a = bl.sula.evaluate(model, items, fwd_hooks=[(name, scale(0.0))], layer=1, n_boot=50, progress=False)
    b = bl.sula.evaluate(model, items, layer=1, n_boot=50, progress=False)
    assert not torch.allclose(a.model_p_first, b.model_p_first)


# ------------------------------------------------------------------------------------- martingale


def test_martingale_gap_sharded_equals_one_process(model, tmp_path):
    kw = dict(n_seqs=10, seed=3, n_boot=50, batch_size=4, progress=False)
    ns = (6, 8, 10)
    ref = bl.martingale.gap(model, ns, **kw)
    with sh.sharded(model, engine=sh.LocalEngine(n_shards=3), shard_dir=tmp_path) as m:
        res = bl.martingale.gap(m, ns, **kw)
    counts = n_shard_files(tmp_path)
    assert len(counts) == 3 and set(counts.values()) == {3}  # one collection per n, 3 shards each
    for a, b in zip(res.per_seq, ref.per_seq):
        assert np.array_equal(a, b)
    assert_frames(res.per_n, ref.per_n, tol=0)
    assert_same(res.to_dict(), ref.to_dict())
    # the stored tail holds the predictive at every position, not only the two gap reads
    seqs = [[1, 0, 1, 1, 0, 0, 1]]
    p_ref, m_ref = bl.martingale.predictive(model, seqs, return_mass=True, batch_size=4)
    with sh.sharded(model, shard_dir=tmp_path / "p") as m:
        p_sh, m_sh = bl.martingale.predictive(m, seqs, return_mass=True, batch_size=4)
    assert len(list((tmp_path / "p").glob("predictive-*/shard-*.json"))) == 1
    assert np.isfinite(p_ref[0, 1:]).all()
    assert np.array_equal(p_sh, p_ref) and np.array_equal(m_sh, m_ref)


def test_martingale_gap_unaligned_within_1e5(model, tmp_path):
    kw = dict(n_seqs=10, seed=3, n_boot=50, progress=False)
    ref = bl.martingale.gap(model, (6, 8, 10), batch_size=4, **kw)
    with sh.sharded(model, engine=sh.LocalEngine(n_shards=2), shard_dir=tmp_path) as m:
        res = bl.martingale.gap(m, (6, 8, 10), batch_size=3, **kw)
    assert_same(res.to_dict(), ref.to_dict(), tol=1e-5)


# --------------------------------------------------------------------------------------- geometry


def test_geometry_sharded_equals_one_process(model, tmp_path):
    prompts = [f"the cat {i} is a {'dog ' * (i % 4)}tree" for i in range(14)]
    kw = dict(layer=1, n_boot=50, n_null=20, n_perm=50, seed=0, batch_size=4, progress=False)
    ref = bl.geometry(model, prompts, **kw)
    with sh.sharded(model, engine=sh.LocalEngine(n_shards=2), shard_dir=tmp_path) as m:
        res = bl.geometry(m, prompts, **kw)
    assert [d.name.split("-")[0] for d in tmp_path.iterdir()] == ["geometry"]
    assert torch.equal(res.value_manifold.coords, ref.value_manifold.coords)
    assert_same(res.to_dict(), ref.to_dict())


# ------------------------------------------------------------------------------------- bad input


def test_bad_engine_arguments(model, items, tmp_path):
    with pytest.raises(bl.InvalidInputError, match="shard_dir must be a folder path"):
        with sh.sharded(model, engine="torchrun", shard_dir=None):
            pass
    with pytest.raises(bl.InvalidInputError, match="engine must be 'local', 'torchrun'"):
        with sh.sharded(model, engine="slurm", shard_dir=tmp_path):
            pass
    (tmp_path / "f").write_text("x")
    with pytest.raises(bl.InvalidInputError, match="is a file"):
        with sh.sharded(model, shard_dir=tmp_path / "f"):
            pass
    with pytest.raises(bl.InvalidInputError, match="shard_dir must be a folder path"):
        with sh.sharded(model, shard_dir=3):
            pass
    with pytest.raises(bl.InvalidInputError, match="n_shards"):
        sh.LocalEngine(n_shards=0)
    with pytest.raises(bl.InvalidInputError, match="tail_positions needs token_ids"):
        with sh.sharded(model, shard_dir=tmp_path) as m:
            bl.collect.collect(m, ["a b"], tail_positions=2)
    assert not [p for p in tmp_path.iterdir() if p.name != "f"]


def test_inputs_that_run_nothing_are_read_in_this_process(model, items, tmp_path):
    """Inside ``sharded`` only forward passes go to the engine: a cache, arrays or a predictor callable
    give the one-process result and write no shard folder."""
    toks, mask = bl.adapter.tokenize(model, items.texts)
    pair = model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter(model))
    kw = dict(layer=1, n_boot=50, seed=2)
    x, y = np.random.default_rng(0).normal(size=(15, 8)), np.linspace(0.0, 1.0, 15)
    ref_sula = bl.sula.evaluate(pair, items, attention_mask=mask, **kw)
    ref_axis = EntropyAxis(layer=1).fit(x, y)
    ref_gap = bl.martingale.gap(bl.martingale.laplace, (6, 8, 10), n_seqs=10, seed=3, n_boot=50)
    with sh.sharded(model, shard_dir=tmp_path) as m:
        res_sula = bl.sula.evaluate(pair, items, attention_mask=mask, **kw)
        res_axis = EntropyAxis(layer=1).fit(x, y)
        res_gap = bl.martingale.gap(bl.martingale.laplace, (6, 8, 10), n_seqs=10, seed=3, n_boot=50)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    for name in SULA_TENSORS:
        assert torch.equal(getattr(res_sula, name), getattr(ref_sula, name)), name
    assert_same(res_sula.to_dict(), ref_sula.to_dict())
    assert torch.equal(res_axis.axes_[1], ref_axis.axes_[1])
    assert_same(res_gap.to_dict(), ref_gap.to_dict())
    # and the cache equals a run of the model (the same reducers): the streaming result
    streamed = bl.sula.evaluate(model, items, progress=False, **kw)
    np.testing.assert_allclose(res_sula.model_p_first.numpy(), streamed.model_p_first.numpy(), atol=1e-6, rtol=0)


def test_same_shard_dir_with_another_model_is_refused(tiny_kind, items, tmp_path):
    kw = dict(layer=1, n_boot=20, batch_size=4, progress=False)
    with sh.sharded(tiny_model(tiny_kind), shard_dir=tmp_path) as m:
        bl.sula.evaluate(m, items, **kw)
    with pytest.raises(sh.ShardMismatchError, match="another model.*delete that folder"):
        with sh.sharded(tiny_model(tiny_kind, seed=1), shard_dir=tmp_path) as m:
            bl.sula.evaluate(m, items, **kw)


# --------------------------------------------------------------------------------------- torchrun


def test_torchrun_two_ranks_sula_every_rank_gets_the_one_process_result(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    kind = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import bayes_lens as bl, bayes_lens.shard as sh
        spec = sh.ModelSpec({TINY!r}, {{"kind": {kind!r}}})
        items = bl.sula.make_prompts(spec.load(), ks=(0, 2, 8), n_per_k=5, seed=1)
        with sh.sharded(spec, engine=sh.TorchrunEngine(n_shards=4), shard_dir=sys.argv[1] + "/shards") as m:
            res = bl.sula.evaluate(m, items, layer=1, n_boot=50, seed=2, batch_size=4, progress=False)
        out = {{"p": res.model_p_first.tolist(), "pc1": res.pc1.tolist(), "mae": res.mae_bits.value,
               "stats": res.to_dict()}}
        with open(sys.argv[1] + f"/rank{{os.environ['RANK']}}.json", "w") as fh:
            json.dump(out, fh, default=str)
    """))
    env = dict(__import__("os").environ, BAYES_LENS_PROGRESS="0", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    model = tiny_model(kind)
    items = bl.sula.make_prompts(model, ks=(0, 2, 8), n_per_k=5, seed=1)
    ref = bl.sula.evaluate(model, items, layer=1, n_boot=50, seed=2, batch_size=4, progress=False)
    (folder,) = [d for d in (tmp_path / "shards").iterdir() if d.is_dir()]
    workers = {json.loads(p.read_text())["worker"]["rank"] for p in folder.glob("shard-*.json")}
    assert workers == {0, 1}  # both ranks ran shards
    for out in ranks:
        assert torch.equal(torch.tensor(out["p"], dtype=torch.float64), ref.model_p_first)
        assert torch.equal(torch.tensor(out["pc1"], dtype=torch.float64), ref.pc1)
        assert out["mae"] == ref.mae_bits.value


def test_torchrun_spec_gets_this_ranks_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    spec = sh.ModelSpec("default", {"device": "cuda", "kind": "bridge"})
    assert sh.TorchrunEngine.rank_spec(spec).kwargs == {"device": "cuda:1", "kind": "bridge"}
    assert sh.TorchrunEngine.rank_spec(sh.ModelSpec("default", {"device": "cpu"})).kwargs == {"device": "cpu"}


def test_ray_two_actors_sula_equals_one_process(tmp_path):
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed: pip install 'bayes-lens[ray]' to test the Ray engine")
    import os

    kind = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
    spec = sh.ModelSpec(TINY, {"kind": kind})
    model = tiny_model(kind)
    items = bl.sula.make_prompts(model, ks=(0, 2, 8), n_per_k=5, seed=1)
    kw = dict(layer=1, n_boot=50, seed=2, batch_size=4, progress=False)
    ref = bl.sula.evaluate(model, items, **kw)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
                                       "BAYES_LENS_PROGRESS": "0", "OMP_NUM_THREADS": "1"}})
    try:
        with pytest.raises(bl.InvalidInputError, match="needs a ModelSpec"):  # actors cannot get a model object
            with sh.sharded(model, engine=sh.RayEngine(2), shard_dir=tmp_path / "obj") as m:
                bl.sula.evaluate(m, items, **kw)
        with sh.sharded(spec, engine=sh.RayEngine(n_replicas=2, num_cpus=1, n_shards=3), shard_dir=tmp_path) as m:
            assert m is not model and sh.model_fingerprint(m) == sh.model_fingerprint(model)  # the spec, built here
            res = bl.sula.evaluate(m, items, **kw)
            with pytest.raises(sh.ShardEngineError, match="another model than the one"):
                bl.sula.evaluate(model, items, **kw)  # the workers build only the spec
    finally:
        ray.shutdown()
    (folder,) = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("sula.evaluate-")]
    pids = {json.loads(p.read_text())["worker"]["pid"] for p in folder.glob("shard-*.json")}
    assert len(pids) == 2 and os.getpid() not in pids
    for name in SULA_TENSORS:
        assert torch.equal(getattr(res, name), getattr(ref, name)), name
    assert_same(res.to_dict(), ref.to_dict())
