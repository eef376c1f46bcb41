"""Shard files on disk: one ``.safetensors`` of rows plus a JSON manifest, written atomically.

Every tensor of a :class:`bayes_lens.collect.Collection` is stored under a flat name - dict fields as
``final_values.12`` / ``final_resid.12``, the rest under their field names (``attn_entropy_bits``,
``next_token_entropy_bits``, ``token_logprobs``, ``n_tokens``, ``indices``, and with
``tail_positions`` ``tail_logits`` / ``tail_logsumexp``); fields that are ``None`` are absent. ``attention_positions`` goes in the safetensors metadata. safetensors holds no
code, so nothing here unpickles (the project rule: no pickle on disk).

A file written by :func:`save_collection` (the merged file of ``bayes-lens shard merge``) checks
itself: its metadata holds a SHA-256 of every tensor (dtype, shape, bytes) and one of the metadata
(settings hash, model fingerprint, the tensor checksums), and :func:`load_collection` verifies the
tensors it reads and the metadata, so a flipped bit anywhere is a
:class:`~bayes_lens.shard.ShardIntegrityError`, not silently different rows. (Shard files carry no
such entry: :func:`~bayes_lens.shard.merge` checks each against the SHA-256 in its manifest.)

Writes are atomic, so a killed worker never leaves a half-written shard that passes for finished: each file is written to a temporary name in the same folder,
flushed, ``fsync``-ed and moved into place with ``os.replace``. The manifest is written last and
records the SHA-256 of the tensor file, so a manifest on disk is the commit mark of a finished shard;
a worker killed before it leaves no manifest, and a rerun redoes that shard.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Union

from torch import Tensor

from .._files import sha256_file, sha256_json, sha256_tensor, write_atomic
from ..collect import Collection
from ._errors import ShardIntegrityError

__all__ = [
    "collection_tensors",
    "collection_from_tensors",
    "save_collection",
    "load_collection",
    "write_atomic",
    "write_json_atomic",
    "write_tensors_atomic",
    "sha256_file",
    "sha256_text",
    "prompt_hashes",
    "MANIFEST_FORMAT",
    "SAFETENSORS_DTYPES",
    "read_safetensors_header",
    "read_into",
]

MANIFEST_FORMAT = "bayes-lens-shard/1"
_SCALAR_FIELDS = ("attn_entropy_bits", "next_token_entropy_bits", "token_logprobs", "n_tokens", "indices",
                  "tail_logits", "tail_logsumexp")


def _dtypes():
    import torch

    return {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
            "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
            "BOOL": torch.bool}


SAFETENSORS_DTYPES = _dtypes()
_MAX_HEADER = 100 << 20


def read_safetensors_header(fh) -> tuple:
    """(header dict, offset of the data) of an open safetensors file: an 8-byte little-endian length, then JSON."""
    raw = fh.read(8)
    if len(raw) != 8:
        raise ShardIntegrityError("the file is shorter than a safetensors header.")
    n = struct.unpack("<Q", raw)[0]
    if n > _MAX_HEADER:
        raise ShardIntegrityError(f"the safetensors header claims {n} bytes: not a safetensors file.")
    header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_into(fh, data_start: int, entry: Dict, out: Tensor) -> None:
    """Read one tensor's bytes (``entry`` of the header) into the contiguous tensor ``out`` (same size)."""
    begin, end = entry["data_offsets"]
    if not out.is_contiguous() or out.numel() * out.element_size() != end - begin:
        raise ShardIntegrityError(f"a tensor's byte range ({end - begin} bytes) does not fit its declared shape.")
    if end == begin:
        return
    view = memoryview(out.view(-1).view(SAFETENSORS_DTYPES["U8"]).numpy())
    fh.seek(data_start + begin)
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise ShardIntegrityError("the file ends inside a tensor (truncated).")
        done += got


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_hashes(prompts: Sequence[str]) -> list:
    """SHA-256 (hex) of each prompt's UTF-8 bytes."""
    return [sha256_text(p) for p in prompts]


