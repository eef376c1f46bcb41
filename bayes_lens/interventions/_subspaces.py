"""Where interventions get their subspaces and sources: random (Haar) subspaces, attention heads' blocks,
and the donors of a swap or a resample-ablation.

METHODS.md §13. The candidate subspaces fitted from data (ridge, PC1, the top-k frame, PLS) come from
:mod:`bayes_lens.estimators`, DAS's from TransformerLens's ``fit_das`` (:mod:`bayes_lens.ablation._das`); the
ones that need no fit come from here. A Haar subspace is
the QR of a Gaussian matrix with the signs of R's diagonal fixed (uniform on the Grassmannian); one
keyed seed per draw, so a band is reproducible draw by draw.
"""

from __future__ import annotations

import numpy as np

from .. import adapter
from .._validate import check_choice, check_seed
from ..errors import InvalidInputError
from ..metrics.stats import keyed_rng

__all__ = ["haar", "haar_draw", "head_blocks", "swap_donors", "resample_donors"]


def haar(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[d, k]`` orthonormal basis of a uniformly random k-dimensional subspace of R^d."""
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return q * np.sign(np.diag(r))


def haar_draw(d: int, k: int, *, seed: int, layer: int, i: int) -> np.ndarray:
    """Draw ``i`` of a layer's random band of rank ``k``: :func:`haar` with the keyed seed (seed, 73, layer, k, i)."""
    return haar(d, k, keyed_rng(seed, 73, layer, k, i))


def head_blocks(model, *, site: str = "z") -> dict:
    """``{"head h": [n·d_head, d_head] basis}``: the coordinate block of each attention head in the flattened
    ``z`` site (query heads) or ``v`` site (key/value heads), for :func:`bayes_lens.localize`'s ``bases=``. With
    ``site="z"`` the localisation table becomes the layer × head grid: each head's readout (ridge on its
    d_head coordinates) and the calibration change when its output is removed (zero-ablation, or
    mean-ablation with ``operation="mean"``), against random subspaces of rank d_head of the same site.

    >>> sorted(head_blocks(model))[:2], head_blocks(model)["head 0"].shape
    (['head 0', 'head 1'], (64, 16))
    """
    check_choice(site, "site", ("z", "v"))
    info = adapter.model_info(model)
    n = info.n_heads if site == "z" else info.n_kv_heads
    eye = np.eye(n * info.d_head)
    return {f"head {h}": eye[:, h * info.d_head:(h + 1) * info.d_head] for h in range(n)}


def swap_donors(items, *, seed: int = 0) -> np.ndarray:
    """``[n]`` the donor of each item for a swap: a seeded draw among the items whose exact posterior has another
    most probable answer (for SULA: the other side of ½), else, where there is none, among those whose posterior
    differs at all (total variation > 10⁻⁹)."""
    post = np.array([it.posterior for it in items], dtype=np.float64)
    rng = keyed_rng(seed, 74)
    out = np.empty(len(items), dtype=np.int64)
    mode = post.argmax(1)
    ties = np.isclose(post.max(1), np.sort(post, 1)[:, -2]) if post.shape[1] > 1 else np.zeros(len(items), bool)
    for i in range(len(items)):
        tv = 0.5 * np.abs(post - post[i]).sum(1)
        differ = tv > 1e-9
        other = np.flatnonzero(differ & (mode != mode[i]) & ~ties) if not ties[i] else np.flatnonzero(differ & ~ties)
        pool = other if len(other) else np.flatnonzero(differ)
        if not len(pool):
            raise InvalidInputError("a swap needs items with different posteriors (several k, both labels); "
                                    "make prompts with ks=(0, 1, 2, 4) or pass swap=False.")
        out[i] = rng.choice(pool)
    return out


def resample_donors(fold_of, *, seed: int = 0) -> np.ndarray:
    """``[n]`` the resample donor of each prompt: a seeded uniform draw among the prompts of the *other* folds
    (``fold_of`` ``[n]``, the cross-fitting's folds), the prompts a cross-fitted subspace applied to that prompt
    was fitted on; never the prompt itself. One draw per prompt, shared by every subspace and every layer, so a
    candidate and its random band differ only in the subspace.

    >>> d = resample_donors(np.array([0, 0, 1, 1, 2, 2]), seed=0)
    >>> bool(np.all(np.array([0, 0, 1, 1, 2, 2])[d] != np.array([0, 0, 1, 1, 2, 2])))
    True
    """
    f = np.asarray(fold_of, dtype=np.int64).ravel()
    seed = check_seed(seed)
    if len(np.unique(f)) < 2:
        raise InvalidInputError("resample donors come from the other folds: pass fold numbers of at least two folds.")
    rng = keyed_rng(seed, 76)
    return np.array([rng.choice(np.flatnonzero(f != f[i])) for i in range(len(f))], dtype=np.int64)
