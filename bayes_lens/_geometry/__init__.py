"""Bayesian geometry of a language model (Paper A §4.2, §5.1; METHODS.md §1–§4), one technique per module.

* :func:`value_manifold` (:mod:`._manifold`) — standardized PCA of final-token values, with the
  Gaussian null;
* :func:`key_orthogonality` (:mod:`._keys`) — mean off-diagonal |cos| of W_K columns, with baselines;
* :func:`attention_focusing` (:mod:`._focusing`) — attention entropy by depth;
* :func:`entropy_alignment` (:mod:`._alignment`) — ρ(PC1, next-token entropy);
* :func:`geometry` (:mod:`._suite`) — all four from one pass.

Every metric takes a model and prompts (a streaming, batched, mask-aware run), what
``run_with_cache`` returned (the ``(logits, cache)`` pair, the cache, or a dict of its tensors with
``model=``) or a :class:`bayes_lens.reduced.ReducedCache`; the public names are re-exported as
``bl.value_manifold`` etc.
"""

from ._alignment import EntropyAlignment, entropy_alignment
from ._focusing import AttentionFocusing, attention_focusing
from ._keys import KeyOrthogonality, key_orthogonality
from ._manifold import CI_METHODS, ValueManifold, value_manifold
from ._suite import Geometry, geometry

__all__ = [
    "ValueManifold", "KeyOrthogonality", "AttentionFocusing", "EntropyAlignment", "Geometry",
    "value_manifold", "key_orthogonality", "attention_focusing", "entropy_alignment", "geometry", "CI_METHODS",
]
