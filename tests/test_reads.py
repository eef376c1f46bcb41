"""Reads (bayes_lens.reads): one class per quantity, generic runner and cache reducer.

The point of the design is that a new final-token quantity is one small class: the first test
writes one here (the top next-token probability) and checks it from the runner and from a user's
cache against TransformerLens's own forward pass, computed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens import adapter
from bayes_lens.collect import collect, reduce_cache, use_runner
from bayes_lens.reads import (AttentionEntropy, BoundRead, FinalRows, NextTokenEntropy, Read, TailLogits,
                              TokenLogprobs)

PROMPTS = ["The cat sat on the", "2 + 2 =", "one two three four five six", "Hi", "a b", "x"]


# ------------------------------------------------------------------ a new quantity: one class
@dataclass(frozen=True)
class TopProb(Read):
    """max_v softmax(logits)_v at the final real token (written here, outside the package)."""

    logits = "final"

    def bind(self, model):
        return _BoundTopProb(self, model)


class _BoundTopProb(BoundRead):
    def after_pass(self, batch, final_logits):
        self.keep("top_prob", torch.softmax(final_logits.double(), -1).max(-1).values.cpu())

    def from_cache(self, view):
        last = bl.hooks.last_index(view.mask)
        fl = view.logits[torch.arange(view.logits.shape[0]), last]
        return {"top_prob": torch.softmax(fl.double(), -1).max(-1).values.cpu()}


def _by_hand(model, prompts):
    """TransformerLens's own forward, one prompt at a time (no padding at all), final position."""
    out = []
    for p in prompts:
        tokens, _ = adapter.tokenize(model, [p])
        with torch.no_grad():
            logits = model(tokens, return_type="logits")
        out.append(torch.softmax(logits[0, -1].double(), -1).max().item())
    return np.array(out)


def test_a_read_written_outside_the_package_runs_in_the_runner_and_on_a_users_cache(tiny):
    rc = collect(tiny, PROMPTS, reads=[TopProb()], batch_size=4, progress=False)
    assert set(rc) == {"top_prob", "next_token_entropy"}   # the next-token entropy is always kept
    np.testing.assert_allclose(rc["top_prob"].numpy(), _by_hand(tiny, PROMPTS), atol=1e-5)
    tokens, mask = adapter.tokenize(tiny, PROMPTS)
    with torch.no_grad():
        logits, cache = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: False)
    from_cache = reduce_cache((logits, cache), model=tiny, attention_mask=mask, reads=[TopProb()])
    torch.testing.assert_close(from_cache["top_prob"], rc["top_prob"], atol=1e-6, rtol=1e-6)


def test_the_keywords_are_spellings_of_reads(tiny):
    kw = collect(tiny, PROMPTS, value_layers=[0, -1], resid_layers=[0], attention=True, token_ids=[3, 5],
                 tail_positions=2, batch_size=4, progress=False)
    n_layers = tiny.cfg.n_layers
    rd = collect(tiny, PROMPTS, reads=[FinalRows(0), FinalRows(n_layers - 1, "v"), FinalRows(0, "resid_post"),
                                       AttentionEntropy("last"), NextTokenEntropy(), TokenLogprobs((3, 5)),
                                       TailLogits((3, 5), 2)], batch_size=4, progress=False)
    assert list(kw) == list(rd)
    for k in kw:
        torch.testing.assert_close(kw[k], rd[k], equal_nan=True, atol=0, rtol=0)
    # a read named twice (by keyword and in reads=) is kept once
    both = collect(tiny, PROMPTS, value_layers=[0], reads=[FinalRows(0)], batch_size=4, progress=False)
    assert sorted(both) == ["final_rows.v.0", "next_token_entropy"]


