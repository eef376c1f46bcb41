"""Wind-tunnel checkpoints: safetensors weights + a JSON config (no pickle anywhere).

A checkpoint is a folder::

    config.json                   format tag, task, model shape, training config, step, seed, history,
                                  ``files`` (which weight files are current) and the SHA-256 of each
    model-<sha16>.safetensors     the Llama weights under Hugging Face names (float32)
    optimizer-<sha16>.safetensors optional: AdamW moments ("<param>.exp_avg", "<param>.exp_avg_sq"),
                                  present in training checkpoints so ``train(..., resume=True)``
                                  continues exactly; left out of the shipped checkpoints

(the shipped checkpoints, and ones written by earlier versions, use the fixed names
``model.safetensors`` / ``optimizer.safetensors`` and have no ``files`` entry; both are read).

Saving is crash-safe: the weight files are written under new names (named by their content hash,
each ``fsync``-ed), then ``config.json`` - which names them and holds their hashes - is replaced
atomically (temporary file, ``fsync``, ``os.replace``): that replace is the single switch from the
old checkpoint to the new one. Only then are the files the new config does not name deleted (and
the next save deletes any such leftovers of a killed save). A process killed at any point leaves a
complete, verifiable checkpoint - the old one or the new one. Saves into one folder are serialized
by a lock file (``.bayes_lens.lock``).

Loading checks the format tag, the hashes (a truncated or edited file is caught before use; a
missing or malformed ``sha256`` entry is an error, never a silent skip), the tensor names and
shapes; any failure raises :class:`~bayes_lens.errors.CheckpointError` saying which file is wrong
and what to do.

Example
-------
>>> import bayes_lens as bl
>>> ckpt = bl.windtunnel.read_checkpoint(bl.windtunnel.shipped_path("bijection"))
>>> ckpt.step, ckpt.task, ckpt.model_config.n_layers
(4000, BijectionTask(V=10), 3)
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..errors import CheckpointError, InvalidInputError
from .model import ModelConfig
from .tasks import task_from_dict
from .._files import FolderLock, fsync_dir, sha256_file, write_text

__all__ = ["Checkpoint", "write_checkpoint", "read_checkpoint", "checkpoint_files", "FORMAT"]

FORMAT = "bayes_lens.windtunnel/1"
_WEIGHTS = "model.safetensors"
_OPTIM = "optimizer.safetensors"
_CONFIG = "config.json"
_LOCK = ".bayes_lens.lock"
_ROLES = ("model", "optimizer")
_SHA = re.compile(r"[0-9a-f]{64}")
# files a save may leave behind: its weight files (old fixed names or hashed names) and temporaries
_OWNED = re.compile(r"(model|optimizer)(-[0-9a-f]{16})?\.safetensors|\.(model|optimizer)-.*\.tmp"
                    r"|config\.json\.tmp|\.config\.json\..*\.tmp")


@dataclass
class Checkpoint:
    """The contents of a checkpoint folder (weights as HF-named float32 tensors)."""

    task: object
    model_config: ModelConfig
    train_config: dict
    step: int
    seed: int
    weights: Dict[str, torch.Tensor] = field(repr=False)
    optimizer: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False)
    history: List[dict] = field(default_factory=list, repr=False)
    extra: dict = field(default_factory=dict)
    path: Optional[Path] = None


def write_checkpoint(path, ckpt: Checkpoint, *, optimizer: bool = True) -> Path:
    """Write ``ckpt`` into folder ``path`` (created if needed), crash-safely (see the module docstring)."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path)!r} exists and is not a folder; pass another out=/--out.")
    path.mkdir(parents=True, exist_ok=True)
    roles = [("model", ckpt.weights)]
    if optimizer and ckpt.optimizer is not None:
        roles.append(("optimizer", ckpt.optimizer))
    with FolderLock(path / _LOCK, what="checkpoint folder"):
        files, hashes = {}, {}
        for role, tensors in roles:  # 1. new files under new names; nothing refers to them yet
            tmp = path / f".{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
            try:
                save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                          metadata={"format": FORMAT})
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                digest = sha256_file(tmp)
                name = f"{role}-{digest[:16]}.safetensors"
                os.replace(tmp, path / name)  # same content hash -> same bytes: replacing is harmless
            except BaseException:
                if tmp.exists():
                    tmp.unlink()
                raise
            files[role], hashes[name] = name, digest
        fsync_dir(path)
        config = {
            "format": FORMAT,
            "task": ckpt.task.to_dict(),
            "model": ckpt.model_config.to_dict(),
            "train": ckpt.train_config,
            "step": int(ckpt.step),
            "seed": int(ckpt.seed),
            "files": files,
            "sha256": hashes,
            "history": ckpt.history,
            "extra": ckpt.extra,
        }
        write_text(path / _CONFIG, json.dumps(config, indent=1))  # 2. THE switch (atomic replace)
        _delete_unreferenced(path, set(files.values()))  # 3. the old files
    ckpt.path = path
    return path


def _delete_unreferenced(path: Path, keep) -> None:
    """Delete weight files and temporaries of earlier (or killed) saves that config.json does not name."""
    for child in path.iterdir():
        if child.name not in keep and _OWNED.fullmatch(child.name) and child.is_file():
            try:
                child.unlink()
            except FileNotFoundError:  # pragma: no cover
                pass


