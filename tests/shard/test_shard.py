"""Sharded runs (issue 13): shard files merge to exactly one process's reduced cache, or are refused.

One-process reference: :func:`bayes_lens.collect.collect` on all prompts. Batch-aligned shards must
give every tensor ``torch.equal`` and the geometry results built on them equal to 1e-6; unaligned
shards (other padding widths) agree to 1e-5. ``torchrun --nproc_per_node 2`` (gloo, CPU) and an
interrupted-then-resumed CLI run give the same tensors. Every way a shard set can fail to be one
run (gap, overlap, swapped files, changed prompts, settings, model) raises its ShardError subclass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import bayes_lens as bl
import bayes_lens.shard as sh
from bayes_lens.collect import collect
from bayes_lens.models.tiny import tiny_model

from bayes_lens.adapter import has_hooked_transformer

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [f"the cat {i} is a {'dog ' * (i % 4)}tree" for i in range(23)]
KW = dict(value_layers="all", resid_layers=[1], attention=True, token_ids=[5, 6], batch_size=4)
TINY = "bayes_lens.models.tiny:tiny_model"
KINDS = (["hooked"] if has_hooked_transformer() else []) + ["bridge"]  # as tests/conftest.py


def tensors(rc):
    return rc.file_tensors()


def assert_equal_collections(a, b, atol=None):
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb)
    assert a.attention_positions == b.attention_positions
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        if atol is None or k in ("n_tokens", "indices"):
            assert torch.equal(ta[k], tb[k]), k
        else:
            assert torch.allclose(ta[k], tb[k], atol=atol, rtol=0), (k, (ta[k] - tb[k]).abs().max())


def assert_same_result(a, b, tol=1e-6):
    """Two result dicts (to_dict()) equal: numbers to ``tol``, everything else exactly."""
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            assert_same_result(a[k], b[k], tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_result(x, y, tol)
    elif isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool):
        assert np.isclose(float(a), float(b), atol=tol, rtol=0, equal_nan=True), (a, b)
    elif isinstance(a, (np.ndarray, torch.Tensor)):
        np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), atol=tol, rtol=0)
    else:
        assert a == b


# ---------------------------------------------------------------------------------- plans


def test_plan_boundaries_fall_on_batches_and_cover_once():
    for n, bs, k in [(23, 4, 3), (10, 3, 2), (100, 16, 7), (5, 8, 4), (64, 16, 4)]:
        shards = sh.plan(n, bs, k)
        assert shards[0].start == 0 and shards[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
        assert all(s.start % bs == 0 for s in shards)
        n_batches = [-(-len(s) // bs) for s in shards]
        assert max(n_batches) - min(n_batches) <= 1
        assert len(shards) == min(k, -(-n // bs))
    assert [(s.start, s.stop) for s in sh.plan(10, 3, 2)] == [(0, 6), (6, 10)]
    assert [s.index for s in sh.shards_for_rank(sh.plan(23, 2, 7), 1, 3)] == [1, 4]
    with pytest.raises(bl.InvalidInputError, match="batch_size"):
        sh.plan(10, 0, 2)
    with pytest.raises(bl.InvalidInputError, match="rank"):
        sh.shards_for_rank(sh.plan(10, 2, 2), 2, 2)


def test_model_spec_round_trip_and_fingerprint():
    spec = sh.ModelSpec(TINY, {"kind": KINDS[0], "seed": 0})
    assert sh.ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    a, b, c = spec.load(), sh.ModelSpec(TINY, {"kind": KINDS[0], "seed": 0}).load(), tiny_model(KINDS[0], seed=1)
    assert sh.model_fingerprint(a) == sh.model_fingerprint(b) != sh.model_fingerprint(c)
    with pytest.raises(bl.InvalidInputError, match="JSON-serializable"):
        sh.ModelSpec(TINY, {"x": object()})
    with pytest.raises(bl.ModelLoadError, match="no 'nope'"):
        sh.ModelSpec("bayes_lens.models.tiny:nope").load()


# ------------------------------------------------------------------- equality with one process


def test_batch_aligned_shards_equal_one_process(tiny_kind, tmp_path):
    model = tiny_model(tiny_kind)
    ref = collect(model, PROMPTS, **KW)
    merged = sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=3, **KW)
    assert len(list(tmp_path.glob("shard-*.json"))) == 3
    assert_equal_collections(merged, ref)
    assert torch.equal(merged.indices, torch.arange(len(PROMPTS)))
    # the reductions on the merged rows equal the one-process ones
    kw = dict(n_boot=50, seed=3)
    assert_same_result(bl.value_manifold(merged, layer=1, n_null=20, **kw).to_dict(),
                       bl.value_manifold(ref, layer=1, n_null=20, **kw).to_dict())
    assert_same_result(bl.entropy_alignment(merged, layer=1, n_perm=50, **kw).to_dict(),
                       bl.entropy_alignment(ref, layer=1, n_perm=50, **kw).to_dict())
    assert_same_result(bl.attention_focusing(merged, **kw).to_dict(), bl.attention_focusing(ref, **kw).to_dict())
    # layer-at-a-time: only the asked layer's rows are read, and they are the same
    one = sh.merge(tmp_path, PROMPTS, layers=[0])
    assert one.layers("v") == [0] and one.layers("resid_post") == []
    assert torch.equal(one.value_rows(0), ref.value_rows(0))
    assert torch.equal(one["token_logprobs"], ref["token_logprobs"])  # per-prompt fields always read
    rows = dict(sh.open_shards(tmp_path).iter_layers("v"))
    assert sorted(rows) == ref.layers("v") == [0, 1]
    assert all(torch.equal(rows[k], ref.value_rows(k)) for k in ref.layers("v"))
    # a rerun resumes: every shard is skipped and no file changes
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    job = sh.read_plan(tmp_path)  # the plan runs the prompts in the runner's order and records the way back
    assert job.prompts == [PROMPTS[i] for i in bl.collect.run_order(PROMPTS)] and job.given_prompts() == PROMPTS
    assert sh.run_shards(model, job.prompts, sh.plan(23, 4, 3), tmp_path, **KW) == {0: "skipped", 1: "skipped",
                                                                                    2: "skipped"}
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_a_damaged_plan_order_is_refused(tmp_path):
    model = tiny_model(KINDS[0])
    sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=2, **KW)
    doc = json.loads((tmp_path / "plan.json").read_text())
    doc["order"][0] = doc["order"][1]
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(sh.ShardIntegrityError, match="damaged 'order'"):
        sh.merge(tmp_path)
    with pytest.raises(sh.ShardIntegrityError, match="damaged 'order'"):
        sh.read_plan(tmp_path)


def test_unaligned_shards_agree_to_1e5(tiny_kind, tmp_path):
    model = tiny_model(tiny_kind)
    ref = collect(model, PROMPTS, **KW)
    for shard in [sh.Shard(0, 0, 5), sh.Shard(1, 5, 14), sh.Shard(2, 14, 23)]:  # not multiples of 4
        assert sh.run_shard(model, PROMPTS, shard, tmp_path, **KW) == "done"
    assert_equal_collections(sh.merge(tmp_path, PROMPTS), ref, atol=1e-5)


# ------------------------------------------------------------------- refusals


@pytest.fixture(scope="module")
def done_dir(tmp_path_factory):
    """Three finished batch-aligned shards of PROMPTS (first model kind), and the one-process reference."""
    d = tmp_path_factory.mktemp("done")
    spec = sh.ModelSpec(TINY, {"kind": KINDS[0]})
    sh.run_shards(spec, PROMPTS, sh.plan(len(PROMPTS), 4, 3), d, **KW)
    return d, spec


@pytest.fixture
def shards(done_dir, tmp_path):
    d = tmp_path / "shards"
    shutil.copytree(done_dir[0], d)
    return d, done_dir[1]


def test_missing_shard_is_named(shards):
    d, _ = shards
    (d / "shard-00001.json").unlink()  # its tensors may stay: without a manifest it is unfinished
    with pytest.raises(sh.ShardCoverageError, match=r"prompts \[8, 16\) of 23 are in no finished shard"):
        sh.merge(d)
    (d / "shard-00002.json").unlink()
    with pytest.raises(sh.ShardCoverageError, match=r"\[8, 23\)"):
        sh.merge(d)


def test_overlapping_shards_are_refused(shards):
    d, spec = shards
    sh.run_shard(spec, PROMPTS, sh.Shard(7, 4, 12), d, **KW)
    with pytest.raises(sh.ShardCoverageError, match="overlaps"):
        sh.merge(d)


def test_shuffled_shard_order_merges_but_swapped_files_do_not(shards, tmp_path):
    d, spec = shards
    ref = sh.merge(d, PROMPTS)
    other = tmp_path / "shuffled"  # shard numbers in another order than the ranges
    for i, (a, b) in enumerate([(16, 23), (0, 8), (8, 16)]):
        sh.run_shard(spec, PROMPTS, sh.Shard(i, a, b), other, **KW)
    assert_equal_collections(sh.merge(other, PROMPTS), ref)
    t0, t1 = d / "shard-00000.safetensors", d / "shard-00001.safetensors"
    tmp = d / "swap"
    os.replace(t0, tmp), os.replace(t1, t0), os.replace(tmp, t1)
    with pytest.raises(sh.ShardIntegrityError, match="does not match the SHA-256"):
        sh.merge(d)


def test_corrupt_files_are_refused(shards):
    d, _ = shards
    t = d / "shard-00002.safetensors"
    t.write_bytes(t.read_bytes()[:-100])  # truncated after it was committed
    with pytest.raises(sh.ShardIntegrityError, match="does not match the SHA-256"):
        sh.merge(d)
    with pytest.raises(sh.ShardIntegrityError, match="ends inside a tensor"):
        sh.merge(d, verify_hashes=False)
    m = json.loads((d / "shard-00001.json").read_text())
    del m["settings_sha256"]
    (d / "shard-00001.json").write_text(json.dumps(m))
    with pytest.raises(sh.ShardIntegrityError, match="incomplete"):
        sh.merge(d)
    (d / "shard-00001.json").write_text("{not json")
    with pytest.raises(sh.ShardIntegrityError, match="cannot read shard manifest"):
        sh.merge(d)


def _merged_file(d):
    out = d / "merged.safetensors"
    ms = sh.open_shards(d, PROMPTS)
    ms.reduced().save(out, {"settings_sha256": ms.manifests[0]["settings_sha256"],
                            "model_fingerprint": ms.model_fingerprint})
    return out


def test_merged_file_verifies_its_bytes(shards):
    """Issue 25: a bit flipped in the merged file (tensor bytes or metadata) is refused on load, with the
    documented error: ``bl.ReducedCache.load`` raises ``bl.CheckpointError`` (or the ``error=`` class)."""
    import struct

    from safetensors import safe_open
    from safetensors.torch import save_file

    d, _ = shards
    out = _merged_file(d)
    good = out.read_bytes()
    assert_equal_collections(bl.ReducedCache.load(out), sh.merge(d, PROMPTS))
    header_len = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + header_len])
    begin, end = header["final_rows.v.0"]["data_offsets"]
    for pos in (begin, (begin + end) // 2, end - 1):  # first, middle and last byte of one layer's rows
        flipped = bytearray(good)
        flipped[8 + header_len + pos] ^= 0x10
        out.write_bytes(bytes(flipped))
        with pytest.raises(bl.CheckpointError, match="'final_rows.v.0' does not match its SHA-256"):
            bl.ReducedCache.load(out)
        with pytest.raises(sh.ShardIntegrityError, match="SHA-256"):  # error= picks the class
            bl.ReducedCache.load(out, names=["final_rows.v.0"], error=sh.ShardIntegrityError)
        one = bl.ReducedCache.load(out, names=["final_rows.v.1"])  # the rows read are intact: they load
        assert list(one) == ["final_rows.v.1"] and one.n_prompts == len(PROMPTS)
    out.write_bytes(good[:-100])  # truncation: still refused
    with pytest.raises(bl.CheckpointError, match="cannot read"):
        bl.ReducedCache.load(out)
    # the metadata (model fingerprint, settings hash) is under the checksum too
    out.write_bytes(good)
    with safe_open(str(out), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert meta["model_fingerprint"] == sh.open_shards(d).model_fingerprint
    save_file(tensors, str(out), metadata={**meta, "model_fingerprint": "0" * 64})
    with pytest.raises(bl.CheckpointError, match="metadata .* does not match its SHA-256"):
        bl.ReducedCache.load(out)
    save_file(tensors, str(out), metadata={k: v for k, v in meta.items() if k != "tensors_sha256"})
    with pytest.raises(bl.CheckpointError, match="SHA-256"):
        bl.ReducedCache.load(out)
    # a file that is no reduced cache (no n_tokens) is refused by name, not read as an empty cache
    save_file({"x": torch.zeros(2)}, str(out))
    with pytest.raises(bl.CheckpointError, match="no 'n_tokens'"):
        bl.ReducedCache.load(out)


def test_changed_prompts_are_refused_and_reordered_ones_come_back_in_their_order(shards):
    """Issue 32: ``merge(dir, prompts)`` returns rows in the order of ``prompts`` (it refused a reordering as
    "changed or reordered prompts"); each row is matched to its prompt by hash, so a changed prompt is refused."""
    d, _ = shards
    changed = list(PROMPTS)
    changed[9] = "a different prompt"
    with pytest.raises(sh.ShardMismatchError, match="prompt 9 differs"):
        sh.merge(d, changed)
    with pytest.raises(sh.ShardMismatchError, match="23 prompts, but 22"):
        sh.merge(d, PROMPTS[:-1])
    ref = sh.merge(d, PROMPTS)
    back = sh.merge(d, PROMPTS[::-1])
    for k, t in tensors(ref).items():
        assert torch.equal(tensors(back)[k], torch.arange(23) if k == "indices" else t.flip(0)), k


def _swap(xs, i, j):
    xs = list(xs)
    xs[i], xs[j] = xs[j], xs[i]
    return xs


def test_merge_with_equal_length_prompts_swapped_returns_rows_in_that_order(tmp_path):
    """Issue 32: two prompts of equal length swapped in the list given to merge (a planned folder: the plan's run
    order keeps equal lengths in their given order, so the swapped list has another run order) come back in
    the order given, equal to one process on that list."""
    model = tiny_model(KINDS[0])
    assert len(PROMPTS[1]) == len(PROMPTS[5])
    sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=3, **KW)
    swapped = _swap(PROMPTS, 1, 5)
    got, ref = sh.merge(tmp_path, swapped), sh.merge(tmp_path, PROMPTS)
    perm = _swap(range(23), 1, 5)
    for k, t in tensors(ref).items():
        assert torch.equal(tensors(got)[k], torch.arange(23) if k == "indices" else t[perm]), k
    assert_equal_collections(got, collect(model, swapped, **KW), atol=1e-5)


def _edit_order(how):
    def edit(d):
        path = d / "plan.json"
        if how == "no plan.json":
            path.unlink()
            return
        doc = json.loads(path.read_text())
        if how == "swapped":
            doc["order"][0], doc["order"][-1] = doc["order"][-1], doc["order"][0]
        elif how == "reversed":
            doc["order"] = doc["order"][::-1]
        elif how == "identity":
            doc["order"] = sorted(doc["order"])
        elif how == "null":
            doc["order"] = None
        elif how == "deleted":
            del doc["order"]
        path.write_text(json.dumps(doc))
    return edit


@pytest.mark.parametrize("how", ["swapped", "reversed", "identity", "null", "deleted", "no plan.json"])
def test_an_edited_or_missing_plan_order_is_refused_by_merge(tmp_path, how):
    """Issue 32: plan.json's "order" was under no checksum, so ``merge(dir)`` returned rows in the wrong prompt
    order after it was edited, nulled or deleted, or after plan.json was deleted. The plan now carries a
    SHA-256 of itself and a planned shard's manifest says so: each is refused, while merge with the prompts
    (matched by hash) still returns the right rows."""
    model = tiny_model(KINDS[0])
    ref = collect(model, PROMPTS, **KW)
    assert bl.collect.run_order(PROMPTS) != list(range(23))  # the rows are stored in another order
    sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=3, **KW)
    assert_equal_collections(sh.merge(tmp_path), ref)
    _edit_order(how)(tmp_path)
    with pytest.raises(sh.ShardIntegrityError, match="plan"):
        sh.merge(tmp_path)
    assert_equal_collections(sh.merge(tmp_path, PROMPTS), ref)
    if how != "no plan.json":
        with pytest.raises(sh.ShardError):  # a rerun refuses too
            sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=3, **KW)


def test_collect_sharded_on_an_empty_or_truncated_plan_is_a_clear_error(tmp_path):
    """Issue 32: a raw JSONDecodeError before (merge gave a clear error)."""
    model = tiny_model(KINDS[0])
    sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=2, **KW)
    text = (tmp_path / "plan.json").read_text()
    for bad in ("", text[: len(text) // 2]):
        (tmp_path / "plan.json").write_text(bad)
        with pytest.raises(sh.ShardIntegrityError, match="plan.json"):
            sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=2, **KW)
        with pytest.raises(sh.ShardIntegrityError, match="plan.json"):
            sh.merge(tmp_path)
    # overwrite=True replaces it; the finished shards are kept and the result is right
    assert_equal_collections(sh.collect_sharded(model, PROMPTS, tmp_path, n_shards=2, overwrite=True, **KW),
                             collect(model, PROMPTS, **KW))


SEPARATORS = ["one\u2028two", "three\u2029four five", "six\x85seven", "plain prompt here", "a\u2028b\u2029c\x85d"]


def test_prompts_with_unicode_line_separators_plan_run_and_merge(tmp_path, capsys):
    """Issue 32: U+2028, U+2029 and U+0085 were written raw to prompts.jsonl and read back with splitlines(),
    which splits on them too, so read_plan, shard run and shard merge failed, and planning again wrote the
    same file. They are written escaped now, and lines split on "\\n" only."""
    from bayes_lens.cli import main

    model = tiny_model(KINDS[0])
    ref = collect(model, SEPARATORS, value_layers=[-1], batch_size=2)
    d = tmp_path / "job"
    rc = sh.collect_sharded(model, SEPARATORS, d, n_shards=2, value_layers=[-1], batch_size=2)
    assert_equal_collections(rc, ref)
    text = (d / "prompts.jsonl").read_text(encoding="utf-8")
    assert len(text.splitlines()) == len(SEPARATORS)  # one line a prompt, whatever splits the lines
    assert sh.read_plan(d).given_prompts() == SEPARATORS
    assert_equal_collections(sh.merge(d), ref)
    # the CLI: plan from a .jsonl holding the raw characters, run, merge
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in SEPARATORS), encoding="utf-8")
    job = tmp_path / "cli"
    assert main(["shard", "plan", str(job), "--prompts", str(src), "--loader", TINY, "--model-kwargs",
                 json.dumps({"kind": KINDS[0]}), "--value-layers", "-1", "--batch-size", "2"]) == 0
    assert main(["shard", "run", str(job), "--no-progress"]) == 0
    assert main(["shard", "merge", str(job)]) == 0
    assert_equal_collections(bl.ReducedCache.load(job / "merged.safetensors"), ref)


def test_a_prompts_file_written_raw_by_an_older_version_still_reads(tmp_path):
    model = tiny_model(KINDS[0])
    sh.collect_sharded(model, SEPARATORS, tmp_path, n_shards=1, value_layers=[-1], batch_size=2)
    job = sh.read_plan(tmp_path)
    raw = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in job.prompts)  # what was written before
    assert "\u2028" in raw
    (tmp_path / "prompts.jsonl").write_text(raw, encoding="utf-8")
    assert sh.read_plan(tmp_path).given_prompts() == SEPARATORS


def test_changed_settings_are_refused_and_named(shards):
    d, spec = shards
    with pytest.raises(sh.ShardMismatchError, match="token_ids"):  # a rerun does not overwrite silently
        sh.run_shard(spec, PROMPTS, sh.Shard(1, 8, 16), d, **{**KW, "token_ids": [7]})
    sh.run_shard(spec, PROMPTS, sh.Shard(1, 8, 16), d, overwrite=True, **{**KW, "token_ids": [7]})
    with pytest.raises(sh.ShardMismatchError, match=r"token_ids: \[5, 6\] in shard-00000.json vs \[7\]"):
        sh.merge(d)


def test_changed_model_is_refused(shards):
    d, _ = shards
    other = sh.ModelSpec(TINY, {"kind": KINDS[0], "seed": 1})
    sh.run_shard(other, PROMPTS, sh.Shard(2, 16, 23), d, overwrite=True, **KW)
    with pytest.raises(sh.ShardMismatchError, match="model fingerprint"):
        sh.merge(d)


SWAP_LOADER = """
from pathlib import Path
from bayes_lens.models.tiny import tiny_model