def test_hook_names_are_resolved_once_per_run_not_per_batch(tiny, monkeypatch):
    calls = []
    real = adapter.hook_name
    monkeypatch.setattr(adapter, "hook_name", lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
    reads = [FinalRows(0), FinalRows(0, "resid_post"), AttentionEntropy("last"), AttentionEntropy("all")]
    counts = []
    for bs in (6, 1):   # one batch, then six
        calls.clear()
        for r in reads:
            collect(tiny, PROMPTS, reads=[r], batch_size=bs, progress=False)
        counts.append(len(calls))
    assert counts[0] == counts[1] > 0


def test_attention_entropy_all_rows_matches_numpy(tiny):
    rc = collect(tiny, PROMPTS, reads=[AttentionEntropy("all")], batch_size=3, progress=False)
    for i, p in enumerate(PROMPTS):
        tokens, _ = adapter.tokenize(tiny, [p])
        with torch.no_grad():
            _, cache = tiny.run_with_cache(tokens)
        for layer in range(tiny.cfg.n_layers):
            pat = cache[adapter.hook_name(tiny, layer, "pattern")][0].double().numpy()   # [h, q, k], causal
            with np.errstate(divide="ignore", invalid="ignore"):
                h = -np.nansum(np.where(pat > 0, pat * np.log2(pat), 0.0), axis=-1)     # [h, q]
            np.testing.assert_allclose(rc[f"attention_entropy.all.{layer}"][i].numpy(), h.mean(-1), atol=1e-5)


def test_mean_over_real_rows_ignores_pad_rows_even_when_nan():
    h = torch.tensor([[[1.0, 2.0, float("nan")], [3.0, 5.0, 7.0]]], dtype=torch.float64)   # [b=1, head=2, q=3]
    mask = torch.tensor([[1, 1, 0]])
    np.testing.assert_allclose(bl.hooks.mean_over_real_rows(h, mask).numpy(), [[1.5, 4.0]])


def test_bad_reads_get_clear_errors(tiny):
    with pytest.raises(bl.InvalidInputError, match="reads must be a list"):
        collect(tiny, PROMPTS, reads="v")
    with pytest.raises(bl.InvalidInputError, match="reads must be bayes_lens.reads.Read"):
        collect(tiny, PROMPTS, reads=[3])
    with pytest.raises(bl.InvalidInputError, match="site must be one of"):
        FinalRows(0, "q")
    with pytest.raises(bl.InvalidInputError, match="attention_positions must be one of"):
        AttentionEntropy("first")
    with pytest.raises(bl.InvalidInputError, match="tail_positions needs token_ids"):
        TailLogits((), 3)
    with pytest.raises(bl.InvalidInputError, match="token_ids must lie in"):
        collect(tiny, PROMPTS, reads=[TokenLogprobs((-1,))])

    class Runner:
        def collect(self, *a, **k):  # pragma: no cover - must not be reached
            raise AssertionError("the sharded runner got a read it cannot record")

    @dataclass(frozen=True)
    class Weighted(TopProb):  # a field a shard's JSON settings cannot hold
        weights: object = None

    with use_runner(Runner()), pytest.raises(bl.InvalidInputError, match="not JSON"):
        collect(tiny, PROMPTS, reads=[Weighted(torch.ones(2))])


def test_a_cache_missing_a_hook_says_which_layers_it_holds(tiny):
    tokens, mask = adapter.tokenize(tiny, PROMPTS)
    with torch.no_grad():
        _, cache = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter(tiny, layers=[0]))
    with pytest.raises(bl.MissingHookError, match=r"has no 'blocks\.\d+\.attn\.hook_v' \(it holds blocks\.\{0\}\."):
        reduce_cache(cache, attention_mask=mask, reads=[FinalRows(-1)])


# ------------------------------------------------------------------ reads in a sharded run
def test_every_read_round_trips_through_its_json_spec():
    import json

    from bayes_lens.reads import read_from_spec

    reads = [FinalRows(3, "z"), FinalRows(-1), AttentionEntropy("all"), NextTokenEntropy(), TokenLogprobs((3, 5)),
             TailLogits((3, 5), 2), TopProb()]
    for r in reads:
        spec = json.loads(json.dumps(r.spec()))
        assert read_from_spec(spec) == r and type(read_from_spec(spec)) is type(r)
    with pytest.raises(bl.errors.InvalidInputError, match="module:Class"):
        read_from_spec({"layer": 1})
    with pytest.raises(bl.NotAllowedError, match="--allow-read bayes_lens.reads:NoSuchRead"):
        read_from_spec({"read": "bayes_lens.reads:NoSuchRead"})
    with pytest.raises(bl.NotAllowedError, match="'bayes_lens.collect:collect' is not allowed"):
        read_from_spec({"read": "bayes_lens.collect:collect"})


