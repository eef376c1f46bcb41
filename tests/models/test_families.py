"""Family x kind matrix: tiny random models of nine architecture families, every model kind.

For each family of :data:`bayes_lens.models.tiny.FAMILIES` (GPT-2, Pythia, Phi, Llama-3, Mistral,
Mixtral, Qwen2, Gemma-2, Gemma-3) and each kind a TransformerLens user meets (HookedTransformer raw
and processed as ``from_pretrained`` does, TransformerBridge, the bridge in compatibility mode), the
public analyses run and their numbers are checked against an **independent computation from the
transformers twin** (same weights): plain torch forward hooks on its value projection,
``output_attentions=True`` and its returned logits, with numpy for PCA, entropies and cosines. No
bayes_lens helper computes a reference value here.

Processed weights: ``fold_value_biases`` moves b_V out of ``hook_v`` (a constant shift per head), so
value rows are compared after centring on processed kinds (PCA is shift-invariant), and the key
cosines are compared with W_K folded as TL folds it (the norm gain multiplied in; centred over
d_model for LayerNorm).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

import bayes_lens as bl
from bayes_lens.models.tiny import FAMILIES, FAMILY_KINDS, family_support, tiny_hf_model, tiny_model, tiny_tokenizer

PROMPTS = [
    "the cat is on the house",
    "a dog",
    " 0 1 1 0 1 0 0 1",
    "the moon river stone bird",
    "query: dax lug mip is",
    "apple chair cloud lamp tree",
    "zorb wug kep the cat",
    "a bird is a bird is a bird",
    " 1 1 1 0",
    "the house of the river",
]
CELLS = [(f, k) for f in FAMILIES for k in FAMILY_KINDS]
# the slowest cells (MoE experts, and the compatibility-mode conversion of every family)
SLOW = {("mixtral", k) for k in FAMILY_KINDS} | {(f, "bridge_compat") for f in FAMILIES}


def _params(cells):
    out = []
    for f, k in cells:
        marks = [pytest.mark.slow] if (f, k) in SLOW else []
        why = family_support(f, k)
        if why is not None:
            marks.append(pytest.mark.skip(reason=why))
        out.append(pytest.param(f, k, marks=marks, id=f"{f}-{k}"))
    return out


@functools.lru_cache(maxsize=None)
def _model(family, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_model(kind, family=family)


@functools.lru_cache(maxsize=None)
def _hf(family):
    return tiny_hf_model(family)


def _ids():
    tok = tiny_tokenizer()
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


# --- the transformers twin, read with plain torch -------------------------------------------------

def _layers(hf, family):
    if family == "gpt2":
        return hf.transformer.h
    if family == "pythia":
        return hf.gpt_neox.layers
    return hf.model.layers


def _v_module(hf, family, layer):
    blk = _layers(hf, family)[layer]
    if family == "gpt2":
        return blk.attn.c_attn
    if family == "pythia":
        return blk.attention.query_key_value
    return blk.self_attn.v_proj


def _edit_v(family, cfg, out, fn):
    """Apply ``fn`` to the value part ``[b, p, n_kv*d_head]`` of the module's output; returns the new output."""
    if family == "gpt2":
        d = cfg.n_embd
        return torch.cat([out[..., : 2 * d], fn(out[..., 2 * d:])], dim=-1)
    if family == "pythia":
        h = cfg.num_attention_heads
        qkv = out.view(*out.shape[:-1], h, 3, -1)  # transformers: view(..., -1, 3 * head_size), chunk(3)
        dh = qkv.shape[-1]
        v = qkv[..., 2, :].reshape(*out.shape[:-1], h * dh)
        qkv = torch.cat([qkv[..., :2, :], fn(v).view(*out.shape[:-1], h, 1, dh)], dim=-2)
        return qkv.reshape(out.shape)
    return fn(out)


