"""The bad-input matrix: every way a user can call the library wrongly gives a clear BayesLensError.

Each case is ``(id, call, error type, phrase)``: ``call`` raises ``error type`` with ``phrase`` (a
regular expression) in its message, and never a raw Python/torch error. Add a case by appending a
tuple to the right list:

* ``CASES``: ``call(tmp)`` needs no model (``tmp`` is a fresh folder);
* ``MODEL_CASES``: ``call(model, tmp)`` runs once per model kind (HookedTransformer on TL 3.x,
  TransformerBridge) with a tiny random llama from :mod:`bayes_lens.models.tiny`.

A case that only applies on some machines is wrapped in ``only(condition, reason, case)``.
"""

from __future__ import annotations

import argparse
import math
from unittest import mock

import numpy as np
import pytest
import torch

import bayes_lens as bl
import bayes_lens.shard  # noqa: F401 - bl.shard.ModelSpec below
from bayes_lens import _validate as V
from bayes_lens import cli
from bayes_lens.errors import (BayesLensError, CheckpointError, InvalidInputError, LockTimeoutError, ModelLoadError,
                               TokenizationError)
from bayes_lens.martingale import (compression, falck_checks, fit_gap, gap, laplace, permutation_average,
                                   positional_spectrum, resample_paths)
from bayes_lens.windtunnel import read_checkpoint, train
from bayes_lens.windtunnel.checkpoint import write_checkpoint
from bayes_lens.models.tiny import tiny_model

NO_CUDA = not torch.cuda.is_available()
NO_MPS = not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def only(condition: bool, reason: str, case: tuple):
    """A case that runs only where ``condition`` holds (e.g. "cuda" is an error only without a GPU)."""
    return pytest.param(*case, id=case[0], marks=pytest.mark.skipif(not condition, reason=reason))


# ----------------------------------------------------------------------- GGUF files for the loaders


def write_gguf(path, *, arch="llama", d_model=8, n_heads=2, n_kv=None, layers=1, tensors=None):
    """A small GGUF: metadata for a llama of the given shape and the given (name -> numpy array) tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(16)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(16)
    w.add_head_count(n_heads)
    if n_kv is not None:
        w.add_head_count_kv(n_kv)
    for name, arr in (tensors or {"token_embd.weight": np.zeros((4, d_model), np.float32)}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_file(tmp, **kw):
    return write_gguf(tmp / "m.gguf", **kw)


def wrong_shape(tmp):
    return gguf_file(tmp, tensors={"token_embd.weight": np.zeros((4, 8), np.float32),
                                   "blk.0.attn_q.weight": np.zeros((7, 8), np.float32)})


def extra_block(tmp):
    return gguf_file(tmp, tensors={"token_embd.weight": np.zeros((4, 8), np.float32),
                                   "blk.3.attn_norm.weight": np.zeros(8, np.float32)})


def refuse_full_parse(path):
    """Load ``path`` with the full GGUF reader forbidden: the architecture check must come first."""
    import gguf

    with mock.patch.object(gguf, "GGUFReader", side_effect=AssertionError("the full reader ran")):
        bl.load_gguf(path)


def folder(tmp, *files):
    d = tmp / "hf"
    d.mkdir()
    for f in files:
        (d / f).write_text("{}")
    return d


def a_file(tmp, name="f"):
    (tmp / name).write_text("x")
    return tmp / name


def report_prepare(tmp, **kw):
    """bl.report's cheap checks: they fail before any model is looked at (model=None is never reached)."""
    kw.setdefault("progress", False)
    return bl.report(None, kw.pop("out", tmp / "out"), **kw)


def no_generator():
    yield from ()


def small_ckpt():
    from bayes_lens.windtunnel import BijectionTask, TrainConfig
    from bayes_lens.windtunnel.checkpoint import Checkpoint
    from bayes_lens.windtunnel.model import build_hf

    task, cfg = BijectionTask(V=4), TrainConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32)
    mcfg = cfg.model_config(task)
    w = {k: v for k, v in build_hf(mcfg, task.d_vocab, seed=0).state_dict().items() if "inv_freq" not in k}
    return Checkpoint(task=task, model_config=mcfg, train_config=cfg.to_dict(), step=1, seed=0, weights=w)


E = InvalidInputError