@pytest.fixture
def fresh_allow_list(monkeypatch):
    """This test's registrations stay in this test."""
    import bayes_lens._allow as allow

    monkeypatch.setattr(allow, "_LOADERS", set(allow._LOADERS))
    monkeypatch.setattr(allow, "_READS", set(allow._READS))
    monkeypatch.delenv(allow.READS_ENV, raising=False)
    return allow


MARKER_READ = """
from dataclasses import dataclass
from pathlib import Path

from bayes_lens.reads import NextTokenEntropy

Path(__file__).with_name("imported.marker").write_text("import-time code ran")


@dataclass(frozen=True)
class Entropy(NextTokenEntropy):
    pass
"""


def test_a_read_spec_imports_only_allowed_classes(tmp_path, monkeypatch, fresh_allow_list):
    """Issue 52 §1: read_from_spec imported the named module before checking it names a Read subclass, so a
    shard plan's read spec ran any importable module's import-time code. The name is checked first."""
    from bayes_lens.reads import allow_read, read_from_spec

    (tmp_path / "bl_marker_read.py").write_text(MARKER_READ)
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = tmp_path / "imported.marker"
    with pytest.raises(bl.NotAllowedError, match="'bl_marker_read:Entropy' is not allowed.*BAYES_LENS_ALLOW_READS"):
        read_from_spec({"read": "bl_marker_read:Entropy"})
    assert not marker.exists()
    monkeypatch.setenv("BAYES_LENS_ALLOW_READS", "bl_marker_read:Entropy")  # what a launcher exports to workers
    assert type(read_from_spec({"read": "bl_marker_read:Entropy"})).__name__ == "Entropy"
    assert marker.exists()
    monkeypatch.delenv("BAYES_LENS_ALLOW_READS")
    # once its module is imported here, the class is registered by its class statement; a Read defined in this
    # test module is too (TopProb round-trips above)
    assert type(read_from_spec({"read": "bl_marker_read:Entropy"})).__name__ == "Entropy"
    allow_read("bayes_lens.collect:collect")  # allowed, but not a Read: still refused, after the import
    with pytest.raises(bl.errors.InvalidInputError, match="not a bayes_lens.reads.Read subclass"):
        read_from_spec({"read": "bayes_lens.collect:collect"})


