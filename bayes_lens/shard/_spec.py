"""What a worker needs to rebuild the model: a :class:`ModelSpec`, and a fingerprint to check it did.

A worker process (a torchrun rank, a SLURM array task, a Ray actor) cannot be handed a model object;
it gets a JSON-serializable :class:`ModelSpec` - ``"default"`` or a ``.gguf`` / Hugging Face folder
path (built with :func:`bayes_lens.load_model`), or ``"package.module:function"`` (an import path of a
loader function) - plus keyword arguments, and calls :meth:`ModelSpec.load`.

A spec read from a file (:meth:`ModelSpec.from_dict`, as a worker reads ``plan.json``) is data: its
loader is imported and called only when this process allows it (:mod:`bayes_lens._allow`: bayes_lens's
and TransformerLens's own loaders, :func:`allow_loader`, ``bayes-lens shard run --allow-loader``,
``BAYES_LENS_ALLOW_LOADERS``), checked on the string before anything is imported
(:class:`~bayes_lens.errors.NotAllowedError` otherwise). A spec built in Python (``ModelSpec(...)``) is
the launcher's own, so building one allows its loader in this process.

:func:`model_fingerprint` says whether two workers built the same model (a merge of shards from
different models would be silently wrong): a
SHA-256 over the model's shape facts (:func:`bayes_lens.adapter.model_info`), its tokenizer (size and
the ids of a probe string), every parameter's name and shape, and 16 evenly spaced weight samples per
parameter. Samples are rounded to bfloat16 before hashing and parameter dtypes are left out, so the
same weights loaded in float32 or bfloat16 give the same fingerprint (the merge warns about mixed
dtypes instead of refusing); different weights, shapes or tokenizers give a different one.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import inspect
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Dict

import torch

from .._allow import allow_loader, allow_read, check_loader
from ..errors import InvalidInputError, ModelLoadError

__all__ = ["ModelSpec", "model_fingerprint", "model_device_dtype", "allow_loader", "allow_read", "as_data"]

# set while a spec is built from data (a plan file, a dict handed to a worker): such a spec allows nothing
_FROM_DATA = contextvars.ContextVar("bayes_lens_spec_from_data", default=False)


@contextmanager
def as_data():
    """Inside the block, ``ModelSpec(...)`` does not allow its loader (the spec comes from a file, not from you)."""
    token = _FROM_DATA.set(True)
    try:
        yield
    finally:
        _FROM_DATA.reset(token)

_PROBE = "The cat sat on the mat. 0 1 2 3 dax: é ∑"
_SAMPLES = 16


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model: ``loader`` is ``"default"``, a model path, or ``"package.module:function"``.

    ``kwargs`` go to :func:`bayes_lens.load_model` (e.g. ``{"kind": "bridge", "device": "cuda"}``)
    or to the loader function; they must be JSON-serializable.

    Example
    -------
    >>> spec = ModelSpec("bayes_lens.models.tiny:tiny_model", {"kind": "hooked", "seed": 1})
    >>> ModelSpec.from_dict(spec.to_dict()) == spec
    True
    """

    loader: str = "default"
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.loader, str) or not self.loader:
            raise InvalidInputError(f"ModelSpec.loader must be 'default', a model path or 'package.module:function', "
                                    f"got {self.loader!r}.")
        if not isinstance(self.kwargs, dict):
            raise InvalidInputError(f"ModelSpec.kwargs must be a dict, got {type(self.kwargs).__name__}.")
        try:
            json.dumps(self.kwargs, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise InvalidInputError(f"ModelSpec.kwargs must be JSON-serializable (a worker rebuilds the model from "
                                    f"them): {err}.") from None
        if ":" in self.loader and not _FROM_DATA.get():  # the launcher's own spec: its loader may run here
            allow_loader(self.loader)

    def __hash__(self):
        return hash((self.loader, json.dumps(self.kwargs, sort_keys=True)))

    def to_dict(self) -> Dict[str, Any]:
        return {"loader": self.loader, "kwargs": json.loads(json.dumps(self.kwargs, sort_keys=True))}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelSpec":
        """The spec a dict describes (as read from ``plan.json``); its loader runs only where it is allowed."""
        if not isinstance(d, dict) or "loader" not in d:
            raise InvalidInputError(f"a model spec is a dict with 'loader' (and 'kwargs'), got {d!r}.")
        kwargs = d.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise InvalidInputError(f"a model spec's 'kwargs' must be a JSON object, got {kwargs!r}.")
        with as_data():
            return cls(loader=d["loader"], kwargs=dict(kwargs))

    def is_import_path(self) -> bool:
        """True for ``"package.module:function"`` (not an existing file or folder)."""
        return ":" in self.loader and not os.path.exists(self.loader)

    def load(self):
        """Build the model in this process (keyword arguments the loader does not take are refused first).

        An import path runs only if this process allows it (see the module doc): otherwise
        :class:`~bayes_lens.errors.NotAllowedError`, before its module is imported."""
        if not self.is_import_path():
            from ..models import load_model

            self._check_kwargs(load_model, f"bl.load_model (ModelSpec {self.loader!r})", skip=("name",))
            return load_model(self.loader, **self.kwargs)
        check_loader(self.loader, self.kwargs)  # on the string: nothing of it is imported before this
        module_name, _, fn_name = self.loader.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ModelLoadError(f"cannot import the loader module {module_name!r} of ModelSpec {self.loader!r}: "
                                 f"{err}. Is it on PYTHONPATH in every worker?") from err
        fn = module
        for part in fn_name.split("."):
            fn = getattr(fn, part, None)
            if fn is None:
                raise ModelLoadError(f"module {module_name!r} has no {fn_name!r} (ModelSpec {self.loader!r}).")
        if not callable(fn):
            raise ModelLoadError(f"ModelSpec loader {self.loader!r} is not callable.")
        self._check_kwargs(fn, f"the loader {self.loader!r}")
        return fn(**self.kwargs)

    def _check_kwargs(self, fn, what: str, skip=()) -> None:
        """InvalidInputError naming the keywords ``fn`` does not take (not a TypeError from inside it)."""
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin or C function: nothing to check against
            return
        params = [p for p in sig.parameters.values() if p.name not in skip]
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return
        named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(set(self.kwargs) - set(named))
        if unknown:
            raise InvalidInputError(f"ModelSpec kwargs {unknown} are not parameters of {what}, which takes "
                                    f"{named}; fix the spec's kwargs (CLI: --model-kwargs).")
        missing = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                 p.KEYWORD_ONLY)
                   and p.name not in self.kwargs]
        if missing:
            raise InvalidInputError(f"{what} needs {missing}, which the ModelSpec kwargs {sorted(self.kwargs)} do "
                                    "not give; add them to the spec's kwargs (CLI: --model-kwargs).")


