"""Offline loading of llama- and gemma3-architecture GGUF files into TransformerLens models.

A GGUF file (llama.cpp's format) holds the config as metadata, the tokenizer (vocabulary, merges,
special ids) and the weights, often block-quantized. This module reads one directly with the
``gguf`` package (memory-mapped), dequantizes each tensor to float32, undoes llama.cpp's
rotary permutation of the Q and K rows, and builds either

* a TL 3.x ``HookedTransformer`` with **raw** (unprocessed) weights - no layer-norm folding, no
  centring - so weight-based metrics (key orthogonality) see the real W_K, or
* a ``TransformerBridge`` around a ``transformers`` ``LlamaForCausalLM`` (or
  ``Gemma3ForCausalLM``) with the same weights.

The Q/K un-permutation: llama.cpp's converter reorders the rows of each head of W_Q and W_K from
Hugging Face's "rotate-half" layout to interleaved pairs. Viewing the rows as
``(n_heads, head_dim // 2, 2, d_in)`` and swapping axes 1 and 2 restores the HF layout (with the
*KV* head count for W_K). After that the weights equal what ``transformers``' own GGUF loader
produces.

Gemma 3 (``general.architecture == "gemma3"``) differs in five ways, all handled here:

* no Q/K permutation (llama.cpp runs Gemma's rotary in the "neox" = rotate-half layout);
* every RMS-norm weight (attention/MLP pre- and post-norms, final norm, query/key norms) is stored
  as ``1 + w``: llama.cpp's converter adds the 1 that Gemma's ``RMSNorm`` adds at run time.
  :func:`hf_state_dict` subtracts it (as transformers' GGUF loader does), the HookedTransformer
  gets ``1 + w`` back (TL's RMS norm multiplies by ``w``, as in TL's own Gemma conversion);
* the token embedding is multiplied by ``sqrt(d_model)`` (folded into ``W_E`` for the
  HookedTransformer; the unembedding stays the unscaled, tied matrix);
* local (sliding-window, rotary base 10 000) and global (rotary base ``rope.freq_base``) layers:
  every sixth layer is global (llama.cpp's and transformers' default pattern);
* BOS is prepended (``tokenizer.ggml.add_bos_token``) and the attention scale is
  ``1/sqrt(d_head)`` (``query_pre_attn_scalar`` = 256 = d_head for the small models).

The architecture is read from the file's header before anything else, so an unsupported file
is refused at once.

Example
-------
>>> import bayes_lens as bl
>>> model = bl.load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", kind="hooked")  # doctest: +SKIP
>>> model.to_string(model.generate("The capital of France is", max_new_tokens=1))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from .._validate import check_choice, check_device
from ..errors import ModelLoadError, require_extra
from .gguf_checks import check_llama_spec

__all__ = ["load_gguf", "load_tokenizer", "LlamaSpec", "read_gguf", "hf_state_dict", "gguf_architecture", "SUPPORTED_ARCHITECTURES",
           "from_weights", "FastGGUFReader"]

_GGUF_MAGIC = b"GGUF"
_CHUNK_BYTES = 16 * 2 ** 20  # quantized bytes dequantized at once for large tensors
SUPPORTED_ARCHITECTURES = ("llama", "gemma3")

# GGUF tensor name (per block "blk.{l}.") -> Hugging Face Llama name
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 block tensors that differ from llama's (the rest are shared)
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass
class LlamaSpec:
    """A model's hyper-parameters, with the GGUF metadata and reader when it came from a file.

    The name is historical: ``arch`` says which architecture (``"llama"`` or ``"gemma3"``); the
    fields after ``reader`` only matter for Gemma 3.
    """

    path: Path
    name: str
    n_layers: int
    d_model: int
    d_mlp: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_ctx: int
    d_vocab: int
    rope_base: float
    rms_eps: float
    tied_embeddings: bool
    metadata: Dict[str, Any] = field(repr=False)
    reader: Any = field(repr=False)
    arch: str = "llama"
    sliding_window: Optional[int] = None  # keys a local layer sees (its own position included)
    rope_base_local: Optional[float] = None  # rotary base of the local layers
    layer_types: Optional[List[str]] = None  # per layer "local" | "global" (None: all global)
    query_pre_attn_scalar: Optional[int] = None  # attention scale 1/sqrt(this); None: d_head

    @property
    def is_gemma3(self) -> bool:
        return self.arch == "gemma3"


def _field_value(f) -> Any:
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - older gguf versions
        from gguf import GGUFValueType

        if f.types and f.types[0] == GGUFValueType.STRING:
            return bytes(f.parts[f.data[0]]).decode("utf-8")
        return f.parts[f.data[0]].tolist()[0]


# GGUF value types (gguf.GGUFValueType): fixed sizes of the scalar ones, 8 = string, 9 = array
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_architecture(path: str | os.PathLike) -> Optional[str]:
    """``general.architecture`` of a GGUF file, read from its header alone (milliseconds).

    Walks the key/value section up to that key without parsing tensors or the tokenizer's large
    arrays (the full reader takes tens of seconds on a 262k vocabulary). Returns None when the key
    is absent; raises :class:`~bayes_lens.errors.ModelLoadError` when the header is cut short.
    """
    import struct

    path = Path(path)

    def read(fh, n):
        b = fh.read(n)
        if len(b) != n:
            raise ModelLoadError(f"{str(path)!r} is truncated inside its header; the file is probably "
                                 "truncated or corrupted - download or copy it again.")
        return b

    def skip_value(fh, vtype):
        if vtype in _SCALAR_SIZES:
            fh.seek(_SCALAR_SIZES[vtype], 1)
        elif vtype == 8:
            fh.seek(struct.unpack("<Q", read(fh, 8))[0], 1)
        elif vtype == 9:
            itype, count = struct.unpack("<IQ", read(fh, 12))
            if itype in _SCALAR_SIZES:
                fh.seek(_SCALAR_SIZES[itype] * count, 1)
            else:
                for _ in range(count):
                    skip_value(fh, itype)
        else:
            raise ModelLoadError(f"{str(path)!r}: unknown GGUF value type {vtype}; the file is corrupted.")

    with open(path, "rb") as fh:
        if read(fh, 4) != _GGUF_MAGIC:
            return None
        version = struct.unpack("<I", read(fh, 4))[0]
        if version < 2:  # GGUF v1 (32-bit lengths, 2023): let the full reader decide
            return None
        _, n_kv = struct.unpack("<QQ", read(fh, 16))
        for _ in range(n_kv):
            key = read(fh, struct.unpack("<Q", read(fh, 8))[0]).decode("utf-8", "replace")
            vtype = struct.unpack("<I", read(fh, 4))[0]
            if key == "general.architecture" and vtype == 8:
                return read(fh, struct.unpack("<Q", read(fh, 8))[0]).decode("utf-8", "replace")
            skip_value(fh, vtype)
    return None


class _Field:
    """One metadata value (the interface of ``gguf.ReaderField`` that this module uses)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


