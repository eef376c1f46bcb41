"""Every docstring example in the package runs, on a tiny random model, in the fast lane.

Each module's examples see the module's own names (as under ``pytest --doctest-modules``) and
``bl`` (the package), ``np``, ``torch``, ``model`` (a tiny random llama TransformerBridge: the one
kind both TransformerLens majors have, fresh for each module) and ``prompts`` (eight short texts its
tokenizer knows). Examples that need the real model, Ray, torchrun or a folder on disk are marked
``# doctest: +SKIP`` in their docstring. Outputs compare under ELLIPSIS and NORMALIZE_WHITESPACE.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch

import bayes_lens as bl

PKG = Path(bl.__file__).resolve().parent
PROMPTS = ["the cat is a dog", "a bird is the moon", "the tree is a house", "a stone is the river",
           "the lamp is a cloud", "a chair is the apple", "the dog is a tree", "a moon is the stone"]
# modules that import an optional extra at import time, and that extra
OPTIONAL = {"bayes_lens.shard._ray": "ray"}


def _module_names():
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts)


@pytest.fixture
def namespace():  # a fresh model per module (0.1 s after the first), so no example sees another's hooks
    from bayes_lens.models.tiny import tiny_model

    return {"bl": bl, "np": np, "torch": torch, "model": tiny_model("bridge"), "prompts": list(PROMPTS)}


def test_every_module_is_covered():
    names = list(_module_names())
    assert "bayes_lens" in names and "bayes_lens.metrics.stats" in names and "bayes_lens._geometry._suite" in names


@pytest.mark.parametrize("name", list(_module_names()))
def test_docstring_examples(name, namespace):
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list = []
    for test in finder.find(module, name, globs={}):
        test.globs = {**vars(module), **namespace}  # as pytest --doctest-modules: the module's names, then these
        runner.run(test, out=failures.append)
    assert not failures, "".join(failures)
