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
  - ``axis.random_control(seed=seed)``: the same intervention along a random unit direction r,
    orthogonalized against u (a seeded Gaussian draw per layer, Gram–Schmidt); a random shift moves
    by the same distance s·σ.

  A patch is an iterable of ``(hook_name, fn)`` pairs — one per layer — so
  ``model.hooks(fwd_hooks=list(patch))`` and ``model.run_with_hooks(x, fwd_hooks=list(patch))``
  work as in TransformerLens. Under SAELens, where an SAE replaces the patch's hook point (TL refuses the
  replaced name itself), a patch made on the model names the SAE's ``hook_sae_output`` while the SAE is
  spliced (``add_sae`` then ``list(patch)``; ``run_with_hooks_with_saes(x, saes=[sae], fwd_hooks=patch)``);
  a list made before that call splices its SAE cannot, so pass ``fwd_hooks=patch.pairs(model, saes=[sae])``
  there. Patches combine with ``+`` (list concatenation of their pairs).
  Layers are resolved with :func:`bayes_lens.adapter.resolve_layer` and hook names are checked
  with :func:`bayes_lens.adapter.check_hooks`: an out-of-range layer such as the paper's "−1"
  fails loudly instead of silently matching nothing.

* ``with patched(model, patches): ...`` runs the model with the patches; every hook is removed on
  exit, also when the body raises. Every patch — the axis's removal and shift, keep-only, the random
  controls — hooks the site's own hook point (``blocks.{l}.attn.hook_v``) and changes the activation
  with the same function (:func:`bayes_lens.hookpoints.move_along` / ``keep_along``), so a treatment
  and its control take one route, and a patch needs no ``bl.attach``. (On an attached model,
  zero-ablating the coordinate hook point ``blocks.{l}.hook_v_axis`` is the same removal.)

* :func:`compare_patched` — clean vs each patch (random controls summarized over seeds): the
  correlation of the *clean-fitted* axis coordinate with the model's entropy (and with the Bayes
  entropy on SULA prompts) read at the patched layer and at later layers, and the SULA calibration
  (MAE of model vs Bayes entropy, Pearson of the two; METHODS.md §6, via
  :func:`bayes_lens.sula.evaluate` with the patches as ``fwd_hooks``), each with a paired bootstrap
  CI (over prompts) of the difference from clean. Paper A: single-layer removal takes the
  axis–entropy correlation from ≈0.27–0.32 to ≈0 while SULA MAE and correlation move by < 1%.
  ``cmp.effect()`` (:class:`AblationEffect`) is the headline: ρ clean vs patched at the first layer
  *after* the patch and at the last layer (at the patched layer a removed coordinate is 0 by
  construction), the random control's change, the calibration change, and a sentence reading them.

Example
-------
>>> import bayes_lens as bl
>>> model = bl.models.tiny.tiny_model("bridge")                # or bl.load_model()
>>> prompts = bl.sula.make_prompts(model, ks=(0, 2), n_per_k=4)
>>> axis = bl.EntropyAxis(layer=-1).fit(model, prompts)
>>> with bl.patched(model, axis.removal()):
...     logits = model("w1: dax, w2: dax. query:")
>>> logits.shape[-1] == model.cfg.d_vocab
True
>>> cmp = bl.compare_patched(model, prompts, [axis.removal(), axis.keep_only()], n_boot=100, n_random_seeds=1)
>>> len(cmp.conditions), type(cmp.plot()).__name__            # clean, 2 patches, 2 random controls
(5, 'Figure')
"""

from ._axis import EntropyAxis
from ._compare import AblationEffect, PatchComparison, compare_patched
from ._das import DAS
from ._jacobian import jacobian_basis
from ._localize import (Design, Localization, default_layers, head_blocks, localize, resample_donors,
                        subspace_patch, swap_donors)
from ._patch import Patch, PatchPart, patched
from ._positions import answer_positions, demonstration_answers
from ._readout import Readout, cross_fitted_readout
from ._seeds import SEEDED, seed_columns
from ._statistic import StatisticPatch, patch_statistic, sufficient_statistic

__all__ = ["EntropyAxis", "Patch", "PatchPart", "patched", "compare_patched",
           "PatchComparison", "AblationEffect", "localize", "Localization", "Design", "subspace_patch",
           "cross_fitted_readout", "Readout", "patch_statistic", "StatisticPatch", "sufficient_statistic",
           "head_blocks", "swap_donors", "resample_donors", "default_layers", "jacobian_basis", "answer_positions",
           "demonstration_answers", "seed_columns", "SEEDED", "DAS"]

from .._namespace import package_dir, submodule_getattr  # noqa: E402

__dir__ = package_dir(globals())
__getattr__ = submodule_getattr(globals())