@dataclass
class _Tensor:
    """One tensor's header and its memory-mapped data (the interface of ``gguf.ReaderTensor`` used here)."""

    name: str
    shape: np.ndarray  # GGUF order (fastest-varying first)
    tensor_type: Any
    n_bytes: int
    data_offset: int
    data: np.ndarray


_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
                7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


class FastGGUFReader:
    """A GGUF reader that parses large metadata arrays with numpy.

    ``gguf.GGUFReader`` builds a Python object per element of every array: ~18 s for Gemma's
    262,144 tokens, scores and token types. This one reads numeric arrays with one
    ``np.frombuffer`` and string arrays in one pass, and memory-maps tensor data exactly as
    ``GGUFReader`` does (quantized tensors as ``uint8`` rows, float tensors in their dtype).
    ``fields`` maps keys to objects with ``contents()``; ``tensors`` lists name, shape,
    tensor_type, n_bytes, data_offset and data.
    """

    def __init__(self, path: str | os.PathLike):
        import struct

        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        self.path = Path(path)
        mm = np.memmap(self.path, mode="r", dtype=np.uint8)
        buf = memoryview(mm)
        pos = 0

        def take(fmt):
            nonlocal pos
            vals = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return vals

        def string():
            nonlocal pos
            (n,) = take("<Q")
            out = bytes(buf[pos:pos + n]).decode("utf-8", "replace")
            if pos + n > len(buf):
                raise struct.error("string past the end of the file")
            pos += n
            return out

        def value(vtype):
            nonlocal pos
            if vtype == 8:
                return string()
            if vtype == 9:
                itype, count = take("<IQ")
                if itype in _NUMPY_TYPES:
                    dt = np.dtype(_NUMPY_TYPES[itype]).newbyteorder("<")
                    arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos)
                    pos += dt.itemsize * count
                    return arr.tolist()
                return [value(itype) for _ in range(count)]
            if vtype in _NUMPY_TYPES:
                dt = np.dtype(_NUMPY_TYPES[vtype]).newbyteorder("<")
                (v,) = np.frombuffer(buf, dtype=dt, count=1, offset=pos).tolist()
                pos += dt.itemsize
                return v
            raise ValueError(f"unknown GGUF value type {vtype}")

        magic = bytes(buf[:4])
        if magic != _GGUF_MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        pos = 4
        (version,) = take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = take("<QQ")
        self.fields: Dict[str, _Field] = {}
        for _ in range(n_kv):
            key = string()
            (vtype,) = take("<I")
            self.fields[key] = _Field(value(vtype))
        infos = []
        for _ in range(n_tensors):
            name = string()
            (n_dims,) = take("<I")
            dims = take(f"<{n_dims}Q")
            ttype, offset = take("<IQ")
            infos.append((name, dims, ttype, offset))
        alignment = int(self.fields["general.alignment"].value) if "general.alignment" in self.fields else 32
        start = pos + (-pos) % alignment
        self.tensors: List[_Tensor] = []
        for name, dims, ttype, offset in infos:
            qtype = GGMLQuantizationType(ttype)
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_elems = int(np.prod(dims))
            n_bytes = n_elems * type_size // block
            np_dims = tuple(reversed(dims))
            data_offset = start + offset
            if data_offset + n_bytes > len(mm):
                self.tensors.append(_Tensor(name, np.array(dims), qtype, n_bytes, data_offset, None))
                continue
            floats = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
            if qtype in floats:
                data = np.frombuffer(buf, dtype=floats[qtype], count=n_elems, offset=data_offset).reshape(np_dims)
            else:
                data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=data_offset).reshape(
                    quant_shape_to_byte_shape(np_dims, qtype))
            self.tensors.append(_Tensor(name, np.array(dims), qtype, n_bytes, data_offset, data))


