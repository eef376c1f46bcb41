"""Entropy-axis ablation: fit the axis, patch it out, and compare the patched model with the clean one.

Paper A (arXiv 2512.23752, §4.5–4.6, §6.2, §7.1; METHODS.md §7) asks whether a model *uses* the
entropy-ordered direction of its value space. This module answers with three public names:

* :class:`EntropyAxis` — the axis u at layer ℓ: PC1 of the final-token value vectors (``hook_v``
  flattened over the *key/value* heads, the paper's site; or ``hook_resid_post``) across prompts,
  signed so that its coordinate correlates non-negatively with the model's entropy (or the Bayes
  entropy of SULA prompts). Two documented ways to obtain a direction that acts on *raw*
  activations (METHODS.md §7):

  - ``standardize="std"`` (**default**): z-score each coordinate across prompts (zero-variance
    coordinates get weight 0), take PC1 ``w`` of the standardized values as in the value-manifold
    metric (METHODS.md §1), and map it back: u = (w / σ) / ‖w / σ‖. The raw coordinate v·u is then
    an affine function of the standardized PC1 score, so removing u removes exactly the PC1 that
    the geometry metrics report.
  - ``standardize="raw"``: PC1 of the raw centred values (u is the top eigenvector of their
    covariance).

* Patches (:class:`Patch`), built by the axis and applied at **every position** of the hook
  (before attention mixes the values, for ``site="v"``); ``hook_v`` ``[batch, pos, n_kv, d_head]``
  is flattened to ``[batch, pos, n_kv·d_head]``, patched, and reshaped back:

  - ``axis.removal(lam)``: v ← v − λ (v·u) u (λ = 1 removes the component; λ = 0 is a no-op — the
    paper's public code had λ reversed, with 0 meaning removal: not copied here);
  - ``axis.keep_only()``: v ← (v·u) u;
  - ``axis.shift(s)``: v ← v + s·σ·u, σ the standard deviation of the clean coordinate;
  - ``axis.random_control(seed)``: the same intervention along a random unit direction r,
    orthogonalized against u (a seeded Gaussian draw per layer, Gram–Schmidt); a random shift moves
    by the same distance s·σ.

  A patch is an iterable of ``(hook_name, fn)`` pairs — one per layer — so
  ``model.hooks(fwd_hooks=list(patch))`` and ``model.run_with_hooks(x, fwd_hooks=list(patch))``
  work as in TransformerLens; patches combine with ``+`` (list concatenation of their pairs).
  Layers are resolved with :func:`bayes_lens.adapter.resolve_layer` and hook names are checked
  with :func:`bayes_lens.adapter.check_hooks`: an out-of-range layer such as the paper's "−1"
  fails loudly instead of silently matching nothing.

* ``with patched(model, patches): ...`` runs the model with the patches; every hook is removed on
  exit, also when the body raises.

* :func:`compare_patched` — clean vs each patch (random controls summarized over seeds): the
  correlation of the *clean-fitted* axis coordinate with the model's entropy (and with the Bayes
  entropy on SULA prompts) read at the patched layer and at later layers, and the SULA calibration
  (MAE of model vs Bayes entropy, Pearson of the two; METHODS.md §6, via
  :func:`bayes_lens.sula.evaluate` with the patches as ``fwd_hooks``), each with a paired bootstrap
  CI (over prompts) of the difference from clean. Paper A: single-layer removal takes the
  axis–entropy correlation from ≈0.27–0.32 to ≈0 while SULA MAE and correlation move by < 1%.

Example
-------
>>> import bayes_lens as bl                                                        # doctest: +SKIP
>>> model = bl.load_model()                                                        # doctest: +SKIP
>>> prompts = bl.sula.make_prompts(model, n_per_k=20)                              # doctest: +SKIP
>>> axis = bl.EntropyAxis(layer=-1).fit(model, prompts)                            # doctest: +SKIP
>>> with bl.patched(model, axis.removal()):                                        # doctest: +SKIP
...     logits = model("w1: dax, w2: dax. query:")
>>> cmp = bl.compare_patched(model, prompts, [axis.removal(), axis.keep_only()])  # doctest: +SKIP
>>> cmp.table; cmp.plot()                                                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from . import adapter
from ._results import Result, plotly
from .errors import CheckpointError, InvalidInputError, LayerIndexError, NonFiniteError

__all__ = ["EntropyAxis", "Patch", "patched", "compare_patched", "PatchComparison"]

_SITES = ("v", "resid_post")
_STANDARDIZE = ("std", "raw")
_SIGN_BY = ("model", "bayes")
_FORMAT_VERSION = 1
_META_KEY = "bayes_lens_entropy_axis"
# a coordinate whose spread fell below this fraction of the clean spread is "removed"
_DEGENERATE_RATIO = 1e-4


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------


def _library_versions() -> Dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("bayes-lens", "transformer-lens", "torch", "transformers", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:  # pragma: no cover - depends on the environment
            out[pkg] = "not installed"
    return out


def _site_dim(info: adapter.ModelInfo, site: str) -> int:
    return info.kv_dim if site == "v" else info.d_model


def _model_meta(model, site: str) -> dict:
    info = adapter.model_info(model)
    return {
        "model_name": info.name,
        "model_kind": info.kind,
        "n_layers": info.n_layers,
        "n_kv_heads": info.n_kv_heads,
        "d_head": info.d_head,
        "d_model": info.d_model,
        "dim": _site_dim(info, site),
        "processed": bool(info.processed),
        "processing": info.processing,
    }


def _check_site(site) -> str:
    if site not in _SITES:
        raise InvalidInputError(f"site must be one of {_SITES} ('v' = hook_v flattened over KV heads, the "
                                f"paper's site; 'resid_post' = the residual stream), got {site!r}.")
    return site


def _finite_float(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        if isinstance(x, Tensor) and x.numel() == 1:
            x = float(x)
        else:
            raise InvalidInputError(f"{name} must be a real number, got {x!r}.")
    x = float(x)
    if not math.isfinite(x):
        raise InvalidInputError(f"{name} must be finite, got {x}; use e.g. {name}=1.0.")
    return x


def _unit(vec, name: str, dim: Optional[int] = None) -> np.ndarray:
    """A finite, non-zero vector as a float64 unit vector (errors name what is wrong)."""
    if isinstance(vec, Tensor):
        vec = vec.detach().cpu().double().numpy()
    u = np.asarray(vec, dtype=np.float64)
    if u.ndim != 1:
        raise InvalidInputError(f"{name} must be a 1-D vector, got shape {list(u.shape)}.")
    if dim is not None and u.shape[0] != dim:
        raise InvalidInputError(
            f"{name} has dimension {u.shape[0]} but the site has dimension {dim} (hook_v: n_kv_heads·d_head; "
            "resid_post: d_model); fit the axis on this model or pass a vector of the right size.")
    if not np.all(np.isfinite(u)):
        raise NonFiniteError(f"{name} contains NaN or infinity; refit the axis (are the activations finite?).")
    norm = float(np.linalg.norm(u))
    if norm == 0.0:
        raise InvalidInputError(f"{name} is the zero vector; an axis needs a direction.")
    return u / norm


def _is_sula_item(p) -> bool:
    return hasattr(p, "text") and hasattr(p, "bayes_entropy_bits") and hasattr(p, "labels")


def _prompt_data(prompts) -> Tuple[List[str], Optional[np.ndarray]]:
    """(texts, Bayes entropies for SULA items or None for plain strings)."""
    if isinstance(prompts, str):
        raise InvalidInputError("prompts must be a list of strings or SULA items, not one string; wrap it.")
    items = list(prompts)
    if not items:
        raise InvalidInputError("the prompt list is empty; pass at least one prompt.")
    if all(_is_sula_item(p) for p in items):  # (SULA items are str subclasses: test them first)
        return [p.text for p in items], np.array([float(p.bayes_entropy_bits) for p in items])
    if all(isinstance(p, str) for p in items):
        return [str(p) for p in items], None
    bad = next(i for i, p in enumerate(items) if not (isinstance(p, str) or _is_sula_item(p)))
    raise InvalidInputError(
        f"prompt {bad} is a {type(items[bad]).__name__}; expected all strings or all SULA items "
        "(from bl.sula.make_prompts).")


def _reader_hooks(model, layers: Sequence[int], site: str, store: dict) -> list:
    """Read hooks storing (global prompt indices, final-real-token rows) per layer.

    They rely on :func:`bayes_lens.collect.forward_batches` (used by ``collect`` and
    ``sula.evaluate``) to publish the batch in flight, so rows can be put back in prompt order
    whatever the batching.
    """
    from .hooks import current_batch, final_rows

    hooks = []
    for layer in layers:
        name = adapter.hook_name(model, layer, site)

        def fn(act, hook=None, _layer=layer, _name=name):
            ctx = current_batch()
            if ctx is None:  # pragma: no cover - only if a caller stops using forward_batches
                raise InvalidInputError("internal: the read hook ran outside bayes_lens.collect.forward_batches.")
            store.setdefault(_layer, []).append((ctx.indices.cpu(), final_rows(act, what=_name)))
            return None

        hooks.append((name, fn))
    adapter.check_hooks(model, [n for n, _ in hooks])
    return hooks


def _assemble(store: dict, layers: Sequence[int], n: int) -> Dict[int, np.ndarray]:
    out = {}
    for layer in layers:
        parts = store.get(layer, [])
        idx = torch.cat([i for i, _ in parts]) if parts else torch.zeros(0, dtype=torch.long)
        if idx.numel() != n or not torch.equal(torch.sort(idx).values, torch.arange(n)):
            raise InvalidInputError(f"the read hook at layer {layer} did not fire exactly once per prompt.")
        rows = torch.cat([r for _, r in parts]).double().numpy()
        out[layer] = rows[np.argsort(idx.numpy(), kind="stable")]
    return out


# sula.evaluate's own bootstrap is not used here (compare_patched does its paired bootstrap)
_EVAL_BOOT = 20


def _run(model, prompts, texts: List[str], is_sula: bool, site: str, layers: Sequence[int], pairs,
         batch_size: int, progress) -> Tuple[Dict[int, np.ndarray], np.ndarray]:
    """One pass over the prompts with ``pairs`` active: final-token activations at ``layers`` and the
    model's entropy (bits): over the two SULA labels via :func:`bayes_lens.sula.evaluate` for SULA
    items, the full next-token entropy via :func:`bayes_lens.collect.collect` for strings."""
    store: dict = {}
    hooks = list(pairs) + _reader_hooks(model, layers, site, store)
    if is_sula:
        from . import sula

        ev = sula.evaluate(model, prompts, fwd_hooks=hooks, batch_size=batch_size, n_boot=_EVAL_BOOT,
                           progress=progress)
        h = ev.model_entropy_bits.detach().cpu().double().numpy()
    else:
        from .collect import collect

        col = collect(model, texts, fwd_hooks=hooks, batch_size=batch_size, progress=progress)
        h = col.next_token_entropy_bits.double().numpy()
    return _assemble(store, layers, len(texts)), np.asarray(h, dtype=np.float64)


def _pc1(x: np.ndarray, standardize: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(u raw-space unit vector, mean, per-coordinate scale, explained-variance ratio of PC1).

    ``x`` is [n, d] float64. "raw": PC1 of centred x. "std": PC1 w of z-scored x (zero-variance
    coordinates dropped, :func:`bayes_lens.metrics.pca.pca`), mapped back u ∝ w / σ. The
    explained-variance ratio is in the space where the PCA was run.
    """
    from .metrics.pca import pca

    fit = pca(x, 1, standardized=(standardize == "std"))
    w = fit.components[0]
    if standardize == "std":
        u = np.zeros(x.shape[1])
        u[fit.kept] = w / fit.scale[fit.kept]
        scale = fit.scale
    else:
        u = w
        scale = np.ones(x.shape[1])
    return u / np.linalg.norm(u), fit.mean, scale, float(fit.explained_variance_ratio[0])


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Part:
    """One layer of a patch: the hook, the direction and the operation."""

    layer: int
    hook_name: str
    site: str
    op: str  # "removal" | "keep_only" | "shift"
    direction: Tensor  # float32 unit vector [dim]
    lam: float = 1.0  # removal strength
    amount: float = 0.0  # shift distance (s·σ), in activation units

    def apply(self, act: Tensor) -> Tensor:
        shape = act.shape
        dim = self.direction.shape[0]
        if self.site == "v" and act.ndim == 4:
            flat = act.reshape(*shape[:-2], shape[-2] * shape[-1])
        else:
            flat = act
        if flat.shape[-1] != dim:
            raise InvalidInputError(
                f"the patch at {self.hook_name} has dimension {dim} but the activation there is "
                f"{list(shape)} ({flat.shape[-1]} per position); the axis was fitted on another model.")
        work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
        u = self.direction.to(device=work.device, dtype=work.dtype)
        if self.op == "shift":
            out = work + self.amount * u
        else:
            coord = (work @ u).unsqueeze(-1)
            out = work - self.lam * coord * u if self.op == "removal" else coord * u
        return out.to(act.dtype).reshape(shape)

    def hook_fn(self, act: Tensor, hook=None) -> Tensor:
        return self.apply(act)