CASES = [
    # ---- the shared validators (bayes_lens._validate), the building blocks of every check below
    ("seed_none", lambda t: V.check_seed(None), E, r"got None .*non-deterministic"),
    ("seed_str", lambda t: V.check_seed("0"), E, r"got '0' \(str\)"),
    ("seed_negative", lambda t: V.check_seed(-1), E, r"non-negative integer such as 0, got -1"),
    ("seed_float", lambda t: V.check_seed(1.5), E, r"got 1.5 \(float\)"),
    ("seed_bool", lambda t: V.check_seed(True), E, r"got True \(bool\)"),
    ("seed_too_big", lambda t: V.check_seed(2**64), E, r"non-negative integer"),
    ("seed_numpy_float", lambda t: V.check_seed(np.float64(3)), E, r"float64"),
    ("int_fractional", lambda t: V.check_positive_int(2.5, "n_boot"), E, r"n_boot must be a positive integer.*fractional"),
    ("int_whole_float", lambda t: V.check_positive_int(2.0, "n"), E, r"pass n=2"),
    ("int_zero", lambda t: V.check_positive_int(0, "n_perm"), E, r"n_perm must be a positive integer, got 0"),
    ("int_string", lambda t: V.check_positive_int("3", "n"), E, r"pass the number itself: n=3"),
    ("int_none", lambda t: V.check_positive_int(None, "n"), E, r"got None"),
    ("int_below_min", lambda t: V.check_int(1, "n", min=2), E, r"integer >= 2, got 1"),
    ("int_above_max", lambda t: V.check_int(9, "layer", min=0, max=3), E, r"in \[0, 3\], got 9"),
    ("nonneg_negative", lambda t: V.check_nonneg_int(-1, "offset"), E, r"non-negative integer, got -1"),
    ("float_nan", lambda t: V.check_float(math.nan, "clip"), E, r"finite number"),
    ("float_string", lambda t: V.check_float("0.5", "clip"), E, r"got '0.5' \(str\)"),
    ("probability_above_one", lambda t: V.check_probability(1.5, "p"), E, r"in \[0, 1\], got 1.5"),
    ("probability_open", lambda t: V.check_probability(0, "p", open_interval=True), E, r"in \(0, 1\)"),
    ("bool_string", lambda t: V.check_bool("yes", "quick"), E, r"True or False"),
    ("choice_list_of_one", lambda t: V.check_choice(["v"], "site", ("q", "k", "v")), E,
     r"pass site='v', a single string, not a list"),
    ("choice_unknown", lambda t: V.check_choice("x", "site", ("q", "k", "v")), E, r"one of \['q', 'k', 'v'\]"),
    ("choice_unhashable", lambda t: V.check_choice({"a": 1}, "mode", (1, 2)), E, r"one of \[1, 2\]"),
    ("choices_unknown", lambda t: V.check_choices(["geometry", "nope"], "sections", ["geometry"]), E,
     r"unknown sections \['nope'\]"),
    ("choices_duplicate", lambda t: V.check_choices(["a", "a"], "sections", ["a"]), E, r"more than once"),
    ("names_not_a_list", lambda t: V.check_names(5, "sections"), E, r"a string or a list of strings"),
    ("names_mixed", lambda t: V.check_names(["a", 1], "sections"), E, r"strings only"),
    ("prompts_empty_generator", lambda t: V.check_prompts(no_generator()), E, r"prompts is empty.*generator"),
    ("prompts_single_string", lambda t: V.check_prompts("hello"), E, r"single string"),
    ("prompts_non_string", lambda t: V.check_prompts(["a", 3]), E, r"prompts\[1\] must be a string"),
    ("prompts_empty_string", lambda t: V.check_prompts(["a", ""]), E, r"prompts\[1\] is an empty string"),
    ("prompts_lone_surrogate", lambda t: V.check_prompts(["ok", "bad \ud800"]), TokenizationError,
     r"prompts\[1\] holds a lone surrogate"),
    ("prompts_dict", lambda t: V.check_prompts({"a": 1}), E, r"list of strings"),
    ("device_nonsense", lambda t: V.check_device("gpu0"), E, r"not a torch device"),
    ("device_not_a_string", lambda t: V.check_device(3), E, r"device string such as 'cpu'"),
    ("device_meta", lambda t: V.check_device("meta"), E, r"holds no data"),
    only(NO_CUDA, "a CUDA GPU is present", ("device_cuda_without_gpu", lambda t: V.check_device("cuda"), E,
                                            r"asks for a CUDA GPU")),
    only(NO_MPS, "MPS is present", ("device_mps_unavailable", lambda t: V.check_device("mps"), E, r"Apple MPS")),
    ("device_cuda_index_out_of_range", lambda t: V.check_device("cuda:99"), E, r"CUDA"),
    ("path_empty", lambda t: V.check_path("", "out"), E, r"out is an empty path"),
    ("path_none", lambda t: V.check_path(None, "out"), E, r"must be a path"),
    ("path_file_for_folder", lambda t: V.check_path(a_file(t), "out", kind="dir"), E, r"exists and is not a folder"),
    ("path_folder_for_file", lambda t: V.check_path(t, "model", kind="file"), E, r"is not a file"),
    ("path_missing", lambda t: V.check_path(t / "nope", "data", must_exist=True), E, r"does not exist"),
    ("output_dir_below_a_file", lambda t: V.check_output_dir(a_file(t) / "sub"), E, r"is a file, not a folder"),
    ("model_string", lambda t: bl.adapter.check_model("gpt2"), E, r"load one with bl.load_model"),
    ("model_none", lambda t: bl.adapter.check_model(None), E, r"HookedTransformer or TransformerBridge, got None"),
    ("model_torch_module", lambda t: bl.adapter.check_model(torch.nn.Linear(2, 2)), E, r"TransformerLens"),
    ("mapping_list", lambda t: V.check_mapping([("a", 1)], "overrides"), E, r"overrides must be a dict"),
    ("mapping_int_keys", lambda t: V.check_mapping({1: 2}, "overrides"), E, r"keys must be strings"),
    # ---- model loading (bayes_lens.models)
    ("load_model_none", lambda t: bl.load_model(None), ModelLoadError, r"named by a string or path, got None"),
    ("load_model_empty_string", lambda t: bl.load_model(""), ModelLoadError, r"model name is empty"),
    ("load_model_number", lambda t: bl.load_model(3), ModelLoadError, r"got 3 \(int\)"),
    ("load_model_empty_folder", lambda t: bl.load_model(folder(t)), ModelLoadError, r"no config.json \(it is empty\)"),
    ("load_model_folder_without_config", lambda t: bl.load_model(folder(t, "notes.txt")), ModelLoadError,
     r"no config.json \(it holds \['notes.txt'\]\)"),
    ("load_model_folder_without_tokenizer", lambda t: bl.load_model(folder(t, "config.json")), ModelLoadError,
     r"no tokenizer files"),
    ("load_model_unknown_name", lambda t: bl.load_model("gpt-17"), ModelLoadError, r"unknown model 'gpt-17'"),
    ("load_model_bad_kind", lambda t: bl.load_model(kind="jax"), ModelLoadError, r"kind must be"),
    ("load_model_bad_device", lambda t: bl.load_model(device="gpu0"), E, r"not a torch device"),
    only(NO_CUDA, "a CUDA GPU is present", ("load_model_cuda_without_gpu", lambda t: bl.load_model(device="cuda"), E,
                                            r"asks for a CUDA GPU")),
    ("load_gguf_none", lambda t: bl.load_gguf(None), ModelLoadError, r"non-empty string or pathlib.Path, got None"),
    ("load_gguf_empty_string", lambda t: bl.load_gguf(""), ModelLoadError, r"non-empty string"),
    ("load_gguf_missing", lambda t: bl.load_gguf(t / "x.gguf"), ModelLoadError, r"GGUF file not found"),
    ("load_gguf_folder", lambda t: bl.load_gguf(t), ModelLoadError, r"is not a file"),
    ("load_gguf_bad_magic", lambda t: bl.load_gguf(a_file(t, "x.gguf")), ModelLoadError, r"is not a GGUF file"),
    ("load_gguf_header_only", lambda t: (t / "h.gguf").write_bytes(b"GGUF\x03\x00\x00\x00") and bl.load_gguf(t / "h.gguf"),
     ModelLoadError, r"truncated|corrupted"),
    ("load_gguf_other_architecture_before_parsing", lambda t: refuse_full_parse(gguf_file(t, arch="gpt2")),
     ModelLoadError, r"architecture 'gpt2'"),
    ("load_gguf_heads_not_multiple_of_kv", lambda t: bl.load_gguf(gguf_file(t, d_model=18, n_heads=9, n_kv=2)),
     ModelLoadError, r"9 attention heads and 2 key/value heads"),
    ("load_gguf_wrong_tensor_shape", lambda t: bl.load_gguf(wrong_shape(t)), ModelLoadError,
     r"'blk.0.attn_q.weight' has shape \[7, 8\].*imply \[8, 8\]"),
    ("load_gguf_block_beyond_count", lambda t: bl.load_gguf(extra_block(t)), ModelLoadError,
     r"declares block_count = 1"),
    ("load_gguf_bad_kind", lambda t: bl.load_gguf(gguf_file(t), kind="jax"), ModelLoadError, r"kind must be"),
    ("load_gguf_bad_device", lambda t: bl.load_gguf(gguf_file(t), device="gpu0"), E, r"not a torch device"),
    # ---- bl.report's checks (all before any model work)
    ("report_sections_single_string_is_one_name", lambda t: report_prepare(t, sections="geometry"), E,
     r"expected a TransformerLens model"),  # passed the section check: "geometry" was not split into letters
    ("report_sections_unknown_string", lambda t: report_prepare(t, sections="nope"), E,
     r"unknown report section\(s\) \['nope'\]"),
    ("report_sections_empty", lambda t: report_prepare(t, sections=[]), E, r"no sections selected"),
    ("report_sections_not_strings", lambda t: report_prepare(t, sections=[1]), E, r"strings only"),
    ("report_seed_negative", lambda t: report_prepare(t, seed=-1), E, r"seed must be a non-negative integer"),
    ("report_seed_str", lambda t: report_prepare(t, seed="0"), E, r"got '0' \(str\)"),
    ("report_seed_none", lambda t: report_prepare(t, seed=None), E, r"non-deterministic"),
    ("report_seed_float", lambda t: report_prepare(t, seed=1.5), E, r"got 1.5"),
    ("report_quick_not_bool", lambda t: report_prepare(t, quick="yes"), E, r"quick must be True or False"),
    ("report_out_is_file", lambda t: report_prepare(t, out=a_file(t)), E, r"exists and is not a folder"),
    ("report_out_below_file", lambda t: report_prepare(t, out=a_file(t) / "sub"), E, r"not writable|not a folder"),
    ("report_out_empty", lambda t: report_prepare(t, out=""), E, r"out is an empty path"),
    ("report_override_unknown", lambda t: report_prepare(t, overrides={"nope": 1}), E, r"unknown size 'nope'"),
    ("report_override_not_dict", lambda t: report_prepare(t, overrides=[("geometry_n", 3)]), E,
     r"overrides must be a dict"),
    ("report_override_str_for_int", lambda t: report_prepare(t, overrides={"geometry_n": "40"}), E,
     r"overrides\['geometry_n'\] must be a positive integer.*the default is"),
    ("report_override_fractional", lambda t: report_prepare(t, overrides={"n_boot": 2.5}), E, r"fractional"),
    ("report_override_zero", lambda t: report_prepare(t, overrides={"sula_n_per_k": 0}), E, r"positive integer"),
    ("report_override_string_for_tuple", lambda t: report_prepare(t, overrides={"geometry_domains": "math"}), E,
     r"must be a list or tuple"),
    ("report_override_tuple_of_wrong_type", lambda t: report_prepare(t, overrides={"sula_ks": (0, "1")}), E,
     r"each value of overrides\['sula_ks'\]"),
    ("report_override_empty_tuple", lambda t: report_prepare(t, overrides={"martingale_ns": ()}), E, r"is empty"),
    ("report_override_dict_unknown_key", lambda t: report_prepare(
        t, overrides={"martingale_permutation": {"bogus": 1}}), E, r"unknown keys \['bogus'\]"),
    ("report_override_dict_bad_value", lambda t: report_prepare(
        t, overrides={"martingale_permutation": {"seq_len": -3}}), E, r"martingale_permutation.seq_len"),
    ("report_override_layer", lambda t: report_prepare(t, overrides={"ablation_layer": 1.5}), E,
     r"'middle' or an integer layer index"),
    ("report_not_a_model", lambda t: bl.report(object(), t / "o", progress=False), E,
     r"expected a TransformerLens model"),
    ("report_unknown_model_name", lambda t: bl.report("gpt-17", t / "o", progress=False), ModelLoadError,
     r"unknown model"),
    # ---- wind tunnel
    ("windtunnel_train_out_is_file", lambda t: train("bijection", steps=1, out=a_file(t)), E,
     r"out .* exists and is not a folder"),
    ("windtunnel_train_out_below_file", lambda t: train("bijection", steps=1, out=a_file(t) / "run"), E,
     r"is a file, not a folder"),
    ("windtunnel_train_seed_negative", lambda t: train("bijection", steps=1, seed=-1), E, r"seed must be"),
    ("windtunnel_train_steps_zero", lambda t: train("bijection", steps=0), E, r"steps must be a positive integer"),
    ("windtunnel_train_unknown_task", lambda t: train("mnist", steps=1), E, r"unknown wind-tunnel task"),
    ("windtunnel_read_missing", lambda t: read_checkpoint(t / "none"), CheckpointError, r"not found"),
    ("windtunnel_read_no_config", lambda t: read_checkpoint(t), CheckpointError, r"has no config.json"),
    ("windtunnel_write_into_file", lambda t: write_checkpoint(a_file(t), small_ckpt()), CheckpointError,
     r"exists and is not a folder"),
    ("windtunnel_load_bad_device", lambda t: bl.windtunnel.load("bijection", device="gpu0"), E,
     r"not a torch device"),
    only(NO_CUDA, "a CUDA GPU is present", ("windtunnel_load_cuda_without_gpu",
                                            lambda t: bl.windtunnel.load("bijection", device="cuda"), E, r"CUDA")),
    ("windtunnel_untrained_seed_none", lambda t: bl.windtunnel.untrained("bijection", seed=None), E,
     r"seed must be"),
    ("windtunnel_unknown_shipped", lambda t: bl.windtunnel.shipped_path("mnist"), E,
     r"unknown wind-tunnel checkpoint"),
    # ---- martingale (checked at entry, before any forward pass)
    ("gap_seed_none", lambda t: gap(laplace, range(10, 20, 2), seed=None), E, r"non-deterministic"),
    ("gap_seed_str", lambda t: gap(laplace, range(10, 20, 2), seed="0"), E, r"got '0'"),
    ("gap_seed_negative", lambda t: gap(laplace, range(10, 20, 2), seed=-1), E, r"seed must be"),
    ("gap_seed_float", lambda t: gap(laplace, range(10, 20, 2), seed=1.5), E, r"got 1.5"),
    ("gap_n_boot_fractional", lambda t: gap(laplace, range(10, 20, 2), n_boot=2.5), E, r"n_boot.*fractional"),
    ("gap_batch_size_zero", lambda t: gap(laplace, range(10, 20, 2), batch_size=0), E, r"batch_size must be"),
    ("gap_n_seqs_one", lambda t: gap(laplace, range(10, 20, 2), n_seqs=1), E, r"n_seqs must be an integer >= 2"),
    ("gap_too_few_ns", lambda t: gap(laplace, [10, 12]), E, r"at least 3 values of n"),
    ("spectrum_seed_none", lambda t: positional_spectrum(laplace, seed=None), E, r"seed must be"),
    ("spectrum_short", lambda t: positional_spectrum(laplace, seq_len=8), E, r"seq_len must be an integer >= 16"),
    ("spectrum_length_float", lambda t: positional_spectrum(laplace, seq_len=32.0), E, r"seq_len must be an integer"),
    ("permutation_seed_negative", lambda t: permutation_average(laplace, seed=-1), E, r"seed must be"),
    ("permutation_n_perms_str", lambda t: permutation_average(laplace, n_perms="8"), E, r"pass the number itself"),
    ("falck_seed_str", lambda t: falck_checks(laplace, seed="0"), E, r"seed must be"),
    ("resample_seed_float", lambda t: resample_paths(laplace, [0, 1], 2, 2, seed=1.5), E, r"seed must be"),
    ("resample_n_paths_zero", lambda t: resample_paths(laplace, [0, 1], 0, 2), E, r"n_paths must be a positive integer"),
    ("compression_seed_bool", lambda t: compression(laplace, seed=True), E, r"got True \(bool\)"),
    ("fit_gap_seed_none", lambda t: fit_gap([10, 20, 30], [0.1, 0.05, 0.03], seed=None), E, r"seed must be"),
    ("fit_gap_bad_shape", lambda t: fit_gap([10, 20, 30], [0.1, 0.05, 0.03], shape="cubic"), E, r"shape must be"),
    # ModelSpec keywords the loader does not take: named before anything is loaded (was a TypeError)
    ("model_spec_unknown_loader_kwarg", lambda t: bl.shard.ModelSpec(
        "bayes_lens.models.tiny:tiny_model", {"kind": "bridge", "sedd": 1}).load(), E,
     r"kwargs \['sedd'\] are not parameters of the loader 'bayes_lens.models.tiny:tiny_model', which takes "
     r"\['kind', 'gqa'"),
    ("model_spec_unknown_load_model_kwarg", lambda t: bl.shard.ModelSpec("default", {"knd": "bridge"}).load(), E,
     r"kwargs \['knd'\] are not parameters of bl.load_model"),
]


