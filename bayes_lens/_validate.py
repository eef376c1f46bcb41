"""Shared argument validators: one place that turns bad input into a clear BayesLensError.

Every public function of the library checks its arguments at entry, *before any work* (no model
load, no entropy pass), with these functions. Each returns the normalized value (a plain ``int``,
a ``list`` of prompts, a device string, a ``Path``) or raises
:class:`~bayes_lens.errors.InvalidInputError` (or the subclass passed as ``error=``) whose message
says what was wrong, what was expected and how to fix it, e.g.::

    seed must be a non-negative integer such as 0, got '0' (str); pass seed=0.

Rules (the argument conventions of NumPy/scikit-learn's ``check_random_state``/``check_scalar``,
made strict): ``bool`` is never an integer; a float is never an integer (``2.5`` and ``2.0`` are
rejected: counts are counted); NumPy integer scalars are accepted; ``None`` is only accepted where
the signature documents it (``allow_none=True``); strings are never split into characters; a
generator of prompts is materialized once, not read as empty.

Example
-------
>>> from bayes_lens._validate import check_seed, check_positive_int, check_choice
>>> check_seed(3)
3
>>> check_positive_int(200, "n_boot")
200
>>> check_choice("v", "site", ("q", "k", "v"))
'v'
>>> check_seed(-1)
Traceback (most recent call last):
...
bayes_lens.errors.InvalidInputError: seed must be a non-negative integer such as 0, got -1 (int); pass seed=0 or another integer >= 0.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence, Type

from .errors import InvalidInputError, TokenizationError

__all__ = [
    "MAX_SEED",
    "describe",
    "check_seed",
    "check_int",
    "check_positive_int",
    "check_nonneg_int",
    "check_float",
    "check_probability",
    "check_bool",
    "check_choice",
    "check_choices",
    "check_names",
    "check_prompts",
    "check_device",
    "check_path",
    "check_output_dir",
    
    "check_mapping",
    "COUNT_RULES",
    "POSITIONS",
    "check_count",
    "check_positions",
]

#: Largest accepted seed (torch.manual_seed takes < 2**64; NumPy any non-negative int).
MAX_SEED = 2**63 - 1

ErrorType = Type[Exception]

#: One rule per parameter name: the least value each named count accepts, the same in every function
#: that takes it (``n_boot`` was once ``>= 0`` in one module, ``>= 1`` in another and ``>= 10`` in
#: a third). Check these with :func:`check_count`, never with a hand-written ``< 1`` test.
#:
#: ============== ===== ==========================================================================
#: name           min   meaning
#: ============== ===== ==========================================================================
#: n_boot         1     bootstrap resamples; ``0`` only where a function documents it as "no
#:                      bootstrap" (the martingale diagnostics) via ``allow_zero=True``
#: n_perm         1     permutations of a permutation test
#: n_null         1     draws of a null distribution
#: n_random_seeds 0     random-axis controls (0: none)
#: batch_size     1     prompts per forward pass
#: n_bins         1     calibration bins
#: n_per_k        1     prompts per number of examples k
#: folds          2     cross-fitting folds K (each fold's rows scored by a fit on the others)
#: n_random       1     Haar-random subspaces drawn for a random band
#: n_shards       1     shards of a plan
#: n_replicas     1     Ray actors
#: tail_positions 0     final positions kept per prompt (0: none)
#: skip_first     0     leading positions a Jacobian-lens fit leaves out (0: none)
#: dim_batch      1     output dimensions per backward pass of a Jacobian-lens fit
#: n_candidates   1     screen neurons a confidence analysis ablates
#: n_random_neurons 0   random neurons of a confidence analysis's band (0: none)
#: n_random_axes  0     random directions removed beside the entropy axis (0: none)
#: reseeds        0     reruns of a localize test with other seeds (0: one seed)
#: ============== ===== ==========================================================================
COUNT_RULES = {
    "n_boot": 1,
    "n_perm": 1,
    "n_null": 1,
    "n_random_seeds": 0,
    "batch_size": 1,
    "rows": 1,
    "n_bins": 1,
    "n_per_k": 1,
    "n_shards": 1,
    "n_replicas": 1,
    "tail_positions": 0,
    "folds": 2,
    "n_random": 1,
    "skip_first": 0,
    "dim_batch": 1,
    "n_candidates": 1,
    "n_random_neurons": 0,
    "n_random_axes": 0,
    "reseeds": 0,
}

#: The query positions an attention-entropy reading averages over: the final real token or every one.
POSITIONS = ("last", "all")


def describe(value: Any) -> str:
    """``repr`` (shortened) plus the type name, for messages: ``'0' (str)``, ``2.5 (float)``."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: Any, name: str, *, min: Optional[int] = None, max: Optional[int] = None,
              allow_none: bool = False, error: ErrorType = InvalidInputError) -> Optional[int]:
    """An integer in ``[min, max]`` (bounds optional); returns a plain ``int``.

    ``bool``, floats (even ``2.0``), strings (even ``'3'``) and ``None`` (unless ``allow_none``) are errors.
    """
    if value is None and allow_none:
        return None
    if min is not None and max is not None:
        want = f"an integer in [{min}, {max}]"
    elif min is not None:
        want = {0: "a non-negative integer", 1: "a positive integer"}.get(min, f"an integer >= {min}")
    elif max is not None:
        want = f"an integer <= {max}"
    else:
        want = "an integer"
    if not _is_int(value):
        hint = ""
        if isinstance(value, float) and math.isfinite(value):
            hint = f" (a count cannot be fractional; pass {name}={int(round(value))})" \
                if value == round(value) else f" (a count cannot be fractional; round it, e.g. {name}={round(value)})"
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            hint = f" (a string; pass the number itself: {name}={int(value)})"
        raise error(f"{name} must be {want}, got {describe(value)}{hint}.")
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise error(f"{name} must be {want}, got {value}.")
    return value