def model_device_dtype(model) -> tuple:
    """(device, dtype) of the model's first parameter, as strings ("cpu", "float32")."""
    for p in model.parameters():
        return str(p.device), str(p.dtype).replace("torch.", "")
    return "cpu", "float32"


def model_fingerprint(model) -> str:
    """SHA-256 (hex) identifying the model's weights, shapes, config and tokenizer (see the module doc)."""
    from .. import adapter

    info = asdict(adapter.model_info(model))
    h = hashlib.sha256()
    h.update(json.dumps(info, sort_keys=True).encode())
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        try:
            ids = list(tok.encode(_PROBE))
        except Exception:  # noqa: BLE001 - a tokenizer without encode still fingerprints by size
            ids = []
        h.update(json.dumps({"vocab": len(tok), "probe": ids}).encode())
    with torch.inference_mode():
        for name, p in model.named_parameters():
            h.update(f"{name}:{list(p.shape)};".encode())
            if p.device.type == "meta" or p.numel() == 0:
                continue
            flat = p.detach().reshape(-1)
            k = min(_SAMPLES, flat.numel())  # integer spacing: float linspace overruns 2^24+ elements
            idx = torch.arange(k, dtype=torch.long) * (flat.numel() - 1) // max(k - 1, 1)
            sample = flat[idx.to(flat.device)].to("cpu", torch.float32).to(torch.bfloat16).to(torch.float32)
            h.update(sample.numpy().tobytes())
    return h.hexdigest()
