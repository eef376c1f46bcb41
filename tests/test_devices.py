"""Device and dtype handling of the runner without a GPU (issue 13, point 3).

No accelerator is needed: a model whose first parameter sits on the ``meta`` device (no data) stands
in for a model split across GPUs whose embedding is not on the first parameter's device; tensors on
``meta`` stand in for a "second device" wherever the code only moves and indexes (meta raises
"Tensor on device cpu is not on the expected device meta" exactly where a CUDA run would raise
"Expected all tensors to be on the same device"); a ``TorchFunctionMode`` spy records every cast to
show that logits are sliced before ``.float()`` and that attention is reduced in float64 slices.
One test per fix; then bf16 and fp16 tiny models end to end against float32, and the refusal of a
``HookedTransformer`` with ``n_devices > 1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import bayes_lens as bl
from bayes_lens import adapter
from bayes_lens.collect import Batch, collect, forward_batches, reduce_cache
from bayes_lens.hooks import final_query_rows, key_entropy_bits, pattern_entropy_bits
from bayes_lens.metrics import stats
from bayes_lens.models.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["the cat sat on the", "a dog is the tree", "0 1 0 1 1 0", "dax lug mip zorb wug kep", "moon"]
KW = dict(value_layers="all", resid_layers=[-1], attention=True, token_ids=[5, 7], batch_size=2, progress=False)


class CastSpy(TorchFunctionMode):
    """Records (method, input shape, output dtype) of every floating cast (``.float()``, ``.double()``, ``.to``)."""

    def __init__(self):
        super().__init__()
        self.casts = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in ("float", "double", "half", "bfloat16", "to") and args and isinstance(args[0], torch.Tensor):
            if isinstance(out, torch.Tensor) and out.dtype != args[0].dtype and out.is_floating_point():
                self.casts.append((name, tuple(args[0].shape), out.dtype))
        return out


def _meta_first(model):
    """Put a data-less parameter first in ``model.parameters()``: its device is not the embedding's."""
    # a bridge lists the wrapped Hugging Face model's parameters: register it there
    owner = model.original_model if adapter.is_bridge(model) else model
    owner.register_parameter("aaa_meta_first", torch.nn.Parameter(torch.empty(1, device="meta"), requires_grad=False))
    assert next(model.parameters()).device.type == "meta"
    return model


# ------------------------------------------------------------------ fix 1: inputs go to the embedding


def test_inputs_go_to_the_embedding_device_not_the_first_parameters(tiny):
    ref = collect(tiny, PROMPTS, **KW)
    model = _meta_first(tiny)
    assert adapter.model_device(model).type == "meta"  # what the runner used to send tokens to
    assert adapter.input_device(model) == torch.device("cpu")
    tokens, mask = adapter.tokenize(model, PROMPTS)
    assert tokens.device.type == mask.device.type == "cpu"
    col = collect(model, PROMPTS, **KW)  # with tokens on meta the forward pass would fail
    assert torch.equal(col.next_token_entropy_bits(), ref.next_token_entropy_bits())
    assert torch.equal(col.attention_entropy_bits(), ref.attention_entropy_bits())


def test_the_embedding_wins_over_cfg_device_and_cfg_device_over_the_first_parameter(tiny):
    tiny.cfg.device = "meta"  # a reported device that differs from where the embedding is
    assert adapter.input_device(tiny) == torch.device("cpu")

    class NoEmbedding(torch.nn.Module):  # nothing to read the embedding's device from: cfg.device decides
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.cfg = type("Cfg", (), {"device": "meta"})()

    assert adapter.input_device(NoEmbedding()) == torch.device("meta")


# ------------------------------------------------------------------ fix 2: indices on the indexed tensor's device


def test_final_logits_and_the_final_token_prehook_index_on_the_logits_device():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # indices on the CPU, logits elsewhere
    last = torch.tensor([2, 3])
    batch = Batch(indices=torch.arange(2), tokens=mask, attention_mask=mask, last_index=last,
                  logits=torch.empty(2, 4, 11, device="meta", dtype=torch.bfloat16))
    fl = batch.final_logits()
    assert fl.device.type == "meta" and fl.shape == (2, 11) and fl.dtype == torch.float32
    resid = torch.empty(2, 4, 8, device="meta")

    class Model(torch.nn.Module):  # an unembedding that is not TL's: only the final-token slicing applies
        def __init__(self):
            super().__init__()
            self.unembed = torch.nn.Identity()

    m = Model()
    with adapter.final_token_unembedding(m, last):
        rows = m.unembed(resid)
    assert rows.device.type == "meta" and rows.shape == (2, 1, 8)
    assert m.unembed(resid).shape == (2, 4, 8)  # the slicing is gone after the block


