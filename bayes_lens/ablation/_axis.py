"""The entropy axis (Paper A §4.5; METHODS.md §7): an sklearn-style estimator, and its patches.

At layer ℓ, the axis u is PC1 of the final-token value vectors (``hook_v`` flattened over the
key/value heads, the paper's site; or ``hook_resid_post``) across prompts, signed so that its
coordinate correlates non-negatively with the model's entropy (or the Bayes entropy of SULA prompts).
``standardize="std"`` (default) takes PC1 w of the z-scored values (as the value-manifold metric,
METHODS.md §1) and maps it back to raw activations, u = (w/σ)/‖w/σ‖; ``"raw"`` takes PC1 of the raw
centred values. ``fit`` takes a model and prompts, a user's cache, or arrays; its patches
(``removal``, ``shift``, ``keep_only``, ``random_control``) are :class:`~bayes_lens.ablation.Patch`
objects. Saved axes carry a SHA-256 per tensor and (format 3) one of their metadata - σ, the entropy
correlations, the model facts, the format version itself - so an edited or damaged file refuses to load.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from torch import Tensor

from .. import adapter, errors
from ..adapter import VECTOR_SITES, check_site
from .._files import sha256_json, write_atomic
from .._inputs import as_reduced, is_layer_dict, source_model
from .._validate import check_choice, check_seed
from ..errors import CheckpointError, InvalidInputError, LayerIndexError, NonFiniteError
from ..hookpoints import axis_hook_name
from ..metrics.calibration import binary_entropy_bits
from ..estimators import pc1_axis
from ..metrics.stats import entropy_bits, pearson
from ..reduced import ReducedCache
from ._common import (
    SIGN_BY, STANDARDIZE, finite_float, library_versions, model_meta, prompt_data, site_dim, unit_vector,
)
from ._patch import Patch, PatchPart, link_model

__all__ = ["EntropyAxis", "axis_cache", "signing_entropy", "value_arrays", "axis_from_pca", "check_loaded"]

# 1: no checksums; 2: a SHA-256 per tensor ("sha256"); 3: also one of the metadata ("metadata_sha256")
_FORMAT_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)
_META_KEY = "bayes_lens_entropy_axis"
_META_SHA = "metadata_sha256"


def _tensor_sha256(t: Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (row-major), as numpy names the dtype (format 2)."""
    a = t.detach().cpu().contiguous().numpy()
    h = hashlib.sha256(f"{a.dtype.str}{list(a.shape)}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _verify(path, meta: dict, tensors: Dict[str, Tensor], trust_unverified: bool = False) -> None:
    """Check the metadata checksum and the tensor checksums wherever the file carries them.

    A checksum that is present is always checked, whatever ``format_version`` says (an edited
    version number must not switch the checks off); format 3 must carry both, format 2 the tensor
    ones. Files of format 1 (no checksums) and 2 (none over the metadata: σ, entropy correlations,
    the model facts) are refused unless ``trust_unverified``: nothing tells an old file from a
    current one whose checksums were removed and whose version was set back, so loading one is the
    caller's explicit decision (then with a warning saying what is not verified).
    """
    version = meta.get("format_version")
    if _META_SHA in meta or version >= 3:
        body = {k: v for k, v in meta.items() if k != _META_SHA}
        if not isinstance(meta.get(_META_SHA), str) or sha256_json(body) != meta[_META_SHA]:
            raise CheckpointError(f"{path}: the axis metadata (format version, σ, entropy correlations, model facts, "
                                  "tensor checksums) does not match its SHA-256: the file was edited or damaged. "
                                  "Fit and save the axis again.")
    sha = meta.get("sha256")
    if sha is not None or version >= 2:
        if not isinstance(sha, dict) or set(sha) != set(tensors):
            raise CheckpointError(f"{path}: the checksums do not list exactly the stored tensors; the file is "
                                  "damaged.")
        for name, t in tensors.items():
            if not isinstance(sha[name], str) or _tensor_sha256(t) != sha[name]:
                raise CheckpointError(f"{path}: the tensor {name!r} does not match its SHA-256; the file is "
                                      "corrupted. Fit and save the axis again.")
    if _META_SHA in meta:
        return
    what = ("format 1, without checksums: neither its tensors nor its metadata (σ, entropy correlations) can be "
            "verified" if sha is None else
            "format 2: its tensors are verified but its metadata (σ, entropy correlations) is not")
    if not trust_unverified:
        raise CheckpointError(f"{path} is an axis file of {what}, and it cannot be told from a current file whose "
                              "checksums were removed (an edited σ would go unnoticed). If you trust where it came "
                              "from (an axis saved by bayes_lens before checksums covered the metadata), load it "
                              "with EntropyAxis.load(path, trust_unverified=True) and save it again (format 3); "
                              "else fit the axis again.")
    warnings.warn(f"{path} is an axis file of {what}; loaded because trust_unverified=True. Save it again to add "
                  "the checksums (format 3).", UserWarning, stacklevel=4)


def axis_cache(source, prompts, *, layers: Sequence[int], site: str = "v", model=None, attention_mask=None,
               tokens=None, logits=None, fwd_hooks=(), batch_size: int = 16, progress: Optional[bool] = None,
               desc: str = "axis: collect") -> Tuple[ReducedCache, object]:
    """``(reduced cache, model)`` an axis is fitted on or read with: final-token rows at ``layers`` and, for
    SULA items, the two labels' log-probabilities (else the next-token entropy), from any input form of
    ``bayes_lens._inputs.as_reduced`` (a model runs ``prompts`` once, with ``fwd_hooks`` active).

    ``prompts`` are SULA items (the entropy is over the two labels) or plain strings (full next-token
    entropy); from a cache of plain strings ``prompts`` may be None.
    """
    from ..tasks import answer_token_ids

    check_site(site)
    texts, bayes = prompt_data(prompts) if prompts is not None else (None, None)
    m = source_model(source, model)
    label_ids = None
    if bayes is not None:
        if m is None:
            raise InvalidInputError("SULA items need the model (for the label token ids): pass model=.")
        label_ids = list(answer_token_ids(m, prompts[0].answers))
    rc, m = as_reduced(source, texts, model=model, logits=logits, attention_mask=attention_mask, tokens=tokens,
                       **{"value_layers" if site == "v" else "resid_layers": list(layers)}, token_ids=label_ids,
                       fwd_hooks=fwd_hooks, batch_size=batch_size, progress=progress, desc=desc)
    return rc, m


def signing_entropy(rc: ReducedCache, prompts) -> np.ndarray:
    """The model's entropy (bits) per prompt: over the two SULA labels (renormalized) for SULA items, else the
    full next-token entropy."""
    from ..tasks import answer_posterior, label_posterior

    bayes = prompt_data(prompts)[1] if prompts is not None else None
    if bayes is not None:
        lp = rc.token_logprobs()
        if lp.shape[1] == 2:  # two answers (SULA): the binary path, bit for bit as before
            p_first, _ = label_posterior(lp)
            return np.asarray(binary_entropy_bits(p_first), dtype=np.float64)
        return np.asarray(entropy_bits(answer_posterior(lp)[0]), dtype=np.float64)
    return rc.next_token_entropy_bits().double().numpy()


def value_arrays(rc: ReducedCache, layers: Sequence[int], site: str) -> Dict[int, np.ndarray]:
    """``{layer: [n, dim] float64}`` final-token rows of ``site`` from a reduced cache."""
    return {layer: rc.value_rows(layer, site).double().numpy() for layer in layers}


#: the package's one PC1 (bayes_lens.estimators.pc1_axis), under the name this module used
axis_from_pca = pc1_axis


class EntropyAxis(TransformerMixin, BaseEstimator):
    """The entropy axis of Paper A §4.5 (METHODS.md §7), a scikit-learn transformer.

    It is a ``sklearn.base.BaseEstimator``: ``get_params(deep=True)``, ``set_params`` and
    ``sklearn.base.clone`` work, ``__init__`` stores each parameter unchanged (they are checked in
    :meth:`fit`), fitted attributes end in ``_``. :meth:`transform` maps final-token activations to the
    axis coordinate, ``[n, n_layers]`` as scikit-learn expects; :meth:`fit_transform` returns the
    coordinates of the rows it was fitted on.

    Parameters (stored as given; no work in ``__init__``)
    ----------
    layer:
        An int (negative counts from the end) or a list of ints: one axis per layer, fitted on the
        same prompts; patches then act on all of them (pass ``layers=`` to a patch builder for a subset).
    site:
        ``"v"`` (default, the paper: ``hook_v`` at the final real token, flattened over the
        key/value heads) or ``"resid_post"``.
    standardize:
        ``"std"`` (default): PC1 of the z-scored values mapped back to raw activations
        (u ∝ w / σ, renormalized), so v·u is an affine function of the standardized PC1 score used
        by the geometry metrics; ``"raw"``: PC1 of the raw centred values.
    sign_by:
        ``"model"`` (default): sign u so the coordinate correlates non-negatively with the model's
        entropy (for SULA prompt sets the entropy over the two labels, renormalized; for plain
        strings the full next-token entropy); ``"bayes"``: with the Bayes entropy of SULA items.
    batch_size, progress:
        Passed to :func:`bayes_lens.collect.collect`.

    Fitted attributes
    -----------------
    ``layers_`` (tuple), ``axes_`` / ``means_`` / ``scales_`` (layer → tensor), ``sigma_`` (layer →
    std of the clean coordinate), ``explained_variance_ratio_``, ``entropy_correlation_`` (layer →
    Pearson of the coordinate with the signing entropy), ``hook_names_``, ``site_``,
    ``entropy_kind_`` (``"labels"``, ``"next_token"`` or ``"bayes"``), ``model_meta_``
    (model name, kind, shape, ``processed`` / ``processing``), ``versions_``, ``n_prompts_``.
    For a single-layer axis also ``layer_``, ``axis_`` and ``hook_name_``.
    """

    def __init__(self, layer: Union[int, Sequence[int]] = -1, site: str = "v", *, standardize: str = "std",
                 sign_by: str = "model", batch_size: int = 16, progress: Optional[bool] = True):
        self.layer = layer
        self.site = site
        self.standardize = standardize
        self.sign_by = sign_by
        self.batch_size = batch_size
        self.progress = progress

    # --- parameters (get_params / set_params: sklearn.base.BaseEstimator) ---
    def _check_params(self) -> None:
        check_site(self.site)
        check_choice(self.standardize, "standardize", STANDARDIZE)
        check_choice(self.sign_by, "sign_by", SIGN_BY)

    # --- fitting ---
    def _layers(self, model) -> List[int]:
        layer = self.layer
        if isinstance(layer, Tensor) and layer.numel() == 1:
            layer = int(layer)
        n = None if model is None else int(model.cfg.n_layers)
        single = isinstance(layer, numbers.Integral) and not isinstance(layer, bool)
        if not single and (isinstance(layer, (str, bytes)) or not hasattr(layer, "__iter__")):
            raise LayerIndexError(f"layer must be an int or a list of ints, got {layer!r}.")
        layers = [int(layer)] if single else list(layer)
        if n is None:
            if any(isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 0 for x in layers):
                raise LayerIndexError(f"fitting on arrays without model= needs non-negative layer indices, got "
                                      f"{self.layer!r}; pass model= to resolve negative ones.")
            return sorted({int(x) for x in layers})
        return [adapter.resolve_layer(n, layers[0])] if single else adapter.resolve_layers(model, layers)

    def fit(self, X, y=None, *, model=None, attention_mask=None, tokens=None, logits=None) -> "EntropyAxis":
        """Fit the axis; returns self. Three forms, one estimator:

        * ``fit(model, prompts)`` — run SULA items or plain strings through ``model`` (one pass);
        * ``fit(cache, prompts)`` — the same from what ``run_with_cache`` returned on those prompts
          (the ``(logits, cache)`` pair, the cache with ``logits=``, or ``dict(cache.items())`` with
          ``model=`` and ``logits=``, holding ``hook_v`` at the axis layers; ``tokens`` or
          ``attention_mask`` for a padded batch), or a reduced cache (:func:`bayes_lens.collect.collect`,
          :func:`bayes_lens.shard.merge`) with ``model=``;
        * ``fit(values, entropy)`` — arrays: final-token activations ``[n, dim]`` (a single-layer
          axis) or ``{layer: [n, dim]}``, and the signing entropy ``[n]`` (bits); ``model=`` resolves
          negative layers and records the model's metadata (weight processing, shape).

        The signing entropy of the first two forms is the model's entropy over the two SULA labels (or
        the full next-token entropy for strings), or the Bayes entropy with ``sign_by="bayes"``. To run
        the forward pass in shards, call ``fit`` inside ``with bl.shard.sharded(...)``.

        >>> axis = bl.EntropyAxis(layer=-1).fit(model, [f"prompt {i} is" for i in range(6)])
        >>> axis.axis_.shape
        torch.Size([32])
        """
        self._check_params()
        if isinstance(X, (np.ndarray, Tensor)) or is_layer_dict(X):
            if y is None:
                raise InvalidInputError("fit(values, entropy) needs the signing entropy [n] as the second argument.")
            self._fit_values(X, y, model)
            self.entropy_kind_ = "given"
            return self
        m = source_model(X, model)
        if m is None:
            raise InvalidInputError("a plain dict cache or a reduced cache does not record its model; pass model=.")
        layers = self._layers(m)
        rc, _ = axis_cache(X, y, layers=layers, site=self.site, model=model, attention_mask=attention_mask,
                           tokens=tokens, logits=logits, batch_size=self.batch_size, progress=self.progress)
        if rc.n_prompts < 3:
            raise InvalidInputError(f"fitting an axis needs at least 3 prompts, got {rc.n_prompts}.")
        bayes = prompt_data(y)[1] if y is not None else None
        if self.sign_by == "bayes" and bayes is None:
            raise InvalidInputError("sign_by='bayes' needs SULA items (with .bayes_entropy_bits), e.g. "
                                    "bl.sula.make_prompts(model); plain strings only allow sign_by='model'.")
        h_sign = bayes if self.sign_by == "bayes" else signing_entropy(rc, y)
        values = value_arrays(rc, layers, self.site)
        self._fit_arrays(m, {layer: torch.from_numpy(values[layer]) for layer in layers}, h_sign)
        self.entropy_kind_ = ("bayes" if self.sign_by == "bayes" else
                              ("labels" if bayes is not None else "next_token"))
        return self

    def _fit_values(self, X, y, model) -> None:
        if is_layer_dict(X):
            if model is not None:
                values = {adapter.resolve_layer(model, k): v for k, v in X.items()}
            else:
                values = {int(k): v for k, v in X.items()}
                if any(k < 0 for k in values):
                    raise LayerIndexError("negative layer keys need model= to resolve them.")
        else:
            layers = self._layers(model)
            if len(layers) != 1:
                raise InvalidInputError(f"one array of values fits a single-layer axis; this axis has layers {layers}: "
                                        "pass {layer: values} for each.")
            values = {layers[0]: X}
        values = {k: torch.as_tensor(v).detach() for k, v in values.items()}
        for k, v in values.items():
            if v.ndim != 2:
                raise InvalidInputError(f"values at layer {k} must be [n_prompts, dim], got shape {list(v.shape)}.")
        entropy = np.asarray(torch.as_tensor(y).detach().double().cpu().numpy() if isinstance(y, Tensor) else y,
                             dtype=np.float64).ravel()
        n = {int(v.shape[0]) for v in values.values()}
        if len(n) != 1 or entropy.shape[0] not in n:
            raise InvalidInputError(f"values have {sorted(n)} rows but the entropy has {entropy.shape[0]}; pass one "
                                    "entropy per prompt.")
        if entropy.shape[0] < 3:
            raise InvalidInputError(f"fitting an axis needs at least 3 prompts, got {entropy.shape[0]}.")
        self._fit_arrays(model, values, entropy)

    def _fit_arrays(self, model, values: Dict[int, Tensor], entropy: np.ndarray) -> None:
        """Fit from final-token activations (layer → [n, dim]) and the signing entropy [n]."""
        dim = int(next(iter(values.values())).shape[1])
        meta = model_meta(model, self.site) if model is not None else {
            "model_name": None, "model_kind": None, "n_layers": None, "n_kv_heads": None, "d_head": None,
            "d_model": None, "dim": dim, "processed": None, "processing": "unknown (fitted on arrays)"}
        axes, means, scales, sigma, evr, corr = {}, {}, {}, {}, {}, {}
        for layer, x in values.items():
            x = x.detach().cpu().double().numpy()
            if not np.all(np.isfinite(x)):
                raise NonFiniteError(f"the activations at layer {layer} contain NaN or infinity.")
            if x.shape[1] != meta["dim"]:
                raise InvalidInputError(f"activations at layer {layer} have dimension {x.shape[1]}, expected "
                                        f"{meta['dim']} for site {self.site!r}.")
            u, mean, scale, ratio = axis_from_pca(x, self.standardize)
            coord = (x - mean) @ u
            r = pearson(coord, entropy)
            if math.isfinite(r) and r < 0:
                u, coord, r = -u, -coord, -r
            if not math.isfinite(r):
                warnings.warn(f"the signing entropy or the coordinate at layer {layer} is constant; the axis "
                              "sign is arbitrary.", UserWarning, stacklevel=3)
            axes[layer] = torch.tensor(u, dtype=torch.float32)
            means[layer] = torch.tensor(mean, dtype=torch.float32)
            scales[layer] = torch.tensor(scale, dtype=torch.float32)
            sigma[layer] = float(coord.std(ddof=1))
            evr[layer] = ratio
            corr[layer] = float(r)
        rows = getattr(self, "_fit_rows", None)  # set by fit_transform: the rows it returns the coordinates of
        if rows is not None:
            rows.update(values)
        self._set_fitted(model, meta, axes, means, scales, sigma, evr, corr, n_prompts=len(entropy))

    def _set_fitted(self, model, meta, axes, means, scales, sigma, evr, corr, *, n_prompts, versions=None):
        layers = tuple(sorted(axes))
        self.layers_ = layers
        self.site_ = self.site
        self.axes_ = {k: axes[k] for k in layers}
        self.means_ = {k: means[k] for k in layers}
        self.scales_ = {k: scales[k] for k in layers}
        self.sigma_ = {k: sigma[k] for k in layers}
        self.explained_variance_ratio_ = {k: evr[k] for k in layers}
        self.entropy_correlation_ = {k: corr[k] for k in layers}
        self.hook_names_ = {k: adapter.SITES[self.site].format(layer=k) for k in layers}
        self.coord_hook_names_ = {k: axis_hook_name(self.site, k) for k in layers}
        if model is not None:
            adapter.check_hooks(model, list(self.hook_names_.values()))
        link_model(self, model)  # its patches name an SAE's output where one replaces their hook point (Patch)
        self.model_meta_ = dict(meta)
        self.versions_ = dict(versions) if versions is not None else library_versions()
        self.n_prompts_ = int(n_prompts)

    @classmethod
    def from_directions(cls, model, directions, *, site: str = "v", sigma=None,
                        means=None) -> "EntropyAxis":
        """An axis from directions you already have: ``{layer: vector}`` (vectors are normalized).

        ``sigma`` (a number or ``{layer: number}``) is the coordinate's standard deviation that
        :meth:`shift` scales by; without it ``shift`` refuses. Useful for hypothesis-driven
        directions and for tests.
        """
        check_site(site)
        if not isinstance(directions, dict) or not directions:
            raise InvalidInputError("directions must be a non-empty dict {layer: vector}.")
        meta = model_meta(model, site)
        axis = cls(layer=sorted(adapter.resolve_layer(model, k) for k in directions), site=site)
        axes, means_, scales, sig, evr, corr = {}, {}, {}, {}, {}, {}
        for k, vec in directions.items():
            layer = adapter.resolve_layer(model, k)
            if layer in axes:
                raise InvalidInputError(f"layer {k} is given twice (resolved to {layer}).")
            axes[layer] = torch.tensor(unit_vector(vec, f"the direction for layer {k}", meta["dim"]), dtype=torch.float32)
            m = means.get(k) if isinstance(means, dict) else None
            means_[layer] = torch.zeros(meta["dim"]) if m is None else torch.as_tensor(m, dtype=torch.float32)
            scales[layer] = torch.ones(meta["dim"])
            s = sigma.get(k) if isinstance(sigma, dict) else sigma
            sig[layer] = float("nan") if s is None else finite_float(s, "sigma")
            evr[layer], corr[layer] = float("nan"), float("nan")
        axis._set_fitted(model, meta, axes, means_, scales, sig, evr, corr, n_prompts=0)
        axis.entropy_kind_ = "given"
        return axis

    # --- fitted accessors ---
    def check_fitted(self) -> None:
        """Raise :class:`~bayes_lens.errors.NotFittedError` (an InvalidInputError and scikit-learn's
        NotFittedError) unless :meth:`fit` (or :meth:`load`, :meth:`from_directions`) ran."""
        if not hasattr(self, "axes_"):
            raise errors.NotFittedError("this EntropyAxis is not fitted yet; call .fit(model, prompts) first.")

    def _single(self, what: str):
        self.check_fitted()
        if len(self.layers_) != 1:
            raise InvalidInputError(f"this axis is fitted on layers {list(self.layers_)}; {what} is defined for a "
                                    "single-layer axis only: use axes_[layer] / hook_names_[layer].")
        return self.layers_[0]

    @property
    def layer_(self) -> int:
        return self._single("layer_")

    @property
    def axis_(self) -> Tensor:
        return self.axes_[self._single("axis_")]

    @property
    def hook_name_(self) -> str:
        return self.hook_names_[self._single("hook_name_")]

    @property
    def coord_hook_name_(self) -> str:
        """The coordinate hook point of a single-layer axis (``blocks.{l}.hook_v_axis``)."""
        return self.coord_hook_names_[self._single("coord_hook_name_")]

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "axes_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True  # fit(values, entropy) needs the signing entropy; fit(model, prompts)
        return tags

    def transform(self, X, *, layer: Optional[int] = None):
        """The axis coordinate (v − mean)·u of final-token activations, one column per layer.

        ``X`` is ``[n, dim]`` (a numpy array or a tensor) for a single-layer axis, or for the axis at
        ``layer`` of a multi-layer one; or ``{layer: [n, dim]}``, one column per key in increasing
        layer order. Returns ``[n, n_columns]`` float64 (scikit-learn's shape: ``[:, 0]`` is the
        coordinate of a single-layer axis): a numpy array when ``X`` holds numpy arrays, else a tensor.

        >>> axis.transform(values)[:, 0]                   # doctest: +SKIP
        >>> axis.transform({3: v3, 5: v5})                 # [n, 2]  # doctest: +SKIP
        """
        self.check_fitted()
        if isinstance(X, dict):
            if layer is not None:
                raise InvalidInputError("pass layer= with one array of activations, not with a {layer: values} dict.")
            if not X:
                raise InvalidInputError("X is an empty dict; pass {layer: [n, dim]} for at least one fitted layer.")
            keys = [self._pick_layers([k])[0] for k in X]
            if len(set(keys)) != len(keys):
                raise InvalidInputError(f"the layers {list(X)} name a layer twice (resolved to {keys}).")
            pairs = sorted(zip(keys, X.values()), key=lambda kv: kv[0])
        else:
            k = self._pick_layers(layer)[0] if layer is not None else self._single("transform of one array "
                                                                                   "without layer=")
            pairs = [(k, X)]
        cols, n = [], None
        for k, v in pairs:
            try:
                v = torch.as_tensor(v).detach().cpu().double()
            except (TypeError, ValueError, RuntimeError) as err:
                raise InvalidInputError(f"the activations at layer {k} must be a [n_prompts, dim] numpy array or "
                                        f"tensor of numbers, got {type(v).__name__} ({err}).") from None
            u = self.axes_[k].double()
            if v.ndim != 2 or v.shape[1] != u.shape[0]:
                raise InvalidInputError(f"the activations at layer {k} must be [n_prompts, {u.shape[0]}] (site "
                                        f"{self.site_!r}), got shape {list(v.shape)}.")
            if n is not None and v.shape[0] != n:
                raise InvalidInputError(f"the activations have {n} rows at one layer and {v.shape[0]} at layer {k}.")
            n = v.shape[0]
            cols.append((v - self.means_[k].double()) @ u)
        out = torch.stack(cols, dim=1)
        return out.numpy() if _holds_numpy(X) else out

    def fit_transform(self, X, y=None, **fit_params):
        """Fit (the same forms and keywords as :meth:`fit`), then return the coordinates of the rows it
        was fitted on: ``[n_prompts, n_layers]`` float64, columns in ``layers_`` order; a numpy array
        when ``X`` holds numpy arrays, else a tensor.

        For arrays it equals ``fit(X, y).transform(X)``; for a model or a cache, the transform of the
        activations the fit collected (no second forward pass).
        """
        rows: Dict[int, Tensor] = {}
        self._fit_rows = rows
        try:
            self.fit(X, y, **fit_params)
        finally:
            del self._fit_rows
        out = self.transform({k: rows[k] for k in self.layers_})
        return out.numpy() if _holds_numpy(X) else out

    # --- patch builders ---
    def _pick_layers(self, layers) -> List[int]:
        self.check_fitted()
        if layers is None:
            return list(self.layers_)
        if isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
            layers = [layers]
        n = self.model_meta_.get("n_layers")
        out = []
        for layer in layers:
            r = int(layer) if n is None and isinstance(layer, numbers.Integral) and layer >= 0 else \
                adapter.resolve_layer(int(n) if n is not None else 0, layer)
            if r not in self.axes_:
                raise LayerIndexError(f"the axis was not fitted on layer {layer} (resolved to {r}); it has layers "
                                      f"{list(self.layers_)}. Fit EntropyAxis(layer=[...]) including it.")
            out.append(r)
        return sorted(set(out))

    def _parts(self, op: str, layers, *, lam=1.0, amount_sigmas=None, directions=None,
               center: bool = False) -> List[PatchPart]:
        parts = []
        for layer in self._pick_layers(layers):
            u = self.axes_[layer] if directions is None else directions[layer]
            if not bool(torch.isfinite(u).all()):
                raise NonFiniteError(f"the axis at layer {layer} contains NaN or infinity; refit it.")
            amount = 0.0
            if op == "shift":
                sig = self.sigma_[layer]
                if not math.isfinite(sig):
                    raise InvalidInputError(f"shift needs the coordinate's σ at layer {layer}; fit the axis on "
                                            "prompts or pass sigma= to EntropyAxis.from_directions.")
                amount = amount_sigmas * sig
            mean = None
            if center and op != "shift":
                mu = self.means_[layer].float()
                if not bool(mu.ne(0).any()):
                    raise InvalidInputError(
                        f"center=True needs the mean activation at layer {layer}, which this axis does not have "
                        "(made by from_directions without means=); fit the axis on prompts or pass means=.")
                mean = mu.clone()
            # one route for the axis and its controls: every part hooks the site itself (hook_v)
            parts.append(PatchPart(layer=layer, hook_name=self.hook_names_[layer], site=self.site_, op=op,
                                   direction=u.float().clone(), lam=float(lam), amount=float(amount), mean=mean))
        return parts

    @property
    def basis_(self) -> str:
        """The weight basis the axis was fitted in: ``"processed"`` (folded/centred weights, e.g.
        ``HookedTransformer.from_pretrained``), ``"raw"`` or ``"unknown"`` (fitted on arrays)."""
        self.check_fitted()
        meta = self.model_meta_
        if meta.get("basis"):
            return str(meta["basis"])
        processed = meta.get("processed")
        return "unknown" if processed is None else ("processed" if processed else "raw")

    def _warn_basis(self, what: str, center: bool, op: str) -> None:
        """Warn when weight processing changed what ``op`` acts on at this axis's site (site-aware).

        ``site="v"``: value biases folded out of ``hook_v`` (``fold_value_biases``) shift v by a constant,
        which changes an uncentred removal / keep-only (not a shift; ``center=True`` undoes it).
        ``site="resid_post"``: centred writing weights (``center_writing_weights``) project the residual
        onto the mean-zero subspace, which changes the direction itself and so every intervention
        along it (``center=True`` does not undo it). Folded layer norm and a centred unembedding change
        neither site; value biases do not change ``resid_post`` (b_V·W_O reaches it through b_O).
        """
        meta = getattr(self, "model_meta_", None) or {}
        if self.site_ == "v":
            if center or op == "shift" or not meta.get("value_bias_folded"):
                return
            warnings.warn(
                f"{what}: this axis was fitted on a model whose value biases were folded out of hook_v "
                f"({meta.get('processing')}; fold_value_biases), so hook_v there is the raw value minus "
                "b_V and v − (v·u)u is a different intervention than on the raw model (METHODS.md §7 defines it on "
                "raw activations). Pass center=True (removes the coordinate's deviation from its mean: the same "
                "intervention in either basis) or fit on raw weights (from_pretrained_no_processing).",
                UserWarning, stacklevel=3)
        elif meta.get("writing_weights_centred"):
            warnings.warn(
                f"{what}: this resid_post axis was fitted on a model whose writing weights were centred "
                f"({meta.get('processing')}; center_writing_weights), so hook_resid_post there is the raw residual "
                "with its mean over d_model removed: the axis direction, and every removal, keep-only or shift "
                "along it, differ from the raw model's (center=True does not undo this). Fit on a model loaded with "
                "center_writing_weights=False (or from_pretrained_no_processing) to match the raw model, or use "
                "site='v', which centring leaves unchanged.", UserWarning, stacklevel=3)

    @staticmethod
    def _layer_tag(layers) -> str:
        return "L" + ",".join(str(x) for x in layers)

    def removal(self, lam: float = 1.0, *, layers=None, center: bool = False) -> Patch:
        """v ← v − λ (v·u) u at every position (λ = 1: full removal; λ = 0: no change).

        One hook per layer on the site's own hook point (``blocks.{l}.attn.hook_v``): v moves along u so
        that its coordinate c = v·u becomes (1 − λ)·c (:func:`bayes_lens.hookpoints.move_along`, the same
        function and hook as :meth:`random_control`'s). The pairs work in plain TransformerLens
        (``model.run_with_hooks(tokens, fwd_hooks=list(axis.removal()))``), no ``bl.attach`` needed. For
        λ = 1 it equals zero-ablating the coordinate hook point ``blocks.{l}.hook_v_axis`` of an attached model.

        ``center=True``: v ← v − λ ((v − μ)·u) u with μ the fitted mean (the coordinate operation
        ``c ↦ c − λ (c − μ·u)``): the coordinate is set to its mean instead of 0. It is invariant
        to a constant shift of v, so a processed model (``fold_value_biases`` moves b_V out of
        ``hook_v``) and its raw twin get the same intervention; the uncentred removal warns on such
        a processed model.
        """
        lam = finite_float(lam, "lam")
        parts = self._parts("removal", layers, lam=lam, center=center)
        self._warn_basis("removal", center, "removal")
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"removal{' centred' if center else ''} λ={lam:g} @{tag}", kind="removal",
                     axis=self, params={"lam": lam, "center": bool(center)}, model_meta=self.model_meta_)

    def keep_only(self, *, layers=None, center: bool = False) -> Patch:
        """v ← (v·u) u at every position: only the axis component survives (``center=True``:
        v ← μ + ((v − μ)·u) u, the same intervention in a processed and a raw basis)."""
        parts = self._parts("keep_only", layers, center=center)
        self._warn_basis("keep_only", center, "keep_only")
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"keep-only{' centred' if center else ''} @{tag}", kind="keep_only", axis=self,
                     params={"center": bool(center)}, model_meta=self.model_meta_)

    def shift(self, sigmas: float, *, layers=None) -> Patch:
        """v ← v + s·σ·u at every position (σ: std of the clean coordinate at that layer): one hook per
        layer on the site's own hook point (``hook_v``) moving the coordinate c ↦ c + s·σ, as in
        :meth:`removal`; no ``bl.attach`` needed."""
        sigmas = finite_float(sigmas, "sigmas")
        parts = self._parts("shift", layers, amount_sigmas=sigmas)
        self._warn_basis("shift", False, "shift")
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"shift {sigmas:+g}σ @{tag}", kind="shift", axis=self,
                     params={"sigmas": sigmas}, model_meta=self.model_meta_)

    def random_direction(self, layer: int, *, seed: int) -> Tensor:
        """A seeded random unit vector orthogonal to the axis at ``layer`` (float32)."""
        seed = check_seed(seed)
        layer = self._pick_layers([layer])[0]
        u = self.axes_[layer].double().numpy()
        u = u / np.linalg.norm(u)
        rng = np.random.default_rng([int(seed), int(layer)])
        r = rng.standard_normal(u.shape[0])
        for _ in range(2):  # Gram–Schmidt twice for orthogonality at float precision
            r = r - (r @ u) * u
        r = r / np.linalg.norm(r)
        return torch.tensor(r, dtype=torch.float32)

    def random_control(self, *positional, seed: Optional[int] = None, op: str = "removal", lam: float = 1.0,
                       sigmas: Optional[float] = None, layers=None, center: bool = False) -> Patch:
        """The same intervention along a random direction orthogonal to the axis (one per layer).

        ``op`` is ``"removal"`` (with ``lam``), ``"keep_only"`` or ``"shift"`` (by ``sigmas``·σ of the
        *axis* coordinate, so the perturbation has the same size). ``seed`` makes it reproducible.
        ``center`` as in :meth:`removal`.
        """
        if positional or seed is None:  # by name only: a bare TypeError said nothing of how to call it
            raise InvalidInputError(f"random_control takes its seed by name: use seed={positional[0]!r}, e.g. "
                                    f"axis.random_control(seed={positional[0]!r})." if positional else
                                    "random_control needs a seed: e.g. axis.random_control(seed=0).")
        check_choice(op, "op", ("removal", "keep_only", "shift"))
        lam = finite_float(lam, "lam")
        if op == "shift":
            sigmas = finite_float(1.0 if sigmas is None else sigmas, "sigmas")
        picked = self._pick_layers(layers)
        self._warn_basis(f"random_control(op={op!r})", center, op)
        dirs = {layer: self.random_direction(layer, seed=seed) for layer in picked}
        parts = self._parts(op, picked, lam=lam, amount_sigmas=sigmas, directions=dirs, center=center)
        tag = self._layer_tag(picked)
        what = {"removal": f"removal λ={lam:g}", "keep_only": "keep-only",
                "shift": f"shift {sigmas if sigmas is not None else 0:+g}σ"}[op]
        group = f"random ⟂ {what}{' centred' if center and op != 'shift' else ''} @{tag}"
        params = {"lam": lam, "sigmas": sigmas, "group": group, "center": bool(center)}
        return Patch(parts, label=f"{group} (seed {seed})", kind=op, axis=self, random_seed=int(seed),
                     params=params, model_meta=self.model_meta_)

    # --- save / load ---
    def _metadata(self) -> dict:
        return {
            "format_version": _FORMAT_VERSION,
            "params": {k: (list(v) if isinstance(v, (list, tuple)) else v)
                       for k, v in self.get_params().items() if k not in ("progress",)},
            "layers": list(self.layers_),
            "site": self.site_,
            "hook_names": {str(k): v for k, v in self.hook_names_.items()},
            "sigma": {str(k): v for k, v in self.sigma_.items()},
            "explained_variance_ratio": {str(k): v for k, v in self.explained_variance_ratio_.items()},
            "entropy_correlation": {str(k): v for k, v in self.entropy_correlation_.items()},
            "entropy_kind": getattr(self, "entropy_kind_", None),
            "model": self.model_meta_,
            "versions": self.versions_,
            "n_prompts": self.n_prompts_,
        }

    def save(self, path) -> Path:
        """Write the fitted axis to ``path``: ``.safetensors`` (default) or ``.npz``; metadata as JSON inside.

        No pickle: tensors are stored as arrays, everything else as a JSON string (the safetensors
        header's metadata, or a unicode array in the npz), with a SHA-256 of every tensor that
        :meth:`load` checks. The file is written under a temporary name and renamed into place, so an
        interrupted save never leaves a half-written axis.
        """
        self.check_fitted()
        path = Path(path)
        if not path.parent.is_dir():
            raise InvalidInputError(f"cannot save the axis to {path}: the folder {path.parent} does not exist; "
                                    "create it first.")
        tensors = {}
        for k in self.layers_:
            tensors[f"axis.{k}"] = self.axes_[k].contiguous()
            tensors[f"mean.{k}"] = self.means_[k].contiguous()
            tensors[f"scale.{k}"] = self.scales_[k].contiguous()
        meta_dict = self._metadata()
        meta_dict["sha256"] = {name: _tensor_sha256(t) for name, t in tensors.items()}
        meta_dict = json.loads(json.dumps(meta_dict, allow_nan=True))  # the form load() reads back
        meta_dict[_META_SHA] = sha256_json(meta_dict)
        meta = json.dumps(meta_dict, allow_nan=True)
        if path.suffix != ".npz" and path.suffix != ".safetensors":
            path = path.with_name(path.name + ".safetensors")
        if path.suffix == ".npz":
            def write(tmp):
                with open(tmp, "wb") as fh:
                    np.savez(fh, __meta__=np.array(meta), **{k: v.numpy() for k, v in tensors.items()})
        else:
            from safetensors.torch import save_file

            def write(tmp):
                save_file(tensors, tmp, metadata={_META_KEY: meta})
        write_atomic(path, write)
        return path

    def export_paper_a(self, folder) -> List[Path]:
        """Write one ``entropy_axis_L{layer}_model.npz`` per layer into ``folder``, the files Paper A's SULA
        pipeline reads (its ``u_ent`` ``[dim]`` and ``sigma_pc1`` keys), with a superset of fields: ``layer``,
        ``site``, ``hook_name``, ``mean``, ``scale``, ``explained_variance_ratio``, ``entropy_correlation``
        and ``metadata`` (this axis's :meth:`save` metadata as a JSON string). Each file is written
        atomically; ``u_ent`` is the unit axis (the reader normalizes it again), ``sigma_pc1`` the clean
        coordinate's standard deviation (NaN for an axis made without one: the reader then uses 1).

        >>> axis = bl.EntropyAxis(layer=-1).fit(model, bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4))
        >>> import tempfile; [p.name for p in axis.export_paper_a(tempfile.mkdtemp())]
        ['entropy_axis_L1_model.npz']
        """
        self.check_fitted()
        folder = Path(folder)
        if not folder.is_dir():
            raise InvalidInputError(f"cannot export the axis to {folder}: not an existing folder; create it first.")
        meta = json.dumps(json.loads(json.dumps(self._metadata(), allow_nan=True)), allow_nan=True)
        out = []
        for k in self.layers_:
            arrays = {"u_ent": self.axes_[k].numpy().astype(np.float32), "sigma_pc1": np.float64(self.sigma_[k]),
                      "layer": np.int64(k), "site": np.array(self.site_), "hook_name": np.array(self.hook_names_[k]),
                      "mean": self.means_[k].numpy(), "scale": self.scales_[k].numpy(),
                      "explained_variance_ratio": np.float64(self.explained_variance_ratio_[k]),
                      "entropy_correlation": np.float64(self.entropy_correlation_[k]), "metadata": np.array(meta)}
            path = folder / f"entropy_axis_L{k}_model.npz"

            def write(tmp, arrays=arrays):
                with open(tmp, "wb") as fh:
                    np.savez(fh, **arrays)
            write_atomic(path, write)
            out.append(path)
        return out

    @classmethod
    def load(cls, path, model=None, *, strict: bool = False, trust_unverified: bool = False) -> "EntropyAxis":
        """Read an axis written by :meth:`save`; with ``model``, check that it fits that model.

        Every tensor's SHA-256 and the metadata's are checked, and its shape, finiteness, unit length
        (axes) and non-negative scale; malformed metadata is a :class:`~bayes_lens.CheckpointError`. A
        different site dimension or too few layers raise CheckpointError; a different weight processing
        (basis) or model name warns, or raises with ``strict=True``. Files of the older formats 1 (no
        checksums) and 2 (none over the metadata) are refused, since a current file with its checksums
        removed looks the same; ``trust_unverified=True`` loads one you trust (with a warning), and
        :meth:`save` then writes it with the checksums.
        """
        path = Path(path)
        if not path.exists():
            raise CheckpointError(f"no axis file at {path}.")
        try:
            if path.suffix == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(str(z["__meta__"]))
                    tensors = {k: torch.from_numpy(z[k].copy()) for k in z.files if k != "__meta__"}
            else:
                from safetensors import safe_open

                with safe_open(str(path), framework="pt") as f:
                    meta = json.loads((f.metadata() or {})[_META_KEY])
                    tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:  # noqa: BLE001 - any parse failure is a bad checkpoint
            raise CheckpointError(
                f"{path} is not a readable bayes_lens axis file ({type(err).__name__}: {err}).") from err
        try:
            return cls._from_saved(path, meta, tensors, model, strict, trust_unverified)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(f"{path}: malformed axis metadata ({type(err).__name__}: {err}); the file is "
                                  "damaged or was not written by EntropyAxis.save.") from err

    @classmethod
    def _from_saved(cls, path, meta, tensors, model, strict, trust_unverified=False) -> "EntropyAxis":
        if not isinstance(meta, dict) or meta.get("format_version") not in _READABLE_VERSIONS:
            version = meta.get("format_version") if isinstance(meta, dict) else None
            raise CheckpointError(f"{path} has axis format {version!r}; this bayes_lens reads {_READABLE_VERSIONS}.")
        _verify(path, meta, tensors, trust_unverified)
        params = meta["params"]
        if not isinstance(params, dict) or set(params) - set(cls().get_params()):
            raise CheckpointError(f"{path}: unknown axis parameters {sorted(set(params) - set(cls().get_params()))}.")
        axis = cls(**params)
        layers = meta["layers"]
        if (not isinstance(layers, list) or not layers
                or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in layers)):
            raise CheckpointError(f"{path}: the axis layers {layers!r} are not a list of non-negative integers.")
        if meta.get("site") not in VECTOR_SITES:
            raise CheckpointError(f"{path}: unknown site {meta.get('site')!r}.")
        try:
            axes = {k: tensors[f"axis.{k}"].float() for k in layers}
            means = {k: tensors[f"mean.{k}"].float() for k in layers}
            scales = {k: tensors[f"scale.{k}"].float() for k in layers}
        except KeyError as err:
            raise CheckpointError(f"{path} lacks the tensor {err}; the file is truncated or not an axis.") from err
        dim = int(meta["model"]["dim"])
        for k in layers:
            for what, t in (("axis", axes[k]), ("mean", means[k]), ("scale", scales[k])):
                if t.ndim != 1 or t.shape[0] != dim or not bool(torch.isfinite(t).all()):
                    raise CheckpointError(f"{path}: the {what} at layer {k} is not a finite vector of dimension {dim}.")
            if abs(float(axes[k].double().norm()) - 1.0) > 1e-4:
                raise CheckpointError(f"{path}: the axis at layer {k} is not unit length; the file is corrupted.")
            if bool((scales[k] < 0).any()):
                raise CheckpointError(f"{path}: the scale at layer {k} has negative entries; the file is corrupted.")
        if model is not None:
            check_loaded(meta, model, path, strict)

        def fl(d):
            return {int(k): (float("nan") if v is None else float(v)) for k, v in d.items()}

        axis.site = meta["site"]
        axis._set_fitted(model, meta["model"], axes, means, scales, fl(meta["sigma"]),
                         fl(meta["explained_variance_ratio"]), fl(meta["entropy_correlation"]),
                         n_prompts=meta["n_prompts"], versions=meta["versions"])
        axis.entropy_kind_ = meta.get("entropy_kind")
        return axis

    def __repr__(self) -> str:
        # ours, not BaseEstimator's: every parameter that changes the axis (sklearn shows only non-default
        # ones) and the fitted layers
        p = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("layer", "site", "standardize", "sign_by"))
        fitted = f" fitted on layers {list(self.layers_)}" if hasattr(self, "layers_") else ""
        return f"EntropyAxis({p}){fitted}"