class Patch:
    """An intervention (possibly at several layers): an iterable of ``(hook_name, fn)`` pairs.

    Made by :class:`EntropyAxis` (``removal``, ``keep_only``, ``shift``, ``random_control``). Use it
    as ``with bl.patched(model, patch):``, ``model.hooks(fwd_hooks=list(patch))`` or
    ``model.run_with_hooks(tokens, fwd_hooks=list(patch))``. ``patch_a + patch_b`` applies both.

    Attributes: ``label``, ``kind`` (``"removal"``, ``"keep_only"``, ``"shift"``, ``"combined"``),
    ``layers``, ``hook_names``, ``site``, ``random_seed`` (None unless a random control),
    ``directions`` (layer → unit vector), ``axis`` (the :class:`EntropyAxis` it came from).
    """

    def __init__(self, parts: Sequence[_Part], *, label: str, kind: str, axis: Optional["EntropyAxis"] = None,
                 random_seed: Optional[int] = None, params: Optional[dict] = None,
                 model_meta: Optional[dict] = None):
        self._parts = tuple(parts)
        self.label = label
        self.kind = kind
        self.axis = axis
        self.random_seed = random_seed
        self.params = dict(params or {})
        self.model_meta = model_meta
        self._pairs = tuple((p.hook_name, p.hook_fn) for p in self._parts)

    # --- the [(hook_name, fn)] protocol ---
    def __iter__(self) -> Iterator[Tuple[str, Callable]]:
        return iter(self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, i):
        return self._pairs[i]

    def __add__(self, other):
        if isinstance(other, Patch):
            site = self.site if self.site == other.site else "mixed"
            return Patch(self._parts + other._parts, label=f"{self.label} + {other.label}", kind="combined",
                         axis=self.axis if self.axis is other.axis else None,
                         model_meta=self.model_meta if site != "mixed" else None)
        if isinstance(other, (list, tuple)):
            return list(self) + list(other)
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, (list, tuple)):
            return list(other) + list(self)
        return NotImplemented

    # --- description ---
    @property
    def layers(self) -> Tuple[int, ...]:
        return tuple(p.layer for p in self._parts)

    @property
    def hook_names(self) -> Tuple[str, ...]:
        return tuple(p.hook_name for p in self._parts)

    @property
    def site(self) -> str:
        sites = {p.site for p in self._parts}
        return sites.pop() if len(sites) == 1 else "mixed"

    @property
    def directions(self) -> Dict[int, Tensor]:
        return {p.layer: p.direction.clone() for p in self._parts}

    @property
    def is_random_control(self) -> bool:
        return self.random_seed is not None

    @property
    def group(self) -> str:
        """The label without the seed: random controls of different seeds share a group."""
        return self.params.get("group", self.label)

    def random_like(self, seed: int) -> "Patch":
        """The random-direction control of this patch: same op, λ/shift, layers and site."""
        if self.axis is None or self.kind not in ("removal", "keep_only", "shift"):
            raise InvalidInputError("random_like needs a patch made by an EntropyAxis (removal, keep_only or shift).")
        return self.axis.random_control(seed, op=self.kind, lam=self.params.get("lam", 1.0),
                                        sigmas=self.params.get("sigmas"), layers=self.layers)

    def __repr__(self) -> str:
        return f"Patch({self.label!r}, hooks={list(self.hook_names)})"


