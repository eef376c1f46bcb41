"""The shipped wind-tunnel checkpoints: loading as both model kinds, entropy error, geometry comparison."""

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

import bayes_lens as bl
from bayes_lens.adapter import has_hooked_transformer


@pytest.mark.parametrize("name", ["bijection", "hmm"])
def test_shipped_checkpoint_loads_and_is_small(name):
    path = bl.windtunnel.shipped_path(name)
    assert sum(f.stat().st_size for f in path.iterdir()) < 3_000_000
    assert not (path / "optimizer.safetensors").exists()
    ckpt = bl.windtunnel.read_checkpoint(path)
    assert ckpt.task.name == name and ckpt.step > 0 and ckpt.extra.get("command")


def test_shipped_bijection_error(tiny_kind):
    model, task = bl.windtunnel.load("bijection", kind=tiny_kind)
    assert bl.adapter.is_bridge(model) == (tiny_kind == "bridge")
    res = bl.windtunnel.evaluate(model, task, n_seqs=500, seed=11, n_boot=200)
    base, _ = bl.windtunnel.untrained("bijection", seed=0, kind=tiny_kind)
    res0 = bl.windtunnel.evaluate(base, task, n_seqs=500, seed=11, n_boot=200)
    assert res.mae_bits.value < 0.05 and res.mae_bits.ci_high < 0.06
    assert res0.mae_bits.value > 1.0
    assert res.kl_bits < 0.1 < res0.kl_bits
    np.testing.assert_allclose(res.table["bayes_entropy_bits"], np.log2(task.V - np.arange(task.V)))


def test_shipped_hmm_error(tiny_kind):
    model, task = bl.windtunnel.load("hmm", kind=tiny_kind)
    res = bl.windtunnel.evaluate(model, task, n_seqs=500, seed=11, n_boot=200)
    base, _ = bl.windtunnel.untrained("hmm", seed=0, kind=tiny_kind)
    res0 = bl.windtunnel.evaluate(base, task, n_seqs=500, seed=11, n_boot=200)
    assert res.mae_bits.value < 0.1 * res0.mae_bits.value
    assert res.seq_mae_bits.value < 0.3 * res0.seq_mae_bits.value
    assert res.kl_bits < 0.1 * res0.kl_bits


@pytest.mark.skipif(not has_hooked_transformer(), reason="HookedTransformer needs TransformerLens 3.x")
@pytest.mark.parametrize("name", ["bijection", "hmm"])
def test_shipped_kinds_agree(name):
    hooked, task = bl.windtunnel.load(name, kind="hooked")
    bridge, _ = bl.windtunnel.load(name, kind="bridge")
    tokens = torch.as_tensor(task.sample(4, seed=0).tokens)
    with torch.no_grad():
        torch.testing.assert_close(hooked(tokens), bridge(tokens), atol=2e-4, rtol=1e-4)


def test_compare_trained_vs_untrained():
    cmp = bl.windtunnel.compare("bijection", n_prompts=60, seed=0, n_boot=100, n_null=20, n_perm=100, n_eval_seqs=200,
                                progress=False)
    t = cmp.table.set_index("metric")
    assert {"value_manifold_pc12_fraction", "key_orthogonality_mean_abs_cos", "focusing_reduction_fraction",
            "alignment_pc1_vs_bayes_entropy_spearman", "entropy_mae_bits"} <= set(t.index)
    assert t.loc["entropy_mae_bits", "trained"] < 0.05 < 1.0 < t.loc["entropy_mae_bits", "untrained"]
    # alignment with the exact Bayes entropy, recomputed independently
    pc1 = cmp.trained_geometry.value_manifold.coords[:, 0].numpy()
    rho = spearmanr(pc1, cmp.bayes_entropy_bits).statistic
    assert t.loc["alignment_pc1_vs_bayes_entropy_spearman", "trained"] == pytest.approx(rho, abs=1e-9)
    # the prompts end right before a y symbol, and the Bayes entropy is log2(V - k + 1)
    V = 10
    for p, h in zip(cmp.prompts, cmp.bayes_entropy_bits):
        words = p.split()
        assert words[-1].startswith("x")
        assert h == pytest.approx(np.log2(V - len(words) // 2))
    assert t.loc["key_orthogonality_mean_abs_cos", "paper_low"] == 0.09
    import json

    json.dumps(cmp.to_dict())


def test_compare_needs_task_for_models():
    model, _ = bl.windtunnel.load("bijection")
    with pytest.raises(bl.InvalidInputError, match="task"):
        bl.windtunnel.compare(model, model)
