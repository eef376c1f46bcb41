"""End to end on the real SmolLM2-135M: ``bayes-lens report --quick`` as a user runs it.

One quick report is produced per module (subprocess, the console script) and shared by the tests:
schema validation, numbers re-derived independently from the CSV tables, every figure rendered in a
real headless Chromium with networking disabled, and an interrupted second run that must leave the
first report byte-for-byte intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bayes_lens.reporting import validate
from browser import find_chromium, render

pytestmark = pytest.mark.real

SECTIONS = ["geometry", "sula", "ablation", "martingale"]


def _cli():
    exe = Path(sys.executable).parent / "bayes-lens"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bayes_lens.cli"]


def _env():
    return dict(os.environ, BAYES_LENS_PROGRESS="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick") / "report"
    t0 = time.perf_counter()
    proc = subprocess.run(_cli() + ["report", "--quick", "--out", str(out), "--seed", "0", "--no-progress"],
                          capture_output=True, text=True, timeout=1200, env=_env())
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": out, "proc": proc, "seconds": seconds,
            "doc": json.loads((out / "report.json").read_text(encoding="utf-8"))}


def _section_table(rep, section, name) -> pd.DataFrame:
    meta = next(t for t in rep["doc"]["sections"][section]["tables"] if t["name"] == name)
    return pd.read_csv(rep["out"] / meta["file"])


def _metric(rep, key) -> dict:
    return next(m for m in rep["doc"]["summary"] if m["key"] == key)


def test_quick_report_validates_against_schema(quick_report):
    doc = validate(quick_report["out"] / "report.json")
    assert doc["status"] == "ok", {n: s["error"] for n, s in doc["sections"].items()}
    assert list(doc["sections"]) == SECTIONS
    assert doc["model"]["n_layers"] == 30 and doc["model"]["n_kv_heads"] == 3
    assert doc["settings"]["quick"] is True and doc["settings"]["seed"] == 0
    assert doc["timings_s"]["model_load"] > 0
    assert doc["timings_s"]["total"] >= sum(doc["timings_s"][s] for s in SECTIONS)
    for m in doc["summary"]:
        assert m["units"]
        if m["ci"] and m["ci"]["low"] is not None and m["value"] is not None:
            assert m["ci"]["low"] <= m["ci"]["high"]
    for rel, meta in doc["files"].items():
        data = (quick_report["out"] / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"]


def test_cli_prints_summary_table(quick_report):
    stdout = quick_report["proc"].stdout
    assert stdout.splitlines()[0].split()[:3] == ["section", "quantity", "value"]
    assert "report.html" in stdout
    assert "Traceback" not in quick_report["proc"].stderr


def test_headline_numbers_match_independent_recomputation(quick_report):
    # SULA MAE: mean |H_model - H_Bayes| over the per-prompt table, recomputed with numpy
    pp = _section_table(quick_report, "sula", "per_prompt")
    h_b = pp["bayes_entropy_bits"].to_numpy()
    p = pp["model_p_first"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_m = -np.nan_to_num(p * np.log2(p)) - np.nan_to_num((1 - p) * np.log2(1 - p))
    assert _metric(quick_report, "sula.mae_bits")["value"] == pytest.approx(np.abs(h_m - h_b).mean(), abs=1e-6)
    # the analytic Bayes entropy of every prompt, from its k and the p = 0.9 posterior, is in [0, 1]
    assert ((h_b >= 0) & (h_b <= 1 + 1e-12)).all()
    # martingale fit: IRLS of Δ = A·log(n)/n + B with w = N/fitted², recomputed by an explicit loop
    g = _section_table(quick_report, "martingale", "gap_per_n")
    n, d, cnt = g["n"].to_numpy(float), g["gap_nats"].to_numpy(), g["n_seqs"].to_numpy(float)
    X = np.stack([np.log(n) / n, np.ones_like(n)], axis=1)
    floor = 1e-3 * np.median(d[d != 0] ** 2)
    w = cnt / np.maximum(d ** 2, floor)
    for _ in range(200):
        A, B = np.linalg.lstsq(X * np.sqrt(w)[:, None], d * np.sqrt(w), rcond=None)[0]
        w = cnt / np.maximum((X @ (A, B)) ** 2, floor)
    assert _metric(quick_report, "martingale.A")["value"] == pytest.approx(A, rel=1e-6, abs=1e-9)
    assert _metric(quick_report, "martingale.B")["value"] == pytest.approx(B, rel=1e-6, abs=1e-9)
    # geometry: the domain table and the headline agree
    dom = _section_table(quick_report, "geometry", "domains").set_index("domain")
    assert _metric(quick_report, "geometry.mixed.pc12")["value"] == pytest.approx(dom.loc["mixed", "pc12_fraction"])
    assert 0 < dom.loc["mixed", "pc1_fraction"] <= dom.loc["mixed", "pc12_fraction"] <= 1
    # key orthogonality: mean over the per-head table, an interval over heads, the verdict next to the
    # ratio to the Gaussian baseline (which passes Paper A's threshold too)
    ko = _section_table(quick_report, "geometry", "key_orthogonality")
    m = _metric(quick_report, "geometry.key_orthogonality")
    assert m["value"] == pytest.approx(ko["mean_abs_cosine"].mean(), rel=1e-9)
    assert m["ci"]["low"] < m["value"] < m["ci"]["high"]
    ratio = m["value"] / m["baseline"]["value"]
    assert f"{ratio:.2f}× the dimension-matched Gaussian baseline" in m["verdict"]["text"]


def test_paper_b_v3_rows_match_their_tables(quick_report):
    """The martingale section's Paper B v3 rows re-derived from its CSV tables with numpy: the cumulative
    excess code length is the sum of the per-position means; the order-averaging identity (given =
    averaged + gain) holds on the per-n means; the headline is the last n; the exact Bayesian's value
    (0) is every row's baseline."""
    cl = _section_table(quick_report, "martingale", "codelength_per_position")
    kt = cl[cl["reference"] == "bayes"].sort_values("position")
    m = _metric(quick_report, "martingale.excess_codelength_kt")
    assert m["value"] == pytest.approx(kt["excess_bits"].sum(), rel=1e-9, abs=1e-12)
    assert m["value"] == pytest.approx(kt["cum_excess_bits"].iloc[-1], rel=1e-9, abs=1e-12)
    assert m["ci"]["low"] <= m["value"] <= m["ci"]["high"] and m["baseline"]["value"] == 0
    oa = _section_table(quick_report, "martingale", "order_averaging").sort_values("n")
    np.testing.assert_allclose(oa["regret_given_bits"], oa["regret_averaged_bits"] + oa["gain_bits"], atol=1e-9)
    assert _metric(quick_report, "martingale.gain")["value"] == pytest.approx(oa["gain_bits"].iloc[-1])
    assert _metric(quick_report, "martingale.regret_averaged")["value"] == pytest.approx(
        oa["regret_averaged_bits"].iloc[-1])
    pi = _section_table(quick_report, "martingale", "position_interventions")
    tv = _metric(quick_report, "martingale.position_tv")
    assert ((pi["tv"] >= 0) & (pi["tv"] <= 1)).all() and 0 <= tv["ci"]["low"] <= tv["value"] <= tv["ci"]["high"] <= 1
    assert tv["baseline"]["value"] == 0


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (the Makefile's set-up "
                    "installs Debian's `chromium`; run `apt-get install -y chromium`)")