def test_attention_rows_and_key_masks_follow_the_pattern_device():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # CPU, as the runner's mask on the input device
    pattern = torch.empty(2, 4, 3, 3, device="meta")  # a layer on another device
    rows = final_query_rows(pattern, mask)
    assert rows.device.type == "meta" and rows.shape == (2, 4, 3)
    ent = key_entropy_bits(rows, mask.bool()[:, None, :])  # the key mask moves to the rows' device
    assert ent.device.type == "meta" and ent.shape == (2, 4) and ent.dtype == torch.float64
    h = stats.chunked_entropy_bits(pattern, dim=2, keys=mask.bool()[:, None, None, :], max_elements=8)
    assert h.device.type == "meta" and h.shape == (2, 4, 3)


def test_each_layers_final_rows_are_brought_to_one_device_before_the_batch_reduction(tiny, monkeypatch):
    import bayes_lens.reads as reads_mod

    seen = []

    def spy(rows, keys, **kw):
        seen.append((rows.device.type, keys.device.type, tuple(rows.shape)))
        return torch.zeros(rows.shape[:-1], dtype=torch.float64)

    monkeypatch.setattr(reads_mod, "key_entropy_bits", spy)
    mask = torch.ones(2, 3, dtype=torch.long, device="meta")  # the input device
    batch = Batch(indices=torch.arange(2), tokens=mask, attention_mask=mask, last_index=torch.tensor([2, 2]))
    bound = reads_mod.AttentionEntropy("last").bind(tiny)
    bound.rows.update({0: torch.rand(2, 4, 3), 1: torch.empty(2, 4, 3, device="meta")})  # layer 1 elsewhere
    bound.after_pass(batch, None)  # torch.stack of cpu + meta raised
    assert seen == [("meta", "meta", (2, 2, 4, 3))]
    assert sorted(bound.by_layer) == [0, 1] and bound.by_layer[0][0].shape == (2, 4)


# ------------------------------------------------------------------ fix 3: logits sliced before .float()


def _vocab_casts(spy, d_vocab):
    """Casts of a logits tensor with more than one position (the [batch, pos, vocab] copy to avoid)."""
    return [c for c in spy.casts if len(c[1]) == 3 and c[1][-1] == d_vocab and c[1][1] > 1]


def test_logits_are_sliced_before_they_are_cast(tiny):
    model = tiny.to(torch.bfloat16)
    d_vocab = int(model.cfg.d_vocab)
    with CastSpy() as spy:
        batches = list(forward_batches(model, PROMPTS, batch_size=2, logits="all", progress=False))
        finals = [b.final_logits() for b in batches]
        col = collect(model, PROMPTS, **KW)
    assert all(b.logits.dtype == torch.bfloat16 and b.logits.ndim == 3 for b in batches)  # model dtype, no copy
    assert all(f.dtype == torch.float32 and f.ndim == 2 for f in finals)
    assert col.next_token_entropy_bits().dtype == torch.float64
    assert not _vocab_casts(spy, d_vocab), _vocab_casts(spy, d_vocab)

    tokens, mask = adapter.tokenize(model, PROMPTS)
    logits, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    with CastSpy() as spy:
        from_cache = reduce_cache((logits, cache), attention_mask=mask, token_ids=[5, 7])
    assert not _vocab_casts(spy, d_vocab), _vocab_casts(spy, d_vocab)
    assert from_cache.token_logprobs().dtype == torch.float64

    seqs = [[0, 1, 1, 0, 1], [1, 1, 1, 0, 0]]
    with CastSpy() as spy:
        p = bl.martingale.predictive(model, seqs)
    assert not _vocab_casts(spy, d_vocab), _vocab_casts(spy, d_vocab)
    assert bool(torch.isfinite(torch.as_tensor(p)[:, 1:]).all())


# ------------------------------------------------------------------ fix 4: attention in float64 slices


def test_all_rows_attention_entropy_is_reduced_in_slices(monkeypatch):
    g = torch.Generator().manual_seed(0)
    pattern = torch.softmax(torch.randn(3, 4, 16, 16, generator=g), dim=-1).to(torch.bfloat16)
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[0, 12:] = 0
    mask[2, :5] = 0
    whole = pattern_entropy_bits(pattern, mask, positions="all")  # default slice: the whole tensor fits
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 3 * 4 * 16 * 3)  # three query rows per slice
    with CastSpy() as spy:
        sliced = pattern_entropy_bits(pattern, mask, positions="all")
    torch.testing.assert_close(sliced, whole, rtol=0, atol=1e-12)
    doubles = [shape for name, shape, dtype in spy.casts if dtype == torch.float64 and len(shape) == 4]
    assert doubles and max(s[2] for s in doubles) == 3, doubles  # never a float64 [b, h, 16, 16]


