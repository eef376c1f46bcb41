"""Running only the blocks after layer L from a kept residual stream, on every model kind (METHODS.md §13,
"resuming").

An intervention at ``hook_resid_post`` of layer L changes nothing in blocks 0..L, so its pass needs only the
blocks after L, fed with the clean stream kept after L (edited). How each kind does that:

* **HookedTransformer**: TransformerLens's own ``forward(resid, start_at_layer=L + 1)``, which loops over
  ``blocks[L + 1:]`` only.
* **TransformerBridge** (TL 3.x and 4.x): the bridge hands the layer loop to the wrapped transformers model,
  so TL 4.3's ``start_at_layer`` still executes blocks 0..L (its docstring says so) and TL 3.9 has none. Here
  the forward runs on the tokens as usual (so the embedding, the attention masks and the rotary or position
  inputs are built by the model's own code, for the right length and padding), but while it runs the wrapped
  layer of each block 0..L-1 returns its input untouched and that of block L returns the kept stream: those
  blocks cost nothing, block L + 1 receives exactly the kept stream, and every hook point of the later blocks
  fires as in a whole pass. The output format of a wrapped layer is that of transformers ≥ 5 (the hidden state
  tensor); a caller checks the first batch against the whole pass (``KeptStream.check``) and falls back to
  whole passes where a kind differs.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from ._models import is_bridge, model_info


def _wrapped_layer(block) -> Optional[torch.nn.Module]:
    return getattr(block, "original_component", None)


@contextlib.contextmanager
def _skipped_blocks(model, layer: int, resid: Tensor):
    """Blocks 0..``layer`` of a bridge do no work; block ``layer`` hands on ``resid``."""
    patched = []

    def passthrough(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def inject(*args, **kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        return resid.to(device=h.device, dtype=h.dtype)

    try:
        for j in range(layer + 1):
            inner = _wrapped_layer(model.blocks[j])
            if inner is None:
                raise NotImplementedError(f"block {j} of this bridge wraps no layer module")
            inner.forward = inject if j == layer else passthrough
            patched.append(inner)
        yield
    finally:
        for inner in patched:
            if "forward" in vars(inner):
                del inner.forward


def run_from_layer(model, resid: Tensor, layer: int, tokens: Tensor, attention_mask: Tensor) -> Tensor:
    """The model's logits with ``resid`` ``[batch, pos, d_model]`` as ``hook_resid_post`` of ``layer``: only the
    blocks after ``layer``, the final norm and the unembedding run (see the module docstring for each kind).
    ``tokens`` and ``attention_mask`` are the batch the stream was kept from. Hooks already on the model fire
    for the later blocks as in a whole pass."""
    n_layers = int(model_info(model).n_layers)
    if not is_bridge(model):
        if layer + 1 < n_layers:
            return model(resid, start_at_layer=layer + 1, attention_mask=attention_mask, return_type="logits")
        return model.unembed(model.ln_final(resid))
    if resid.shape[:2] != tokens.shape:
        raise ValueError(f"the kept stream's shape {list(resid.shape[:2])} is not the tokens' {list(tokens.shape)}")
    with _skipped_blocks(model, layer, resid):
        return model(tokens, attention_mask=attention_mask, return_type="logits")