def test_report_renders_in_headless_chromium_offline(quick_report):
    doc = quick_report["doc"]
    n_figures = sum(len(s["figures"]) for s in doc["sections"].values())
    assert n_figures >= 8
    res = render(quick_report["out"] / "report.html")
    n_figures += 1  # the first screen's headline figure (issue 37.3)
    assert 'id="fig-headline"' in res["dom"]
    assert res["figures"] == n_figures, res["dom"][:500]
    assert res["rendered"] == n_figures
    assert res["errors"] == [] and res["console_errors"] == []
    assert res["dom"].count('class="plot-container plotly"') == n_figures  # plotly drew into every div
    for sec in doc["sections"].values():
        for fig in sec["figures"]:
            assert f'id="{fig["id"]}"' in res["dom"]


def test_interrupted_run_leaves_previous_report_intact(quick_report, tmp_path):
    out = tmp_path / "report"
    shutil.copytree(quick_report["out"], out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # a shell without job control (`make test &` in a script, nohup) starts us with SIGINT ignored, and the
    # child would inherit that: give it the default disposition, so Python turns Ctrl-C into KeyboardInterrupt
    proc = subprocess.Popen(_cli() + ["report", "--quick", "--out", str(out), "--seed", "7", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        for line in proc.stderr:  # wait until the analyses are under way, then interrupt (Ctrl-C)
            seen.append(line)
            if "[1/4] geometry" in line:
                time.sleep(2)
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any("[1/4] geometry" in s for s in seen), "".join(seen)
    assert proc.returncode == 130, rest
    assert "interrupted" in rest[1]
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["report.html", "report.json", "tables"]