def test_attached_entropy_hook_points_are_reduced_in_slices(tiny, monkeypatch):
    tokens, mask = adapter.tokenize(tiny, PROMPTS)
    names = lambda n: n.endswith("pattern_entropy") or n == "hook_next_token_entropy"  # noqa: E731
    with bl.attach(tiny):
        _, whole = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=names)
        monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 64)
        _, sliced = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=names)
    keys = [k for k in whole.keys() if names(k)]
    assert len(keys) == int(tiny.cfg.n_layers) + 1
    for k in keys:
        torch.testing.assert_close(sliced[k], whole[k], rtol=0, atol=1e-10, equal_nan=True)


# ------------------------------------------------------------------ fix 5: HookedTransformer split over devices


def test_a_hooked_transformer_split_over_devices_is_refused(tiny_kind):
    model = tiny_model(tiny_kind)
    model.cfg.n_devices = 2
    if tiny_kind == "bridge":  # the bridge splits with accelerate's device map: accepted
        col = collect(model, PROMPTS[:2], value_layers=[-1], progress=False)
        assert col.n_prompts == 2
        return
    for call in (lambda: collect(model, PROMPTS, value_layers=[-1], progress=False),
                 lambda: list(forward_batches(model, PROMPTS, progress=False)),
                 lambda: bl.key_orthogonality(model)):
        with pytest.raises(bl.UnsupportedModelError, match=r"boot_transformers\(.*n_devices=N\).*device_map"):
            call()
    assert issubclass(bl.UnsupportedModelError, bl.BayesLensError)


# ------------------------------------------------------------------ bf16 / fp16 end to end

# Tolerances. bf16 keeps 8 significant bits (relative rounding 2**-9 ≈ 0.002 per operation); through the
# tiny model's two layers the logits move by ~1e-2, which moves an entropy of ~8 bits by ~1e-2 bits
# (measured: next-token 0.008, attention 0.018 bits, label log-probs 0.02 nats). So 0.06 bits / nats
# with a 3x margin; fp16 (11 bits) is ~8x tighter, held to the same bound. Value rows: relative 3%.
TOL = {torch.bfloat16: 0.06, torch.float16: 0.06}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_models_give_finite_float64_statistics_close_to_float32(tiny_kind, dtype):
    ref = collect(tiny_model(tiny_kind), PROMPTS, **KW)
    half = tiny_model(tiny_kind).to(dtype)
    col = collect(half, PROMPTS, **KW)
    tol = TOL[dtype]
    for name in ("next_token_entropy_bits", "attention_entropy_bits", "token_logprobs"):
        got, want = getattr(col, name)(), getattr(ref, name)()
        assert got.dtype == torch.float64 and got.device.type == "cpu", name
        assert bool(torch.isfinite(got).all()), name
        assert float((got - want).abs().max()) < tol, (name, float((got - want).abs().max()))
    for layer, rows in ((l, col.value_rows(l)) for l in col.layers("v")):
        assert rows.dtype == torch.float32 and bool(torch.isfinite(rows).all())
        rel = float((rows - ref.value_rows(layer)).norm() / ref.value_rows(layer).norm())
        assert rel < 0.03, (layer, rel)
    # the cache path on the same half-precision model agrees with the streaming path
    tokens, mask = adapter.tokenize(half, PROMPTS)
    logits, cache = half.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    fc = reduce_cache((logits, cache), attention_mask=mask, attention=True, token_ids=[5, 7])
    assert float((fc.attention_entropy_bits() - col.attention_entropy_bits()).abs().max()) < 1e-6
    assert float((fc.next_token_entropy_bits() - col.next_token_entropy_bits()).abs().max()) < tol


def test_bf16_geometry_close_to_float32(tiny_kind):
    prompts = PROMPTS * 4
    ref = bl.geometry(tiny_model(tiny_kind), prompts)
    got = bl.geometry(tiny_model(tiny_kind).to(torch.bfloat16), prompts)
    assert abs(got.value_manifold.pc1.value - ref.value_manifold.pc1.value) < 0.02
    diff = (got.attention_focusing.layer_entropy_bits - ref.attention_focusing.layer_entropy_bits).abs().max()
    assert got.attention_focusing.layer_entropy_bits.dtype == torch.float64 and float(diff) < 0.06
    assert abs(got.entropy_alignment.spearman.value - ref.entropy_alignment.spearman.value) < 0.15


# ------------------------------------------------------------------ the GPU check script, dry run


def test_gpu_check_dry_run_on_cpu(tmp_path):
    script = ROOT / "benchmarks" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--cpu-dry-run"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "BAYES_LENS_PROGRESS": "0",
                                                      "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAIL" not in proc.stdout and "all checks passed" in proc.stdout, proc.stdout