def info_args(**kw):
    base = dict(model="default", kind="auto", device=None, seed=0, prompt="The capital of France is",
                max_new_tokens=8)
    return argparse.Namespace(**{**base, **kw})


def cli_info(model, **kw):
    with mock.patch.object(cli, "_load", return_value=(model, 0.0)):
        return cli._cmd_info(info_args(**kw))



def _fitted_axis(model):
    g = torch.Generator().manual_seed(0)
    dim = bl.adapter.model_info(model).kv_dim
    return bl.EntropyAxis.from_directions(model, {0: torch.randn(dim, generator=g)}, sigma=1.0)


def _flip_axis_byte(model, tmp):
    path = _fitted_axis(model).save(tmp / "axis.safetensors")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # a byte inside the last tensor
    path.write_bytes(bytes(data))
    return path


def _flat_cache(model):
    toks, _ = bl.adapter.tokenize(model, ["the cat is a dog"])
    with torch.inference_mode():
        return model.run_with_cache(toks, names_filter=bl.hook_filter(), remove_batch_dim=True)[1]


def _padded_pair(model):
    toks, mask = bl.adapter.tokenize(model, ["the cat is a dog", "moon", "a b"])
    with torch.inference_mode():
        return model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())


def _dict_cache_on(model, other):
    """A dict cache of ``model``'s run, read with ``model=other`` (another model)."""
    toks, mask = bl.adapter.tokenize(model, ["the cat is a dog", "moon", "a b"])
    with torch.inference_mode():
        _, cache = model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())
    return bl.value_manifold(dict(cache.items()), model=other, attention_mask=mask, n_boot=10, n_null=5)


