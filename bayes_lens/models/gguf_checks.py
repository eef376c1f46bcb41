"""Cheap checks of a GGUF file before any tensor is read: the architecture, head counts, tensor shapes.

* :func:`peek_architecture` reads ``general.architecture`` straight from the GGUF header (the
  key-value section that precedes the tensor table, GGUF spec v2/v3: magic, version, tensor count,
  KV count, then ``(key, type, value)`` records), so an unsupported file is refused in
  milliseconds instead of after the full reader has parsed every field and tensor record.
* :func:`check_llama_spec` checks that the hyper-parameters are coherent (query heads a multiple of
  the key/value heads, as grouped-query attention requires) and that every tensor has the shape
  those hyper-parameters imply, so a wrong-shaped tensor is a :class:`ModelLoadError` naming the
  tensor, not a reshape or ``load_state_dict`` error deep inside torch.

Reference: the GGUF format, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md .

Example
-------
>>> from bayes_lens.models.gguf_checks import peek_architecture
>>> peek_architecture("model.gguf")            # doctest: +SKIP
'llama'
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO, Dict, Optional, Tuple

from ..errors import ModelLoadError

__all__ = ["peek_architecture", "check_llama_spec", "expected_llama_shapes"]

# GGUF value types -> struct format of a scalar (8: string, 9: array are handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_KV = 256          # the architecture key comes first in every writer we know; give up after this
_MAX_STRING = 1 << 20  # a longer "string" means a corrupted header


class _Stop(Exception):
    pass


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Stop
    return data


def _string(fh: BinaryIO, end: str) -> bytes:
    (n,) = struct.unpack(end + "Q", _read(fh, 8))
    if n > _MAX_STRING:
        raise _Stop
    return _read(fh, n)


def _skip_value(fh: BinaryIO, vtype: int, end: str) -> None:
    if vtype in _SCALARS:
        fh.seek(struct.calcsize(_SCALARS[vtype]), os.SEEK_CUR)
    elif vtype == 8:
        _string(fh, end)
    elif vtype == 9:
        (etype,) = struct.unpack(end + "I", _read(fh, 4))
        (count,) = struct.unpack(end + "Q", _read(fh, 8))
        if etype in _SCALARS:
            fh.seek(count * struct.calcsize(_SCALARS[etype]), os.SEEK_CUR)
        elif etype == 8:
            for _ in range(count):
                _string(fh, end)
        else:
            raise _Stop
    else:
        raise _Stop


def peek_architecture(path) -> Optional[str]:
    """``general.architecture`` of a GGUF file read from its header, or None if it cannot be found cheaply.

    Never raises for a malformed file (the full reader reports those with a precise message).
    """
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return None
            raw = _read(fh, 4)
            end = "<"
            (version,) = struct.unpack("<I", raw)
            if version > 0xFFFF:  # a big-endian file
                end = ">"
                (version,) = struct.unpack(">I", raw)
            if version < 2:
                return None
            _read(fh, 8)  # tensor count
            (n_kv,) = struct.unpack(end + "Q", _read(fh, 8))
            for _ in range(min(n_kv, _MAX_KV)):
                key = _string(fh, end)
                (vtype,) = struct.unpack(end + "I", _read(fh, 4))
                if key == b"general.architecture" and vtype == 8:
                    return _string(fh, end).decode("utf-8", "replace")
                _skip_value(fh, vtype, end)
    except (_Stop, OSError, struct.error):
        return None
    return None


def expected_llama_shapes(spec) -> Dict[str, Tuple[int, ...]]:
    """Torch-order shapes (rows, cols) of the llama GGUF tensors of ``spec``, keyed by GGUF name ("blk.{l}.")."""
    d, dh, nh, nkv, dm, v = spec.d_model, spec.d_head, spec.n_heads, spec.n_kv_heads, spec.d_mlp, spec.d_vocab
    block = {
        "attn_norm.weight": (d,),
        "ffn_norm.weight": (d,),
        "attn_q.weight": (nh * dh, d),
        "attn_k.weight": (nkv * dh, d),
        "attn_v.weight": (nkv * dh, d),
        "attn_output.weight": (d, nh * dh),
        "ffn_gate.weight": (dm, d),
        "ffn_up.weight": (dm, d),
        "ffn_down.weight": (d, dm),
    }
    out = {"token_embd.weight": (v, d), "output.weight": (v, d), "output_norm.weight": (d,)}
    for layer in range(spec.n_layers):
        out.update({f"blk.{layer}.{k}": s for k, s in block.items()})
    return out


def check_llama_spec(spec, tensors: Any = ()) -> None:
    """Raise :class:`ModelLoadError` if ``spec``'s head counts are incoherent or a known tensor has the wrong shape.

    ``tensors`` are the GGUF reader's tensor records (``.name``, ``.shape`` in GGUF order). Tensors
    with names this check does not know are left to the loader.
    """
    where = str(spec.path)
    for field in ("n_layers", "d_model", "d_mlp", "n_heads", "n_kv_heads", "d_head", "n_ctx", "d_vocab"):
        value = getattr(spec, field)
        if value < (0 if field == "n_layers" else 1):
            raise ModelLoadError(f"{where!r} declares {field} = {value}; it must be positive. The file's metadata "
                                 "is corrupted.")
    if spec.n_heads % spec.n_kv_heads:
        raise ModelLoadError(
            f"{where!r} has {spec.n_heads} attention heads and {spec.n_kv_heads} key/value heads; grouped-query "
            "attention needs the heads to be a multiple of the key/value heads. The file's metadata is corrupted "
            "(attention.head_count / attention.head_count_kv)."
        )
    expected = expected_llama_shapes(spec)
    for t in tensors:
        name = str(t.name)
        if name.startswith("blk."):
            parts = name.split(".", 2)
            if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) >= spec.n_layers:
                raise ModelLoadError(f"{where!r} has tensor {name!r} but declares block_count = {spec.n_layers}; "
                                     "the file is corrupted.")
        if name not in expected:
            continue
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        want = expected[name]
        if len(want) == 1:
            shape = (int(list(t.shape)[0]),) if len(shape) == 1 else shape
        if shape != want:
            raise ModelLoadError(
                f"{where!r}: tensor {name!r} has shape {list(shape)}, but the file's hyper-parameters (d_model "
                f"{spec.d_model}, heads {spec.n_heads}/{spec.n_kv_heads} x {spec.d_head}, d_mlp {spec.d_mlp}, "
                f"vocab {spec.d_vocab}) imply {list(want)}. The file is corrupted or was converted wrongly."
            )