def check_positive_int(value: Any, name: str, *, min: int = 1, max: Optional[int] = None,
                       allow_none: bool = False, error: ErrorType = InvalidInputError) -> Optional[int]:
    """An integer ``>= min`` (default 1): counts such as ``n``, ``n_boot``, ``n_perm``, ``batch_size``."""
    return check_int(value, name, min=min, max=max, allow_none=allow_none, error=error)


def check_nonneg_int(value: Any, name: str, *, max: Optional[int] = None, allow_none: bool = False,
                     error: ErrorType = InvalidInputError) -> Optional[int]:
    """An integer ``>= 0`` (an index, an offset)."""
    return check_int(value, name, min=0, max=max, allow_none=allow_none, error=error)


def check_count(value: Any, name: str, *, allow_zero: bool = False, allow_none: bool = False,
                error: ErrorType = InvalidInputError) -> Optional[int]:
    """A count named in :data:`COUNT_RULES`, checked by that one rule (``allow_zero``: ``0`` also
    accepted, for a function that documents ``0`` as "switched off"); returns a plain ``int``."""
    if name not in COUNT_RULES:
        raise KeyError(f"no count rule for {name!r}; add it to bayes_lens._validate.COUNT_RULES")
    least = 0 if allow_zero else COUNT_RULES[name]
    return check_int(value, name, min=least, allow_none=allow_none, error=error)


def check_positions(value: Any, name: str = "positions", *, error: ErrorType = InvalidInputError) -> str:
    """``"last"`` or ``"all"`` (:data:`POSITIONS`): which query rows an attention entropy averages."""
    return check_choice(value, name, POSITIONS, error=error)


def check_seed(seed: Any, name: str = "seed", *, allow_none: bool = False,
               error: ErrorType = InvalidInputError) -> Optional[int]:
    """A seed: an integer in ``[0, MAX_SEED]``. ``None``, ``'0'``, ``-1``, ``1.5``, ``True`` are errors.

    ``None`` is refused by default because a seed of ``None`` silently means "not reproducible";
    pass ``allow_none=True`` only where that is documented.
    """
    if seed is None and allow_none:
        return None
    if not _is_int(seed) or not 0 <= int(seed) <= MAX_SEED:
        extra = " (None would make the result non-deterministic)" if seed is None else ""
        raise error(f"{name} must be a non-negative integer such as 0, got {describe(seed)}{extra}; "
                    f"pass {name}=0 or another integer >= 0.")
    return int(seed)