def _compare_with_foreign_axis(model):
    items = ["the cat is a dog", "moon", "a b", "river stone"]
    toks, mask = bl.adapter.tokenize(model, items)
    with torch.inference_mode():
        pair = model.run_with_cache(toks, attention_mask=mask, names_filter=bl.hook_filter())
    other = tiny_model(bl.adapter.model_info(model).kind, gqa=False)  # twice the key/value width
    g = torch.Generator().manual_seed(0)
    axis = bl.EntropyAxis.from_directions(other, {0: torch.randn(bl.adapter.model_info(other).kv_dim,
                                                                 generator=g)}, sigma=1.0)
    return bl.compare_patched(items, clean=pair, patched={"same": pair}, axis=axis, attention_mask=mask, n_boot=10)


MODEL_CASES = [
    ("info_max_new_tokens_past_context", lambda m, t: cli_info(m, max_new_tokens=m.cfg.n_ctx + 1), E,
     r"--max-new-tokens \d+ does not fit: the prompt has \d+ tokens and the model's context is \d+ tokens"),
    ("report_sections_unknown_with_model", lambda m, t: bl.report(m, t / "o", sections="nope", progress=False), E,
     r"\['nope'\]"),
    ("report_override_type_with_model", lambda m, t: bl.report(m, t / "o", overrides={"n_boot": "x"},
                                                                progress=False), E, r"overrides\['n_boot'\]"),
    ("report_seed_with_model", lambda m, t: bl.report(m, t / "o", seed=-1, progress=False), E, r"seed must be"),
    ("gap_seed_none_with_model", lambda m, t: gap(m, range(4, 10, 2), seed=None), E, r"seed must be"),
    ("spectrum_seed_str_with_model", lambda m, t: positional_spectrum(m, seed="1"), E, r"seed must be"),
    ("compression_n_boot_with_model", lambda m, t: compression(m, n_boot=-1), E, r"n_boot must be"),
    # analyses (the lead's files): seeds, counts, sites, prompts, caches, patches, axes
    ("value_manifold_seed_none", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], seed=None), E, r"seed must be .*None"),
    ("value_manifold_seed_str", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], seed="0"), E, r"got '0'"),
    ("value_manifold_seed_negative", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], seed=-1), E, r"got -1"),
    ("value_manifold_seed_float", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], seed=1.5), E, r"got 1.5"),
    ("value_manifold_n_boot_float", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], n_boot=2.5), E, r"n_boot must be"),
    ("value_manifold_site_list", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], site=["v"]), E, r"site must be"),
    ("value_manifold_one_string", lambda m, t: bl.value_manifold(m, "the cat"), E, r"single string"),
    ("value_manifold_two_prompts", lambda m, t: bl.value_manifold(m, ["a b", "c d"]), E, r"at least 3 prompts"),
    ("value_manifold_empty_generator", lambda m, t: bl.value_manifold(m, (p for p in [])), E, r"empty"),
    ("value_manifold_lone_surrogate", lambda m, t: bl.value_manifold(m, ["a", "b", "c\ud800"]),
     bl.TokenizationError, r"surrogate"),
    ("value_manifold_layer_out_of_range", lambda m, t: bl.value_manifold(m, ["the cat is", "a dog", "moon river"], layer=99), bl.LayerIndexError,
     r"out of range"),
    ("focusing_n_boot_zero", lambda m, t: bl.attention_focusing(m, ["the cat is", "a dog", "moon river"], n_boot=0), E, r"n_boot must be"),
    ("focusing_positions", lambda m, t: bl.attention_focusing(m, ["the cat is", "a dog", "moon river"], positions="first"), E, r"positions"),
    ("alignment_n_perm_zero", lambda m, t: bl.entropy_alignment(m, ["the cat is", "a dog", "moon river"], n_perm=0), E, r"n_perm must be"),
    ("geometry_not_a_model", lambda m, t: bl.geometry(3, ["the cat is", "a dog", "moon river"]), E, r"TransformerLens model"),
    ("geometry_no_prompts", lambda m, t: bl.geometry(m), E, r"prompts are required"),
    ("sula_make_prompts_seed_none", lambda m, t: bl.sula.make_prompts(m, seed=None), E, r"non-deterministic"),
    ("sula_evaluate_plain_strings", lambda m, t: bl.sula.evaluate(m, ["the cat is", "a dog", "moon river"]), E, r"not a SULA item"),
    ("sula_evaluate_seed_float", lambda m, t: bl.sula.evaluate(m, seed=0.5), E, r"seed must be"),
    ("patched_pair_not_callable", lambda m, t: bl.patched(m, [("blocks.0.attn.hook_v", 3)]).__enter__(), E,
     r"\(hook_name: str, fn: callable\)"),
    ("patched_unknown_hook", lambda m, t: bl.patched(m, [("blocks.9.attn.hook_v", lambda a, hook: a)]).__enter__(),
     bl.MissingHookError, r"no hook point"),
    ("axis_not_fitted_attach", lambda m, t: bl.attach(m, axis=bl.EntropyAxis()), E, r"not fitted"),
    ("axis_save_missing_folder", lambda m, t: _fitted_axis(m).save(t / "missing" / "axis"), E,
     r"does not exist"),
    ("axis_load_flipped_byte", lambda m, t: bl.EntropyAxis.load(_flip_axis_byte(m, t)), bl.CheckpointError,
     r"SHA-256"),
    ("axis_fit_arrays_mismatch", lambda m, t: bl.EntropyAxis(layer=0).fit(np.ones((4, 3)), np.ones(3)), E,
     r"entropy"),
    ("cache_remove_batch_dim", lambda m, t: bl.value_manifold(_flat_cache(m)), E, r"remove_batch_dim"),
    ("cache_padded_without_mask", lambda m, t: bl.value_manifold(_padded_pair(m)), E, r"tokens="),
    ("cache_dict_without_model", lambda m, t: bl.value_manifold(dict(_padded_pair(m)[1].items())), E, r"model="),
    ("cache_dict_of_a_deeper_model", lambda m, t: _dict_cache_on(m, tiny_model(bl.adapter.model_info(m).kind,
                                                                               n_layers=1)), E,
     r"the cache holds layer 1: the cache was made by another model"),
    ("cache_dict_of_other_heads", lambda m, t: _dict_cache_on(m, tiny_model(bl.adapter.model_info(m).kind,
                                                                            gqa=False)), E,
     r"hook_v in the cache is \[3, \d+, 2, 16\].*made by another model"),
    ("compare_patched_caches_axis_of_another_model", lambda m, t: _compare_with_foreign_axis(m), E,
     r"the axis was fitted on .* has dimension 64, but the caches' model .* has 32"),
    ("compare_patched_only_clean", lambda m, t: bl.compare_patched(["a"] * 4, clean=_padded_pair(m)), E,
     r"clean=.*patched="),
    ("compare_patched_seed", lambda m, t: bl.compare_patched(m, ["the cat is", "a dog", "moon river"] + ["x y"], [], seed=-2), E, r"seed must be"),
    ("hook_filter_string_sites", lambda m, t: bl.hook_filter(sites="v"), E, r"not one string"),
    ("prompts_mixed_seed_before_work", lambda m, t: bl.prompts.mixed(m, seed=None), E, r"seed must be"),
]