def model(kind):  # the same spec, whatever weights the file next to it names (a retrained checkpoint)
    return tiny_model(kind, seed=int((Path(__file__).parent / "weights_seed.txt").read_text()))
"""


def test_spec_resume_of_a_finished_folder_checks_the_weights(tmp_path, monkeypatch):
    """Issue 25: a ModelSpec whose loader now returns other weights must not reuse the finished shards."""
    (tmp_path / "bl_swap_loader.py").write_text(SWAP_LOADER)
    (tmp_path / "weights_seed.txt").write_text("0")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = sh.ModelSpec("bl_swap_loader:model", {"kind": KINDS[0]})
    d, shards = tmp_path / "job", sh.plan(len(PROMPTS), 4, 3)
    run = [PROMPTS[i] for i in bl.collect.run_order(PROMPTS)]  # the order collect_sharded's plan runs them in
    assert set(sh.run_shards(spec, run, shards, d, **KW).values()) == {"done"}
    assert set(sh.run_shards(spec, run, shards, d, **KW).values()) == {"skipped"}  # same weights: resumed
    (tmp_path / "weights_seed.txt").write_text("1")  # other weights behind the unchanged spec
    with pytest.raises(sh.ShardMismatchError, match="another model: the model 'bl_swap_loader:model' loads now"):
        sh.run_shards(spec, run, shards, d, **KW)
    with pytest.raises(sh.ShardMismatchError, match="fingerprint"):
        sh.collect_sharded(spec, PROMPTS, d, n_shards=3, **KW)
    # overwrite=True redoes them with the new weights, which then equal one process on those weights
    sh.run_shards(spec, run, shards, d, overwrite=True, **KW)
    assert_equal_collections(sh.merge(d, run), collect(tiny_model(KINDS[0], seed=1), run, **KW))


def test_mixed_dtypes_warn(shards):
    d, _ = shards
    m = json.loads((d / "shard-00001.json").read_text())
    m["dtype"] = "bfloat16"
    (d / "shard-00001.json").write_text(json.dumps(m))
    with pytest.warns(sh.MixedShardsWarning, match="dtypes"):
        col = sh.merge(d)
    assert col.n_prompts == len(PROMPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m["dtype"] = "float32"
        (d / "shard-00001.json").write_text(json.dumps(m))
        sh.merge(d)


def test_nonfinite_value_is_reported_by_global_index(tmp_path):
    """Row 1 of shard [8, 16)'s first batch is the shard's second prompt in the runner's order; the error
    names its global number, not 1."""

    def poison(act, hook):
        act[1] = float("nan")
        return act

    which = 8 + bl.collect.run_order(PROMPTS[8:16])[1]
    assert which != 1
    with pytest.raises(bl.NonFiniteError, match=rf"prompt\(s\) \[{which}\]"):
        sh.run_shard(tiny_model(KINDS[0]), PROMPTS, sh.Shard(1, 8, 16), tmp_path, task="poison row 1",
                     fwd_hooks=[("blocks.1.hook_resid_post", poison)], **KW)
    assert not (tmp_path / "shard-00001.json").exists()


def test_bad_collect_arguments_are_refused(tmp_path):
    with pytest.raises(bl.InvalidInputError, match="start_index"):
        sh.run_shard(sh.ModelSpec(TINY), PROMPTS, sh.Shard(0, 0, 4), tmp_path, start_index=3)
    with pytest.raises(bl.InvalidInputError, match="task="):
        sh.run_shard(sh.ModelSpec(TINY), PROMPTS, sh.Shard(0, 0, 4), tmp_path, fwd_hooks=[("x", print)])
    with pytest.raises(sh.ShardCoverageError, match="no finished shard"):
        sh.merge(tmp_path)


_ENOSPC_TEXT = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def _leftovers(d):
    return sorted(p.name for p in Path(d).rglob("*") if p.name.endswith(".tmp") or p.suffix == ".safetensors")


def test_full_or_read_only_file_system_is_a_write_error(tmp_path, monkeypatch):
    """Issue 25: ENOSPC / EROFS / EEXIST while writing shards are a WriteError naming the file and the
    fix (not a bare OSError or SafetensorError), and nothing partial is committed."""
    import errno

    import safetensors.torch
    from safetensors import SafetensorError

    model = tiny_model(KINDS[0])
    real_save = safetensors.torch.save_file

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"x" * 100)  # half-written, then the disk is full
        raise SafetensorError(_ENOSPC_TEXT)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    d = tmp_path / "full"
    with pytest.raises(bl.WriteError, match=r"shard-00000.safetensors.*No space left on device; the disk is full"):
        sh.collect_sharded(model, PROMPTS, d, n_shards=2, **KW)
    assert _leftovers(d) == [] and not list(d.glob("shard-*.json"))  # no tensor file, no temporary, no manifest
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    assert_equal_collections(sh.collect_sharded(model, PROMPTS, d, n_shards=2, **KW), collect(model, PROMPTS, **KW))

    # a read-only file system: the shard folder cannot be created (an analysis in bl.shard.sharded goes through the same code)
    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(bl.WriteError, match="Read-only file system; the file system is read-only"):
        sh.collect_sharded(model, PROMPTS, tmp_path / "ro" / "job", **KW)
    with pytest.raises(bl.WriteError, match="read-only"):
        with sh.sharded(model, shard_dir=tmp_path / "ro2") as m:
            bl.geometry(m, PROMPTS[:6], layer=0, n_boot=10, n_null=5, n_perm=10)
    monkeypatch.undo()

    # an existing folder that turned read-only: the temporary file cannot be made
    import tempfile

    def no_tmp(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", no_tmp)
    with pytest.raises(bl.WriteError, match="plan.json|prompts.jsonl"):
        sh.write_plan(tmp_path / "plan_ro", None, PROMPTS, sh.plan(len(PROMPTS), 4, 2), KW)
    monkeypatch.undo()

    # a file where the shard folder should be (EEXIST): named, with the fix
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(bl.WriteError, match="it is a file, not a folder"):
        sh.collect_sharded(model, PROMPTS, f, **KW)
    with pytest.raises(bl.WriteError, match="Not a directory; a file is in the way where a folder is needed"):
        sh.run_shards(model, PROMPTS, sh.plan(len(PROMPTS), 4, 2), f / "sub", **KW)
    assert f.read_text() == "x"


def test_cli_shard_plan_into_a_file_or_read_only_folder(tmp_path, monkeypatch, capsys):
    import errno

    from bayes_lens.cli import main

    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS))
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["shard", "plan", str(f), "--prompts", str(prompts_file)]) == 2
    err = capsys.readouterr().err
    assert "it is a file, not a folder" in err and "Errno" not in err and err.count("\n") == 1

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["shard", "plan", str(tmp_path / "ro" / "job"), "--prompts", str(prompts_file)]) == 2
    err = capsys.readouterr().err
    assert "the file system is read-only: write to a writable folder" in err and "Errno" not in err


def test_cli_shard_plan_bad_token_ids(tmp_path, capsys):
    from bayes_lens.cli import main

    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS))
    for bad in ("a,b", "5,,6", "5.5"):
        assert main(["shard", "plan", str(tmp_path / "job"), "--prompts", str(prompts_file), "--token-ids", bad]) == 2
        err = capsys.readouterr().err
        assert f"--token-ids must be comma-separated integer token ids (e.g. 17,42), got {bad!r}" in err
        assert "internal error" not in err
    assert not (tmp_path / "job" / "plan.json").exists()


def test_shard_status_names_damaged_and_missing_folders(shards, tmp_path, capsys):
    """Issue 25: a shard whose tensor file was deleted is not finished; a missing folder or a file is
    an error with a non-zero exit, not 'finished: 0'."""
    from bayes_lens.cli import main

    d, spec = shards
    assert sh.status(d)["damaged"] == [] and len(sh.status(d)["finished"]) == 3
    (d / "shard-00001.safetensors").unlink()
    t2 = d / "shard-00002.safetensors"
    t2.write_bytes(t2.read_bytes()[:-10])
    st = sh.status(d)
    assert st["finished"] == [(0, 0, 8)]
    assert st["damaged"] == [(1, 8, 16, "shard-00001.safetensors is missing"),
                             (2, 16, 23, f"shard-00002.safetensors has {t2.stat().st_size} bytes, its manifest says "
                                         f"{t2.stat().st_size + 10}")]
    assert main(["shard", "status", str(d)]) == 1
    cap = capsys.readouterr()
    assert "finished: 1 shard(s) 0[0,8)" in cap.out and "damaged:  1[8,16) shard-00001.safetensors is missing" in cap.out
    assert "2 damaged shard(s)" in cap.err
    # what status lists as damaged, a rerun redoes
    assert sh.run_shards(spec, PROMPTS, sh.plan(len(PROMPTS), 4, 3), d, **KW) == {0: "skipped", 1: "done", 2: "done"}
    assert sh.status(d)["damaged"] == [] and main(["shard", "status", str(d)]) == 0
    capsys.readouterr()
    with pytest.raises(sh.ShardCoverageError, match="no shard folder"):
        sh.status(tmp_path / "nowhere")
    assert main(["shard", "status", str(tmp_path / "nowhere")]) == 2
    assert "no shard folder" in capsys.readouterr().err
    f = tmp_path / "a_file"
    f.write_text("x")
    assert main(["shard", "status", str(f)]) == 2
    assert "is a file, not a shard folder" in capsys.readouterr().err


def test_bad_layers_are_refused_before_the_plan_is_written(tmp_path):
    """Issue 25: value_layers=[7] on a 2-layer model failed after writing plan.json, so the corrected
    rerun was a ShardMismatchError."""
    model = tiny_model(KINDS[0])
    d = tmp_path / "job"
    with pytest.raises(bl.LayerIndexError, match="value_layers"):
        sh.collect_sharded(model, PROMPTS, d, value_layers=[7], batch_size=4)
    with pytest.raises(bl.LayerIndexError, match="resid_layers"):
        sh.collect_sharded(model, PROMPTS, d, resid_layers=[-3], batch_size=4)
    assert not (d / "plan.json").exists()
    with pytest.raises(bl.LayerIndexError):  # an analysis in bl.shard.sharded (its workers could get a spec)
        with sh.sharded(model, shard_dir=tmp_path / "axis") as m:
            bl.EntropyAxis(layer=7, progress=False).fit(m, PROMPTS[:8])
    assert not list((tmp_path / "axis").rglob("plan.json"))
    col = sh.collect_sharded(model, PROMPTS, d, value_layers=[1], batch_size=4)  # the corrected call just runs
    assert_equal_collections(col, collect(model, PROMPTS, value_layers=[1], batch_size=4))


# ------------------------------------------------------------------- processes


def _env(*extra_paths):
    env = dict(os.environ, BAYES_LENS_PROGRESS="0", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, extra_paths), env.get("PYTHONPATH", "")])
    return env


def test_torchrun_two_ranks_gloo_equal_one_process(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import bayes_lens.shard as sh
        prompts, kw, kinds, out = {PROMPTS!r}, {KW!r}, {list(KINDS)!r}, sys.argv[1]
        for kind in kinds:
            spec = sh.ModelSpec({TINY!r}, {{"kind": kind}})
            col = sh.collect_sharded(spec, prompts, f"{{out}}/{{kind}}", engine="torchrun", n_shards=4, **kw)
            if col is not None:
                col.save(f"{{out}}/{{kind}}.safetensors")
    """))
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=240, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for kind in KINDS:
        workers = {json.loads(p.read_text())["shard"]["index"]: json.loads(p.read_text())["worker"]
                   for p in (tmp_path / kind).glob("shard-*.json")}
        assert {i: (w["rank"], w["world_size"]) for i, w in workers.items()} == {0: (0, 2), 1: (1, 2), 2: (0, 2),
                                                                                3: (1, 2)}
        ref = collect(tiny_model(kind), PROMPTS, **KW)
        assert_equal_collections(bl.ReducedCache.load(tmp_path / f"{kind}.safetensors"), ref)


