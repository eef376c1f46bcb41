"""Shard files on disk: one ``.safetensors`` of rows plus a JSON manifest, written atomically.

A shard's tensor file holds its :class:`~bayes_lens.reduced.ReducedCache` under the reduced cache's
own keys (read keys such as ``final_rows.v.12``, plus ``n_tokens`` and ``indices``; folders written by
earlier releases, keyed by hook names such as ``blocks.12.attn.hook_v``, merge unchanged;
:meth:`~bayes_lens.reduced.ReducedCache.file_tensors`); ``attention_positions`` goes in the
safetensors metadata. safetensors holds no code, so nothing here unpickles (the project rule: no
pickle on disk). The merged file of ``bayes-lens shard merge`` is written by
:meth:`ReducedCache.save <bayes_lens.reduced.ReducedCache.save>`, which checksums every tensor and
the metadata; shard files are checked by :func:`~bayes_lens.shard.merge` against the SHA-256 in
their manifest.

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
from typing import Dict, Sequence, Union

from torch import Tensor

from .._files import sha256_file, write_atomic
from ._errors import ShardIntegrityError

__all__ = [
    "write_atomic",
    "write_json_atomic",
    "write_tensors_atomic",
    "sha256_file",
    "sha256_text",
    "prompt_hashes",
    "prompts_digest",
    "MANIFEST_FORMAT",
    "SAFETENSORS_DTYPES",
    "read_safetensors_header",
    "read_into",
]

MANIFEST_FORMAT = "bayes-lens-shard/1"


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


def prompts_digest(prompts: Sequence[str]) -> str:
    """One SHA-256 of a prompt list, in its order: of its prompts' hashes joined by newlines."""
    return sha256_text("\n".join(prompt_hashes(prompts)))


def write_json_atomic(path: Union[str, Path], obj) -> None:
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_tensors_atomic(path: Union[str, Path], tensors: Dict[str, Tensor], metadata: Dict[str, str]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
