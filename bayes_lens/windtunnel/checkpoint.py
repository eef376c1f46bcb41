"""Wind-tunnel checkpoints: safetensors weights + a JSON config (no pickle anywhere).

A checkpoint is a folder::

    config.json            format tag, task, model shape, training config, step, seed, history,
                           SHA-256 of every .safetensors file
    model.safetensors      the Llama weights under Hugging Face names (float32)
    optimizer.safetensors  optional: AdamW moments ("<param>.exp_avg", "<param>.exp_avg_sq"),
                           present in training checkpoints so ``train(..., resume=True)`` continues
                           exactly; left out of the shipped checkpoints to keep them small

Loading checks the format tag, the hashes (a truncated or edited file is caught before use), the
tensor names and shapes; any failure raises :class:`~bayes_lens.errors.CheckpointError` saying
which file is wrong and what to do.

Example
-------
>>> import bayes_lens as bl
>>> ckpt = bl.windtunnel.read_checkpoint(bl.windtunnel.shipped_path("bijection"))   # doctest: +SKIP
>>> ckpt.step, ckpt.task                                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..errors import CheckpointError, InvalidInputError
from .model import ModelConfig
from .tasks import task_from_dict
from .._files import sha256_file

__all__ = ["Checkpoint", "write_checkpoint", "read_checkpoint", "FORMAT"]

FORMAT = "bayes_lens.windtunnel/1"
_WEIGHTS = "model.safetensors"
_OPTIM = "optimizer.safetensors"
_CONFIG = "config.json"


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
    """Write ``ckpt`` into folder ``path`` (created if needed; files replaced atomically)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hashes = {}
    files = [(_WEIGHTS, ckpt.weights)]
    if optimizer and ckpt.optimizer is not None:
        files.append((_OPTIM, ckpt.optimizer))
    elif (path / _OPTIM).exists():
        (path / _OPTIM).unlink()
    for name, tensors in files:
        tmp = path / (name + ".tmp")
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp),
                  metadata={"format": FORMAT})
        os.replace(tmp, path / name)
        hashes[name] = sha256_file(path / name)
    config = {
        "format": FORMAT,
        "task": ckpt.task.to_dict(),
        "model": ckpt.model_config.to_dict(),
        "train": ckpt.train_config,
        "step": int(ckpt.step),
        "seed": int(ckpt.seed),
        "sha256": hashes,
        "history": ckpt.history,
        "extra": ckpt.extra,
    }
    tmp = path / (_CONFIG + ".tmp")
    tmp.write_text(json.dumps(config, indent=1))
    os.replace(tmp, path / _CONFIG)
    ckpt.path = path
    return path


def _load_tensors(file: Path, expected_hash: Optional[str]) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if expected_hash is not None and sha256_file(file) != expected_hash:
        raise CheckpointError(
            f"{str(file)!r} does not match the SHA-256 recorded in config.json: the file is corrupted or "
            "was changed after saving. Restore it, or re-train (bl.windtunnel.train)."
        )
    try:
        return load_file(str(file))
    except Exception as err:  # noqa: BLE001 - safetensors raises several kinds
        raise CheckpointError(f"{str(file)!r} is not a readable safetensors file ({type(err).__name__}: {err}); "
                              "it is probably truncated - restore or re-train it.") from err


def read_checkpoint(path, *, optimizer: bool = True) -> Checkpoint:
    """Read and validate a checkpoint folder; raises :class:`CheckpointError` on any problem."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"wind-tunnel checkpoint folder not found: {str(path)!r}. Pass the folder that "
                              "bl.windtunnel.train(out=...) wrote (it holds config.json and model.safetensors).")
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
    try:
        task = task_from_dict(config["task"])
        model_config = ModelConfig.from_dict(config["model"])
        step, seed = int(config["step"]), int(config["seed"])
    except (KeyError, TypeError, ValueError, InvalidInputError) as err:
        raise CheckpointError(f"{str(cfg_file)!r} is missing or has a bad entry ({type(err).__name__}: {err}).") from err
    hashes = config.get("sha256") or {}
    if not (path / _WEIGHTS).is_file():
        raise CheckpointError(f"{str(path)!r} has no {_WEIGHTS}; the checkpoint is incomplete.")
    weights = _load_tensors(path / _WEIGHTS, hashes.get(_WEIGHTS))
    _check_shapes(weights, model_config, task.d_vocab, path)
    optim = None
    if optimizer and (path / _OPTIM).is_file():
        optim = _load_tensors(path / _OPTIM, hashes.get(_OPTIM))
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