def check_float(value: Any, name: str, *, min: Optional[float] = None, max: Optional[float] = None,
                min_inclusive: bool = True, max_inclusive: bool = True, allow_none: bool = False,
                error: ErrorType = InvalidInputError) -> Optional[float]:
    """A finite real number in the given range (``bool`` and strings are errors); returns a ``float``."""
    if value is None and allow_none:
        return None
    lo = "" if min is None else f"{'[' if min_inclusive else '('}{min:g}"
    hi = "" if max is None else f"{max:g}{']' if max_inclusive else ')'}"
    want = f"a finite number in {lo or '(-inf'}, {hi or 'inf)'}" if (min is not None or max is not None) \
        else "a finite number"
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise error(f"{name} must be {want}, got {describe(value)}.")
    value = float(value)
    if not math.isfinite(value):
        raise error(f"{name} must be {want}, got {value}.")
    if min is not None and (value < min or (value == min and not min_inclusive)):
        raise error(f"{name} must be {want}, got {value:g}.")
    if max is not None and (value > max or (value == max and not max_inclusive)):
        raise error(f"{name} must be {want}, got {value:g}.")
    return value


def check_probability(value: Any, name: str, *, open_interval: bool = False,
                      error: ErrorType = InvalidInputError) -> float:
    """A probability in ``[0, 1]`` (or ``(0, 1)`` with ``open_interval=True``)."""
    return check_float(value, name, min=0.0, max=1.0, min_inclusive=not open_interval,
                       max_inclusive=not open_interval, error=error)