def checkpoint_files(path) -> Dict[str, Path]:
    """``{"model": Path, "optimizer": Path}`` (optimizer only if present) of the checkpoint in ``path``.

    Reads ``config.json``'s ``files`` entry; checkpoints without one (shipped, or written by earlier
    versions) use ``model.safetensors`` / ``optimizer.safetensors``.
    """
    path = Path(path)
    config = _read_config(path)
    return {role: path / name for role, name in _file_names(config, path).items()}


def _file_names(config: dict, path: Path) -> Dict[str, str]:
    cfg_file = path / _CONFIG
    files = config.get("files")
    if files is None:  # fixed names of the shipped / earlier checkpoints
        out = {"model": _WEIGHTS}
        if (path / _OPTIM).is_file():
            out["optimizer"] = _OPTIM
        return out
    if not isinstance(files, dict) or not isinstance(files.get("model"), str) or any(
            r not in _ROLES or not isinstance(n, str) or Path(n).name != n or n.startswith(".")
            for r, n in files.items()):
        raise CheckpointError(f"{str(cfg_file)!r} has a malformed 'files' entry {files!r} (expected "
                              "{'model': '<file>.safetensors', 'optimizer': ...}); the checkpoint is corrupted.")
    return dict(files)


def _expected_hash(config: dict, name: str, cfg_file: Path) -> str:
    hashes = config.get("sha256")
    if not isinstance(hashes, dict):
        raise CheckpointError(f"{str(cfg_file)!r} has no 'sha256' table (got {hashes!r}), so {name} cannot be "
                              "verified; the checkpoint is corrupted or was edited - restore it or re-train.")
    h = hashes.get(name)
    if not isinstance(h, str) or not _SHA.fullmatch(h):
        raise CheckpointError(f"{str(cfg_file)!r} has no valid SHA-256 for {name} (got {h!r}; expected 64 "
                              "lowercase hex digits), so it cannot be verified; restore the checkpoint or re-train.")
    return h


def _load_tensors(file: Path, expected_hash: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if sha256_file(file) != expected_hash:
        raise CheckpointError(
            f"{str(file)!r} does not match the SHA-256 recorded in config.json: the file is corrupted or "
            "was changed after saving. Restore it, or re-train (bl.windtunnel.train)."
        )
    try:
        return load_file(str(file))
    except Exception as err:  # noqa: BLE001 - safetensors raises several kinds
        raise CheckpointError(f"{str(file)!r} is not a readable safetensors file ({type(err).__name__}: {err}); "
                              "it is probably truncated - restore or re-train it.") from err


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"wind-tunnel checkpoint folder not found: {str(path)!r}. Pass the folder that "
                              "bl.windtunnel.train(out=...) wrote (it holds config.json and the .safetensors files).")
    cfg_file = path / _CONFIG
    if not cfg_file.is_file():
        raise CheckpointError(f"{str(path)!r} has no {_CONFIG}; it is not a wind-tunnel checkpoint.")
    try:
        config = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{str(cfg_file)!r} is not valid JSON ({err}); the checkpoint is corrupted.") from err
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        got = config.get("format") if isinstance(config, dict) else None
        raise CheckpointError(f"{str(cfg_file)!r} has format {got!r}, expected {FORMAT!r}; "
                              "it was not written by this version of bayes_lens.windtunnel.")
    return config


def read_checkpoint(path, *, optimizer: bool = True) -> Checkpoint:
    """Read and validate a checkpoint folder; raises :class:`CheckpointError` on any problem."""
    path = Path(path)
    config = _read_config(path)
    cfg_file = path / _CONFIG
    try:
        task = task_from_dict(config["task"])
        model_config = ModelConfig.from_dict(config["model"])
        step, seed = int(config["step"]), int(config["seed"])
    except (KeyError, TypeError, ValueError, InvalidInputError) as err:
        raise CheckpointError(f"{str(cfg_file)!r} is missing or has a bad entry ({type(err).__name__}: {err}).") from err
    names = _file_names(config, path)
    if not (path / names["model"]).is_file():
        raise CheckpointError(f"{str(path)!r} has no {names['model']}; the checkpoint is incomplete.")
    weights = _load_tensors(path / names["model"], _expected_hash(config, names["model"], cfg_file))
    _check_shapes(weights, model_config, task.d_vocab, path)
    optim = None
    if optimizer and "optimizer" in names:
        if not (path / names["optimizer"]).is_file():
            raise CheckpointError(f"{str(path)!r} has no {names['optimizer']} (named in config.json); "
                                  "the checkpoint is incomplete.")
        optim = _load_tensors(path / names["optimizer"], _expected_hash(config, names["optimizer"], cfg_file))
    return Checkpoint(task=task, model_config=model_config, train_config=dict(config.get("train") or {}),
                      step=step, seed=seed, weights=weights, optimizer=optim,
                      history=list(config.get("history") or []), extra=dict(config.get("extra") or {}), path=path)


def _check_shapes(weights: Dict[str, torch.Tensor], cfg: ModelConfig, d_vocab: int, path: Path) -> None:
    from .model import build_hf

    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_hf(cfg, d_vocab).state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(k for k in set(expected) & set(weights) if tuple(weights[k].shape) != expected[k])
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"{str(path)!r}: the weights do not fit the model described in config.json (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, wrong shape {wrong[:3]}). The checkpoint is corrupted or mixed up."
        )
    for k, v in weights.items():
        if not torch.isfinite(v).all():
            raise CheckpointError(f"{str(path)!r}: tensor {k!r} contains NaN or infinity.")