def write_json_atomic(path: Union[str, Path], obj) -> None:
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_tensors_atomic(path: Union[str, Path], tensors: Dict[str, Tensor], metadata: Dict[str, str]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def collection_tensors(col: Collection) -> Dict[str, Tensor]:
    """The Collection's tensors under flat names (``final_values.12``, ``n_tokens``, ...)."""
    out = {}
    for layer, rows in col.final_values.items():
        out[f"final_values.{int(layer)}"] = rows
    for layer, rows in col.final_resid.items():
        out[f"final_resid.{int(layer)}"] = rows
    for name in _SCALAR_FIELDS:
        value = getattr(col, name)
        if value is not None:
            out[name] = value
    return out


def collection_from_tensors(tensors: Dict[str, Tensor], attention_positions: str = "last") -> Collection:
    """Inverse of :func:`collection_tensors`."""
    fv, fr = {}, {}
    for name, t in tensors.items():
        if name.startswith("final_values."):
            fv[int(name.split(".", 1)[1])] = t
        elif name.startswith("final_resid."):
            fr[int(name.split(".", 1)[1])] = t
    return Collection(
        final_values=dict(sorted(fv.items())), final_resid=dict(sorted(fr.items())),
        attn_entropy_bits=tensors.get("attn_entropy_bits"),
        next_token_entropy_bits=tensors.get("next_token_entropy_bits"),
        token_logprobs=tensors.get("token_logprobs"), n_tokens=tensors["n_tokens"],
        attention_positions=attention_positions, indices=tensors.get("indices"),
        tail_logits=tensors.get("tail_logits"), tail_logsumexp=tensors.get("tail_logsumexp"),
    )


_TENSORS_SHA = "tensors_sha256"
_META_SHA = "metadata_sha256"


def save_collection(col: Collection, path: Union[str, Path], metadata: Optional[Dict[str, str]] = None) -> Path:
    """Write a Collection to one ``.safetensors`` file (atomically); read it back with :func:`load_collection`.

    The file carries the SHA-256 of each tensor and of its metadata (see the module doc).
    """
    path = Path(path)
    meta = {"attention_positions": col.attention_positions, "format": "bayes-lens-collection/1"}
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    tensors = collection_tensors(col)
    meta[_TENSORS_SHA] = json.dumps({name: sha256_tensor(t) for name, t in tensors.items()}, sort_keys=True)
    meta.pop(_META_SHA, None)
    meta[_META_SHA] = sha256_json(meta)
    write_tensors_atomic(path, tensors, meta)
    return path


def _verify_collection(path: Path, meta: Dict[str, str], names: Iterable[str], tensors: Dict[str, Tensor]) -> None:
    """Check the checksums a :func:`save_collection` file carries (files without them: nothing to check)."""
    fix = ("the file was changed or damaged after it was written; write it again (bayes-lens shard merge DIR, or "
           "bl.shard.save_collection).")
    if _META_SHA not in meta and _TENSORS_SHA not in meta:
        return
    body = {k: v for k, v in meta.items() if k != _META_SHA}
    if meta.get(_META_SHA) != sha256_json(body):
        raise ShardIntegrityError(f"{str(path)!r}: its metadata (settings hash, model fingerprint, tensor checksums) "
                                  f"does not match its SHA-256: {fix}")
    try:
        sha = json.loads(meta[_TENSORS_SHA])
    except (KeyError, ValueError):
        sha = None
    if not isinstance(sha, dict) or set(sha) != set(names):
        raise ShardIntegrityError(f"{str(path)!r}: its tensor checksums do not list exactly the stored tensors: {fix}")
    for name, t in tensors.items():
        if sha256_tensor(t) != sha[name]:
            raise ShardIntegrityError(f"{str(path)!r}: the tensor {name!r} does not match its SHA-256: {fix}")


def load_collection(path: Union[str, Path], layers: Optional[Iterable[int]] = None) -> Collection:
    """Read a Collection written by :func:`save_collection` or a shard; ``layers`` keeps only those rows.

    The checksums of a :func:`save_collection` file are verified for every tensor read.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ShardIntegrityError(f"no such collection file: {str(path)!r}.")
    keep = None if layers is None else {int(x) for x in layers}
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            names = list(f.keys())
            tensors = {}
            for name in names:
                if keep is not None and name.startswith(("final_values.", "final_resid.")):
                    if int(name.split(".", 1)[1]) not in keep:
                        continue
                tensors[name] = f.get_tensor(name)
    except ShardIntegrityError:
        raise
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file
        raise ShardIntegrityError(f"cannot read {str(path)!r} as safetensors ({err}); rerun the shard that wrote "
                                  "it.") from err
    _verify_collection(path, meta, names, tensors)
    if "n_tokens" not in tensors:
        raise ShardIntegrityError(f"{str(path)!r} holds no 'n_tokens': not a bayes_lens collection file.")
    return collection_from_tensors(tensors, meta.get("attention_positions", "last"))