def _flatten_pairs(patches) -> List[Tuple[str, Callable]]:
    if patches is None:
        return []
    if isinstance(patches, Patch):
        return list(patches)
    if (isinstance(patches, tuple) and len(patches) == 2 and isinstance(patches[0], str)
            and callable(patches[1])):
        return [patches]
    if isinstance(patches, (str, bytes)) or not hasattr(patches, "__iter__"):
        raise InvalidInputError(f"patches must be a Patch, a (hook_name, fn) pair, or a list of those; "
                                f"got {type(patches).__name__}.")
    out = []
    for p in patches:
        out += _flatten_pairs(p)
    return out


def _patch_objects(patches) -> List[Patch]:
    if isinstance(patches, Patch):
        return [patches]
    if isinstance(patches, (list, tuple)) and not (len(patches) == 2 and isinstance(patches[0], str)):
        return [q for p in patches for q in _patch_objects(p)]
    return []


def _check_against_model(model, patch: Patch) -> None:
    """Refuse a patch of the wrong shape for ``model``; warn when the weight basis differs."""
    info = adapter.model_info(model)
    for part in patch._parts:
        if part.layer >= info.n_layers:
            raise LayerIndexError(f"the patch acts on layer {part.layer} but the model has {info.n_layers} layers.")
        dim = _site_dim(info, part.site)
        if part.direction.shape[0] != dim:
            raise InvalidInputError(
                f"the patch {patch.label!r} has an axis of dimension {part.direction.shape[0]} at {part.hook_name}, "
                f"but this model's {part.site!r} site has dimension {dim}; fit the axis on this model.")
    meta = patch.model_meta
    if meta is not None and bool(meta.get("processed")) != bool(info.processed):
        warnings.warn(
            f"the patch {patch.label!r} was fitted on a model with {meta.get('processing')!r} but this model has "
            f"{info.processing!r}: a direction measured in one weight basis is wrong in the other "
            "(METHODS.md §0 'Weights'). Refit the axis on this model.", UserWarning, stacklevel=3)


def _resolve_pairs(model, patches) -> List[Tuple[str, Callable]]:
    adapter._check_model(model)
    pairs = _flatten_pairs(patches)
    for name, fn in pairs:
        if not isinstance(name, str) or not callable(fn):
            raise InvalidInputError(f"each hook must be a (hook_name: str, fn: callable) pair, got ({name!r}, {fn!r}).")
    for p in _patch_objects(patches):
        _check_against_model(model, p)
    adapter.check_hooks(model, sorted({n for n, _ in pairs}))
    return pairs