def _ids(cases):
    return [getattr(c, "id", None) or c[0] for c in cases]


@pytest.mark.parametrize("case_id, call, error, phrase", CASES, ids=_ids(CASES))
def test_bad_input(case_id, call, error, phrase, tmp_path):
    with pytest.raises(error, match=phrase) as info:
        call(tmp_path)
    assert isinstance(info.value, BayesLensError)


@pytest.mark.parametrize("case_id, call, error, phrase", MODEL_CASES, ids=_ids(MODEL_CASES))
def test_bad_input_with_model(case_id, call, error, phrase, tiny, tmp_path):
    with pytest.raises(error, match=phrase) as info:
        call(tiny, tmp_path)
    assert isinstance(info.value, BayesLensError)
    assert not (tmp_path / "o" / "report.json").exists()  # nothing was written


def test_matrix_is_large_enough():
    from conftest import KINDS

    assert len(CASES) + len(MODEL_CASES) * len(KINDS) >= 80


# ----------------------------------------------------------------------- the good side of the validators


def test_validators_normalize_good_values(tmp_path):
    assert V.check_seed(np.int64(7)) == 7 and type(V.check_seed(np.int64(7))) is int
    assert V.check_seed(None, allow_none=True) is None
    assert V.check_positive_int(3, "n") == 3 and V.check_int(None, "n", allow_none=True) is None
    assert V.check_float(np.float32(0.5), "p") == 0.5 and V.check_probability(1, "p") == 1.0
    assert V.check_bool(np.bool_(True), "q") is True
    assert V.check_choice("v", "site", ("q", "k", "v")) == "v"
    assert V.check_names("geometry", "sections") == ["geometry"]
    assert V.check_choices(("sula", "geometry"), "sections", ["geometry", "sula"]) == ["sula", "geometry"]
    assert V.check_prompts(p for p in ["a", "b"]) == ["a", "b"]  # a generator is read once, not as empty
    assert V.check_device(None) is None and V.check_device("cpu") == "cpu"
    assert V.check_device(torch.device("cpu")) == "cpu"
    assert V.check_path(str(tmp_path), "out", kind="dir") == tmp_path
    assert V.check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # nothing is created
    assert V.check_mapping(None, "overrides") == {}