def _refuse_architecture(path: Path, arch) -> None:
    raise ModelLoadError(
        f"{str(path)!r} has architecture {arch!r}; bayes_lens reads {list(SUPPORTED_ARCHITECTURES)} "
        "GGUF files. Load other architectures with TransformerLens from Hugging Face weights "
        "(bl.load_model(HF_FOLDER, kind='bridge'))."
    )


def read_gguf(path: str | os.PathLike) -> LlamaSpec:
    """Open and validate a llama GGUF file (metadata only; tensors stay memory-mapped).

    Raises :class:`~bayes_lens.errors.ModelLoadError` naming the file and the problem: missing,
    not a GGUF (bad magic), truncated, or an unsupported architecture.
    """
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)).strip():
        raise ModelLoadError(f"the GGUF path must be a non-empty string or pathlib.Path, got {path!r}; pass the "
                             "path of a .gguf file (or use bl.load_model() for the default model).")
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"GGUF file not found: {str(path)!r}. Check the path.")
    if not path.is_file():
        raise ModelLoadError(f"{str(path)!r} is not a file; pass the path of a .gguf file.")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(
            f"{str(path)!r} is not a GGUF file: it starts with {magic!r}, expected {_GGUF_MAGIC!r}. "
            "Pass a llama.cpp .gguf file (or a Hugging Face folder with --model)."
        )
    if path.stat().st_size < 24:
        raise ModelLoadError(f"{str(path)!r} is truncated ({path.stat().st_size} bytes, less than a GGUF "
                             "header); the file is probably truncated or corrupted - download or copy it again.")
    early = gguf_architecture(path)  # refuse an unsupported file before the slow full parse
    if early is not None and early not in SUPPORTED_ARCHITECTURES:
        _refuse_architecture(path, early)
    require_extra("gguf", "gguf")
    try:
        reader = FastGGUFReader(path)
    except Exception as err:  # noqa: BLE001 - the reader raises many kinds on bad files
        raise ModelLoadError(
            f"{str(path)!r} could not be read as GGUF ({type(err).__name__}: {err}); the file is "
            "probably truncated or corrupted - download or copy it again."
        ) from err
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelLoadError(
                f"{str(path)!r} is truncated: tensor {t.name!r} ends at byte {end} but the file has "
                f"{size} bytes. Download or copy the file again."
            )
    meta = {k: _field_value(f) for k, f in reader.fields.items()
            if not k.startswith("tokenizer.ggml.") or k.endswith(("_id", ".model", ".pre", "add_bos_token",
                                                                   "add_eos_token", "add_space_prefix"))}
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        _refuse_architecture(path, arch)

    def need(key: str):
        if f"{arch}.{key}" not in meta:
            raise ModelLoadError(f"{str(path)!r} lacks the metadata key {arch}.{key!s}; the file is incomplete.")
        return meta[f"{arch}.{key}"]

    d_model = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        embd = [t for t in reader.tensors if t.name == "token_embd.weight"]
        if not embd:
            raise ModelLoadError(f"{str(path)!r} has no token_embd.weight tensor; the file is incomplete.")
        vocab = int(embd[0].shape[-1])
    gemma = {}
    if arch == "gemma3":
        scaling = meta.get(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none") and float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) != 1.0:
            raise ModelLoadError(f"{str(path)!r}: rope scaling {scaling!r} (Gemma 3 4B and larger) is not "
                                 "supported; bayes_lens reads the 270M and 1B Gemma 3 files.")
        n_layers = int(need("block_count"))
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, (list, tuple)):  # newer converters: one bool per layer (True = local)
            types = ["local" if bool(p) else "global" for p in pattern]
        else:  # llama.cpp / transformers: every pattern-th layer is global
            types = ["local" if (i + 1) % int(pattern) else "global" for i in range(n_layers)]
        d_head = int(meta.get(f"{arch}.attention.key_length", d_model // n_heads))
        gemma = dict(
            arch=arch,
            sliding_window=int(need("attention.sliding_window")),
            rope_base_local=float(meta.get(f"{arch}.rope.freq_base_swa", 10000.0)),
            layer_types=types,
            # llama.cpp: 1/sqrt(d_model / n_heads) for the 27B model (62 layers), 1/sqrt(d_head) otherwise
            query_pre_attn_scalar=int(d_model // n_heads if n_layers == 62 else d_head),
        )
    spec = LlamaSpec(
        path=path,
        name=str(meta.get("general.name", path.stem)),
        n_layers=int(need("block_count")),
        d_model=d_model,
        d_mlp=int(need("feed_forward_length")),
        n_heads=n_heads,
        n_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", n_heads)),
        d_head=int(meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
                   or d_model // n_heads),
        n_ctx=int(need("context_length")),
        d_vocab=int(vocab),
        rope_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tied_embeddings="output.weight" not in names,
        metadata=meta,
        reader=reader,
        **gemma,
    )
    check_llama_spec(spec, reader.tensors)  # coherent heads, every known tensor of the right shape
    return spec


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation (see the module docstring)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state_dict(contents: LlamaSpec) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, float32 tensor)`` for every weight, dequantized, in transformers' convention.

    llama: Q/K rows un-permuted. gemma3: norm weights stored as ``1 + w`` get the 1 subtracted.
    Either way the tensors equal what transformers' own GGUF loader produces.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    gemma = contents.is_gemma3
    block_names = _GEMMA3_BLOCK_NAMES if gemma else _BLOCK_NAMES
    for t in contents.reader.tensors:
        if t.name in _TOP_NAMES:
            name = _TOP_NAMES[t.name]
        elif t.name.startswith("blk."):
            _, layer, rest = t.name.split(".", 2)
            if rest not in block_names:
                raise ModelLoadError(f"{str(contents.path)!r}: unexpected tensor {t.name!r} for a "
                                     f"{contents.arch} model.")
            name = f"model.layers.{layer}.{block_names[rest]}"
        elif t.name == "rope_freqs.weight":
            raise ModelLoadError(f"{str(contents.path)!r}: rope frequency scaling (rope_freqs) is not supported.")
        else:
            continue
        try:
            if t.tensor_type == GGMLQuantizationType.F32:
                arr = np.asarray(t.data, dtype=np.float32)
            elif t.data.ndim == 2 and t.data.size > _CHUNK_BYTES:
                # a large tensor (Gemma's 262k x 640 embedding) row block by row block, so the
                # dequantizer's float intermediates stay small: the peak memory is the weights
                rows = t.data.shape[0]
                step = max(1, _CHUNK_BYTES // t.data.shape[1])
                first = dequantize(t.data[:step], t.tensor_type)
                arr = np.empty((rows, first.shape[1]), dtype=np.float32)
                arr[:step] = first
                for i in range(step, rows, step):
                    arr[i:i + step] = dequantize(t.data[i:i + step], t.tensor_type)
            else:
                arr = dequantize(t.data, t.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as err:
            raise ModelLoadError(
                f"{str(contents.path)!r}: tensor {t.name!r} has type {t.tensor_type.name}, which the "
                f"installed gguf package cannot dequantize ({err}). Upgrade it (pip install -U gguf) "
                "or convert the file to another quantization."
            ) from err
        arr = np.asarray(arr, dtype=np.float32).reshape([int(s) for s in reversed(t.shape)] if len(t.shape) > 1
                                                        else [int(t.shape[0])])
        if gemma:
            if name.endswith("norm.weight"):
                arr = arr - np.float32(1.0)  # a new array: no longer a view of the file
        elif name.endswith("q_proj.weight"):
            arr = _unpermute(arr, contents.n_heads)
        elif name.endswith("k_proj.weight"):
            arr = _unpermute(arr, contents.n_kv_heads)
        if t.tensor_type == GGMLQuantizationType.F32 or not arr.flags.c_contiguous:
            arr = np.array(arr, dtype=np.float32, copy=True)  # F32 data is a view of the memory-mapped file
        yield name, torch.from_numpy(arr)


def _tokenizer(contents: LlamaSpec):
    """The GGUF's own tokenizer, built from its metadata (no second read of the file)."""
    from transformers import PreTrainedTokenizerFast

    meta = contents.metadata
    reader = contents.reader
    if "tokenizer.ggml.tokens" not in reader.fields:
        raise ModelLoadError(f"{str(contents.path)!r} carries no tokenizer (tokenizer.ggml.tokens is missing); "
                             "bayes_lens needs the GGUF's own tokenizer.")
    tok_dict: Dict[str, Any] = {
        "tokenizer_type": meta.get("tokenizer.ggml.model"),
        "pre_tokenizer_type": meta.get("tokenizer.ggml.pre"),
        "tokens": _field_value(reader.fields["tokenizer.ggml.tokens"]),
    }
    for key, name in (("merges", "merges"), ("token_type", "token_type"), ("scores", "scores")):
        if f"tokenizer.ggml.{key}" in reader.fields:
            tok_dict[name] = _field_value(reader.fields[f"tokenizer.ggml.{key}"])
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

        backend, _ = convert_gguf_tokenizer(meta["general.architecture"], tok_dict)
    except Exception:  # noqa: BLE001 - fall back to transformers' own (slower) GGUF route
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(contents.path.parent), gguf_file=contents.path.name)
    tokens = tok_dict["tokens"]

    def special(key):
        idx = meta.get(f"tokenizer.ggml.{key}")
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=special("bos_token_id"),
        eos_token=special("eos_token_id"),
        unk_token=special("unknown_token_id"),
        pad_token=special("padding_token_id") or special("eos_token_id"),
        # no name_or_path here: for a vocabulary over 100k transformers would look the name up (on the
        # hub, or as a local folder with a config.json) to check for a Mistral pre-tokenizer bug
    )
    tok.name_or_path = str(contents.path)
    tok.init_kwargs["name_or_path"] = str(contents.path)
    # TL 3.x's set_tokenizer re-loads a tokenizer "with BOS" from name_or_path unless init_kwargs
    # says add_bos_token; that re-load cannot read a GGUF path. Our tokenizer never adds BOS
    # itself (no post-processor), so this only skips the re-load; prepending stays off
    # (cfg.default_prepend_bos=False), matching llama.cpp for this file.
    tok.init_kwargs["add_bos_token"] = True
    tok.add_bos_token = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    chat = reader.fields.get("tokenizer.chat_template")
    if chat is not None:
        tok.chat_template = _field_value(chat)
    return tok


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer stored inside a GGUF file (a ``PreTrainedTokenizerFast``), without loading the weights' model.

    >>> tok = load_tokenizer(bl.models.default_model_path())   # doctest: +SKIP
    """
    return _tokenizer(read_gguf(path))


def _hooked_config(c: LlamaSpec, device: str | None):
    from transformer_lens import HookedTransformerConfig

    if c.is_gemma3:  # mirrors TL 3.9's built-in google/gemma-3-270m config, read from the file
        return HookedTransformerConfig(
            model_name=c.path.stem,
            init_weights=False,
            d_model=c.d_model,
            d_head=c.d_head,
            n_heads=c.n_heads,
            d_mlp=c.d_mlp,
            n_layers=c.n_layers,
            n_ctx=min(c.n_ctx, 8192),
            eps=c.rms_eps,
            d_vocab=c.d_vocab,
            act_fn="gelu_pytorch_tanh",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_adjacent_pairs=False,
            rotary_dim=c.d_head,
            rotary_base=c.rope_base,
            rotary_base_local=c.rope_base_local,
            use_attn_scale=True,
            attn_scale=float(c.query_pre_attn_scalar or c.d_head) ** 0.5,
            n_key_value_heads=c.n_kv_heads if c.n_kv_heads != c.n_heads else None,
            gated_mlp=True,
            final_rms=True,
            use_normalization_before_and_after=True,
            use_qk_norm=True,
            window_size=c.sliding_window,
            use_local_attn=True,
            attn_types=list(c.layer_types),
            original_architecture="Gemma3ForCausalLM",
            default_prepend_bos=bool(c.metadata.get("tokenizer.ggml.add_bos_token", True)),
            tokenizer_prepends_bos=False,
            device=device or "cpu",
        )
    return HookedTransformerConfig(
        model_name=c.path.stem,
        init_weights=False,  # every weight comes from the file; random init would only cost time
        d_model=c.d_model,
        d_head=c.d_head,
        n_heads=c.n_heads,
        d_mlp=c.d_mlp,
        n_layers=c.n_layers,
        n_ctx=min(c.n_ctx, 8192),
        eps=c.rms_eps,
        d_vocab=c.d_vocab,
        act_fn="silu",
        n_key_value_heads=c.n_kv_heads if c.n_kv_heads != c.n_heads else None,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=c.d_head,
        rotary_base=c.rope_base,
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        default_prepend_bos=bool(c.metadata.get("tokenizer.ggml.add_bos_token", False)),
        tokenizer_prepends_bos=False,
        device=device or "cpu",
    )


def _to_hooked(c: LlamaSpec, tokenizer, device: str | None, weights=None):
    try:
        from transformer_lens import HookedTransformer
    except ImportError as err:
        raise ModelLoadError(
            "kind='hooked' needs TransformerLens 3.x (HookedTransformer was removed in 4.0); use "
            "kind='bridge' or kind='auto', or pip install 'transformer-lens>=3.4,<4'."
        ) from err
    cfg = _hooked_config(c, device)
    gqa = "_" if cfg.n_key_value_heads is not None else ""
    sd: Dict[str, torch.Tensor] = {}
    gemma = c.is_gemma3
    # transformers' Gemma norms compute x * (1 + w); TL's compute x * w (TL's own Gemma conversion adds 1)
    norm = (lambda w: w + 1.0) if gemma else (lambda w: w)
    for name, w in (hf_state_dict(c) if weights is None else weights):
        if name == "model.embed_tokens.weight":
            # Gemma scales the embedding by sqrt(d_model) (in the weights' dtype, as transformers does)
            sd["embed.W_E"] = w * torch.tensor(c.d_model ** 0.5, dtype=w.dtype) if gemma else w
            if c.tied_embeddings:
                sd["unembed.W_U"] = w.T.contiguous()
        elif name == "lm_head.weight":
            sd["unembed.W_U"] = w.T.contiguous()
        elif name == "model.norm.weight":
            sd["ln_final.w"] = norm(w)
        else:
            parts = name.split(".")
            layer, sub = int(parts[2]), ".".join(parts[3:])
            b = f"blocks.{layer}."
            if sub == "input_layernorm.weight":
                sd[b + "ln1.w"] = norm(w)
            elif sub == "post_attention_layernorm.weight":
                sd[b + ("ln1_post.w" if gemma else "ln2.w")] = norm(w)
            elif sub == "pre_feedforward_layernorm.weight":
                sd[b + "ln2.w"] = norm(w)
            elif sub == "post_feedforward_layernorm.weight":
                sd[b + "ln2_post.w"] = norm(w)
            elif sub == "self_attn.q_norm.weight":
                sd[b + "attn.q_norm.w"] = norm(w)
            elif sub == "self_attn.k_norm.weight":
                sd[b + "attn.k_norm.w"] = norm(w)
            elif sub == "self_attn.q_proj.weight":
                sd[b + "attn.W_Q"] = w.view(c.n_heads, c.d_head, c.d_model).transpose(1, 2).contiguous()
            elif sub == "self_attn.k_proj.weight":
                sd[b + f"attn.{gqa}W_K"] = w.view(c.n_kv_heads, c.d_head, c.d_model).transpose(1, 2).contiguous()
            elif sub == "self_attn.v_proj.weight":
                sd[b + f"attn.{gqa}W_V"] = w.view(c.n_kv_heads, c.d_head, c.d_model).transpose(1, 2).contiguous()
            elif sub == "self_attn.o_proj.weight":
                sd[b + "attn.W_O"] = w.view(c.d_model, c.n_heads, c.d_head).permute(1, 2, 0).contiguous()
            elif sub == "mlp.gate_proj.weight":
                sd[b + "mlp.W_gate"] = w.T.contiguous()
            elif sub == "mlp.up_proj.weight":
                sd[b + "mlp.W_in"] = w.T.contiguous()
            elif sub == "mlp.down_proj.weight":
                sd[b + "mlp.W_out"] = w.T.contiguous()
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False, default_padding_side="right")
    own = model.state_dict()
    for key, value in own.items():  # zero biases and buffers the GGUF does not carry
        if key not in sd and (key.endswith((".b_Q", "b_K", "b_V", ".b_O", ".b_in", ".b_out", "b_U"))):
            sd[key] = torch.zeros_like(value)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if not m.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    if missing or unexpected:
        raise ModelLoadError(f"{str(c.path)!r}: weights did not match the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}).")
    model.eval()
    if device:
        model.to(device)
    return model


def _hf_gemma3_config(c: LlamaSpec):
    from transformers import Gemma3TextConfig

    meta = c.metadata
    return Gemma3TextConfig(
        vocab_size=c.d_vocab,
        hidden_size=c.d_model,
        intermediate_size=c.d_mlp,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.d_head,
        max_position_embeddings=c.n_ctx,
        rms_norm_eps=c.rms_eps,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": c.rope_base},
                         "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_base_local}},
        sliding_window=c.sliding_window,
        layer_types=["sliding_attention" if t == "local" else "full_attention" for t in c.layer_types],
        query_pre_attn_scalar=int(c.query_pre_attn_scalar or c.d_head),
        tie_word_embeddings=c.tied_embeddings,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        # TransformerBridge picks its adapter from `architectures`; set it here, on our own config
        architectures=["Gemma3ForCausalLM"],
        attn_implementation="eager",
    )


class _ParametersOnMeta:
    """Create a module's *parameters* on the meta device, its buffers (rotary frequencies, Gemma's
    embedding scale) normally: every parameter is then assigned from the file, no random init."""

    def __enter__(self):
        self._orig = torch.nn.Module.register_parameter

        def register(module, name, param):
            self._orig(module, name, param)
            if param is not None and not param.is_meta:
                p = module._parameters[name]
                module._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

        torch.nn.Module.register_parameter = register
        return self

    def __exit__(self, *exc):
        torch.nn.Module.register_parameter = self._orig
        return False


def _assign_weights(hf, c: LlamaSpec, weights=None) -> None:
    """Assign the GGUF's tensors (or ``weights``) to a transformers model built on the meta device, tying
    the unembedding to the embedding when the file has no separate ``output.weight``."""
    sd = dict(hf_state_dict(c) if weights is None else weights)
    if c.tied_embeddings:
        sd.pop("lm_head.weight", None)
    missing, unexpected = hf.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise ModelLoadError(f"{str(c.path)!r}: weights did not match a {type(hf).__name__} (missing "
                             f"{missing[:5]}, unexpected {unexpected[:5]}).")
    if c.tied_embeddings:
        hf.tie_weights()


def _hf_model(c: LlamaSpec, weights=None):
    """A transformers ``LlamaForCausalLM`` / ``Gemma3ForCausalLM`` holding the file's weights."""
    if not c.is_gemma3:
        return _hf_llama(c, weights)
    from transformers import Gemma3ForCausalLM

    with _ParametersOnMeta():
        hf = Gemma3ForCausalLM(_hf_gemma3_config(c))
    _assign_weights(hf, c, weights)
    hf.eval()
    return hf


def _hf_llama(c: LlamaSpec, weights=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok_meta = c.metadata
    hf_cfg = LlamaConfig(
        vocab_size=c.d_vocab,
        hidden_size=c.d_model,
        intermediate_size=c.d_mlp,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.d_head,
        max_position_embeddings=c.n_ctx,
        rms_norm_eps=c.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base},
        tie_word_embeddings=c.tied_embeddings,
        bos_token_id=tok_meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=tok_meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=tok_meta.get("tokenizer.ggml.padding_token_id"),
        attn_implementation="eager",
    )
    with torch.device("meta"):
        hf = LlamaForCausalLM(hf_cfg)
    _assign_weights(hf, c, weights)
    # buffers created on the meta device (rotary inverse frequencies) are rebuilt on the CPU
    for module in hf.modules():
        if hasattr(module, "inv_freq") and getattr(module.inv_freq, "is_meta", False):
            inv_freq, scaling = module.rope_init_fn(module.config, "cpu") if hasattr(module, "rope_init_fn") \
                else _default_inv_freq(c)
            module.register_buffer("inv_freq", inv_freq, persistent=False)
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq = inv_freq
            if hasattr(module, "attention_scaling"):
                module.attention_scaling = scaling
    hf.eval()
    return hf


def _default_inv_freq(c: LlamaSpec):
    inv = 1.0 / (c.rope_base ** (torch.arange(0, c.d_head, 2, dtype=torch.int64).float() / c.d_head))
    return inv, 1.0


def _to_bridge(c: LlamaSpec, tokenizer, device: str | None, weights=None):
    from transformer_lens.model_bridge import TransformerBridge

    hf = _hf_model(c, weights)
    for module in hf.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                raise ModelLoadError(f"{str(c.path)!r}: buffer {name!r} was not initialized.")
    hf.config.name_or_path = str(c.path)
    bridge = TransformerBridge.boot_transformers(str(c.path.stem), hf_model=hf, tokenizer=tokenizer,
                                                 device=device or "cpu")
    # follow the file: llama.cpp prepends BOS only when tokenizer.ggml.add_bos_token says so
    bridge.cfg.default_prepend_bos = bool(c.metadata.get("tokenizer.ggml.add_bos_token", c.is_gemma3))
    bridge.cfg.model_name = c.path.stem
    bridge.eval()
    return bridge


def from_weights(spec: LlamaSpec, weights, tokenizer, kind: str = "hooked", *, device: str | None = None):
    """Build a model of ``kind`` (``"hooked"`` or ``"bridge"``) from a spec and HF-named weights.

    ``weights`` yields ``(hf_name, tensor)`` pairs in transformers' convention (what
    :func:`hf_state_dict` yields) - e.g. random weights for a tiny model of a real architecture.
    """
    check_choice(kind, "kind", ("hooked", "bridge"), error=ModelLoadError)
    if kind == "hooked":
        return _to_hooked(spec, tokenizer, device, weights)
    if kind == "bridge":
        return _to_bridge(spec, tokenizer, device, weights)
    raise AssertionError(f"unreachable: kind={kind!r} was checked above")


def load_gguf(path: str | os.PathLike, kind: str = "auto", *, device: str | None = None):
    """Load a llama- or gemma3-architecture GGUF file as a TransformerLens model with raw weights.

    Parameters
    ----------
    path:
        The ``.gguf`` file.
    kind:
        ``"hooked"`` (TL 3.x ``HookedTransformer``), ``"bridge"`` (``TransformerBridge``), or
        ``"auto"``: ``HookedTransformer`` where the installed TransformerLens has it, else the bridge.
    device:
        Torch device (default CPU).

    Returns
    -------
    A model whose tokenizer is the GGUF's own, with no BOS prepended unless the file asks for it
    (SmolLM2: no; Gemma 3: yes).
    Weights are **not** processed (no folded layer norm, no centring).

    Raises
    ------
    ModelLoadError
        Missing file, bad magic, truncated file, unsupported architecture or tensor type.
    """
    from ..adapter import has_hooked_transformer

    check_choice(kind, "kind", ("auto", "hooked", "bridge"), error=ModelLoadError)
    device = check_device(device)
    contents = read_gguf(path)
    tokenizer = _tokenizer(contents)
    # The reader's parsed metadata (~90 MB of small arrays for a 49k vocabulary) is no longer needed:
    # free it before the weights are dequantized, to keep the peak memory of loading low.
    contents.reader.fields.clear()
    if kind == "auto":
        kind = "hooked" if has_hooked_transformer() else "bridge"
    model = _to_hooked(contents, tokenizer, device) if kind == "hooked" else _to_bridge(contents, tokenizer, device)
    return model