def _holds_numpy(X) -> bool:
    """Whether ``X`` is a numpy array or a non-empty dict of them (transform then returns numpy)."""
    if isinstance(X, dict):
        return bool(X) and all(isinstance(v, np.ndarray) for v in X.values())
    return isinstance(X, np.ndarray)


def check_loaded(meta: dict, model, path, strict: bool) -> None:
    """Refuse (CheckpointError) or warn when a saved axis does not fit ``model``."""
    info = adapter.model_info(model)
    saved = meta["model"]
    dim = site_dim(info, meta["site"])
    if int(saved["dim"]) != dim:
        raise CheckpointError(
            f"{path} holds an axis of dimension {saved['dim']} for site {meta['site']!r} (model "
            f"{saved['model_name']!r}), but this model's site has dimension {dim}; refit the axis on this model.")
    if max(int(k) for k in meta["layers"]) >= info.n_layers:
        raise CheckpointError(f"{path} has axes on layers {meta['layers']} but the model has {info.n_layers} layers.")
    problems = []
    if saved.get("processed") is not None and bool(saved["processed"]) != bool(info.processed):
        problems.append(f"weights were {saved['processing']!r} when fitted but are {info.processing!r} now "
                        "(another basis: the direction does not carry over)")
    if saved.get("n_layers") is not None and (saved["model_name"] != info.name
                                              or int(saved["n_layers"]) != info.n_layers):
        problems.append(f"fitted on {saved['model_name']!r} ({saved['n_layers']} layers), loading onto "
                        f"{info.name!r} ({info.n_layers} layers)")
    if problems:
        msg = f"{path}: " + "; ".join(problems) + "."
        if strict:
            raise CheckpointError(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)