def test_validator_errors_are_value_errors_too():
    # InvalidInputError subclasses ValueError: code that caught ValueError keeps working
    with pytest.raises(ValueError):
        V.check_seed(-1)


def test_public_validators_are_documented():
    for name in V.__all__:
        obj = getattr(V, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.split()) >= 5, name


def test_report_single_section_string_runs_that_section_only(tmp_path, monkeypatch):
    from bayes_lens.models.tiny import tiny_model
    from bayes_lens.reporting import SectionOutput, _sections
    from bayes_lens.reporting._core import Section

    ran = []
    fake = {n: Section(n, n, n, lambda ctx, n=n: ran.append(n) or SectionOutput()) for n in _sections.SECTIONS}
    monkeypatch.setattr(_sections, "SECTIONS", fake)
    doc = bl.report(tiny_model("bridge"), tmp_path, sections="geometry", progress=False)
    assert ran == ["geometry"] and list(doc["sections"]) == ["geometry"]


def test_report_override_values_are_used(tmp_path, monkeypatch):
    from bayes_lens.models.tiny import tiny_model
    from bayes_lens.reporting import SectionOutput, _sections
    from bayes_lens.reporting._core import Section

    seen = {}
    fake = {"geometry": Section("geometry", "g", "g", lambda ctx: seen.update(ctx.sizes) or SectionOutput())}
    monkeypatch.setattr(_sections, "SECTIONS", fake)
    bl.report(tiny_model("bridge"), tmp_path, sections="geometry", progress=False, quick=True,
              overrides={"geometry_n": np.int64(7), "geometry_domains": ["code"], "ablation_layer": 3,
                         "martingale_permutation": {"seq_len": 9}})
    assert seen["geometry_n"] == 7 and type(seen["geometry_n"]) is int
    assert seen["geometry_domains"] == ("code",) and seen["ablation_layer"] == 3
    assert seen["martingale_permutation"] == {"seq_len": 9, "n_seqs": 3, "n_perms": 16, "ks": (1, 2, 4, 8)}


