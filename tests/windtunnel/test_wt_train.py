"""Wind-tunnel training, evaluation, checkpoints (round trip, resume, corruption) and the CLI."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

import bayes_lens as bl
from bayes_lens.windtunnel import BijectionTask, HMMTask, TrainConfig, evaluate, read_checkpoint, train
from bayes_lens.windtunnel.checkpoint import checkpoint_files
from bayes_lens.windtunnel.model import build_hf, to_tl

SMALL = TrainConfig(n_layers=1, d_model=32, n_heads=2, d_head=16, d_mlp=64, batch_size=32, lr=3e-3, warmup=20)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("wt") / "bij"
    run = train(BijectionTask(V=5), SMALL, steps=300, seed=0, out=out, eval_every=100, n_eval_seqs=200, threads=1)
    return run


def test_training_beats_untrained_and_context_free(trained_run, tiny_kind):
    task = trained_run.task
    model = trained_run.model(kind=tiny_kind)
    res = evaluate(model, task, n_seqs=400, seed=1)
    base = to_tl(build_hf(SMALL.model_config(task), task.d_vocab, seed=123).state_dict(), SMALL.model_config(task),
                 task.vocab, tiny_kind)
    res0 = evaluate(base, task, n_seqs=400, seed=1)
    # best predictor that ignores the context: uniform over V at every position
    context_free = np.mean([abs(math.log2(5) - math.log2(5 - k)) for k in range(5)])
    assert res0.mae_bits.value > 1.0
    assert res.mae_bits.value < 0.25 * res0.mae_bits.value
    assert res.mae_bits.value < 0.5 * context_free
    assert res.mae_bits.ci_low <= res.mae_bits.value <= res.mae_bits.ci_high
    assert list(trained_run.history["step"]) == [100, 200, 300]
    assert trained_run.history["mae_bits"].iloc[-1] == pytest.approx(trained_run.final_mae_bits)


def test_evaluate_matches_independent_entropies(trained_run):
    task = trained_run.task
    hf = build_hf(SMALL.model_config(task), task.d_vocab, attn="eager")
    hf.load_state_dict(trained_run.weights, strict=False)
    res = evaluate(hf, task, n_seqs=50, seed=5, n_boot=100)
    batch = task.sample(50, seed=5)
    with torch.no_grad():
        logits = hf(input_ids=torch.as_tensor(batch.tokens)).logits.double()
    probs = torch.softmax(logits, -1).numpy()[:, batch.target_positions]
    h = scipy_entropy(probs, base=2, axis=-1)
    np.testing.assert_allclose(res.model_entropy_bits, h, atol=1e-6)
    np.testing.assert_allclose(res.table["bayes_entropy_bits"], np.log2(5 - np.arange(5)), atol=1e-12)
    expected_mae = np.abs(h.mean(0) - np.log2(5 - np.arange(5))).mean()
    assert res.mae_bits.value == pytest.approx(expected_mae, abs=1e-6)
    q = batch.bayes_probs
    p_ans = probs[..., batch.answer_ids]
    kl = np.where(q > 0, q * np.log2(np.where(q > 0, q, 1) / p_ans), 0).sum(-1)
    assert res.kl_bits == pytest.approx(kl.mean(), abs=1e-6)
    json.dumps(res.to_dict())
    assert set(res.to_dataframe().columns) >= {"task", "position", "quantity", "value_bits"}


def test_tl_models_match_training_network(trained_run, tiny_kind):
    task = trained_run.task
    hf = build_hf(SMALL.model_config(task), task.d_vocab, attn="eager")
    hf.load_state_dict(trained_run.weights, strict=False)
    hf.eval()
    model = bl.windtunnel.load(trained_run.path, kind=tiny_kind)[0]
    prompts = task.to_text(task.sample(4, seed=9).tokens)
    tokens, mask = bl.adapter.tokenize(model, prompts)
    np.testing.assert_array_equal(tokens.numpy(), task.from_text(prompts))  # word-level, no BOS
    with torch.no_grad():
        ref = hf(input_ids=tokens).logits
        got = model(tokens)
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-4, rtol=1e-4)


def test_checkpoint_round_trip(trained_run):
    ckpt = read_checkpoint(trained_run.path)
    assert ckpt.step == 300 and ckpt.seed == 0 and ckpt.task == trained_run.task
    assert TrainConfig.from_dict(ckpt.train_config) == SMALL
    for k, v in trained_run.weights.items():
        torch.testing.assert_close(ckpt.weights[k], v, atol=0, rtol=0)
    assert ckpt.optimizer is not None and len(ckpt.history) == 3


def test_resume_is_exact(tmp_path):
    task = HMMTask(S=2, V=2, K=4, Q=4)
    cfg = TrainConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, batch_size=8, warmup=5)
    full = train(task, cfg, steps=24, seed=3, out=tmp_path / "full", eval_every=6, n_eval_seqs=20, threads=1)
    # the same 24-step schedule, interrupted after 12 steps, then resumed from the checkpoint
    part = train(task, cfg, steps=24, seed=3, out=tmp_path / "part", eval_every=6, n_eval_seqs=20, threads=1, stop_at=12)
    assert read_checkpoint(tmp_path / "part").step == 12 and part.steps == 12
    resumed = train(task, cfg, steps=24, seed=3, out=tmp_path / "part", resume=True, eval_every=6, n_eval_seqs=20,
                    threads=1)
    for k, v in full.weights.items():
        torch.testing.assert_close(resumed.weights[k], v, atol=1e-6, rtol=1e-5)
    assert not torch.equal(part.weights["lm_head.weight"], full.weights["lm_head.weight"])
    assert list(resumed.history["step"]) == list(full.history["step"]) == [6, 12, 18, 24]
    np.testing.assert_allclose(resumed.history["mae_bits"], full.history["mae_bits"], atol=1e-5)
    # resuming a finished run does nothing and returns its weights
    again = train(task, cfg, steps=24, seed=3, out=tmp_path / "part", resume=True, n_eval_seqs=20, threads=1)
    torch.testing.assert_close(again.weights["lm_head.weight"], resumed.weights["lm_head.weight"], atol=0, rtol=0)


def test_existing_checkpoint_needs_resume_or_overwrite(trained_run):
    with pytest.raises(bl.InvalidInputError, match="already holds a checkpoint"):
        train(trained_run.task, SMALL, steps=10, out=trained_run.path)
    with pytest.raises(bl.CheckpointError, match="cannot resume"):
        train(BijectionTask(V=6), SMALL, steps=400, out=trained_run.path, resume=True)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage, match", [
    ("truncate", "SHA-256|safetensors"),
    ("flip", "SHA-256"),
    ("json", "not valid JSON"),
    ("format", "format"),
    ("missing_weights", r"no model-[0-9a-f]{16}\.safetensors"),
    ("shape", "do not fit"),
    ("no_sha", "no 'sha256' table"),
    ("sha_not_table", "no 'sha256' table"),
    ("sha_short", "no valid SHA-256 for model-"),
    ("sha_missing_entry", "no valid SHA-256 for model-"),
    ("files_malformed", "malformed 'files' entry"),
    ("files_escape", "malformed 'files' entry"),
])
def test_corrupted_checkpoint(trained_run, tmp_path, damage, match):
    path = _copy(trained_run.path, tmp_path / "c")
    w = checkpoint_files(path)["model"]
    if damage == "truncate":
        w.write_bytes(w.read_bytes()[:1000])
    elif damage == "flip":
        data = bytearray(w.read_bytes())
        data[-5] ^= 0xFF
        w.write_bytes(bytes(data))
    elif damage == "json":
        (path / "config.json").write_text("{not json")
    elif damage == "format":
        cfg = json.loads((path / "config.json").read_text())
        cfg["format"] = "something/else"
        (path / "config.json").write_text(json.dumps(cfg))
    elif damage == "missing_weights":
        w.unlink()
    elif damage == "shape":
        cfg = json.loads((path / "config.json").read_text())
        cfg["model"]["d_mlp"] = 48
        (path / "config.json").write_text(json.dumps(cfg))
    else:  # a damaged sha256 / files entry must never skip verification silently
        cfg = json.loads((path / "config.json").read_text())
        if damage == "no_sha":
            del cfg["sha256"]
        elif damage == "sha_not_table":
            cfg["sha256"] = "deadbeef"
        elif damage == "sha_short":
            cfg["sha256"][w.name] = "abc"
        elif damage == "sha_missing_entry":
            cfg["sha256"] = {}
        elif damage == "files_malformed":
            cfg["files"] = ["model.safetensors"]
        elif damage == "files_escape":
            cfg["files"]["model"] = "../elsewhere.safetensors"
        (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(bl.CheckpointError, match=match):
        bl.windtunnel.load(path)


def test_missing_checkpoint_and_bad_names(tmp_path):
    with pytest.raises(bl.CheckpointError, match="not found"):
        bl.windtunnel.load(tmp_path / "nowhere")
    with pytest.raises(bl.InvalidInputError, match="unknown wind-tunnel checkpoint"):
        bl.windtunnel.shipped_path("mnist")
    with pytest.raises(bl.InvalidInputError, match="unknown wind-tunnel task"):
        train("mnist", steps=1)
    with pytest.raises(bl.InvalidInputError, match="steps"):
        train("bijection", steps=0)
    with pytest.raises(bl.InvalidInputError, match="lr"):
        TrainConfig(lr=-1.0)
    with pytest.raises(bl.InvalidInputError, match="divide"):
        TrainConfig(n_heads=4, n_kv_heads=3)


def test_evaluate_rejects_other_vocabulary(trained_run, tiny_kind):
    model = trained_run.model(kind=tiny_kind)
    with pytest.raises(bl.InvalidInputError, match="vocabulary"):
        evaluate(model, BijectionTask(V=7), n_seqs=10)
    with pytest.raises(bl.InvalidInputError, match="n_seqs must be"):
        evaluate(model, trained_run.task, n_seqs=1)


def test_cli_train_and_eval(tmp_path, capsys):
    from bayes_lens.cli import windtunnel_main as cli_main

    out = tmp_path / "cli"
    rc = cli_main(["train", "--task", "bijection", "--V", "4", "--layers", "1", "--d-model", "16", "--heads", "2",
                   "--d-head", "8", "--steps", "5", "--out", str(out), "--eval-n", "10", "--threads", "1"])
    assert rc == 0 and checkpoint_files(out)["model"].is_file()
    assert "final MAE" in capsys.readouterr().out
    recorded = json.loads((out / "config.json").read_text())["extra"]["command"]
    assert recorded.startswith("bayes-lens windtunnel train --task bijection --V 4 ") and recorded.endswith("--threads 1")
    assert cli_main(["eval", "--checkpoint", str(out), "--n", "20"]) == 0
    assert "MAE" in capsys.readouterr().out
    assert cli_main(["eval", "--checkpoint", str(tmp_path / "nope"), "--n", "20"]) == 2
    assert "error" in capsys.readouterr().err


def test_resume_without_a_checkpoint_says_it_starts_afresh(tmp_path, capsys):
    """Issue 25: --resume with no checkpoint in --out trained from scratch silently. A job script that
    always passes --resume must keep working on its first run, so it starts at step 0 - and says so."""
    from bayes_lens.cli import windtunnel_main as cli_main

    task = BijectionTask(V=4)
    cfg = TrainConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, batch_size=8, warmup=2)
    with pytest.warns(UserWarning, match="holds no checkpoint .* starting a new run at step 0"):
        run = train(task, cfg, steps=3, seed=0, out=tmp_path / "fresh", resume=True, n_eval_seqs=10, threads=1)
    ref = train(task, cfg, steps=3, seed=0, out=tmp_path / "ref", n_eval_seqs=10, threads=1)
    assert all(torch.equal(run.weights[k], ref.weights[k]) for k in ref.weights)  # a run from step 0
    with pytest.raises(bl.InvalidInputError, match="no out was given"):
        train(task, cfg, steps=3, resume=True)
    args = ["train", "--task", "bijection", "--V", "4", "--layers", "1", "--d-model", "16", "--heads", "2",
            "--d-head", "8", "--steps", "3", "--eval-n", "10", "--threads", "1", "--resume"]
    assert cli_main(args + ["--out", str(tmp_path / "cli")]) == 0
    err = capsys.readouterr().err
    assert "--resume: " in err and "holds no checkpoint yet; starting a new run at step 0" in err
    assert cli_main(args + ["--out", str(tmp_path / "cli")]) == 0  # now there is one: resumed, no notice
    assert "holds no checkpoint" not in capsys.readouterr().err
