"""expand_kv=True repeats each KV head next to itself (einops pattern), checked against torch's
repeat_interleave over the head axis, which is how grouped-query attention maps query heads to KV heads."""

from __future__ import annotations

import numpy as np
import torch

from bayes_lens import adapter
from bayes_lens._geometry._sources import expand_kv_heads
from bayes_lens.models.tiny import tiny_model


def test_expand_kv_heads_matches_repeat_interleave():
    model = tiny_model("bridge", gqa=True, rotary=True)
    info = adapter.model_info(model)
    rep = info.n_heads // info.n_kv_heads
    assert rep > 1
    x = np.random.default_rng(0).normal(size=(7, info.n_kv_heads * info.d_head))
    got = expand_kv_heads(x, model, True)
    ref = torch.from_numpy(x).view(7, info.n_kv_heads, info.d_head).repeat_interleave(rep, dim=1).reshape(7, -1)
    np.testing.assert_array_equal(got, ref.numpy())
    assert expand_kv_heads(x, model, False) is x