# ----------------------------------------------------------------------- the command line (exit 2, one line)


def _one_line(capsys, pattern):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert pytest.importorskip("re").search(pattern, lines[0]), lines[0]


def test_cli_windtunnel_train_out_is_a_file(tmp_path, capsys):
    from bayes_lens.cli import windtunnel_main as cli_main

    f = a_file(tmp_path)
    rc = cli_main(["train", "--task", "bijection", "--V", "4", "--layers", "1", "--d-model", "16", "--heads", "2",
                   "--d-head", "8", "--steps", "2", "--out", str(f), "--eval-n", "10"])
    assert rc == 2
    _one_line(capsys, r"error: out .* exists and is not a folder")
    assert f.read_text() == "x"


def test_cli_info_max_new_tokens_past_context(tiny, capsys):
    with mock.patch.object(cli, "_load", return_value=(tiny, 0.0)):
        assert cli.main(["info", "--max-new-tokens", str(tiny.cfg.n_ctx + 5)]) == 2
    _one_line(capsys, r"error: --max-new-tokens \d+ does not fit")


def test_cli_info_negative_max_new_tokens(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["info", "--max-new-tokens", "-1"])
    assert info.value.code == 2
    assert "non-negative integer" in capsys.readouterr().err


def test_cli_bad_device(capsys):
    assert cli.main(["info", "--device", "gpu0"]) == 2
    _one_line(capsys, r"--device='gpu0' is not a torch device")


