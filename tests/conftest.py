"""Shared fixtures: tiny random models of every kind, and the real SmolLM2-135M (session-scoped).

``tiny_kind`` is parametrized over the model kinds the installed TransformerLens offers
(``hooked`` only on TL 3.x, ``bridge`` on both), so a test that uses it runs once per kind.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("BAYES_LENS_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bayes_lens.adapter import has_hooked_transformer  # noqa: E402

KINDS = (["hooked"] if has_hooked_transformer() else []) + ["bridge"]


def pytest_collection_modifyitems(config, items):
    """Tests that use the real model are marked ``real``: ``make test-fast`` (-m "not real") skips them."""
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in ("smol", "smol_bridge", "smol_geometry")):
            item.add_marker(pytest.mark.real)


def pytest_report_header(config):
    import importlib.metadata as md

    return f"transformer-lens {md.version('transformer-lens')}; model kinds under test: {KINDS}"


@pytest.fixture(autouse=True)
def _restore_grad_mode():
    """Put torch's global grad mode back after every test.

    The README quickstart and the tutorials run as written, in this process, and they call
    ``torch.set_grad_enabled(False)`` as TransformerLens's demos do; without this, every later test
    that trains or uses backward hooks would run with autograd off.
    """
    import torch

    before = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(before)


@pytest.fixture(params=KINDS)
def tiny_kind(request) -> str:
    return request.param


@pytest.fixture
def tiny(tiny_kind):
    """A tiny random llama (rotary, GQA) of each available kind."""
    from bayes_lens.models.tiny import tiny_model

    return tiny_model(tiny_kind, gqa=True, rotary=True)


@pytest.fixture(scope="session")
def tiny_pair():
    """The same tiny random llama weights as (HookedTransformer, TransformerBridge); TL 3.x only."""
    if not has_hooked_transformer():
        pytest.skip("HookedTransformer needs TransformerLens 3.x")
    from bayes_lens.models.tiny import tiny_pair as make

    return make(gqa=True, seed=0)


@pytest.fixture(scope="session")
def smol():
    """The real SmolLM2-135M-Instruct, loaded once per session as the default kind ('auto')."""
    import bayes_lens as bl

    return bl.load_model()


@pytest.fixture(scope="session")
def smol_bridge(smol):
    """SmolLM2-135M as a TransformerBridge (the same object as ``smol`` on TL 4.x)."""
    import bayes_lens as bl

    if bl.adapter.is_bridge(smol):
        return smol
    return bl.load_model(kind="bridge")
