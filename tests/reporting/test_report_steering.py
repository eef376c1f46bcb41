"""The opt-in report section "steering" (METHODS.md §16): its rows are the table's, re-read from its CSV."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import bayes_lens as bl
from bayes_lens.models.tiny import tiny_model


def test_steering_section_is_opt_in_and_its_rows_come_from_its_table(tmp_path):
    from bayes_lens.reporting._core import check_sections
    from bayes_lens.reporting._sections import SECTIONS

    assert not SECTIONS["steering"].default
    assert "steering" not in [s.name for s in check_sections(None, SECTIONS)]
    model = tiny_model("bridge")
    doc = bl.report(model, tmp_path / "r", sections=["steering"], quick=True, progress=False, overrides={"n_boot": 50})
    sec = doc["sections"]["steering"]
    assert sec["status"] == "ok", sec
    table = pd.read_csv(tmp_path / "r" / "tables" / "steering__steering.csv")
    grid = pd.read_csv(tmp_path / "r" / "tables" / "steering__steering_grid.csv")
    metrics = {m["key"]: m for m in sec["metrics"]}
    ew = metrics["steering.evidence_weight"]
    g0 = grid[(grid["direction"] == "contrast") & (grid["alpha"] == 0)]
    want = np.polyfit(g0["llr_bayes_nats"], g0["log_odds_nats"], 1)[0]      # the unsteered slope, by numpy
    assert ew["value"] == pytest.approx(want, abs=1e-6) and ew["baseline"]["value"] == 1.0
    for r in table[table["kind"] != "random"].itertuples():
        m = metrics[f"steering.L{sec['settings']['layer']}.{r.direction}.beta_int"]
        assert m["value"] == pytest.approx(r.beta_int, abs=1e-9)
        assert m["verdict"]["text"].startswith(r.verdict.upper())