def test_lock_timeout_error_is_a_bayes_lens_error():
    assert issubclass(LockTimeoutError, BayesLensError) and issubclass(LockTimeoutError, TimeoutError)


@pytest.mark.parametrize("value, pattern", [
    ("", r"--sections '' has an empty section name"),
    ("sula,,sula", r"--sections 'sula,,sula' has an empty section name"),
    ("sula,", r"--sections 'sula,' has an empty section name"),
    ("sula,sula", r"report sections \['sula'\] are named more than once"),
])
def test_cli_report_sections_empty_or_repeated(value, pattern, tmp_path, capsys):
    """Issue 25: --sections '' ran every section and 'sula,,sula' was accepted, while the API refuses
    sections=[]; both are refused before any model is loaded (and duplicates in the API too)."""
    with mock.patch.object(cli, "_load", side_effect=AssertionError("no model may be loaded")):
        assert cli.main(["report", "--sections", value, "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    _one_line(capsys, pattern)
    assert not (tmp_path / "o" / "report.json").exists()


def test_report_sections_repeated_in_the_api(tiny, tmp_path):
    with pytest.raises(InvalidInputError, match=r"\['geometry'\] are named more than once"):
        bl.report(tiny, tmp_path / "o", sections=["geometry", "sula", "geometry"], progress=False)


# --- One rule per parameter name (issue 33 §5) -----------------------------------------------------

def test_n_boot_follows_one_rule_everywhere():
    """n_boot was ``>= 0`` (martingale), ``>= 1`` (geometry, SULA) and ``>= 10`` (ablation): now every
    function that always computes an interval takes ``n_boot >= 1`` and says so in the same words;
    ``0`` stays accepted only where it is documented as "no bootstrap" (the martingale diagnostics)."""
    from bayes_lens.ablation._compare import _check_common
    from bayes_lens.metrics.pca import bootstrap_pca_stats
    from bayes_lens.sula._evaluate import _check_n_boot

    assert V.COUNT_RULES["n_boot"] == 1
    x = np.random.default_rng(0).normal(size=(6, 3))
    for call in (lambda nb: bootstrap_pca_stats(x, n_boot=nb), lambda nb: _check_common("spearman", 0, nb),
                 lambda nb: _check_n_boot(nb)):
        for bad, shown in ((0, "0"), (2.5, r"2\.5 \(float\)"), (True, r"True \(bool\)")):
            with pytest.raises(InvalidInputError, match=rf"^n_boot must be a positive integer, got {shown}"):
                call(bad)
    _check_common("spearman", 0, 5)  # was refused (n_boot >= 10) by compare_patched / compare_axis only
    assert bootstrap_pca_stats(x, n_boot=np.int64(3), seed=0).shape == (3, 3)
    # the documented "off" switch of the martingale diagnostics
    assert np.isnan(fit_gap([10, 20, 30, 40], [0.1, 0.05, 0.034, 0.026], n_boot=0).A.ci).all()


def test_positions_is_checked_by_one_rule():
    """``positions`` / ``attention_positions`` was checked by seven copies; all now give one message."""
    from bayes_lens.hooks import attention_entropy_hooks, pattern_entropy_bits
    from bayes_lens.reduced import ReducedCache

    pattern = torch.full((1, 1, 2, 2), 0.5)
    calls = {
        "positions": [lambda: pattern_entropy_bits(pattern, positions="first"),
                      lambda: attention_entropy_hooks(None, positions="first", out={})],
        "attention_positions": [lambda: ReducedCache({}, n_tokens=torch.tensor([2]), attention_positions="first")],
    }
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(InvalidInputError, match=rf"^{name} must be one of \['last', 'all'\], got 'first'\.$"):
                fn()
    assert V.check_positions("all") == "all"


def test_counts_named_in_the_rules_are_checked_by_them():
    for name, least in V.COUNT_RULES.items():
        assert V.check_count(least, name) == least
        with pytest.raises(InvalidInputError, match=rf"^{name} must be "):
            V.check_count(least - 1, name)
        with pytest.raises(InvalidInputError, match=r"fractional"):
            V.check_count(least + 0.5, name)
    assert V.check_count(0, "n_boot", allow_zero=True) == 0
    with pytest.raises(KeyError, match="COUNT_RULES"):
        V.check_count(3, "n_unknown")
