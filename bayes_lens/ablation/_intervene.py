"""One intervention at one layer's site, run two ways: resumed from the kept clean stream, or a whole pass.

METHODS.md §13 ("Resumed passes"). :func:`bayes_lens.localize` and
:func:`bayes_lens.ablation.patch_statistic` change the activation of one site at one layer per prompt
(a subspace removal, mean- or resample-ablation, a swap, a shift of the decoded statistic). Each such
change is one function ``edit(batch, x)`` of the site's activation ``x`` ``[batch, pos, dim]`` (flattened
over heads; ``batch.indices`` the prompts' numbers, ``batch.last_index`` their final real positions), and
:func:`run_edit` is the one runner of it:

* **resumed** (``site="resid_post"`` with a :class:`ResumedStream`): the edit is applied to the clean
  residual stream kept after the layer, and only the later blocks run (TransformerLens's
  ``start_at_layer``: the HookedTransformer has it; the TL 4.3 bridge accepts it but still runs every block,
  swapping the residual in at the start block, so there it saves nothing), so k interventions at layer L
  cost about 1 + k·(1 − (L + 1)/n_layers) forward passes;
* **whole pass** (any site, any model kind): the same ``edit`` runs as a hook at the site's hook point,
  through the runner (:func:`bayes_lens.collect.collect`), for every prompt at once.

Either way the final-token rows of the same site at later layers (``read_layers``) come back with the
answer posterior, for the downstream readout (Δρ). The kept stream is taken from the analysis's own
clean pass (:class:`StreamKeeper`, a per-batch hook factory for that pass: no extra pass), and
:meth:`ResumedStream.check` compares the unpatched resume with the clean pass on the first batch; a
model kind that resumes differently (the TL 3 bridge has no ``start_at_layer``) falls back to whole
passes.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import adapter
from ..collect import collect
from ..reads import FinalRows

__all__ = ["ResumedStream", "StreamKeeper", "run_edit"]


class StreamKeeper:
    """A per-batch ``fwd_hooks`` factory for an analysis's clean :func:`~bayes_lens.collect.collect`: it keeps
    each batch's clean ``hook_resid_post`` after every layer of ``layers`` (read-only hooks), so the
    interventions resume from it without a pass of their own (:meth:`stream`)."""

    def __init__(self, model, layers: Sequence[int]):
        self.model = model
        self.names = {int(layer): adapter.hook_name(model, int(layer), "resid_post") for layer in layers}
        self.kept: Dict[int, list] = {layer: [] for layer in self.names}

    def __call__(self, batch) -> List[tuple]:
        hooks = []
        for layer, name in self.names.items():
            def grab(act, hook=None, layer=layer):
                self.kept[layer].append((batch, act.detach().clone()))
            hooks.append((name, grab))
        return hooks

    def stream(self, layer: int, answer_ids, clean_logprobs, n: int) -> Optional["ResumedStream"]:
        """The :class:`ResumedStream` after ``layer`` from the kept batches, or None when they do not hold each of
        the ``n`` prompts once (a runner that ran the clean pass elsewhere, e.g. from shards on disk)."""
        batches = self.kept.get(int(layer), [])
        seen = np.concatenate([b.indices.numpy() for b, _ in batches]) if batches else np.zeros(0, dtype=np.int64)
        if len(seen) != n or not np.array_equal(np.sort(seen), np.arange(n)):
            return None
        return ResumedStream(self.model, layer, answer_ids, batches, clean_logprobs)


class ResumedStream:
    """The clean residual stream after ``layer`` kept per batch (``batches``: ``(Batch, resid [b, pos, d])``
    pairs, as :class:`StreamKeeper` keeps them), and the rest of the model run from it.

    An intervention at ``resid_post`` of layer L changes nothing below it, so each one costs the blocks
    after L only (TransformerLens's ``start_at_layer``). ``clean_logprobs`` ``[n, K]`` are the clean pass's
    answer log-probabilities, for :meth:`check`.
    """

    def __init__(self, model, layer: int, answer_ids, batches, clean_logprobs):
        self.model, self.layer, self.ids = model, int(layer), list(answer_ids)
        self.batches = list(batches)
        self.clean = np.asarray(clean_logprobs, dtype=np.float64)

    def run(self, edit=None, read_layers: Sequence[int] = (), batches=None
            ) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
        """(``[n, K]`` answer log-probabilities, ``{layer: [n, d]}`` final-token ``resid_post`` rows at each of
        ``read_layers``, all after this one) with ``edit(batch, resid) -> resid`` applied to the kept stream; rows
        in the order of the prompts' numbers (``batches``: a subset of the kept ones, for :meth:`check`)."""
        n_layers = int(adapter.model_info(self.model).n_layers)
        batches = self.batches if batches is None else batches
        names = {int(k): adapter.hook_name(self.model, int(k), "resid_post") for k in read_layers}
        lps, got_rows, order = [], {k: [] for k in names}, []
        for batch, resid in batches:
            x = resid if edit is None else edit(batch, resid.clone())
            got = {}

            def grab(act, hook=None, key=None, batch=batch, got=got):
                got[key] = act[torch.arange(act.shape[0], device=act.device),
                               batch.last_index.to(act.device)].detach().double().cpu()

            # each hook knows its layer (a bridge names an aliased point by its target: hook_out, not hook_resid_post)
            hooks = [(name, functools.partial(grab, key=k)) for k, name in names.items()]
            with adapter.model_lock(self.model), torch.inference_mode(), \
                    adapter.final_token_unembedding(self.model, batch.last_index), \
                    adapter.added_hooks(self.model, hooks):
                logits = self.model(x, start_at_layer=self.layer + 1, attention_mask=batch.attention_mask,
                                    return_type="logits") if self.layer + 1 < n_layers else \
                    self.model.unembed(self.model.ln_final(x))
            lps.append(torch.log_softmax(logits[:, -1].double(), -1)[:, self.ids].cpu().numpy())
            for k in names:
                got_rows[k].append(got[k].numpy())
            order.append(batch.indices.numpy())
        back = np.argsort(np.concatenate(order), kind="stable")
        return (np.concatenate(lps)[back], {k: np.concatenate(v)[back] for k, v in got_rows.items()})

    def logprobs(self, edit=None) -> np.ndarray:
        """``[n, K]`` answer log-probabilities with ``edit(batch, resid) -> resid`` applied at the layer."""
        return self.run(edit)[0]

    def check(self, tol: float = 1e-3) -> Optional[str]:
        """None when the unpatched resume of the first batch reproduces the clean pass, else why not (in words);
        one batch decides, so a kind that cannot resume costs one batch's later blocks, not a pass."""
        first = self.batches[:1]
        try:
            got, _ = self.run(batches=first)
        except Exception as err:  # noqa: BLE001 - a kind that cannot resume: whole passes instead
            return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        worst = float(np.max(np.abs(got - self.clean[np.sort(first[0][0].indices.numpy())])))
        return None if worst <= tol else f"the resumed log-probabilities differ from the whole pass by {worst:.3g}"


def run_edit(model, texts, answer_ids, edit, *, layer: int, site: str, stream: Optional[ResumedStream] = None,
             read_layers: Sequence[int] = (), batch_size: int = 16, desc: str = "intervention"
             ) -> Tuple[np.ndarray, Dict[int, np.ndarray]]:
    """(the answer posterior ``[n, K]``, ``{layer: [n, dim]}`` final-token rows of ``site`` at ``read_layers``) with
    ``edit(batch, x) -> x`` applied to ``layer``'s ``site`` (``x`` ``[batch, pos, dim]``, flattened over heads): on
    the kept clean stream when ``stream`` is given (``site="resid_post"``), else by a hook at the site in a whole
    pass (the module docstring). ``edit`` may change ``x`` in place; it gets its own copy."""
    from ..sula import answer_posterior

    read_layers = [int(k) for k in read_layers]
    if stream is not None:
        lp, rows = stream.run(edit, read_layers)
        return answer_posterior(lp)[0], rows
    hook = adapter.hook_name(model, layer, site)

    def factory(batch):
        def fn(act, hook=None):
            flat = act.reshape(act.shape[0], act.shape[1], -1).clone()
            return edit(batch, flat).reshape(act.shape).to(act.dtype)
        return [(hook, fn)]

    rc = collect(model, list(texts), token_ids=list(answer_ids), fwd_hooks=factory,
                 reads=[FinalRows(k, site) for k in read_layers], batch_size=batch_size, progress=False, desc=desc)
    return (answer_posterior(rc.token_logprobs())[0],
            {k: rc.value_rows(k, site).double().numpy() for k in read_layers})