def _reference(family, edit=None):
    """Per prompt (unpadded): final-token value rows of the last layer, final attention rows, final logits."""
    hf = _hf(family)
    cfg = hf.config
    last = len(_layers(hf, family)) - 1
    rows, attn, logits = [], [], []

    def hook(module, inputs, out):
        captured = {}

        def grab(v):
            captured["v"] = v.detach().clone()
            return edit(v) if edit is not None else v

        new = _edit_v(family, cfg, out, grab)
        rows.append(captured["v"][0, -1])
        return new if edit is not None else None

    handle = _v_module(hf, family, last).register_forward_hook(hook)
    try:
        with torch.no_grad():
            for ids in _ids():
                out = hf(torch.tensor([ids]), output_attentions=True)
                logits.append(out.logits[0, -1].double())
                attn.append(torch.stack([a[0, :, -1].double() for a in out.attentions]))  # [L, H, k]
    finally:
        handle.remove()
    return torch.stack(rows).double().numpy(), attn, torch.stack(logits)


def _entropy_bits(p):
    p = p[p > 0]
    return float(-(p * torch.log2(p)).sum())


def _logit_entropy_bits(logits):
    lp = torch.log_softmax(logits.double(), -1)
    return (-(lp.exp() * lp).sum(-1) / np.log(2)).numpy()


def _pcs(x):
    x = x - x.mean(0)
    sd = x.std(0)
    x = x[:, sd > 1e-9 * max(1.0, float(sd.max()))] / sd[sd > 1e-9 * max(1.0, float(sd.max()))]
    s2 = np.linalg.svd(x, compute_uv=False) ** 2
    return s2[0] / s2.sum(), (s2[0] + s2[1]) / s2.sum()


