"""What ``dir()`` shows for the public packages: their ``__all__`` and their public submodules.

A package's globals also hold its imports (``annotations``, ``importlib``, ``Path`` ...) and its
private helpers; tab completion and ``dir(bl)`` should offer only what a user may rely on. Each
public package sets ``__dir__`` (and, where it has no lazy ``__getattr__`` of its own, a
``__getattr__`` that imports a public submodule on first access, so every name ``dir`` lists
resolves).
"""

from __future__ import annotations

import importlib
import pkgutil


def public_submodules(path) -> list:
    """The names of the public (not ``_``-prefixed) modules and packages found on ``path``."""
    return sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_"))


def package_dir(namespace: dict):
    """A ``__dir__`` for the package whose globals are ``namespace``: ``__all__`` + public submodules."""

    def __dir__():
        return sorted(set(namespace["__all__"]) | set(public_submodules(namespace["__path__"])))

    return __dir__


def import_submodule(namespace: dict, name: str):
    """The public submodule ``name`` of the package whose globals are ``namespace``, imported now.

    Raises AttributeError (as a module ``__getattr__`` must) when there is no such public submodule.
    """
    if not name.startswith("_") and name in public_submodules(namespace["__path__"]):
        return importlib.import_module(f"{namespace['__name__']}.{name}")
    raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")


def submodule_getattr(namespace: dict):
    """A module ``__getattr__`` that imports public submodules on first access (and nothing else)."""

    def __getattr__(name: str):
        return import_submodule(namespace, name)

    return __getattr__
