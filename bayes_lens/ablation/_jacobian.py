"""The Jacobian-lens subspace at a layer: the residual directions the model's output depends on.

Gurnee et al., "Verbalizable Representations Form a Global Workspace in Language Models" (Transformer
Circuits Thread, 2026), as TransformerLens 4.3 implements it (``transformer_lens.tools.analysis.JacobianLens``);
METHODS.md §13 ("Jacobian-lens subspace"). TransformerLens's lens fits, for each source layer l, the
transport matrix

    J[l] = E_prompt[ (1/|V|) Σ_{t∈V} Σ_{t'∈V, t'≥t} ∂h_final,t' / ∂h_l,t ]      ([d_model, d_model])

from the output of block l (``blocks.{l}.hook_out``, which is ``hook_resid_post`` of block l) to the output
of the final block (before the final norm), V the positions after the first ``skip_first`` and before the
last. Its J-lens vector of token t is v_t = J[l]ᵀ W_U[:, t] (``JacobianLens.lens_vectors``), and J-space is
their span. :func:`jacobian_basis` turns that into an orthonormal basis for
:func:`bayes_lens.localize`'s ``bases=`` at ``site="resid_post"``:

* ``rank=r`` (default 4): the top-r right singular vectors of the J-lens dictionary D = W_Uᵀ J[l]
  (``[d_vocab, d_model]``, the rows v_t: ``JacobianLens.lens_vector_dictionary``), i.e. the top-r
  eigenvectors of J[l]ᵀ W_U W_Uᵀ J[l]: the principal directions of J-space, the directions at layer l whose
  first-order effect on the logits (through J[l] and the unembedding) is largest summed over the vocabulary;
* ``tokens=[...]``: the span of those tokens' J-lens vectors, the subspace ``JacobianLens.ablation_hooks``
  projects out (unit rows, orthonormalized); with a task's answer tokens, the directions at l that move
  the answers' logits to first order.

At the final layer J = I (TransformerLens never fits it: its transport is the identity). The lens is fitted
offline on the model's own prompts (``JacobianLens.fit``: the prompts, replicated, one backward pass per
``dim_batch`` output dimensions; deterministic). A TransformerLens without ``JacobianLens`` (3.x before 3.9) gets
an error saying it needs TransformerLens ≥ 4.3; the lens also needs a raw ``TransformerBridge`` (no
compatibility mode, no processed weights, not a ``HookedTransformer``), which TransformerLens checks.

Example
-------
>>> try:
...     B = jacobian_basis(model, prompts, 0, rank=2)
...     ok = B.shape == (model.cfg.d_model, 2) and bool(np.allclose(B.T @ B, np.eye(2), atol=1e-8))
... except bl.errors.MissingExtraError:     # a TransformerLens without JacobianLens: the error says so
...     ok = True
>>> ok
True
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from .. import adapter
from .._validate import check_count, check_positive_int
from ..errors import InvalidInputError, MissingExtraError, UnsupportedModelError
from ._common import prompt_data

__all__ = ["jacobian_basis", "jacobian_lens_class"]


def jacobian_lens_class():
    """TransformerLens's ``JacobianLens`` class, or :class:`~bayes_lens.errors.MissingExtraError` saying that the
    Jacobian-lens subspace needs TransformerLens ≥ 4.3."""
    try:
        from transformer_lens.tools.analysis import JacobianLens
    except ImportError as err:
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version("transformer-lens")
        except PackageNotFoundError:  # pragma: no cover - depends on the environment
            have = "not installed"
        raise MissingExtraError(
            f"the Jacobian-lens subspace needs TransformerLens >= 4.3 (its transformer_lens.tools.analysis.JacobianLens; "
            f"the 3.9 release carries it too), and this environment's transformer-lens {have} has none. Install it "
            "with pip install 'transformer-lens>=4.3' and load the model as a TransformerBridge (bl.load_model does), "
            "or pass your own basis= instead.") from err
    return JacobianLens


def _fit(model, texts: List[str], layers: List[int], *, skip_first: int, dim_batch: int):
    lens_cls = jacobian_lens_class()
    n_layers = int(adapter.model_info(model).n_layers)
    sources = sorted({k for k in layers if k < n_layers - 1})
    if not sources:
        return None
    lengths = [int(model.to_tokens(t).shape[-1]) for t in texts]  # as JacobianLens.fit tokenizes them
    keep = [t for t, n in zip(texts, lengths) if n > skip_first + 1]
    if not keep:
        raise InvalidInputError(f"every prompt has at most {skip_first + 1} tokens, so none has a position to fit the "
                                f"Jacobian lens on (it skips the first {skip_first} and the last); pass longer prompts "
                                "or a smaller skip_first.")
    try:
        return lens_cls.fit(model, keep, corpus="bayes_lens prompts", source_layers=sources, dim_batch=dim_batch,
                            max_seq_len=max(lengths), skip_first_positions=skip_first, show_progress=False)
    except (TypeError, ValueError) as err:  # TransformerLens refuses the model: say why and what works
        raise UnsupportedModelError(
            f"TransformerLens's JacobianLens cannot fit this model: {err} The Jacobian lens needs a raw "
            "TransformerBridge (TransformerBridge.boot_transformers(...) or bl.load_model, without "
            "enable_compatibility_mode() or process_weights()) in eval mode.") from err


def jacobian_basis(model, prompts, layers: Union[int, Sequence[int]], rank: Optional[int] = None, *,
                   tokens=None, lens=None, skip_first: int = 1, dim_batch: int = 8
                   ) -> Union[np.ndarray, Dict[int, np.ndarray]]:
    """The Jacobian-lens subspace at ``layers`` (one layer: a ``[d_model, r]`` orthonormal basis; a list: ``{layer:
    basis}``, as :func:`bayes_lens.localize`'s ``bases=`` takes), at ``resid_post`` (the module docstring has the
    definitions).

    ``prompts`` strings or task items (the model's own prompts the lens is fitted on); ``rank`` the number of
    principal J-space directions (default 4); ``tokens`` token strings or ids instead: the span of their J-lens
    vectors (then no ``rank``); ``lens`` a fitted ``JacobianLens`` holding these layers (then ``prompts`` is not
    used for fitting); ``skip_first`` leading positions left out of the fit (TransformerLens's default 16 is for
    long corpus texts; task prompts are short, so 1: the BOS position); ``dim_batch`` output dimensions per
    backward pass.

    >>> try:
    ...     jb = jacobian_basis(model, prompts, [0, 1], rank=2)
    ...     ok = sorted(jb) == [0, 1]
    ... except bl.errors.MissingExtraError:
    ...     ok = True
    >>> ok
    True
    """
    lens_cls = jacobian_lens_class()
    adapter.check_model(model)
    single = not isinstance(layers, (list, tuple, range))
    wanted = [adapter.resolve_layer(model, layers)] if single else adapter.resolve_layers(model, list(layers))
    skip_first = check_count(skip_first, "skip_first", allow_zero=True)
    dim_batch = check_count(dim_batch, "dim_batch")
    info = adapter.model_info(model)
    d = int(info.d_model)
    if tokens is not None and rank is not None:
        raise InvalidInputError("pass rank= (the top principal J-space directions) or tokens= (the span of those "
                                "tokens' J-lens vectors), not both.")
    if tokens is None:
        rank = 4 if rank is None else check_positive_int(rank, "rank")
        if rank >= d:
            raise InvalidInputError(f"rank {rank} is not below d_model = {d}; pass a smaller rank.")
    ids = None
    if tokens is not None:
        from ..tasks import answer_token_ids

        toks = [tokens] if isinstance(tokens, (str, int)) else list(tokens)
        if not toks:
            raise InvalidInputError("tokens= is empty; pass the tokens whose J-lens vectors span the subspace.")
        strs = [t for t in toks if isinstance(t, str)]
        got = iter(answer_token_ids(model, strs)) if strs else iter(())
        ids = [int(next(got)) if isinstance(t, str) else int(t) for t in toks]
    if lens is None:
        texts, _ = prompt_data(prompts)
        lens = _fit(model, texts, wanted, skip_first=skip_first, dim_batch=dim_batch)
    elif not isinstance(lens, lens_cls):
        raise InvalidInputError(f"lens= must be a fitted transformer_lens JacobianLens, got {type(lens).__name__}.")
    W_U = model.W_U.detach().double().cpu()  # [d_model, d_vocab]
    out = {}
    for layer in wanted:
        if layer == info.n_layers - 1:
            J = torch.eye(d, dtype=torch.float64)  # the final layer's transport is the identity
        elif lens is None or layer not in lens.jacobians:
            raise InvalidInputError(f"the Jacobian lens has no transport matrix for layer {layer} (it holds "
                                    f"{[] if lens is None else lens.source_layers}); fit it on that layer.")
        else:
            J = lens.jacobians[layer].double()
        if ids is None:
            gram = W_U @ W_U.T  # [d, d]: the dictionary's Gram matrix without forming [d_vocab, d]
            vals, vecs = np.linalg.eigh((J.T @ gram @ J).numpy())
            basis = vecs[:, np.argsort(vals)[::-1][:rank]]
        else:
            vecs = (J.T @ W_U[:, ids]).numpy()  # [d, n] the J-lens vectors, as columns
            units = vecs / np.linalg.norm(vecs, axis=0, keepdims=True)
            u, s, _ = np.linalg.svd(units, full_matrices=False)
            basis = u[:, s > s[0] * max(units.shape) * np.finfo(np.float64).eps * 16]
        signs = np.sign(basis[np.argmax(np.abs(basis), axis=0), np.arange(basis.shape[1])])
        out[int(layer)] = basis * signs  # a deterministic sign per column
    return out[wanted[0]] if single else out