def test_a_read_spec_with_an_unknown_field_or_naming_read_itself_is_a_clear_error(tmp_path, capsys):
    """Issue 52 §5: a read spec with an unknown field (TypeError) or naming Read itself (NotImplementedError in bind)
    was "internal error", exit 1, from `bayes-lens shard run`: each is a one-line InvalidInputError."""
    import json

    import bayes_lens.shard as shard
    from bayes_lens._files import sha256_json
    from bayes_lens.cli import main
    from bayes_lens.reads import read_from_spec

    with pytest.raises(bl.errors.InvalidInputError, match=r"unknown field\(s\) \['layr'\]; FinalRows takes \['layer', "
                       r"'site'\]"):
        read_from_spec({"read": "bayes_lens.reads:FinalRows", "layer": 1, "layr": 1})
    with pytest.raises(bl.errors.InvalidInputError, match=r"missing field\(s\) \['layer'\]"):
        read_from_spec({"read": "bayes_lens.reads:FinalRows"})
    with pytest.raises(bl.errors.InvalidInputError, match="the base class of the reads"):
        read_from_spec({"read": "bayes_lens.reads:Read"})
    with pytest.raises(bl.errors.InvalidInputError, match="does not build a TokenLogprobs"):
        read_from_spec({"read": "bayes_lens.reads:TokenLogprobs", "token_ids": "abc"})
    spec = shard.ModelSpec("bayes_lens.models.tiny:tiny_model", {"kind": "bridge"})
    for bad in ({"read": "bayes_lens.reads:FinalRows", "layer": 0, "layr": 1}, {"read": "bayes_lens.reads:Read"}):
        d = tmp_path / str(len(bad))
        shard.write_plan(d, spec, PROMPTS, shard.plan(len(PROMPTS), 3, 1), {"reads": [FinalRows(0).spec()],
                                                                            "batch_size": 3})
        doc = json.loads((d / "plan.json").read_text())
        doc["settings"]["reads"] = [bad]
        doc.pop("plan_sha256")
        doc["plan_sha256"] = sha256_json(doc)
        (d / "plan.json").write_text(json.dumps(doc))
        capsys.readouterr()
        assert main(["shard", "run", str(d), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "internal error" not in err and len(err.strip().splitlines()) == 1
        assert ("unknown field(s) ['layr']" if "layr" in bad else "the base class of the reads") in err


def test_reads_run_in_shards_bit_for_bit_and_enter_the_settings(tiny, tmp_path):
    """``collect(..., reads=[...])`` inside bl.shard.sharded: the merged rows equal one process's exactly, the reads'
    specs are in the plan's settings (so another read set gets another folder), and a worker that rebuilds the
    reads from the plan's JSON gets the same rows; a keyword-only run's settings hold no "reads" key (the settings
    hashes of folders made before are unchanged)."""
    import json

    import bayes_lens.shard as shard
    from bayes_lens.shard import collect_settings

    reads = [FinalRows(0, "z"), TopProb()]
    ref = collect(tiny, PROMPTS, reads=reads, batch_size=2, progress=False)
    with shard.sharded(tiny, engine=shard.LocalEngine(n_shards=3), shard_dir=tmp_path) as m:
        got = collect(m, PROMPTS, reads=reads, batch_size=2, progress=False, desc="reads test")
        other = collect(m, PROMPTS, reads=[FinalRows(1, "z")], batch_size=2, progress=False, desc="reads test")
    assert set(got) == set(ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=0, rtol=0)
    folders = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 2 and "final_rows.z.1" in other
    settings = [json.loads((f / "plan.json").read_text())["settings"] for f in folders]
    recorded = [s["reads"] for s in settings]
    assert sorted(map(len, recorded)) == [1, 2]
    both = next(r for r in recorded if len(r) == 2)
    again = collect(tiny, PROMPTS, reads=both, batch_size=2, progress=False)   # what a plan's worker runs
    for k in ref:
        torch.testing.assert_close(again[k], ref[k], atol=0, rtol=0)
    assert "reads" not in collect_settings({"value_layers": [0], "batch_size": 2})


def test_both_attention_positions_in_one_run_under_their_own_keys(tiny):
    """Read keys name the read, so the final-row and the all-rows entropies no longer collide in one cache."""
    both = collect(tiny, PROMPTS, reads=[AttentionEntropy("last"), AttentionEntropy("all")], batch_size=3,
                   progress=False)
    n_layers = tiny.cfg.n_layers
    assert {k for k in both if k.startswith("attention_entropy.")} == {
        f"attention_entropy.{p}.{layer}" for p in ("last", "all") for layer in range(n_layers)}
    for positions in ("last", "all"):
        alone = collect(tiny, PROMPTS, attention=True, attention_positions=positions, batch_size=3, progress=False)
        assert alone.attention_positions == positions
        torch.testing.assert_close(both.attention_entropy_bits(positions=positions), alone.attention_entropy_bits(),
                                   atol=0, rtol=0)
    assert both.attention_positions == "last"  # both held: the default
    with pytest.raises(bl.MissingHookError, match="positions='last'.*collect again with attention_positions='last'"):
        collect(tiny, PROMPTS, attention=True, attention_positions="all", batch_size=3,
                progress=False).attention_entropy_bits(positions="last")
