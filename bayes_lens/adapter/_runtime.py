"""The adapter's runtime facet: devices and the per-model lock.

Part of :mod:`bayes_lens.adapter` (METHODS.md §0 "Devices"): the device inputs go to
(:func:`input_device`: the embedding's, which for a model split across devices is not the first
parameter's), the model's device (:func:`model_device`), and the lock that keeps two threads from
mixing hooks on one model (:func:`model_lock`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Optional

import torch

__all__ = [
    "model_lock",
    "weights_state",
    "model_device",
    "input_device",
]


_LOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


_LOCKS_GUARD = threading.Lock()


def model_lock(model) -> "threading.RLock":
    """The re-entrant lock that serializes bayes_lens's forward passes (and patches) on ``model``.

    Hooks in TransformerLens are global state of the model: a hook one thread adds fires on another
    thread's forward pass. Every runner and patch context of bayes_lens holds this lock for the whole
    time its hooks are attached, so two threads analysing one model take turns instead of mixing.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = threading.RLock()
            _LOCKS[model] = lock
        return lock


def weights_state(model) -> tuple:
    """Identity and in-place version (torch's ``Tensor._version``) of every parameter: it changes when weights
    are loaded or edited, so a cache keyed by it is never read for other weights."""
    try:
        return tuple((id(p), p._version) for p in model.parameters())
    except AttributeError:  # pragma: no cover - not a torch module
        return ()


def model_device(model) -> torch.device:
    """The device of the model's first parameter (CPU when it has none); where inputs go is :func:`input_device`."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(getattr(model.cfg, "device", None) or "cpu")


def _first_param_device(module) -> Optional[torch.device]:
    params = getattr(module, "parameters", None)
    if params is None:
        return None
    try:
        for p in params():
            return p.device
    except (TypeError, AttributeError):
        return None
    return None


def input_device(model) -> torch.device:
    """The device token ids and masks go to: the token embedding's.

    A model split across devices (``TransformerBridge.boot_transformers(..., n_devices=N)`` or a
    ``device_map``) has its embedding on one device and other parameters elsewhere, so the first
    parameter's device is not where inputs belong. Order: the Hugging Face model's input embeddings
    (a bridge), ``model.embed`` (both kinds), ``cfg.device`` (which TransformerLens sets to the
    embedding's device), the first parameter, the CPU.
    """
    hf = getattr(model, "original_model", None)
    get = getattr(hf, "get_input_embeddings", None)
    if callable(get):
        try:
            dev = _first_param_device(get())
        except (NotImplementedError, AttributeError):
            dev = None
        if dev is not None:
            return dev
    embed = getattr(model, "embed", None)
    dev = _first_param_device(embed) if isinstance(embed, torch.nn.Module) else None
    if dev is not None:
        return dev
    cfg_device = getattr(getattr(model, "cfg", None), "device", None)
    if cfg_device:
        return torch.device(cfg_device)
    return model_device(model)