def test_ray_two_actors_equal_one_process(tmp_path):
    try:
        import ray
    except ImportError:
        pytest.skip("Ray is not installed: pip install 'bayes-lens[ray]' to test the Ray engine")
    kind = KINDS[0]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
                                       "BAYES_LENS_PROGRESS": "0", "OMP_NUM_THREADS": "1"}})
    try:
        eng = sh.RayEngine(n_replicas=2, num_cpus=1)
        col = sh.collect_sharded(sh.ModelSpec(TINY, {"kind": kind}), PROMPTS, tmp_path, engine=eng, n_shards=3, **KW)
    finally:
        ray.shutdown()
    workers = {json.loads(p.read_text())["worker"]["pid"] for p in tmp_path.glob("shard-*.json")}
    assert len(workers) == 2 and os.getpid() not in workers  # two actors, not this process
    assert_equal_collections(col, collect(tiny_model(kind), PROMPTS, **KW))


CRASH_LOADER = '''
"""Test loader: the tiny model, which kills its process on the BL_CRASH_AT-th forward pass."""
import os

from bayes_lens.models.tiny import tiny_model


def model(kind):
    m = tiny_model(kind)
    at = int(os.environ.get("BL_CRASH_AT", "0"))
    if at:
        calls = [0]

        def crash(module, args):
            calls[0] += 1
            if calls[0] == at:
                os._exit(17)

        m.unembed.register_forward_pre_hook(crash)
    return m
'''