@contextlib.contextmanager
def patched(model, patches):
    """Run ``model`` with ``patches`` inside the block; all their hooks are removed on exit, also on error.

    ``patches`` is a :class:`Patch`, a list of patches, or any ``[(hook_name, fn)]`` list; an empty
    list runs the clean model. Hook points are checked first (a misspelt or out-of-range hook is an
    error, never a silent no-op), and a patch whose axis has the wrong dimension for the model is
    refused.

    >>> with bl.patched(model, axis.removal()):          # doctest: +SKIP
    ...     logits = model(tokens)
    """
    pairs = _resolve_pairs(model, patches)
    with model.hooks(fwd_hooks=pairs):
        yield model


# ---------------------------------------------------------------------------------------------
# The axis
# ---------------------------------------------------------------------------------------------


class EntropyAxis:
    """The entropy axis of Paper A §4.5 (METHODS.md §7), scikit-learn style.

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

    # --- parameters ---
    def get_params(self) -> dict:
        return {"layer": self.layer, "site": self.site, "standardize": self.standardize,
                "sign_by": self.sign_by, "batch_size": self.batch_size, "progress": self.progress}

    def _check_params(self) -> None:
        _check_site(self.site)
        if self.standardize not in _STANDARDIZE:
            raise InvalidInputError(f"standardize must be one of {_STANDARDIZE}, got {self.standardize!r}.")
        if self.sign_by not in _SIGN_BY:
            raise InvalidInputError(f"sign_by must be one of {_SIGN_BY}, got {self.sign_by!r}.")

    def _layers(self, model) -> List[int]:
        layer = self.layer
        if isinstance(layer, Tensor) and layer.numel() == 1:
            layer = int(layer)
        if isinstance(layer, numbers.Integral) and not isinstance(layer, bool):
            return [adapter.resolve_layer(model, int(layer))]
        if isinstance(layer, (str, bytes)) or not hasattr(layer, "__iter__"):
            raise LayerIndexError(f"layer must be an int or a list of ints, got {layer!r}.")
        return adapter.resolve_layers(model, list(layer))

    # --- fitting ---
    def fit(self, model, prompts) -> "EntropyAxis":
        """Fit the axis on ``prompts`` (SULA items or plain strings) run through ``model``; returns self."""
        self._check_params()
        layers = self._layers(model)
        texts, bayes = _prompt_data(prompts)
        if len(texts) < 3:
            raise InvalidInputError(f"fitting an axis needs at least 3 prompts, got {len(texts)}.")
        if self.sign_by == "bayes" and bayes is None:
            raise InvalidInputError("sign_by='bayes' needs SULA items (with .bayes_entropy_bits), e.g. "
                                    "bl.sula.make_prompts(model); plain strings only allow sign_by='model'.")
        values, h_model = _run(model, prompts, texts, bayes is not None, self.site, layers, [],
                               self.batch_size, self.progress)
        h_sign = bayes if self.sign_by == "bayes" else h_model
        self._fit_arrays(model, {layer: torch.from_numpy(values[layer]) for layer in layers}, h_sign)
        self.entropy_kind_ = "bayes" if self.sign_by == "bayes" else ("labels" if bayes is not None else "next_token")
        return self

    def _fit_arrays(self, model, values: Dict[int, Tensor], entropy: np.ndarray) -> None:
        """Fit from final-token activations (layer → [n, dim]) and the signing entropy [n]."""
        from .metrics.stats import pearson

        meta = _model_meta(model, self.site)
        axes, means, scales, sigma, evr, corr = {}, {}, {}, {}, {}, {}
        for layer, x in values.items():
            x = x.detach().cpu().double().numpy()
            if not np.all(np.isfinite(x)):
                raise NonFiniteError(f"the activations at layer {layer} contain NaN or infinity.")
            if x.shape[1] != meta["dim"]:
                raise InvalidInputError(f"activations at layer {layer} have dimension {x.shape[1]}, expected "
                                        f"{meta['dim']} for site {self.site!r}.")
            u, mean, scale, ratio = _pc1(x, self.standardize)
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
        if model is not None:
            adapter.check_hooks(model, list(self.hook_names_.values()))
        self.model_meta_ = dict(meta)
        self.versions_ = dict(versions) if versions is not None else _library_versions()
        self.n_prompts_ = int(n_prompts)

    @classmethod
    def from_directions(cls, model, directions, *, site: str = "v", sigma=None,
                        means=None) -> "EntropyAxis":
        """An axis from directions you already have: ``{layer: vector}`` (vectors are normalized).

        ``sigma`` (a number or ``{layer: number}``) is the coordinate's standard deviation that
        :meth:`shift` scales by; without it ``shift`` refuses. Useful for hypothesis-driven
        directions and for tests.
        """
        _check_site(site)
        if not isinstance(directions, dict) or not directions:
            raise InvalidInputError("directions must be a non-empty dict {layer: vector}.")
        meta = _model_meta(model, site)
        axis = cls(layer=sorted(adapter.resolve_layer(model, k) for k in directions), site=site)
        axes, means_, scales, sig, evr, corr = {}, {}, {}, {}, {}, {}
        for k, vec in directions.items():
            layer = adapter.resolve_layer(model, k)
            if layer in axes:
                raise InvalidInputError(f"layer {k} is given twice (resolved to {layer}).")
            axes[layer] = torch.tensor(_unit(vec, f"the direction for layer {k}", meta["dim"]), dtype=torch.float32)
            m = means.get(k) if isinstance(means, dict) else None
            means_[layer] = torch.zeros(meta["dim"]) if m is None else torch.as_tensor(m, dtype=torch.float32)
            scales[layer] = torch.ones(meta["dim"])
            s = sigma.get(k) if isinstance(sigma, dict) else sigma
            sig[layer] = float("nan") if s is None else _finite_float(s, "sigma")
            evr[layer], corr[layer] = float("nan"), float("nan")
        axis._set_fitted(model, meta, axes, means_, scales, sig, evr, corr, n_prompts=0)
        axis.entropy_kind_ = "given"
        return axis

    # --- fitted accessors ---
    def _check_fitted(self) -> None:
        if not hasattr(self, "axes_"):
            raise InvalidInputError("this EntropyAxis is not fitted yet; call .fit(model, prompts) first.")

    def _single(self, what: str):
        self._check_fitted()
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

    def transform(self, values: Tensor, layer: Optional[int] = None) -> Tensor:
        """The coordinate (v − mean)·u of final-token activations ``values`` [n, dim] at ``layer``."""
        self._check_fitted()
        layer = self._pick_layers(layer)[0] if layer is not None else self._single("transform without layer")
        u = self.axes_[layer].double()
        v = torch.as_tensor(values).double()
        if v.shape[-1] != u.shape[0]:
            raise InvalidInputError(f"values have dimension {v.shape[-1]}, the axis {u.shape[0]}.")
        return (v - self.means_[layer].double()) @ u

    # --- patch builders ---
    def _pick_layers(self, layers) -> List[int]:
        self._check_fitted()
        if layers is None:
            return list(self.layers_)
        if isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
            layers = [layers]
        n = int(self.model_meta_["n_layers"])
        out = []
        for layer in layers:
            r = adapter.resolve_layer(n, layer)
            if r not in self.axes_:
                raise LayerIndexError(f"the axis was not fitted on layer {layer} (resolved to {r}); it has layers "
                                      f"{list(self.layers_)}. Fit EntropyAxis(layer=[...]) including it.")
            out.append(r)
        return sorted(set(out))

    def _parts(self, op: str, layers, *, lam=1.0, amount_sigmas=None, directions=None) -> List[_Part]:
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
            parts.append(_Part(layer=layer, hook_name=self.hook_names_[layer], site=self.site_, op=op,
                               direction=u.float().clone(), lam=float(lam), amount=float(amount)))
        return parts

    @staticmethod
    def _layer_tag(layers) -> str:
        return "L" + ",".join(str(x) for x in layers)

    def removal(self, lam: float = 1.0, *, layers=None) -> Patch:
        """v ← v − λ (v·u) u at every position (λ = 1: full removal; λ = 0: no change)."""
        lam = _finite_float(lam, "lam")
        parts = self._parts("removal", layers, lam=lam)
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"removal λ={lam:g} @{tag}", kind="removal", axis=self,
                     params={"lam": lam}, model_meta=self.model_meta_)

    def keep_only(self, *, layers=None) -> Patch:
        """v ← (v·u) u at every position: only the axis component survives."""
        parts = self._parts("keep_only", layers)
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"keep-only @{tag}", kind="keep_only", axis=self, params={},
                     model_meta=self.model_meta_)

    def shift(self, sigmas: float, *, layers=None) -> Patch:
        """v ← v + s·σ·u at every position (σ: std of the clean coordinate at that layer)."""
        sigmas = _finite_float(sigmas, "sigmas")
        parts = self._parts("shift", layers, amount_sigmas=sigmas)
        tag = self._layer_tag([p.layer for p in parts])
        return Patch(parts, label=f"shift {sigmas:+g}σ @{tag}", kind="shift", axis=self,
                     params={"sigmas": sigmas}, model_meta=self.model_meta_)

    def random_direction(self, seed: int, layer: int) -> Tensor:
        """A seeded random unit vector orthogonal to the axis at ``layer`` (float32)."""
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise InvalidInputError(f"seed must be a non-negative integer, got {seed!r}.")
        layer = self._pick_layers([layer])[0]
        u = self.axes_[layer].double().numpy()
        u = u / np.linalg.norm(u)
        rng = np.random.default_rng([int(seed), int(layer)])
        r = rng.standard_normal(u.shape[0])
        for _ in range(2):  # Gram–Schmidt twice for orthogonality at float precision
            r = r - (r @ u) * u
        r = r / np.linalg.norm(r)
        return torch.tensor(r, dtype=torch.float32)

    def random_control(self, seed: int, *, op: str = "removal", lam: float = 1.0, sigmas: Optional[float] = None,
                       layers=None) -> Patch:
        """The same intervention along a random direction orthogonal to the axis (one per layer).

        ``op`` is ``"removal"`` (with ``lam``), ``"keep_only"`` or ``"shift"`` (by ``sigmas``·σ of the
        *axis* coordinate, so the perturbation has the same size). ``seed`` makes it reproducible.
        """
        if op not in ("removal", "keep_only", "shift"):
            raise InvalidInputError(f"op must be 'removal', 'keep_only' or 'shift', got {op!r}.")
        lam = _finite_float(lam, "lam")
        if op == "shift":
            sigmas = _finite_float(1.0 if sigmas is None else sigmas, "sigmas")
        picked = self._pick_layers(layers)
        dirs = {layer: self.random_direction(seed, layer) for layer in picked}
        parts = self._parts(op, picked, lam=lam, amount_sigmas=sigmas, directions=dirs)
        tag = self._layer_tag(picked)
        what = {"removal": f"removal λ={lam:g}", "keep_only": "keep-only",
                "shift": f"shift {sigmas if sigmas is not None else 0:+g}σ"}[op]
        group = f"random ⟂ {what} @{tag}"
        params = {"lam": lam, "sigmas": sigmas, "group": group}
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
        header's metadata, or a unicode array in the npz).
        """
        self._check_fitted()
        path = Path(path)
        tensors = {}
        for k in self.layers_:
            tensors[f"axis.{k}"] = self.axes_[k].contiguous()
            tensors[f"mean.{k}"] = self.means_[k].contiguous()
            tensors[f"scale.{k}"] = self.scales_[k].contiguous()
        meta = json.dumps(self._metadata(), allow_nan=True)
        if path.suffix == ".npz":
            np.savez(path, __meta__=np.array(meta), **{k: v.numpy() for k, v in tensors.items()})
        else:
            if path.suffix != ".safetensors":
                path = path.with_name(path.name + ".safetensors")
            from safetensors.torch import save_file

            save_file(tensors, str(path), metadata={_META_KEY: meta})
        return path

    @classmethod
    def load(cls, path, model=None, *, strict: bool = False) -> "EntropyAxis":
        """Read an axis written by :meth:`save`; with ``model``, check that it fits that model.

        A different site dimension or too few layers raise :class:`~bayes_lens.CheckpointError`; a
        different weight processing (basis) or model name warns, or raises with ``strict=True``.
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
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - any parse failure is a bad checkpoint
            raise CheckpointError(
                f"{path} is not a readable bayes_lens axis file ({type(err).__name__}: {err}).") from err
        if meta.get("format_version") != _FORMAT_VERSION:
            raise CheckpointError(f"{path} has axis format {meta.get('format_version')!r}; this bayes_lens reads "
                                  f"{_FORMAT_VERSION}.")
        params = dict(meta["params"])
        axis = cls(**params)
        layers = [int(k) for k in meta["layers"]]
        try:
            axes = {k: tensors[f"axis.{k}"].float() for k in layers}
            means = {k: tensors[f"mean.{k}"].float() for k in layers}
            scales = {k: tensors[f"scale.{k}"].float() for k in layers}
        except KeyError as err:
            raise CheckpointError(f"{path} lacks the tensor {err}; the file is truncated or not an axis.") from err
        dim = int(meta["model"]["dim"])
        for k, u in axes.items():
            if u.ndim != 1 or u.shape[0] != dim or not bool(torch.isfinite(u).all()):
                raise CheckpointError(f"{path}: the axis at layer {k} is not a finite vector of dimension {dim}.")
            if abs(float(u.double().norm()) - 1.0) > 1e-4:
                raise CheckpointError(f"{path}: the axis at layer {k} is not unit length; the file is corrupted.")
        if model is not None:
            _check_loaded(meta, model, path, strict)
        fl = lambda d: {int(k): (float("nan") if v is None else float(v)) for k, v in d.items()}  # noqa: E731
        axis.site = meta["site"]
        axis._set_fitted(model, meta["model"], axes, means, scales, fl(meta["sigma"]),
                         fl(meta["explained_variance_ratio"]), fl(meta["entropy_correlation"]),
                         n_prompts=meta["n_prompts"], versions=meta["versions"])
        axis.entropy_kind_ = meta.get("entropy_kind")
        return axis

    def __repr__(self) -> str:
        p = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if k not in ("batch_size", "progress"))
        fitted = f" fitted on layers {list(self.layers_)}" if hasattr(self, "layers_") else ""
        return f"EntropyAxis({p}){fitted}"


def _check_loaded(meta: dict, model, path, strict: bool) -> None:
    info = adapter.model_info(model)
    saved = meta["model"]
    dim = _site_dim(info, meta["site"])
    if int(saved["dim"]) != dim:
        raise CheckpointError(
            f"{path} holds an axis of dimension {saved['dim']} for site {meta['site']!r} (model "
            f"{saved['model_name']!r}), but this model's site has dimension {dim}; refit the axis on this model.")
    if max(int(k) for k in meta["layers"]) >= info.n_layers:
        raise CheckpointError(f"{path} has axes on layers {meta['layers']} but the model has {info.n_layers} layers.")
    problems = []
    if bool(saved["processed"]) != bool(info.processed):
        problems.append(f"weights were {saved['processing']!r} when fitted but are {info.processing!r} now "
                        "(another basis: the direction does not carry over)")
    if saved["model_name"] != info.name or int(saved["n_layers"]) != info.n_layers:
        problems.append(f"fitted on {saved['model_name']!r} ({saved['n_layers']} layers), loading onto "
                        f"{info.name!r} ({info.n_layers} layers)")
    if problems:
        msg = f"{path}: " + "; ".join(problems) + "."
        if strict:
            raise CheckpointError(msg)
        warnings.warn(msg, UserWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Clean vs patched comparison
# ---------------------------------------------------------------------------------------------


def _corr_rows(x: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    """Correlation of matching rows of x, y ([B, n]); NaN where a row is constant."""
    if method == "spearman":
        from scipy.stats import rankdata

        x, y = rankdata(x, axis=-1), rankdata(y, axis=-1)
    xc = x - x.mean(-1, keepdims=True)
    yc = y - y.mean(-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (xc * yc).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def _std_rows(x: np.ndarray) -> np.ndarray:
    return x.std(-1, ddof=1)


@dataclass(frozen=True)
class _Condition:
    label: str  # group label (random seeds share it)
    kind: str
    patches: Tuple[object, ...]  # one per seed (a Patch or a [(name, fn)] list); () for clean
    seeds: Tuple[Optional[int], ...]
    layers: Tuple[int, ...]
    is_random: bool


def _conditions(patches, n_random_seeds: int) -> List[_Condition]:
    if isinstance(patches, Patch):
        items = [(patches.label, patches)]
    elif isinstance(patches, dict):
        items = list(patches.items())
    elif isinstance(patches, (list, tuple)):
        items = []
        for i, p in enumerate(patches):
            if isinstance(p, Patch):
                items.append((p.label, p))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and callable(p[1]):
                raise InvalidInputError("compare_patched takes a list of patches (one per condition), not one list "
                                        "of (hook_name, fn) pairs; pass {'my patch': pairs} to name raw hooks.")
            else:
                items.append((f"patch {i}", p))
    else:
        raise InvalidInputError(f"patches must be a Patch, a list of patches or a dict label -> patch; got "
                                f"{type(patches).__name__}.")
    if not items:
        raise InvalidInputError("no patches given; pass e.g. [axis.removal()].")
    groups: Dict[str, dict] = {}
    order: List[str] = []

    def add(label, kind, patch, seed, layers, is_random):
        if label not in groups:
            groups[label] = {"kind": kind, "patches": [], "seeds": [], "layers": layers, "is_random": is_random}
            order.append(label)
        g = groups[label]
        if seed in g["seeds"] and seed is not None:
            return
        if seed is None and g["patches"]:
            raise InvalidInputError(f"two patches share the label {label!r}; give them distinct labels (a dict).")
        g["patches"].append(patch)
        g["seeds"].append(seed)

    for label, p in items:
        if isinstance(p, Patch):
            if p.is_random_control:
                add(p.group, p.kind, p, p.random_seed, p.layers, True)
            else:
                add(label, p.kind, p, None, p.layers, False)
        else:
            pairs = _flatten_pairs(p)
            add(str(label), "hooks", pairs, None, (), False)
    # automatic random controls for every axis patch
    for label, p in items:
        if isinstance(p, Patch) and not p.is_random_control and p.axis is not None and \
                p.kind in ("removal", "keep_only", "shift"):
            for s in range(n_random_seeds):
                r = p.random_like(s)
                add(r.group, r.kind, r, s, r.layers, True)
    return [_Condition(label=k, kind=groups[k]["kind"], patches=tuple(groups[k]["patches"]),
                       seeds=tuple(groups[k]["seeds"]), layers=tuple(groups[k]["layers"]),
                       is_random=groups[k]["is_random"]) for k in order]


@dataclass(frozen=True, eq=False)
class PatchComparison(Result):
    """Clean vs patched: axis–entropy correlation by readout layer and SULA calibration, with CIs.

    ``table`` (long format; also ``to_dataframe()``) has one row per condition × metric × readout
    layer × entropy: ``condition`` (``"clean"``, a patch label, or a random-control group
    summarized over ``n_seeds`` seeds: values are means over seeds), ``kind``, ``is_random``,
    ``patched_layers``, ``metric`` (``axis_entropy_corr``: correlation of the clean-fitted axis
    coordinate with an entropy; ``coordinate_std_ratio``: std of that coordinate / its clean std;
    ``sula_mae_bits`` and ``sula_pearson``: calibration against the Bayes posterior, METHODS.md §6),
    ``readout_layer``, ``entropy`` (``model`` = the model's own entropy under that condition, or
    ``bayes``), ``value`` with ``value_ci_low/high``, ``diff_from_clean`` with ``diff_ci_low/high``
    (paired percentile bootstrap over prompts: the same resampled prompts for clean and patched),
    ``rel_diff`` (diff / clean value), ``seed_diff_min/max`` (spread over random seeds) and
    ``degenerate`` (the coordinate's spread collapsed — e.g. read right after a full removal — so
    its correlation is undefined and reported as 0).
    """

    table: object
    conditions: Tuple[str, ...]
    readout_layers: Tuple[int, ...]
    site: str
    correlation: str
    entropy_kind: str
    calibration: bool
    n_prompts: int
    n_boot: int
    seed: int
    n_random_seeds: int
    axis_layers: Tuple[int, ...]

    def to_dataframe(self):
        return self.table.copy()

    def summary(self):
        """The headline rows: axis–entropy correlation at each patched layer, and calibration."""
        t = self.table
        keep = (t["metric"].isin(["sula_mae_bits", "sula_pearson"])
                | ((t["metric"] == "axis_entropy_corr") & t["readout_layer"].isin(list(self.axis_layers))))
        return t[keep].reset_index(drop=True)

    def plot(self):
        """Two panels: axis–entropy correlation (model entropy) by readout layer; calibration change vs clean."""
        go = plotly()
        from plotly.subplots import make_subplots

        t = self.table
        fig = make_subplots(rows=1, cols=2, subplot_titles=(
            f"{self.correlation} ρ(axis coordinate, model entropy)", "calibration: change vs clean"))
        corr = t[(t["metric"] == "axis_entropy_corr") & (t["entropy"] == "model")]
        for cond in self.conditions:
            d = corr[corr["condition"] == cond].sort_values("readout_layer")
            if d.empty:
                continue
            fig.add_trace(go.Scatter(
                x=d["readout_layer"], y=d["value"], mode="lines+markers", name=cond,
                line={"dash": "dot"} if bool(d["is_random"].iloc[0]) else None,
                error_y={"type": "data", "symmetric": False, "array": d["value_ci_high"] - d["value"],
                         "arrayminus": d["value"] - d["value_ci_low"]}), row=1, col=1)
        cal = t[t["metric"].isin(["sula_mae_bits", "sula_pearson"]) & (t["condition"] != "clean")]
        for metric in ("sula_mae_bits", "sula_pearson"):
            d = cal[cal["metric"] == metric]
            if d.empty:
                continue
            fig.add_trace(go.Bar(
                x=d["condition"], y=d["diff_from_clean"], name=f"Δ {metric}",
                error_y={"type": "data", "symmetric": False, "array": d["diff_ci_high"] - d["diff_from_clean"],
                         "arrayminus": d["diff_from_clean"] - d["diff_ci_low"]}), row=1, col=2)
        fig.update_xaxes(title_text="readout layer", row=1, col=1)
        fig.update_yaxes(title_text="correlation", row=1, col=1)
        fig.update_yaxes(title_text="patched − clean", row=1, col=2)
        fig.update_layout(title="Entropy-axis ablation (Paper A §4.6; METHODS.md §7)", barmode="group")
        return fig


def compare_patched(model, prompts, patches, *, axis: Optional[EntropyAxis] = None, readout_layers="auto",
                    n_random_seeds: int = 3, correlation: str = "pearson", calibration="auto", n_boot: int = 1000,
                    seed: int = 0, batch_size: int = 16, progress: Optional[bool] = True) -> PatchComparison:
    """Clean vs each patch on ``prompts``: axis–entropy correlation by layer and SULA calibration, with CIs.

    Parameters
    ----------
    patches:
        A :class:`Patch`, a list of them (one condition each), or a dict ``{label: patch}`` (a value
        may also be a raw ``[(hook_name, fn)]`` list). Random controls passed in are grouped by
        their label without the seed.
    axis:
        The axis whose *clean-fitted* coordinate is read (default: the axis the first patch came
        from). At readout layers it was not fitted on, an axis with the same settings is fitted on
        the clean run of ``prompts``.
    readout_layers:
        ``"auto"``: every layer from the first patched layer to the last; or a list of layers.
    n_random_seeds:
        For every axis patch (removal, keep-only, shift) add random-direction controls with seeds
        ``0..n_random_seeds-1`` (same op, λ, layers and site), summarized over seeds (0 = none).
    correlation:
        ``"pearson"`` (default) or ``"spearman"``.
    calibration:
        ``"auto"`` (SULA items given → yes), True or False: run :func:`bayes_lens.sula.evaluate`
        under each patch (``fwd_hooks``) and compare MAE and Pearson of model vs Bayes entropy.
    n_boot, seed:
        Paired percentile bootstrap over prompts (one index matrix shared by every condition).

    The model's entropy under a condition is the entropy over the two SULA labels (renormalized,
    as in :func:`bayes_lens.sula.evaluate`) for SULA items, else the full next-token entropy; the
    Bayes entropy is fixed by the prompt. One forward pass per condition (and seed): the patch, read
    hooks at every readout layer and, for SULA items, ``sula.evaluate``'s own hooks run together.
    """
    import pandas as pd

    adapter._check_model(model)
    if correlation not in ("pearson", "spearman"):
        raise InvalidInputError(f"correlation must be 'pearson' or 'spearman', got {correlation!r}.")
    if isinstance(n_random_seeds, bool) or not isinstance(n_random_seeds, numbers.Integral) or n_random_seeds < 0:
        raise InvalidInputError(f"n_random_seeds must be a non-negative integer, got {n_random_seeds!r}.")
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < 10:
        raise InvalidInputError(f"n_boot must be an integer ≥ 10, got {n_boot!r}.")
    texts, bayes = _prompt_data(prompts)
    is_sula = bayes is not None
    n = len(texts)
    if n < 4:
        raise InvalidInputError(f"compare_patched needs at least 4 prompts for correlations and CIs, got {n}.")
    if calibration == "auto":
        calibration = bayes is not None
    elif calibration and bayes is None:
        raise InvalidInputError("calibration needs SULA items (bl.sula.make_prompts); pass calibration=False "
                                "for plain strings.")
    conds = _conditions(patches, int(n_random_seeds))
    if axis is None:
        axis = next((p.axis for c in conds for p in c.patches if isinstance(p, Patch) and p.axis is not None), None)
    if axis is None:
        raise InvalidInputError("no axis to read: pass axis=EntropyAxis(...).fit(...) or patches made by an axis.")
    axis._check_fitted()
    site = axis.site_
    info = adapter.model_info(model)
    if int(axis.model_meta_["dim"]) != _site_dim(info, site):
        raise InvalidInputError(f"the axis has dimension {axis.model_meta_['dim']} but this model's {site!r} site "
                                f"has {_site_dim(info, site)}; fit the axis on this model.")
    for c in conds:  # validate every patch before any compute
        for p in c.patches:
            _resolve_pairs(model, p)
    if readout_layers == "auto":
        patched_layers = [layer for c in conds for layer in c.layers] or list(axis.layers_)
        readouts = list(range(min(patched_layers), info.n_layers))
    else:
        readouts = adapter.resolve_layers(model, readout_layers)

    # clean run, reference axes at every readout layer
    vals_clean, h_clean = _run(model, prompts, texts, is_sula, site, readouts, [], batch_size, progress)
    missing = [k for k in readouts if k not in axis.axes_]
    ref_u = {k: axis.axes_[k].double().numpy() for k in readouts if k in axis.axes_}
    ref_mean = {k: axis.means_[k].double().numpy() for k in readouts if k in axis.axes_}
    if missing:
        extra = EntropyAxis(layer=missing, site=site, standardize=axis.standardize, sign_by=axis.sign_by)
        h_sign = bayes if axis.sign_by == "bayes" else h_clean
        extra._fit_arrays(model, {k: torch.from_numpy(vals_clean[k]) for k in missing}, h_sign)
        ref_u.update({k: extra.axes_[k].double().numpy() for k in missing})
        ref_mean.update({k: extra.means_[k].double().numpy() for k in missing})

    def coords(vals):
        return {k: (vals[k] - ref_mean[k]) @ ref_u[k] for k in readouts}

    # every condition: per-seed coordinates, model entropy, calibration entropy
    runs = {"clean": [(coords(vals_clean), h_clean)]}
    for c in conds:
        out = []
        for p in c.patches:
            vals, h = _run(model, prompts, texts, is_sula, site, readouts, _flatten_pairs(p), batch_size,
                           progress)
            out.append((coords(vals), h))
        runs[c.label] = out

    rng = np.random.default_rng(seed)
    idx = np.concatenate([np.arange(n)[None, :], rng.integers(0, n, size=(n_boot, n))])  # row 0 = full sample
    clean_c, clean_h = runs["clean"][0]
    entropies = [("model", None)] + ([("bayes", bayes)] if bayes is not None else [])

    def metric_rows(member):
        """metric key -> (values over idx rows [1 + n_boot], degenerate flag) for one run."""
        cs, h = member
        out = {}
        for k in readouts:
            x = cs[k]
            ratio = _std_rows(x[idx]) / _std_rows(clean_c[k][idx])
            out[("coordinate_std_ratio", k, None)] = (ratio, False)
            degenerate = bool(np.std(x) <= _DEGENERATE_RATIO * np.std(clean_c[k]))
            for ename, e in entropies:
                ee = h if e is None else e
                r = np.zeros(idx.shape[0]) if degenerate else _corr_rows(x[idx], ee[idx], correlation)
                out[("axis_entropy_corr", k, ename)] = (r, degenerate)
        if calibration:
            out[("sula_mae_bits", None, None)] = (np.abs(h[idx] - bayes[idx]).mean(-1), False)
            out[("sula_pearson", None, None)] = (_corr_rows(h[idx], bayes[idx], correlation), False)
        return out

    clean_rows = metric_rows(runs["clean"][0])

    def pct(a):
        a = a[np.isfinite(a)]
        if a.size < n_boot / 2:
            return float("nan"), float("nan")
        lo, hi = np.quantile(a, [0.025, 0.975])
        return float(lo), float(hi)

    records = []
    meta = [("clean", "clean", False, (), 1)] + [(c.label, c.kind, c.is_random, c.layers, len(c.patches))
                                                  for c in conds]
    for label, kind, is_random, layers, n_seeds in meta:
        members = [metric_rows(m) for m in runs[label]] if label != "clean" else [clean_rows]
        for key, (clean_vals, _) in clean_rows.items():
            metric, layer, ename = key
            per = np.stack([m[key][0] for m in members])  # [seeds, 1 + n_boot]
            degenerate = any(m[key][1] for m in members)
            value = per.mean(0)
            diff = value - clean_vals
            seed_diffs = per[:, 0] - clean_vals[0]
            v_lo, v_hi = pct(value[1:])
            d_lo, d_hi = pct(diff[1:]) if label != "clean" else (0.0, 0.0)
            base = clean_vals[0]
            records.append({
                "condition": label, "kind": kind, "is_random": is_random, "n_seeds": n_seeds,
                "patched_layers": ",".join(str(x) for x in layers), "metric": metric,
                "readout_layer": layer, "entropy": ename, "value": float(value[0]),
                "value_ci_low": v_lo, "value_ci_high": v_hi, "diff_from_clean": float(diff[0]),
                "diff_ci_low": d_lo, "diff_ci_high": d_hi,
                "rel_diff": float(diff[0] / base) if np.isfinite(base) and base != 0 else float("nan"),
                "seed_diff_min": float(seed_diffs.min()), "seed_diff_max": float(seed_diffs.max()),
                "degenerate": degenerate,
            })
    table = pd.DataFrame.from_records(records)
    table["readout_layer"] = pd.Series([None if v is None or v != v else int(v) for v in table["readout_layer"]],
                                       dtype=object)
    return PatchComparison(
        table=table, conditions=tuple(m[0] for m in meta), readout_layers=tuple(readouts), site=site,
        correlation=correlation, entropy_kind="labels" if is_sula else "next_token",
        calibration=bool(calibration), n_prompts=n, n_boot=int(n_boot), seed=int(seed),
        n_random_seeds=int(n_random_seeds), axis_layers=tuple(axis.layers_),
    )
