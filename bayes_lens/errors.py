"""Errors raised by bayes_lens.

Every error the library raises on purpose is a :class:`BayesLensError`; the subclasses say which
kind of input was wrong. Messages follow one rule: say what was wrong, what was expected, and how
to fix it (the einops / equinox convention of a single library error type with specific subclasses).

Example
-------
>>> import bayes_lens as bl
>>> try:
...     bl.load_gguf("missing.gguf")
... except bl.BayesLensError as err:
...     print(type(err).__name__)
ModelLoadError
"""

from __future__ import annotations

__all__ = [
    "BayesLensError",
    "ModelLoadError",
    "MissingHookError",
    "InvalidInputError",
    "LayerIndexError",
    "NonFiniteError",
    "TokenizationError",
    "CheckpointError",
    "MissingExtraError",
    "LockTimeoutError",
    "UnsupportedModelError",
    "WriteError",
    "NotFittedError",
    "NotAllowedError",
]


class BayesLensError(Exception):
    """Base class of every error bayes_lens raises on purpose."""


class ModelLoadError(BayesLensError):
    """A model file or package could not be loaded (missing, truncated, unsupported, not installed)."""


class MissingHookError(BayesLensError):
    """A model or an ActivationCache lacks a hook point that a metric needs."""


class InvalidInputError(BayesLensError, ValueError):
    """An argument has the wrong value, type or shape (empty prompt list, bad probability, ...)."""


class UnsupportedModelError(InvalidInputError):
    """A TransformerLens model set up in a way bayes_lens cannot run correctly (a ``HookedTransformer``
    split with ``n_devices > 1``); the message names the supported route."""


class LayerIndexError(InvalidInputError, IndexError):
    """A layer index is out of range for the model."""


class NonFiniteError(BayesLensError, ValueError):
    """Activations, weights or a fitted direction contain NaN or infinity."""


class TokenizationError(InvalidInputError):
    """A string that must be one token is not, or a prompt does not fit the model's context."""


class CheckpointError(BayesLensError):
    """A saved axis or wind-tunnel checkpoint is missing, corrupted or does not fit the model."""


class LockTimeoutError(BayesLensError, TimeoutError):
    """Another process held the lock of an output folder (a report being committed) for too long."""


class WriteError(BayesLensError, OSError):
    """A file or folder could not be written (disk full, read-only file system, no permission, a file
    where a folder should be); nothing partial was left in place of the file."""


class NotAllowedError(BayesLensError):
    """A file (a shard plan, a read spec) names code - a model loader or a read class - that this process
    was not allowed to import and run; the message says how to allow it (:mod:`bayes_lens._allow`)."""


class MissingExtraError(BayesLensError, ImportError):
    """An optional dependency (an *extra*) is not installed; the message gives the pip command."""


def require_extra(module: str, extra: str):
    """Import an optional dependency or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            f"{module!r} is not installed; it comes with the {extra!r} extra: "
            f"pip install 'bayes-lens[{extra}]' (or pip install {module})"
        ) from err


def __getattr__(name: str):
    """``NotFittedError`` is made on first use: its scikit-learn base costs a second to import, which
    ``bayes-lens --help`` (it imports this module) must not pay."""
    if name == "NotFittedError":
        import threading

        with globals().setdefault("_NOT_FITTED_LOCK", threading.Lock()):  # one class, even under threads
            if name not in globals():
                globals()[name] = _not_fitted_error()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _not_fitted_error():
    bases = (InvalidInputError,)
    try:  # scikit-learn is a dependency (EntropyAxis is its estimator); this module stays importable without it
        from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

        bases += (_SklearnNotFittedError,)
    except ImportError:  # pragma: no cover - depends on the environment
        pass

    class NotFittedError(*bases):
        """An estimator (``EntropyAxis``) was used before ``fit``. It is also scikit-learn's
        ``sklearn.exceptions.NotFittedError`` (so a ``ValueError`` and an ``AttributeError``): code that
        catches that one for any estimator catches this too."""

    NotFittedError.__qualname__ = "NotFittedError"
    return NotFittedError