def test_killed_worker_resumes_to_the_same_result(tiny_kind, tmp_path, monkeypatch, capsys):
    from bayes_lens.cli import main

    (tmp_path / "bl_crash_loader.py").write_text(CRASH_LOADER)
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    d = tmp_path / "job"
    assert main(["shard", "plan", str(d), "--prompts", str(prompts_file), "--loader", "bl_crash_loader:model",
                 "--model-kwargs", json.dumps({"kind": tiny_kind}), "--batch-size", "4", "--n-shards", "3",
                 "--value-layers", "all", "--resid-layers", "1", "--attention", "--token-ids", "5,6"]) == 0
    # 6 batches, 2 per shard: the 4th forward pass is the second batch of shard 1
    env = dict(_env(tmp_path), BL_CRASH_AT="4")
    # a worker process runs a loader of the user's only when its launcher names it (issue 52 §1)
    proc = subprocess.run([sys.executable, "-m", "bayes_lens.cli", "shard", "run", str(d), "--allow-loader",
                           "bl_crash_loader:model"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 17, proc.stderr[-2000:]
    assert (d / "shard-00000.json").exists() and not (d / "shard-00001.json").exists()
    assert not list(d.glob(".*.tmp"))
    assert sh.status(d)["pending"] == [(1, 8, 16), (2, 16, 23)]
    with pytest.raises(sh.ShardCoverageError, match=r"\[8, 23\)"):
        sh.merge(d)
    monkeypatch.syspath_prepend(str(tmp_path))
    capsys.readouterr()
    assert main(["shard", "run", str(d), "--no-progress"]) == 0
    assert capsys.readouterr().out.split("\n")[:3] == ["shard 0: skipped", "shard 1: done", "shard 2: done"]
    assert main(["shard", "status", str(d)]) == 0 and "pending:  0 of 3" in capsys.readouterr().out
    assert main(["shard", "merge", str(d)]) == 0
    ref = collect(tiny_model(tiny_kind), PROMPTS, **KW)
    assert_equal_collections(bl.ReducedCache.load(d / "merged.safetensors"), ref)


def test_written_files_honour_the_umask(tmp_path):
    """Issue 32: every .safetensors file the library wrote was 0600 (mkstemp's mode, which safetensors' writer
    restored) while its JSON and .npz files were 0644 under umask 022, so a shard folder shared with another
    user could not be merged. Every file of a shard folder, a merged cache and an axis follows the umask."""
    old = os.umask(0o022)
    try:
        model = tiny_model(KINDS[0])
        d = tmp_path / "job"
        rc = sh.collect_sharded(model, PROMPTS, d, n_shards=2, **KW)
        rc.save(d / "merged.safetensors")
        axis = bl.EntropyAxis(layer=-1, standardize="raw", progress=False).fit(model, PROMPTS)
        axis.save(d / "axis.safetensors")
        axis.save(d / "axis.npz")
    finally:
        os.umask(old)
    files = sorted(p for p in d.iterdir() if p.is_file())
    assert {p.suffix for p in files} >= {".safetensors", ".json", ".jsonl", ".npz"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o644) for p in files}


# ------------------------------------------------------------------ a shard folder is data (issue 52 §1)
EVIL_LOADER = """
from pathlib import Path

Path(__file__).with_name("imported.marker").write_text("import-time code ran")


def model(kind):
    from bayes_lens.models.tiny import tiny_model

    return tiny_model(kind)
"""


def _rewrite_plan(d, edit):
    """What anyone who can write the folder can do: edit plan.json and recompute its SHA-256."""
    from bayes_lens._files import sha256_json

    doc = json.loads((d / "plan.json").read_text())
    edit(doc)
    doc.pop("plan_sha256")
    doc["plan_sha256"] = sha256_json(doc)
    (d / "plan.json").write_text(json.dumps(doc))


@pytest.fixture
def fresh_allow_list(monkeypatch):
    """This test's registrations stay in this test."""
    import bayes_lens._allow as allow

    monkeypatch.setattr(allow, "_LOADERS", set(allow._LOADERS))
    monkeypatch.setattr(allow, "_READS", set(allow._READS))
    monkeypatch.delenv(allow.LOADERS_ENV, raising=False)
    monkeypatch.delenv(allow.READS_ENV, raising=False)
    return allow


def _planned_job(tmp_path):
    from bayes_lens.cli import main

    src = tmp_path / "prompts.txt"
    src.write_text("\n".join(PROMPTS[:6]))
    d = tmp_path / "job"
    assert main(["shard", "plan", str(d), "--prompts", str(src), "--loader", TINY, "--model-kwargs",
                 json.dumps({"kind": KINDS[0]}), "--value-layers", "-1", "--batch-size", "3"]) == 0
    return d


def test_a_plan_naming_subprocess_getoutput_is_refused_by_a_worker(tmp_path, capsys, fresh_allow_list):
    """Issue 52 §1: a plan rewritten to call subprocess.getoutput (SHA-256 recomputed) ran the command in every
    worker of `bayes-lens shard run`. A worker now calls only allowed loaders; this one is refused before import."""
    from bayes_lens.cli import main

    d = _planned_job(tmp_path)
    marker = tmp_path / "command.ran"

    def edit(doc):
        doc["model"] = {"loader": "subprocess:getoutput", "kwargs": {"cmd": f"touch {marker}"}}

    _rewrite_plan(d, edit)
    capsys.readouterr()
    assert main(["shard", "run", str(d), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "'subprocess:getoutput' is not allowed" in err and "--allow-loader subprocess:getoutput" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(bl.NotAllowedError, match="BAYES_LENS_ALLOW_LOADERS"):  # from Python: the same refusal
        sh.ModelSpec.from_dict(sh.read_plan(d).spec.to_dict()).load()
    assert not marker.exists()


def test_a_plans_loader_module_is_not_imported_unless_allowed(tmp_path, monkeypatch, capsys, fresh_allow_list):
    """Issue 52 §1: the check is on the string 'module:function', before importlib runs, so an unallowed module's
    import-time code never runs; --allow-loader (or BAYES_LENS_ALLOW_LOADERS) lets the launcher's own loader run."""
    from bayes_lens.cli import main

    (tmp_path / "bl_marker_loader.py").write_text(EVIL_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    d = _planned_job(tmp_path)
    _rewrite_plan(d, lambda doc: doc.update(model={"loader": "bl_marker_loader:model", "kwargs": {"kind": KINDS[0]}}))
    marker = tmp_path / "imported.marker"
    assert main(["shard", "run", str(d), "--no-progress"]) == 2
    assert "bl_marker_loader:model' is not allowed" in capsys.readouterr().err
    assert not marker.exists()
    with pytest.raises(bl.NotAllowedError):
        sh.run_shards(sh.read_plan(d).spec, sh.read_plan(d).prompts, sh.read_plan(d).shards, d, value_layers=[-1],
                      batch_size=3)
    assert not marker.exists()
    monkeypatch.setenv("BAYES_LENS_ALLOW_LOADERS", "other.mod:fn, bl_marker_loader:model")  # what a launcher exports
    assert main(["shard", "run", str(d), "--no-progress", "--shard", "0"]) == 0
    assert marker.exists()
    monkeypatch.delenv("BAYES_LENS_ALLOW_LOADERS")
    assert main(["shard", "run", str(d), "--no-progress", "--allow-loader", "bl_marker_loader:model"]) == 0
    assert sh.status(d)["pending"] == []


def test_a_built_in_loader_with_trust_remote_code_needs_its_name_allowed(fresh_allow_list):
    """Issue 52 §1: TransformerLens's own loaders are allowed, but not to run code downloaded with a model."""
    spec = sh.ModelSpec.from_dict({"loader": "transformer_lens:HookedTransformer.from_pretrained",
                                   "kwargs": {"model_name": "someone/model", "trust_remote_code": True}})
    with pytest.raises(bl.NotAllowedError, match="trust_remote_code=True"):
        spec.load()
    with pytest.raises(bl.InvalidInputError, match="package.module:function"):
        sh.allow_loader("no colon")


def test_launchers_own_specs_still_run_in_process_and_on_torchrun_ranks(tmp_path, monkeypatch, fresh_allow_list):
    """A spec built in Python is the launcher's: collect_sharded / sharded with a user's loader run as before."""
    (tmp_path / "bl_own_loader.py").write_text(EVIL_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = sh.ModelSpec("bl_own_loader:model", {"kind": KINDS[0]})
    rc = sh.collect_sharded(spec, PROMPTS[:6], tmp_path / "job", n_shards=2, value_layers=[-1], batch_size=3)
    assert_equal_collections(rc, collect(tiny_model(KINDS[0]), PROMPTS[:6], value_layers=[-1], batch_size=3))
    with sh.sharded(spec, shard_dir=tmp_path / "study") as m:
        assert collect(m, PROMPTS[:3], value_layers=[-1]).n_prompts == 3
    fresh_allow_list._LOADERS.clear()  # a rank's copy of a spec read from data allows nothing
    cuda = sh.ModelSpec.from_dict({"loader": "bl_own_loader:model", "kwargs": {"kind": KINDS[0], "device": "cuda"}})
    with pytest.raises(bl.NotAllowedError):
        sh.TorchrunEngine.rank_spec(cuda).load()


def test_a_ray_actor_runs_what_the_driver_allows_not_what_the_folder_says(tmp_path, monkeypatch, fresh_allow_list):
    """Issue 52 §1: a Ray actor is another process; it gets the spec as data and the driver's allow-list beside it
    (RayEngine.run passes user_allowed_loaders() and allowed_reads()), so it runs the driver's own loader only."""
    from bayes_lens._allow import user_allowed_loaders
    from bayes_lens.shard._ray import ShardWorker

    (tmp_path / "bl_actor_loader.py").write_text(EVIL_LOADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"loader": "bl_actor_loader:model", "kwargs": {"kind": KINDS[0]}}
    shards = [(0, 0, 3)]
    with pytest.raises(bl.NotAllowedError):
        ShardWorker(spec, str(tmp_path / "a")).run(PROMPTS[:3], shards, None, False, {"value_layers": [-1]})
    assert not (tmp_path / "imported.marker").exists()
    driver = sh.ModelSpec(**spec)  # the driver built it in Python: allowed there, and handed to the actor
    assert driver.loader in user_allowed_loaders()
    allowed = sorted(user_allowed_loaders())
    fresh_allow_list._LOADERS.clear()  # the actor's process knows nothing of the driver's registrations
    worker = ShardWorker(spec, str(tmp_path / "b"), allowed, [])
    assert worker.run(PROMPTS[:3], shards, None, False, {"value_layers": [-1]}) == {0: "done"}


def test_a_keyed_plan_runs_only_when_signed_with_the_key(tmp_path, monkeypatch, fresh_allow_list):
    """Issue 52 §1 (keyed): with BAYES_LENS_SHARD_KEY set, plans carry an HMAC-SHA256 and a worker with the key runs
    only plans signed with it, so rewriting a plan and its SHA-256 is not enough."""
    monkeypatch.setenv("BAYES_LENS_SHARD_KEY", "launcher secret")
    d = tmp_path / "job"
    sh.write_plan(d, sh.ModelSpec(TINY, {"kind": KINDS[0]}), PROMPTS[:6], sh.plan(6, 3, 2), {"value_layers": [-1],
                                                                                            "batch_size": 3})
    doc = json.loads((d / "plan.json").read_text())
    assert len(doc["plan_hmac"]) == 64 and sh.read_plan(d).spec.loader == TINY
    monkeypatch.setenv("BAYES_LENS_SHARD_KEY", "another key")
    with pytest.raises(sh.ShardIntegrityError, match="not signed with this key"):
        sh.read_plan(d)
    monkeypatch.setenv("BAYES_LENS_SHARD_KEY", "launcher secret")
    _rewrite_plan(d, lambda doc: doc.update(n_prompts=6, shards=[[0, 0, 6]]))  # plan_sha256 matches again
    with pytest.raises(sh.ShardIntegrityError, match="not signed with this key"):
        sh.read_plan(d)
    _rewrite_plan(d, lambda doc: doc.pop("plan_hmac"))
    with pytest.raises(sh.ShardIntegrityError, match="carries no signature"):
        sh.read_plan(d)
    monkeypatch.delenv("BAYES_LENS_SHARD_KEY")  # a worker without a key checks the SHA-256 only
    assert [(s.start, s.stop) for s in sh.read_plan(d).shards] == [(0, 6)]