def check_bool(value: Any, name: str, *, error: ErrorType = InvalidInputError) -> bool:
    """``True`` or ``False`` (NumPy booleans too); ``'yes'``, ``1``, ``None`` are errors."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be True or False, got {describe(value)}.")
    return bool(value)


def check_choice(value: Any, name: str, choices: Sequence[Any], *, error: ErrorType = InvalidInputError) -> Any:
    """One of ``choices`` (compared with ``==``; a list or set is never "one of" string choices)."""
    choices = list(choices)
    if all(isinstance(c, str) for c in choices) and not isinstance(value, str):
        single = ""
        if isinstance(value, (list, tuple)) and len(value) == 1 and value[0] in choices:
            single = f" (pass {name}={value[0]!r}, a single string, not a list)"
        raise error(f"{name} must be one of {choices}, got {describe(value)}{single}.")
    try:
        ok = value in choices
    except TypeError:
        ok = False
    if not ok:
        raise error(f"{name} must be one of {choices}, got {value!r}.")
    return value


def check_names(values: Any, name: str, *, allow_empty: bool = False,
                error: ErrorType = InvalidInputError) -> List[str]:
    """A list of strings. One string is one name (``"geometry"`` -> ``["geometry"]``), never its characters."""
    if isinstance(values, str):
        return [values]
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise error(f"{name} must be a string or a list of strings, got {describe(values)}.")
    out = list(values)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise error(f"{name} must hold strings only, got {describe(bad[0])} among {out!r}.")
    if not out and not allow_empty:
        raise error(f"{name} is empty; pass at least one name.")
    return out


def check_choices(values: Any, name: str, choices: Sequence[str], *, allow_empty: bool = False,
                  error: ErrorType = InvalidInputError) -> List[str]:
    """:func:`check_names`, each of which must be one of ``choices`` (order kept, duplicates refused)."""
    out = check_names(values, name, allow_empty=allow_empty, error=error)
    unknown = [v for v in out if v not in choices]
    if unknown:
        raise error(f"unknown {name} {unknown}; choose from {list(choices)}.")
    dup = sorted({v for v in out if out.count(v) > 1})
    if dup:
        raise error(f"{name} lists {dup} more than once; name each once.")
    return out


def check_prompts(prompts: Any, name: str = "prompts", *, allow_empty: bool = False,
                  error: ErrorType = InvalidInputError) -> List[str]:
    """A non-empty list of non-empty strings; a generator or tuple is materialized once.

    A single string is refused (it would be read as a list of characters); a lone UTF-16 surrogate
    (``"\\ud800"``, which no tokenizer can encode) raises :class:`~bayes_lens.errors.TokenizationError`.
    """
    if isinstance(prompts, str):
        raise error(f"{name} must be a list of strings, got a single string {describe(prompts)}; "
                    f"wrap it in a list: [{prompts[:30]!r}].")
    if isinstance(prompts, (bytes, dict)) or not isinstance(prompts, Iterable):
        raise error(f"{name} must be a list of strings, got {describe(prompts)}.")
    out = list(prompts)
    if not out and not allow_empty:
        raise error(f"{name} is empty; pass at least one prompt (a generator can be read only once - "
                    "pass a list).")
    for i, p in enumerate(out):
        if not isinstance(p, str):
            raise error(f"{name}[{i}] must be a string, got {describe(p)}.")
        if not p:
            raise error(f"{name}[{i}] is an empty string; every prompt needs at least one character.")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as err:
            raise TokenizationError(
                f"{name}[{i}] holds a lone surrogate {p[err.start]!r} at character {err.start}, which is not "
                "valid text and cannot be tokenized; remove it (e.g. s.encode('utf-8', 'replace').decode())."
            ) from None
    return out


def check_device(device: Any, name: str = "device", *, allow_none: bool = True,
                 error: ErrorType = InvalidInputError) -> Optional[str]:
    """A torch device that exists here: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"auto"`` or a ``torch.device``.

    Returns its normalized string (``None`` stays ``None``: the default device; ``"auto"`` becomes
    ``"cuda"`` when a CUDA GPU is visible, else ``"cpu"``: the command line's default). A nonsense string, a
    CUDA device on a CPU-only torch (or one past ``torch.cuda.device_count()``) and an unavailable MPS
    are errors.
    """
    if device is None and allow_none:
        return None
    import torch

    if not isinstance(device, (str, torch.device)) or isinstance(device, bool):
        raise error(f"{name} must be a device string such as 'cpu' or 'cuda' (or a torch.device), got "
                    f"{describe(device)}.")
    if isinstance(device, str) and device.strip().lower() == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise error(f"{name}={device!r} is not a torch device; use 'auto', 'cpu', 'cuda', 'cuda:0' or 'mps'.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise error(f"{name}={device!r} asks for a CUDA GPU, but {why}; use {name}='cpu' "
                        "(or install a CUDA build of torch on a machine with a GPU).")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise error(f"{name}={device!r}: there are only {torch.cuda.device_count()} CUDA device(s) "
                        f"(indices 0..{torch.cuda.device_count() - 1}).")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise error(f"{name}={device!r} asks for Apple MPS, which is not available here; use {name}='cpu'.")
    elif dev.type == "meta":
        raise error(f"{name}='meta' holds no data and cannot run a model; use 'cpu' or 'cuda'.")
    elif dev.type != "cpu":
        raise error(f"{name}={device!r}: bayes_lens runs on 'cpu', 'cuda' or 'mps', not {dev.type!r}.")
    return str(dev)


def check_path(path: Any, name: str, *, kind: str = "any", must_exist: bool = False,
               error: ErrorType = InvalidInputError) -> Path:
    """A file-system path (``str`` or ``os.PathLike``, not empty); ``kind`` is ``"file"``, ``"dir"`` or ``"any"``.

    With ``must_exist`` the path must exist (and be of ``kind``); otherwise an existing path must
    still be of ``kind`` (a file where a folder is wanted is an error).
    """
    if kind not in ("any", "file", "dir"):
        raise ValueError(f"kind must be 'any', 'file' or 'dir', got {kind!r}")
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise error(f"{name} must be a path (a string or pathlib.Path), got {describe(path)}.")
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise error(f"{name} is an empty path; pass a file or folder name.")
    p = Path(text).expanduser()
    what = {"file": "a file", "dir": "a folder", "any": "a file or folder"}[kind]
    if must_exist and not p.exists():
        raise error(f"{name} {str(p)!r} does not exist; pass an existing {what[2:]}.")
    if p.exists():
        if kind == "file" and not p.is_file():
            raise error(f"{name} {str(p)!r} is not a file (it is a folder); pass {what}.")
        if kind == "dir" and not p.is_dir():
            raise error(f"{name} {str(p)!r} exists and is not a folder; pass a folder (or a new name).")
    return p


def check_output_dir(path: Any, name: str = "out", *, error: ErrorType = InvalidInputError) -> Path:
    """An output folder: an existing folder, or a new path whose nearest existing parent is a writable folder.

    Nothing is created. A file (or a path *below* a file) is an error.
    """
    p = check_path(path, name, kind="dir", error=error)
    parent = p
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise error(f"{name} {str(p)!r} cannot be created: {str(parent)!r} is a file, not a folder; "
                    "pass another folder.")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{name} {str(p)!r} is not writable ({str(parent)!r} does not allow writing); "
                    "pass a folder you can write to.")
    return p


def check_mapping(value: Any, name: str, *, allow_none: bool = True,
                  error: ErrorType = InvalidInputError) -> dict:
    """A ``dict`` with string keys (``None`` -> ``{}`` when allowed)."""
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        raise error(f"{name} must be a dict, got {describe(value)}.")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise error(f"{name} keys must be strings, got {describe(bad[0])}.")
    return dict(value)


