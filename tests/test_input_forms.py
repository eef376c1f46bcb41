"""Every analysis × every documented input form gives the streaming result (one input normaliser).

The forms (README "Every analysis takes ..."): a model with prompts (the streaming reference), the
``(logits, ActivationCache)`` pair ``run_with_cache`` returns, the ``ActivationCache`` with
``logits=``, ``dict(cache.items())`` with ``model=`` and ``logits=``, the pair of ``(logits, dict)``
with ``model=``, a :class:`bl.ReducedCache` from ``bl.collect.collect`` with ``model=``, and one
saved and loaded again. The cache is made by TransformerLens's own ``run_with_cache`` on a padded batch
(``attention_mask=``); the reduced cache by the runner. Each cell's numbers are compared with the
streaming call's, table by table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import bayes_lens as bl

TEXTS = ["the cat is a dog", "a bird", "the moon and the river and the stone", "apple chair cloud",
         "the house is a tree", "dog", "the lamp is a lamp and a chair", "stone river moon bird cat"]
FAST = dict(n_boot=20, seed=3)
FORMS = ("pair", "cache+logits", "dict+model", "dict-pair+model", "reduced", "reduced-file")


def _frames_close(a: pd.DataFrame, b: pd.DataFrame, tol=1e-5):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if pd.api.types.is_numeric_dtype(a[col]) and not pd.api.types.is_bool_dtype(a[col]):
            np.testing.assert_allclose(x.astype(float), y.astype(float), atol=tol, rtol=1e-5, err_msg=col)
        else:
            assert [str(v) for v in x] == [str(v) for v in y], col


def _source(form, model, texts, logits, cache, rc_path, need):
    """(positional source, keyword arguments) of ``form``; ``need`` = what the reduced cache must hold."""
    mask = _source.mask
    if form == "pair":
        return (logits, cache), dict(attention_mask=mask)
    if form == "cache+logits":
        return cache, dict(attention_mask=mask, logits=logits)
    if form == "dict+model":
        return dict(cache.items()), dict(attention_mask=mask, logits=logits, model=model)
    if form == "dict-pair+model":
        return (logits, dict(cache.items())), dict(attention_mask=mask, model=model)
    rc = bl.collect.collect(model, texts, **need)
    if form == "reduced":
        return rc, dict(model=model)
    rc.save(rc_path)
    return bl.ReducedCache.load(rc_path), dict(model=model)


@pytest.fixture
def made(tiny, tmp_path):
    tokens, mask = bl.adapter.tokenize(tiny, TEXTS)
    with torch.no_grad():
        logits, cache = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter())
    _source.mask = mask
    return tiny, logits, cache, tmp_path / "reduced.safetensors"


L = 1  # the tiny model's last layer
ANALYSES = {
    # name: (call(source, prompts_or_None, **kw), needs of a reduced cache, prompts passed with a cache)
    "geometry": (lambda src, p, **kw: bl.geometry(src, p, n_null=5, n_perm=20, **FAST, **kw),
                 dict(value_layers=[L], attention=True), False),
    "value_manifold": (lambda src, p, **kw: bl.value_manifold(src, p, layer=L, n_null=5, **FAST, **kw),
                       dict(value_layers=[L]), False),
    "attention_focusing": (lambda src, p, **kw: bl.attention_focusing(src, p, **FAST, **kw),
                           dict(attention=True), False),
    "entropy_alignment": (lambda src, p, **kw: bl.entropy_alignment(src, p, layer=L, n_perm=20, **FAST, **kw),
                          dict(value_layers=[L]), False),
}


def _drop_irrelevant(kw, name):
    if name in ("attention_focusing", "value_manifold"):
        kw.pop("logits", None)
    return kw


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_geometry_analyses_equal_streaming_from_every_form(made, name, form):
    model, logits, cache, path = made
    call, need, _ = ANALYSES[name]
    ref = call(model, TEXTS)
    src, kw = _source(form, model, TEXTS, logits, cache, path, need)
    got = call(src, None, **_drop_irrelevant(kw, name))
    _frames_close(got.to_dataframe(), ref.to_dataframe())


@pytest.mark.parametrize("form", FORMS)
def test_entropy_axis_fit_equals_streaming_from_every_form(made, form):
    """Plain strings (signed by the next-token entropy) and the documented failing form of issue 27:
    ``EntropyAxis(layer=1).fit(dict(cache.items()), prompts, model=m)`` (with the logits it reads)."""
    model, logits, cache, path = made
    ref = bl.EntropyAxis(layer=L).fit(model, TEXTS)
    src, kw = _source(form, model, TEXTS, logits, cache, path, dict(value_layers=[L]))
    got = bl.EntropyAxis(layer=L).fit(src, TEXTS, **kw)
    torch.testing.assert_close(got.axis_, ref.axis_, atol=1e-5, rtol=1e-4)
    assert got.sigma_[L] == pytest.approx(ref.sigma_[L], rel=1e-5)
    assert got.entropy_correlation_[L] == pytest.approx(ref.entropy_correlation_[L], abs=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_sula_evaluate_and_axis_on_items_equal_streaming_from_every_form(tiny, form, tmp_path):
    items = bl.sula.make_prompts(tiny, ks=(0, 1, 2, 4), n_per_k=3, seed=1)
    tokens, mask = bl.adapter.tokenize(tiny, items.texts)
    with torch.no_grad():
        logits, cache = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=bl.hook_filter(sites=("v",)))
    _source.mask = mask
    ids = list(bl.sula.label_token_ids(tiny, items.labels))
    src, kw = _source(form, tiny, items.texts, logits, cache, tmp_path / "rc.safetensors",
                      dict(value_layers=[L], token_ids=ids))
    ref = bl.sula.evaluate(tiny, items, layer=L, n_boot=20)
    got = bl.sula.evaluate(src, items, layer=L, n_boot=20, **kw)
    _frames_close(got.table, ref.table)
    _frames_close(got.geometry, ref.geometry)
    ref_axis = bl.EntropyAxis(layer=L).fit(tiny, items)
    got_axis = bl.EntropyAxis(layer=L).fit(src, items, **kw)
    torch.testing.assert_close(got_axis.axis_, ref_axis.axis_, atol=1e-5, rtol=1e-4)
    assert got_axis.entropy_kind_ == ref_axis.entropy_kind_ == "labels"


def test_the_forms_say_what_is_missing(made):
    """A form without what the analysis reads gets a clear error naming the fix, not a wrong number."""
    model, logits, cache, path = made
    mask = _source.mask
    with pytest.raises(bl.MissingHookError, match="logits"):
        bl.EntropyAxis(layer=L).fit(dict(cache.items()), TEXTS, model=model, attention_mask=mask)
    with pytest.raises(bl.InvalidInputError, match="model="):
        bl.EntropyAxis(layer=L).fit(dict(cache.items()), TEXTS, attention_mask=mask, logits=logits)
    rc = bl.collect.collect(model, TEXTS, value_layers=[0])
    with pytest.raises(bl.MissingHookError, match="value_layers=\\[1\\]"):
        bl.value_manifold(rc, layer=L, model=model, **FAST)
    with pytest.raises(bl.MissingHookError, match="attention=True"):
        bl.attention_focusing(rc, model=model, **FAST)
    with pytest.raises(bl.InvalidInputError, match="describe a cache"):
        bl.value_manifold(rc, layer=0, model=model, attention_mask=mask, **FAST)
    with pytest.raises(bl.InvalidInputError, match="keyed by layer numbers"):
        bl.value_manifold({0: np.zeros((8, 4))}, layer=0, **FAST)
