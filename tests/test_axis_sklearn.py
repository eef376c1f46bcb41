"""``bl.EntropyAxis`` is a scikit-learn transformer: sklearn's own ``clone``, ``get_params``/``set_params``
and the estimator checks that apply to it, and ``transform``/``fit_transform`` against numpy.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils import estimator_checks as ec

import bayes_lens as bl
from bayes_lens.adapter import hook_name, tokenize

TEXTS = ["the cat is a dog", "moon", "the tree is a house", "a bird", "river stone apple", "the lamp",
         "cloud chair", "the moon is a cloud"]

# the checks of sklearn.utils.estimator_checks that apply to an estimator fitted on (values [n, dim],
# entropy [n]); the others test predict/score, sample weights, sparse input, n_features_in_ or
# set_output, which this transformer does not offer
CHECKS = [
    "check_estimator_cloneable", "check_estimator_repr", "check_no_attributes_set_in_init",
    "check_parameters_default_constructible", "check_get_params_invariance", "check_set_params",
    "check_dont_overwrite_parameters", "check_estimators_overwrite_params", "check_estimators_fit_returns_self",
    "check_fit_idempotent", "check_fit_check_is_fitted", "check_estimators_unfitted", "check_transformers_unfitted",
    "check_estimators_pickle", "check_methods_subset_invariance", "check_methods_sample_order_invariance",
    "check_pipeline_consistency", "check_mixin_order", "check_readonly_memmap_input", "check_transformer_general",
    "check_transformer_preserve_dtypes", "check_estimators_dtypes",
]


@pytest.mark.parametrize("check", CHECKS)
def test_sklearn_estimator_checks(check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. the arbitrary-sign warning on sklearn's constant targets
        getattr(ec, check)("EntropyAxis", bl.EntropyAxis(layer=0, progress=False))


def test_init_stores_parameters_unchanged_and_fit_checks_them():
    layers = [0, 1]
    axis = bl.EntropyAxis(layer=layers, site="mlp", standardize="zscore")  # no check in __init__ (sklearn rule)
    assert axis.layer is layers and axis.site == "mlp" and axis.standardize == "zscore"
    with pytest.raises(bl.InvalidInputError, match="site"):
        axis.fit(np.ones((4, 3)), np.arange(4.0))


def test_get_params_set_params_and_clone():
    layers = [0, 1]
    axis = bl.EntropyAxis(layer=layers, site="resid_post", sign_by="bayes", batch_size=4, progress=False)
    expected = {"layer": [0, 1], "site": "resid_post", "standardize": "std", "sign_by": "bayes", "batch_size": 4,
                "progress": False}
    assert axis.get_params(deep=True) == axis.get_params(deep=False) == expected
    assert axis.set_params(site="v", layer=1) is axis and (axis.site, axis.layer) == ("v", 1)
    with pytest.raises(ValueError, match="Invalid parameter"):
        axis.set_params(n_components=2)

    x = np.random.default_rng(0).standard_normal((20, 5))
    fitted = bl.EntropyAxis(layer=layers, progress=False).fit({0: x, 1: x[:, ::-1].copy()}, x[:, 0])
    twin = clone(fitted)
    assert type(twin) is bl.EntropyAxis and twin.get_params() == fitted.get_params()
    assert twin.layer == layers and twin.layer is not layers  # sklearn deep-copies non-estimator parameters
    assert not hasattr(twin, "axes_") and hasattr(fitted, "axes_")
    refit = twin.fit({0: x, 1: x[:, ::-1].copy()}, x[:, 0])
    for k in (0, 1):
        assert torch.equal(refit.axes_[k], fitted.axes_[k])


def test_repr_shows_every_axis_parameter_and_the_fitted_layers():
    axis = bl.EntropyAxis(layer=0, progress=False)
    assert repr(axis) == "EntropyAxis(layer=0, site='v', standardize='std', sign_by='model')"
    x = np.random.default_rng(1).standard_normal((10, 4))
    assert repr(axis.fit(x, x[:, 1])).endswith(" fitted on layers [0]")


def test_transform_and_fit_transform_on_arrays_match_numpy():
    rng = np.random.default_rng(2)
    x0, x1 = rng.standard_normal((30, 6)), rng.standard_normal((30, 6)) * np.arange(1, 7)
    h = x0[:, 0] + 0.1 * rng.standard_normal(30)
    axis = bl.EntropyAxis(layer=[0, 1], progress=False)
    z = axis.fit_transform({0: x0, 1: x1}, h)
    assert isinstance(z, np.ndarray) and z.shape == (30, 2) and z.dtype == np.float64
    for j, (k, x) in enumerate(((0, x0), (1, x1))):
        u, mu = axis.axes_[k].double().numpy(), axis.means_[k].double().numpy()
        np.testing.assert_allclose(z[:, j], (x - mu) @ u, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(axis.transform(x, layer=k)[:, 0], z[:, j], rtol=1e-12, atol=1e-12)
        assert np.std(z[:, j], ddof=1) == pytest.approx(axis.sigma_[k], rel=1e-5)
    np.testing.assert_array_equal(axis.transform({1: x1, 0: x0}), z)  # columns in layer order
    assert np.corrcoef(z[:, 0], h)[0, 1] > 0  # signed by the entropy
    zt = axis.transform({0: torch.from_numpy(x0)})
    assert isinstance(zt, torch.Tensor) and torch.equal(zt, torch.from_numpy(z[:, :1]))
    with pytest.raises(bl.InvalidInputError, match="single-layer"):
        axis.transform(x0)
    with pytest.raises(bl.InvalidInputError, match=r"\[n_prompts, 6\]"):
        axis.transform(x0[:, :5], layer=0)
    with pytest.raises(bl.LayerIndexError, match="not fitted on layer 3"):
        axis.transform({3: x0})
    for bad in ("abc", None, [["a", "b"]]):  # issue 32: a raw torch TypeError before
        with pytest.raises(bl.InvalidInputError, match="must be a .n_prompts, dim. numpy array or tensor"):
            axis.transform(bad, layer=0)
    with pytest.raises(bl.InvalidInputError, match="at layer 1 must be"):
        axis.transform({0: x0, 1: "abc"})
    # it composes in a scikit-learn pipeline
    pipe = make_pipeline(FunctionTransformer(lambda a: a * 2.0), bl.EntropyAxis(layer=0, progress=False))
    np.testing.assert_allclose(pipe.fit_transform(x0, h), pipe.transform(x0), rtol=1e-12, atol=1e-12)


def test_fit_transform_on_a_model_is_the_transform_of_the_fitted_activations(tiny):
    axis = bl.EntropyAxis(layer=-1, progress=False, batch_size=3)
    z = axis.fit_transform(tiny, TEXTS)
    assert isinstance(z, torch.Tensor) and z.shape == (len(TEXTS), 1) and z.dtype == torch.float64
    name = hook_name(tiny, 1, "v")
    rows = []
    for t in TEXTS:  # the final-token hook_v by hand, one unpadded prompt at a time
        toks, _ = tokenize(tiny, [t])
        with torch.inference_mode():
            _, cache = tiny.run_with_cache(toks, names_filter=lambda n: n == name)
        rows.append(cache[name][0, -1].reshape(-1).double())
    x = torch.stack(rows)
    expected = (x - axis.means_[1].double()) @ axis.axes_[1].double()
    torch.testing.assert_close(z[:, 0], expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(axis.transform(x), z, rtol=1e-4, atol=1e-5)
    assert float(z[:, 0].std()) == pytest.approx(axis.sigma_[1], rel=1e-4)
    assert not hasattr(axis, "_fit_rows")


def test_use_before_fit_raises_sklearns_not_fitted_error():
    """Issue 37.5: scikit-learn users catch ``sklearn.exceptions.NotFittedError``; bayes_lens users catch
    ``bl.InvalidInputError``. The one error is both (and a ``bl.BayesLensError``)."""
    import pickle

    from sklearn.exceptions import NotFittedError

    axis = bl.EntropyAxis(layer=0)
    for use in (lambda: axis.transform(np.ones((4, 3))), axis.removal, lambda: axis.layer_):
        with pytest.raises(NotFittedError, match="not fitted yet; call .fit"):
            use()
    with pytest.raises(bl.InvalidInputError) as info:
        axis.transform(np.ones((4, 3)))
    err = info.value
    assert type(err) is bl.NotFittedError and isinstance(err, (bl.BayesLensError, ValueError, AttributeError))
    assert type(pickle.loads(pickle.dumps(err))) is bl.NotFittedError   # one class, found again by name
    from bayes_lens.errors import NotFittedError as same

    assert same is bl.NotFittedError


def test_paper_a_export_reads_with_the_paper_a_reader_logic(tmp_path):
    """EntropyAxis.export_paper_a writes the per-layer files Paper A's SULA pipeline loads
    (experiments/paper3_llm/sula_pipeline/hf_activations.py: entropy_axis_L{layer}_model.npz with u_ent
    and sigma_pc1). Its reader logic, re-implemented here, gets back our unit axis and σ."""
    import numpy as np

    import bayes_lens as bl
    from bayes_lens.models.tiny import tiny_model

    model = tiny_model("bridge", n_layers=3)   # (layer 0's final-token values depend on the final token only)
    axis = bl.EntropyAxis(layer=[1, 2]).fit(model, bl.sula.make_prompts(model, ks=(0, 1, 2, 4), n_per_k=4))
    paths = axis.export_paper_a(tmp_path)
    assert [p.name for p in paths] == ["entropy_axis_L1_model.npz", "entropy_axis_L2_model.npz"]
    dim = model.cfg.n_key_value_heads * model.cfg.d_head
    for layer in (1, 2):
        data = np.load(tmp_path / f"entropy_axis_L{layer}_model.npz")       # the reader, as written there
        assert "u_ent" in data and "sigma_pc1" in data
        u_ent = np.asarray(data["u_ent"], dtype=np.float32).reshape(-1)
        sigma_pc1 = float(data["sigma_pc1"])
        if not np.isfinite(sigma_pc1) or sigma_pc1 <= 0.0:
            sigma_pc1 = 1.0
        u_norm = u_ent / float(np.linalg.norm(u_ent))
        assert u_norm.shape[0] == dim
        np.testing.assert_allclose(u_norm, axis.axes_[layer].numpy(), atol=1e-6)
        assert sigma_pc1 == pytest.approx(axis.sigma_[layer])
        assert int(data["layer"]) == layer and str(data["site"]) == "v"
