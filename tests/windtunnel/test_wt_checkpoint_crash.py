"""Crash-safe wind-tunnel checkpoint saves: a SIGKILL at every step leaves a complete, verifiable checkpoint.

A forked child saves checkpoint B over checkpoint A and SIGKILLs itself just before its k-th file
change (safetensors write, replace, unlink, rename, mkdir), for every k until it gets through. After
each kill ``read_checkpoint`` must succeed and return exactly A or exactly B (weights, optimizer
state and step together), and the next save must leave no debris behind.
"""

from __future__ import annotations

import json
import os
import signal
import traceback

import pytest
import torch

import bayes_lens as bl
from bayes_lens.windtunnel import BijectionTask, TrainConfig, read_checkpoint
from bayes_lens.windtunnel.checkpoint import Checkpoint, checkpoint_files, write_checkpoint
from bayes_lens.windtunnel.model import build_hf

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fault injection forks a child process")

CFG = TrainConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32)
TASK = BijectionTask(V=4)


def make_ckpt(step: int, seed: int) -> Checkpoint:
    mcfg = CFG.model_config(TASK)
    weights = {k: v for k, v in build_hf(mcfg, TASK.d_vocab, seed=seed).state_dict().items()
               if not k.endswith("rotary_emb.inv_freq")}
    optim = {f"{k}.exp_avg": torch.full_like(v, float(seed)) for k, v in weights.items()}
    return Checkpoint(task=TASK, model_config=mcfg, train_config=CFG.to_dict(), step=step, seed=0,
                      weights=weights, optimizer=optim, history=[{"step": step}])


A, B, C = make_ckpt(10, 1), make_ckpt(20, 2), make_ckpt(30, 3)


def same(read: Checkpoint, ref: Checkpoint) -> bool:
    return (read.step == ref.step and set(read.weights) == set(ref.weights)
            and all(torch.equal(read.weights[k], ref.weights[k]) for k in ref.weights)
            and read.optimizer is not None
            and all(torch.equal(read.optimizer[k], ref.optimizer[k]) for k in ref.optimizer))


def save_in_child(path, ckpt, kill_at: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import safetensors.torch as st

            count = [0]

            def wrap(fn):
                def inner(*a, **k):
                    count[0] += 1
                    if count[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return fn(*a, **k)
                return inner

            for name in ("replace", "rename", "unlink", "mkdir", "rmdir"):
                setattr(os, name, wrap(getattr(os, name)))
            st.save_file = wrap(st.save_file)
            write_checkpoint(path, ckpt)
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def owned_files(path):
    return sorted(p.name for p in path.iterdir())


@pytest.mark.parametrize("start", ["fresh", "legacy_names"])
def test_kill_at_every_step_of_a_save(tmp_path, start):
    k, killed = 0, 0
    while True:
        k += 1
        path = tmp_path / f"k{k}"
        write_checkpoint(path, A)
        if start == "legacy_names":  # a checkpoint in the fixed-name layout of earlier versions
            cfg = json.loads((path / "config.json").read_text())
            files = cfg.pop("files")
            for role, name in files.items():
                fixed = f"{role}.safetensors"
                os.rename(path / name, path / fixed)
                cfg["sha256"][fixed] = cfg["sha256"].pop(name)
            (path / "config.json").write_text(json.dumps(cfg))
            assert same(read_checkpoint(path), A)
        status = save_in_child(path, B, k)
        got = read_checkpoint(path)  # never raises: the old or the new checkpoint is always complete
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0 and same(got, B)
            break
        assert os.WTERMSIG(status) == signal.SIGKILL
        killed += 1
        assert same(got, A) or same(got, B), k
        write_checkpoint(path, C)  # the next save works and clears what the killed one left
        assert same(read_checkpoint(path), C)
        files = checkpoint_files(path)
        assert owned_files(path) == sorted([".bayes_lens.lock", "config.json", files["model"].name,
                                            files["optimizer"].name])
        assert k < 100
    assert killed >= 6  # 2 files x (write, replace) + config replace + 2 deletions (+ mkdir)


def test_save_replaces_files_and_keeps_only_the_named_ones(tmp_path):
    write_checkpoint(tmp_path, A)
    first = checkpoint_files(tmp_path)
    write_checkpoint(tmp_path, B)
    second = checkpoint_files(tmp_path)
    assert first["model"] != second["model"] and not first["model"].exists()
    assert owned_files(tmp_path) == sorted([".bayes_lens.lock", "config.json", second["model"].name,
                                            second["optimizer"].name])
    write_checkpoint(tmp_path, B, optimizer=False)  # a save without the optimizer drops its file
    assert set(checkpoint_files(tmp_path)) == {"model"}
    assert read_checkpoint(tmp_path).optimizer is None
    (tmp_path / "notes.safetensors").write_bytes(b"user file")  # not ours: never deleted
    write_checkpoint(tmp_path, C)
    assert (tmp_path / "notes.safetensors").exists()


def test_save_into_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(bl.CheckpointError, match="exists and is not a folder"):
        write_checkpoint(tmp_path / "f", A)
