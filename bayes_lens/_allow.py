"""What a worker may import and call: the allow-lists of model loaders and read classes.

A shard folder is data, never code. ``plan.json`` names a model loader (``"package.module:function"``
with JSON keyword arguments) and may name read classes (``"package.module:Class"``); anyone who can
write the folder can change those strings and recompute the plan's SHA-256, so a worker
(``bayes-lens shard run DIR``, every torchrun / srun rank started on it) imports and calls only names
that the *launching user* allowed, checked on the string before anything is imported:

* loaders: bayes_lens's own (:data:`BUILTIN_LOADERS`, and ``"default"`` or a model path, which
  :func:`bayes_lens.load_model` opens) and TransformerLens's own (``HookedTransformer.from_pretrained``,
  ``TransformerBridge.boot_transformers``; with ``trust_remote_code`` only when allowed by name);
  every :class:`~bayes_lens.shard.ModelSpec` built in Python in this process (the launcher's own spec);
  :func:`allow_loader`; ``bayes-lens shard run DIR --allow-loader pkg.mod:fn``; the environment
  variable ``BAYES_LENS_ALLOW_LOADERS`` (comma-separated), which the processes a launcher starts inherit;
* read classes: every :class:`~bayes_lens.reads.Read` subclass whose class statement has run in this
  process (bayes_lens's own, and yours once its module is imported); :func:`allow_read`;
  ``--allow-read pkg.mod:Class``; ``BAYES_LENS_ALLOW_READS``.

Anything else is refused with :class:`~bayes_lens.errors.NotAllowedError` before its module is
imported (so no import-time code of it runs).

Example
-------
>>> from bayes_lens._allow import allow_loader, check_loader
>>> allow_loader("mypkg.models:load")
>>> check_loader("mypkg.models:load", {})
>>> check_loader("subprocess:getoutput", {"cmd": "id"})
Traceback (most recent call last):
...
bayes_lens.errors.NotAllowedError: the model loader 'subprocess:getoutput' is not allowed ...
"""

from __future__ import annotations

import os
import threading
from typing import Iterable, Mapping, Set

from .errors import InvalidInputError, NotAllowedError

__all__ = ["BUILTIN_LOADERS", "LOADERS_ENV", "READS_ENV", "allow_loader", "allow_read", "allowed_loaders",
           "allowed_reads", "check_loader", "check_read", "user_allowed_loaders"]

LOADERS_ENV = "BAYES_LENS_ALLOW_LOADERS"
READS_ENV = "BAYES_LENS_ALLOW_READS"

#: bayes_lens's and TransformerLens's own model loaders, allowed in every worker
BUILTIN_LOADERS = frozenset({
    "bayes_lens:load_model", "bayes_lens.models:load_model",
    "bayes_lens:load_gguf", "bayes_lens.models:load_gguf", "bayes_lens.models.gguf:load_gguf",
    "bayes_lens.models.tiny:tiny_model", "bayes_lens.models.tiny:planted_model",
    "transformer_lens:HookedTransformer.from_pretrained",
    "transformer_lens:HookedTransformer.from_pretrained_no_processing",
    "transformer_lens.HookedTransformer:HookedTransformer.from_pretrained",
    "transformer_lens.HookedTransformer:HookedTransformer.from_pretrained_no_processing",
    "transformer_lens:TransformerBridge.boot_transformers",
    "transformer_lens.model_bridge:TransformerBridge.boot_transformers",
    "transformer_lens.model_bridge.bridge:TransformerBridge.boot_transformers",
})
# keyword arguments that make a built-in loader run code it downloads: only for a loader allowed by name
_CODE_KWARGS = ("trust_remote_code",)

_LOCK = threading.Lock()
_LOADERS: Set[str] = set()
_READS: Set[str] = set()


def _names(names: Iterable[str], what: str, example: str) -> list:
    out = []
    for name in names:
        module, _, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
        if not module or not qualname or any(c.isspace() for c in name):
            raise InvalidInputError(f"an allowed {what} is written 'package.module:{example}' (no spaces), got "
                                    f"{name!r}.")
        out.append(name)
    return out


def allow_loader(*names: str) -> None:
    """Let this process (a worker) import and call the model loaders ``names`` (``"package.module:function"``)."""
    checked = _names(names, "loader", "function")
    with _LOCK:
        _LOADERS.update(checked)


def allow_read(*names: str) -> None:
    """Let this process rebuild the read classes ``names`` (``"package.module:Class"``) from a read spec."""
    checked = _names(names, "read class", "Class")
    with _LOCK:
        _READS.update(checked)


def _env(var: str) -> Set[str]:
    return {n.strip() for n in os.environ.get(var, "").split(",") if n.strip()}


def allowed_loaders() -> frozenset:
    """Every loader this process may call now: built-in, registered and in ``BAYES_LENS_ALLOW_LOADERS``."""
    with _LOCK:
        return frozenset(BUILTIN_LOADERS | _LOADERS | _env(LOADERS_ENV))


def allowed_reads() -> frozenset:
    """Every read class this process may rebuild now: the registered ones and ``BAYES_LENS_ALLOW_READS``."""
    with _LOCK:
        return frozenset(_READS | _env(READS_ENV))


def user_allowed_loaders() -> frozenset:
    """The loaders allowed beyond the built-in ones (what an engine hands to the workers it starts)."""
    with _LOCK:
        return frozenset(_LOADERS | _env(LOADERS_ENV))


def check_loader(name: str, kwargs: Mapping) -> None:
    """Refuse (:class:`NotAllowedError`) a loader this process was not told it may call, before any import."""
    with _LOCK:
        named = name in _LOADERS or name in _env(LOADERS_ENV)
    if named:
        return
    if name in BUILTIN_LOADERS:
        risky = [k for k in _CODE_KWARGS if kwargs.get(k)]
        if not risky:
            return
        raise NotAllowedError(
            f"the model spec asks the built-in loader {name!r} for {risky[0]}=True, which runs code downloaded with "
            f"the model; a worker does that only for a loader its launcher allowed by name: bayes-lens shard run DIR "
            f"--allow-loader {name} (or {LOADERS_ENV}={name}, or bl.shard.allow_loader({name!r})).")
    raise NotAllowedError(
        f"the model loader {name!r} is not allowed in this worker: a shard folder is data, and a worker imports and "
        f"calls only bayes_lens's and TransformerLens's own loaders and the ones its launcher names. If you wrote this "
        f"plan and trust {name!r}, allow it: bayes-lens shard run DIR --allow-loader {name} (or set "
        f"{LOADERS_ENV}={name} for the workers, or call bl.shard.allow_loader({name!r}) first).")


def check_read(name: str) -> None:
    """Refuse (:class:`NotAllowedError`) a read class this process was not told it may rebuild, before any import."""
    if name in allowed_reads():
        return
    raise NotAllowedError(
        f"the read class {name!r} is not allowed in this worker: a read spec is data, and a worker imports only the "
        f"Read subclasses already defined in it (bayes_lens's own, and those of modules it imported) and the ones its "
        f"launcher names. If you trust {name!r}, allow it: bayes-lens shard run DIR --allow-read {name} (or set "
        f"{READS_ENV}={name}, or call bl.reads.allow_read({name!r}) first).")