def _key_weights(family, layer, folded):
    """[n_kv, d_model, d_head] W_K of the twin, folded as TL folds it when ``folded``."""
    hf = _hf(family)
    cfg = hf.config
    blk = _layers(hf, family)[layer]
    if family == "gpt2":
        d, h = cfg.n_embd, cfg.n_head
        w = blk.attn.c_attn.weight.detach()[:, d:2 * d].reshape(d, h, d // h).permute(1, 0, 2)
        norm, layer_norm = blk.ln_1, True
    elif family == "pythia":
        h = cfg.num_attention_heads
        w = blk.attention.query_key_value.weight.detach()
        w = w.view(h, 3, -1, w.shape[-1])[:, 1].transpose(1, 2)
        norm, layer_norm = blk.input_layernorm, True
    else:
        k = blk.self_attn.k_proj.weight.detach()
        dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        w = k.view(-1, dh, k.shape[-1]).transpose(1, 2)
        norm, layer_norm = blk.input_layernorm, family == "phi"
    w = w.double()
    if folded:
        g = norm.weight.detach().double() + (1.0 if family.startswith("gemma") else 0.0)
        w = w * g[None, :, None]
        if layer_norm:
            w = w - w.mean(dim=1, keepdim=True)
    return w.numpy()


def _mean_abs_offdiag(w):
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    cos = np.abs(np.einsum("hdi,hdj->hij", u, u))
    m = w.shape[-1]
    return (cos.sum(axis=(1, 2)) - np.trace(cos, axis1=1, axis2=2)) / (m * (m - 1))


def _processed(model):
    return bl.adapter.model_info(model).processed


# --- the matrix -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family,kind", _params(CELLS))
def test_geometry_matches_transformers(family, kind):
    """PC1/PC1+PC2, attention entropies and their window-aware baselines, key cosines, next-token entropy."""
    model = _model(family, kind)
    v, attn, logits = _reference(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        geo = bl.geometry(model, PROMPTS, n_boot=20, n_null=10, n_perm=20, progress=False)
    pc1, pc12 = _pcs(v)
    assert geo.value_manifold.pc1.value == pytest.approx(pc1, abs=1e-4)
    assert geo.value_manifold.pc12.value == pytest.approx(pc12, abs=1e-4)

    head = np.array([[[_entropy_bits(a[layer, h]) for h in range(a.shape[1])] for layer in range(a.shape[0])]
                     for a in attn])  # [prompt, layer, head]
    af = geo.attention_focusing
    np.testing.assert_allclose(af.head_entropy_bits.double().numpy(), head.mean(0), atol=1e-4)
    np.testing.assert_allclose(af.layer_entropy_bits.double().numpy(), head.mean(2).mean(0), atol=1e-4)
    visible = np.array([[int((a[layer, 0] > 0).sum()) for layer in range(a.shape[0])] for a in attn])
    np.testing.assert_allclose(af.layer_uniform_entropy_bits.double().numpy(), np.log2(visible).mean(0), atol=1e-9)

    ko = geo.key_orthogonality
    folded = _processed(model)
    want = np.stack([_mean_abs_offdiag(_key_weights(family, layer, folded)) for layer in range(model.cfg.n_layers)])
    np.testing.assert_allclose(ko.per_head.double().numpy(), want, atol=1e-5)
    assert ko.processed == folded

    col = bl.collect.collect(model, PROMPTS, value_layers=[-1], progress=False)
    np.testing.assert_allclose(col.next_token_entropy_bits().double().numpy(), _logit_entropy_bits(logits), atol=1e-4)
    rows = col.value_rows(model.cfg.n_layers - 1, "v").double().numpy()
    if folded:  # fold_value_biases: hook_v = v - b_V
        rows, v = rows - rows.mean(0), v - v.mean(0)
    np.testing.assert_allclose(rows, v, atol=1e-4)


def _attached_cache(model):
    tokens, mask = bl.adapter.tokenize(model, PROMPTS)
    last = mask.sum(1) - 1
    with bl.attach(model):
        _, cache = model.run_with_cache(tokens, attention_mask=mask,
                                        names_filter=lambda n: n.endswith(("entropy", "hook_pattern_entropy")))
    return cache, last


@pytest.mark.parametrize("family,kind", _params(CELLS))
def test_hook_points_match_transformers(family, kind):
    """bayes_lens's attention-entropy hook points at each prompt's final real query row."""
    model = _model(family, kind)
    _, attn, _ = _reference(family)
    cache, last = _attached_cache(model)
    for layer in range(model.cfg.n_layers):
        got = cache["pattern_entropy", layer]  # TL's own short-name resolution; [batch, query_pos, head]
        got = got[torch.arange(len(PROMPTS)), last].double().numpy()  # [prompt, head]
        want = np.array([[_entropy_bits(a[layer, h]) for h in range(a.shape[1])] for a in attn])
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("family,kind", _params(CELLS))
def test_next_token_entropy_hook_matches_returned_logits(family, kind):
    """``hook_next_token_entropy`` is the entropy of the logits transformers returns (softcap included)."""
    model = _model(family, kind)
    _, _, logits = _reference(family)
    cache, last = _attached_cache(model)
    got = cache["hook_next_token_entropy"][torch.arange(len(PROMPTS)), last, 0].double().numpy()
    np.testing.assert_allclose(got, _logit_entropy_bits(logits), atol=1e-4)


@pytest.mark.parametrize("family,kind", _params(CELLS))
def test_removal_patch_matches_transformers(family, kind):
    """axis.removal() on the TL model = v - (v.u)u on the twin's value projection (raw kinds); on a
    processed kind the basis-independent removal(center=True) = v - ((v - mean v).u)u on the twin."""
    model = _model(family, kind)
    layer = model.cfg.n_layers - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        axis = bl.EntropyAxis(layer=-1, progress=False).fit(model, PROMPTS)
    u = axis.axes_[layer].double()
    processed = _processed(model)
    assert axis.basis_ == ("processed" if processed else "raw")
    v_clean, _, _ = _reference(family)
    mu = torch.from_numpy(v_clean.mean(0)) if processed else torch.zeros_like(u)

    def remove(v):
        w = v.double()
        c = (w - mu.to(w)) @ u.to(w)
        return (w - c.unsqueeze(-1) * u.to(w)).to(v.dtype)

    _, _, want = _reference(family, edit=remove)
    patch = axis.removal(center=processed)
    got = []
    with bl.patched(model, patch), torch.no_grad():
        for ids in _ids():
            got.append(model(torch.tensor([ids]))[0, -1].double())
    got = torch.log_softmax(torch.stack(got), -1)
    np.testing.assert_allclose(got.numpy(), torch.log_softmax(want, -1).numpy(), atol=1e-4)
    # the patch changed something (so the comparison is not clean vs clean)
    _, _, clean = _reference(family)
    assert float((torch.log_softmax(clean, -1) - got).abs().max()) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("family,kind", _params([(f, k) for f in FAMILIES for k in ("hooked_processed", "bridge")]))
def test_other_public_analyses_run(family, kind):
    """SULA evaluation, the martingale gap and compare_patched run on every family (numbers are
    checked elsewhere on llama; here: they run and give finite results)."""
    model = _model(family, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items = bl.sula.make_prompts(model, ks=(0, 2), n_per_k=3, seed=0)
        ev = bl.sula.evaluate(model, items, n_boot=10, progress=False)
        assert np.isfinite(ev.to_dataframe().select_dtypes("number").to_numpy(dtype=float)).any()
        g = bl.martingale.gap(model, ns=(4, 6, 8), n_seqs=4, n_boot=10, progress=False)
        assert np.isfinite(np.asarray(g.to_dataframe().select_dtypes("number"), dtype=float)).any()
        axis = bl.EntropyAxis(layer=-1, progress=False).fit(model, PROMPTS)
        cmp = bl.compare_patched(model, PROMPTS, [axis.removal(center=True)], n_random_seeds=1, n_boot=10,
                                 progress=False)
        assert len(cmp.to_dataframe()) >= 1


# --- the removal is one intervention whatever the weight processing -------------------------------

@pytest.mark.parametrize("raw_kind,proc_kind", [("hooked", "hooked_processed"), ("bridge", "bridge_compat")])
@pytest.mark.parametrize("family", ["gpt2", "pythia", "qwen2"])
def test_centred_removal_is_the_same_on_processed_and_raw_twins(family, raw_kind, proc_kind, tmp_path):
    """fold_value_biases moves b_V out of hook_v: the plain removal v - (v.u)u then differs between a
    processed model and its raw twin (and warns); removal(center=True) is the same intervention (1e-4)."""
    if family_support(family, proc_kind) is not None:
        pytest.skip(family_support(family, proc_kind))
    raw, proc = _model(family, raw_kind), _model(family, proc_kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax_raw = bl.EntropyAxis(layer=-1, progress=False).fit(raw, PROMPTS)
        ax_proc = bl.EntropyAxis(layer=-1, progress=False).fit(proc, PROMPTS)
    assert (ax_raw.basis_, ax_proc.basis_) == ("raw", "processed")
    assert ax_proc.model_meta_["value_bias_folded"] is True and ax_raw.model_meta_["value_bias_folded"] is False
    ax_proc.save(tmp_path / "axis.safetensors")
    assert bl.EntropyAxis.load(tmp_path / "axis.safetensors").basis_ == "processed"

    def final_logprobs(model, patch):
        out = []
        with bl.patched(model, patch), torch.no_grad():
            for ids in _ids():
                out.append(model(torch.tensor([ids]))[0, -1].double())
        return torch.log_softmax(torch.stack(out), -1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the centred removal warns on neither basis
        a = final_logprobs(raw, ax_raw.removal(center=True))
        b = final_logprobs(proc, ax_proc.removal(center=True))
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4)
    with pytest.warns(UserWarning, match="center=True"):
        plain_proc = ax_proc.removal()
    plain_raw = ax_raw.removal()
    gap = float((final_logprobs(raw, plain_raw) - final_logprobs(proc, plain_proc)).abs().max())
    assert gap > 1e-3  # the uncentred removals are different interventions (why the warning exists)


def test_uncentred_removal_on_raw_weights_does_not_warn():
    model = _model("gpt2", "bridge")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        axis = bl.EntropyAxis(layer=-1, progress=False).fit(model, PROMPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        axis.removal()
        axis.keep_only()
        axis.random_control(seed=0)


@pytest.mark.parametrize("family,kind", _params([(f, k) for f in FAMILIES for k in FAMILY_KINDS if (f, k) not in SLOW]))
def test_value_biases_folded_matches_the_architecture(family, kind):
    """adapter.value_biases_folded: True exactly for processed models whose twin has value or norm biases."""
    model = _model(family, kind)
    hf = _hf(family)
    has_bias = any(n.endswith("bias") and ("norm" in n or ".ln_" in n or "v_proj" in n or "c_attn" in n
                                          or "query_key_value" in n) for n, _ in hf.named_parameters())
    assert bl.adapter.value_biases_folded(model) is (has_bias and _processed(model))
    assert bl.adapter.masks_left_padding_from_tokens(model) is (not bl.adapter.is_bridge(model))


# --- issue 32 §3: what weight processing changes is site-aware -------------------------------------

_ONLY = {
    "value_biases": dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=True),
    "centring": dict(fold_ln=False, center_writing_weights=True, center_unembed=False, fold_value_biases=False),
}


def _hooked_with(family, flags):
    """The raw HookedTransformer of ``family`` processed with exactly ``flags`` (TL's own processing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tiny_model("hooked", family=family)
        model.load_and_process_state_dict(model.state_dict(), **flags)
    return model.eval()


def _final_logprobs(model, patch):
    out = []
    with bl.patched(model, patch), torch.no_grad():
        for ids in _ids():
            out.append(model(torch.tensor([ids]))[0, -1].double())
    return torch.log_softmax(torch.stack(out), -1)


def _fit(model, site):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bl.EntropyAxis(layer=-1, site=site, progress=False).fit(model, PROMPTS)


@pytest.mark.skipif(not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TransformerLens 3.x")
@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_fold_value_biases_alone_is_reported_and_warned(family):
    """``fold_value_biases`` alone (what from_pretrained keeps with fold_ln, center_writing_weights and
    center_unembed off) was reported as raw weights and its uncentred removal, different from the raw twin's,
    did not warn. Now: named in processing (the basis stays raw: W_K and the PCA direction are the raw
    model's), recorded on the axis, the v-site removal warns, and removal(center=True) equals the raw twin's."""
    raw, folded = _model(family, "hooked"), _hooked_with(family, _ONLY["value_biases"])
    processed, how = bl.adapter.processing(folded)
    assert processed is False and "fold_value_biases" in how
    assert bl.adapter.processing(raw) == (False, "raw weights")
    assert bl.adapter.value_biases_folded(folded) is True and bl.adapter.value_biases_folded(raw) is False
    # independently: TL moved b_V into b_O, so hook_v is the raw value minus b_V (a constant per head)
    for blk_raw, blk in zip(raw.blocks, folded.blocks):
        assert float(blk.attn.b_V.detach().abs().max()) == 0.0 and float(blk_raw.attn.b_V.detach().abs().max()) > 0
    ax_raw, ax = _fit(raw, "v"), _fit(folded, "v")
    assert ax.model_meta_["value_bias_folded"] is True and ax.basis_ == "raw"
    np.testing.assert_allclose(abs(float(ax.axis_.double() @ ax_raw.axis_.double())), 1.0, atol=1e-4)
    with pytest.warns(UserWarning, match="fold_value_biases"):
        plain = ax.removal()
    gap = float((_final_logprobs(folded, plain) - _final_logprobs(raw, ax_raw.removal())).abs().max())
    assert gap > 1e-2  # the reason for the warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        centred = _final_logprobs(folded, ax.removal(center=True))
        ax.removal(center=True), ax.shift(1.0)  # neither depends on the constant: no warning
        ax_raw.removal()
    np.testing.assert_allclose(centred.numpy(), _final_logprobs(raw, ax_raw.removal(center=True)).numpy(), atol=1e-4)
    # a raw-fitted patch applied to the folded model is a different intervention there: it warns
    with pytest.warns(UserWarning, match="value biases folded"):
        with bl.patched(folded, ax_raw.removal()):
            pass


@pytest.mark.parametrize("raw_kind,proc_kind", [pytest.param("hooked", "hooked_processed", marks=pytest.mark.skipif(
    not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TransformerLens 3.x")),
    pytest.param("bridge", "bridge_compat", marks=pytest.mark.slow)])
def test_resid_post_axis_warns_about_centring_not_value_biases(raw_kind, proc_kind):
    """A resid_post axis under center_writing_weights changes direction and its removal differs from the raw
    twin's by nats, and used to pass without a warning while every flag on gave the value-bias warning.
    hook_resid_post of the centred model is the raw residual minus its mean over d_model (checked
    directly); the resid_post patches warn about centring, and not about value biases."""
    if family_support("gpt2", proc_kind) is not None:
        pytest.skip(family_support("gpt2", proc_kind))
    raw, proc = _model("gpt2", raw_kind), _model("gpt2", proc_kind)
    assert bl.adapter.writing_weights_centred(proc) and not bl.adapter.writing_weights_centred(raw)
    name = bl.adapter.hook_name(raw, -1, "resid_post")
    ids = torch.tensor([_ids()[0]])
    with torch.no_grad():
        r_raw = raw.run_with_cache(ids, names_filter=lambda n: n == name)[1][name].double()
        r_proc = proc.run_with_cache(ids, names_filter=lambda n: n == name)[1][name].double()
    np.testing.assert_allclose(r_proc.numpy(), (r_raw - r_raw.mean(-1, keepdim=True)).numpy(), atol=1e-4)
    ax_raw, ax = _fit(raw, "resid_post"), _fit(proc, "resid_post")
    assert ax.model_meta_["writing_weights_centred"] is True
    assert abs(float(ax.axis_.double() @ ax_raw.axis_.double())) < 0.999
    for build in (ax.removal, lambda: ax.removal(center=True), ax.keep_only, lambda: ax.shift(1.0),
                  lambda: ax.random_control(seed=0)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build()
        texts = [str(w.message) for w in caught]
        assert any("center_writing_weights" in t for t in texts), texts
        assert not any("folded out of hook_v" in t for t in texts), texts  # the v-site warning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gap = float((_final_logprobs(proc, ax.removal()) - _final_logprobs(raw, ax_raw.removal())).abs().max())
    assert gap > 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # raw weights: nothing to say
        ax_raw.removal(), ax_raw.shift(1.0), ax_raw.keep_only()


@pytest.mark.skipif(not bl.adapter.has_hooked_transformer(), reason="HookedTransformer needs TransformerLens 3.x")
@pytest.mark.parametrize("family,site,flags", [("qwen2", "resid_post", "all"), ("gpt2", "resid_post", "value_biases"),
                                               ("gpt2", "v", "centring")])
def test_processing_that_leaves_the_site_alone_does_not_warn(family, site, flags):
    """Every flag on Qwen2 (RMSNorm: TL does not centre it) leaves hook_resid_post as on the raw twin; value
    biases alone leave GPT-2's resid_post alone; centring alone leaves hook_v alone (LayerNorm removes the
    mean). The removal equals the raw twin's there (1e-4) and no basis warning is given."""
    proc = _model(family, "hooked_processed") if flags == "all" else _hooked_with(family, _ONLY[flags])
    raw = _model(family, "hooked")
    ax_raw, ax = _fit(raw, site), _fit(proc, site)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch = ax.removal()
        ax.keep_only(), ax.shift(1.0), ax.random_control(seed=0)
        got = _final_logprobs(proc, patch)
    np.testing.assert_allclose(got.numpy(), _final_logprobs(raw, ax_raw.removal()).numpy(), atol=1e-4)


def test_readme_gemma2_softcap_note_matches_the_code():
    """README's note 3 said hook_next_token_entropy is computed *before* Gemma-2's final-logit softcap (a fix
    under way, the test xfail). It is computed on the returned, capped logits: on the Gemma-2 twin the hook
    equals the entropy of transformers' logits and differs from that of the uncapped logits (recovered by
    atanh), so the softcap matters here and is included. The README now says so (the note moved to
    docs/models.md, which the README links)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    note = text[text.index("3. ", text.index("Limits that are TransformerLens's own")):]
    note = " ".join(note[: note.index("\n\n")].split())
    assert "softcap included" in note and "before" not in note and "xfail" not in note and "under way" not in note
    marks = {m.name for m in getattr(test_next_token_entropy_hook_matches_returned_logits, "pytestmark", [])}
    assert "xfail" not in marks
    kind = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
    model = _model("gemma2", kind)
    _, _, logits = _reference("gemma2")
    cap = float(_hf("gemma2").config.final_logit_softcapping)
    uncapped = cap * torch.atanh((logits / cap).clamp(-1 + 1e-12, 1 - 1e-12))
    cache, last = _attached_cache(model)
    got = cache["hook_next_token_entropy"][torch.arange(len(PROMPTS)), last, 0].double().numpy()
    np.testing.assert_allclose(got, _logit_entropy_bits(logits), atol=1e-4)
    assert float(np.abs(_logit_entropy_bits(uncapped) - _logit_entropy_bits(logits)).max()) > 1e-3
