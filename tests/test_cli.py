"""The ``bayes-lens`` command: --help everywhere, one-line errors with exit status 2 on bad input.

Bad input must be caught *before* the model is loaded (a wrong --out must not cost a model load),
so these tests are fast. The end-to-end run of ``bayes-lens report --quick`` on SmolLM2 lives in
tests/reporting/test_report_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bayes_lens.cli import build_parser, main

COMMANDS = ["report", "geometry", "sula", "ablate", "martingale", "localize"]


def _console_script():
    exe = Path(sys.executable).parent / "bayes-lens"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "bayes_lens.cli"]


def _run(*args, timeout=120):
    env = dict(os.environ, BAYES_LENS_PROGRESS="0")
    return subprocess.run(_console_script() + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def _one_line_error(proc, pattern: str):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bayes-lens: error:")
    assert pattern in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_console_script_help():
    proc = _run("--help")
    assert proc.returncode == 0
    for cmd in COMMANDS + ["models", "info"]:
        assert cmd in proc.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_analysis_command_has_help_and_shared_options(cmd, capsys):
    with pytest.raises(SystemExit) as exc:
        main([cmd, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--out", "--seed", "--quick", "--device"):
        assert opt in out


def test_parser_defaults():
    args = build_parser().parse_args(["sula"])
    assert (args.model, args.seed, args.quick, args.device, args.out) == ("default", 0, False, "auto", None)


def test_unknown_model_subprocess():
    _one_line_error(_run("report", "--model", "no-such-model", "--out", os.devnull + "-x"), "unknown model")


@pytest.mark.parametrize("argv,pattern", [
    (["report", "--model", "/definitely/missing.gguf"], "not found"),
    (["geometry", "--seed", "-3"], "non-negative integer"),
    (["sula", "--seed", "abc"], "non-negative integer"),
    (["report", "--sections", "geometry,bogus"], "unknown report section"),
    (["martingale", "--device", "not-a-device"], "--device"),
    (["ablate", "--device", "cuda:7"], "--device"),
    (["geometry", "--engine", "torchrun"], "--shard-dir"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_one_line_exit_2(argv, pattern, tmp_path, capsys):
    if argv[0] != "frobnicate":
        argv = argv + ["--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bayes-lens: error:") and pattern in lines[0], err
    assert not (tmp_path / "out" / "report.json").exists()


def test_unwritable_output_folder_fails_before_loading(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = _run("report", "--quick", "--out", str(blocker / "sub"), timeout=60)
    _one_line_error(proc, "not writable")
    assert "loading model" not in proc.stderr  # failed before any model work


# the command line in a child whose model loader raises: a check that runs only after the load fails the test
_NO_LOAD_CHILD = ("import sys\nimport bayes_lens.cli as cli\n"
                  "def _no_load(args):\n    raise AssertionError('the model was loaded before the cheap checks')\n"
                  "cli._load = _no_load\nsys.exit(cli.main(sys.argv[1:]))\n")
# root writes through permission bits (CI runs as root), so there the folder is a read-only bind mount of itself in
# a user and mount namespace of the child's own (no privileges needed); 97/98: the mount could not be made read-only
_READ_ONLY_BIND = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 97; '
                   'touch "$0/.probe" 2>/dev/null && exit 98; exec "$@"')


def _run_in_read_only_folder(ro: Path, *args, timeout=120) -> subprocess.CompletedProcess:
    """``bayes-lens *args`` (model loading refused) with the new folder ``ro`` read-only: mode 0o500 for a normal
    user; for root a read-only bind (``unshare -Urm``), skipped only where the kernel refuses that namespace."""
    ro.mkdir()
    env = dict(os.environ, BAYES_LENS_PROGRESS="0")
    child = [sys.executable, "-c", _NO_LOAD_CHILD, *args]
    if os.geteuid() != 0:
        ro.chmod(0o500)
        try:
            return subprocess.run(child, capture_output=True, text=True, timeout=timeout, env=env)
        finally:
            ro.chmod(0o700)
    if shutil.which("unshare") is None:
        pytest.skip("running as root without util-linux's unshare: no unprivileged read-only folder to test")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", _READ_ONLY_BIND, str(ro), *child], capture_output=True,
                          text=True, timeout=timeout, env=env)
    if proc.returncode in (97, 98) or proc.stderr.startswith("unshare:"):
        pytest.skip(f"running as root and no read-only bind could be made here: {proc.stderr.strip()[:200]}")
    return proc


def test_read_only_output_folder(tmp_path):
    """A read-only --out fails at once, in one line, before the model load (also as root, on a read-only bind)."""
    _one_line_error(_run_in_read_only_folder(tmp_path / "ro", "sula", "--out", str(tmp_path / "ro")), "not writable")
    assert not (tmp_path / "ro" / "report.json").exists()


def test_read_only_shard_dir_and_csv_folder_fail_before_the_run(tmp_path):
    """Issue 52 raw errors: `localize --shard-dir` and `reproduce --csv` in a read-only folder failed only after the
    whole run; both are refused first (exit 2, one line), before the model load - also as root."""
    ro = tmp_path / "ro"
    proc = _run_in_read_only_folder(ro, "localize", "--quick", "--no-progress", "--out", str(tmp_path / "out"),
                                    "--shard-dir", str(ro / "shards"))
    _one_line_error(proc, "--shard-dir")
    assert "not writable" in proc.stderr
    proc = _run_in_read_only_folder(tmp_path / "ro2", "reproduce", "falck", "--no-progress", "--csv",
                                    str(tmp_path / "ro2" / "rows.csv"))
    _one_line_error(proc, "--csv")
    assert "cannot be written" in proc.stderr


def test_models_command(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and ".gguf" in out


def test_summary_table_formats_every_metric():
    from bayes_lens.cli import summary_table

    doc = {"summary": [
        {"section": "sula", "key": "sula.mae_bits", "label": "MAE", "value": 0.4321, "units": "bits",
         "ci": {"low": 0.4, "high": 0.5, "level": 0.95, "method": "m"}, "baseline": {"value": 0.6, "label": "prior"},
         "references": []},
        {"section": "geometry", "key": "geometry.mixed.pc1", "label": "PC1", "value": 0.25, "units": "fraction",
         "ci": None, "baseline": None, "references": []},
    ], "sections": {"sula": {"status": "ok"}, "martingale": {"status": "error", "error": {"message": "boom"}}}}
    text = summary_table(doc)
    assert "0.432 bits" in text and "[0.400, 0.500]" in text and "0.600 (prior)" in text
    assert "25.0%" in text
    assert "ERROR: boom" in text


def test_windtunnel_commands_are_hooked_in(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["windtunnel", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "eval" in out


# ---------------------------------------------------------------------------------------------------
# --help and --version without torch (issue 16.5)
# ---------------------------------------------------------------------------------------------------
_PROBE = ("import sys; from bayes_lens.cli import main\n"
          "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
          "print('TORCH_LOADED=' + str('torch' in sys.modules))")


_EVERY_HELP = [["--help"], ["--version"], ["report", "--help"], ["geometry", "--help"], ["sula", "--help"],
               ["ablate", "--help"], ["martingale", "--help"], ["models", "--help"], ["info", "--help"],
               ["windtunnel", "--help"], ["windtunnel", "train", "--help"], ["windtunnel", "eval", "--help"],
               ["shard", "--help"], ["shard", "plan", "--help"], ["shard", "run", "--help"],
               ["shard", "merge", "--help"], ["shard", "status", "--help"]]


@pytest.mark.parametrize("args", _EVERY_HELP, ids=lambda a: " ".join(a))
def test_help_and_version_do_not_import_torch(args):
    """Every ``--help`` answers from argparse alone (issue 26.6: torch's import was 1 s quiet, 13-18 s
    under load); asserting the import, not a time, keeps the test independent of the machine's load."""
    env = dict(os.environ, BAYES_LENS_PROGRESS="0")
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120, env=env)
    assert "usage:" in r.stdout or "bayes-lens " in r.stdout, r.stdout + r.stderr
    assert "TORCH_LOADED=False" in r.stdout, r.stdout


def test_version_names_the_installed_distribution(capsys):
    """bayes_lens's version, then TransformerLens's version, major and model classes (issue 37.1: the pip
    route installs TL 4.x, where bl.load_model() returns a TransformerBridge), checked against TL itself."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"bayes-lens {version('bayes-lens')}"
    tl = version("transformer-lens")
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
        hooked = True
    except ImportError:   # TL 4.x raises ImportError (not AttributeError) for the removed class
        hooked = False
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401
        bridge = True
    except ImportError:
        bridge = False
    yes = {True: "yes", False: "no"}
    assert lines[1] == (f"TransformerLens {tl} (major {tl.split('.')[0]}): HookedTransformer {yes[hooked]}, "
                        f"TransformerBridge {yes[bridge]}; bl.load_model() returns a "
                        f"{'HookedTransformer' if hooked else 'TransformerBridge'} by default")
    assert len(lines) == 2


@pytest.mark.parametrize("argv,hint,helps", [
    (["reprot"], "did you mean 'report'?", "bayes-lens --help"),
    (["report", "--quik"], "did you mean '--quick'?", "bayes-lens report --help"),
    (["geometry", "--quik", "--sed", "3"], "did you mean '--quick' (for '--quik'), '--seed' (for '--sed')?",
     "bayes-lens geometry --help"),
    (["sula", "--kind", "bridg"], "did you mean 'bridge'?", "bayes-lens sula --help"),
    (["shard", "plna"], "did you mean 'plan'?", "bayes-lens shard --help"),
    (["windtunnel", "evla"], "did you mean 'eval'?", "bayes-lens windtunnel --help"),
    (["models", "--verbose"], None, "bayes-lens models --help"),   # nothing close: no guess
    (["frobnicate"], None, "bayes-lens --help"),
])
def test_misspelt_command_or_option_gets_did_you_mean(argv, hint, helps, capsys):
    """Issue 37.5: `bayes-lens reprot` / `--quik` say what was probably meant (argparse on Python 3.11 does
    not), in the one error line, and point to the --help that lists the right options."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bayes-lens: error:"), lines
    if hint is None:
        assert "did you mean" not in lines[0]
    else:
        assert hint in lines[0], lines[0]
    assert lines[0].endswith(f"(see `{helps}`)"), lines[0]


def test_top_level_help_lists_windtunnel_without_loading_it(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "windtunnel" in out and "train / evaluate wind-tunnel models" in out


def test_summary_table_never_cuts_labels():
    from bayes_lens.cli import summary_table

    label = "a deliberately long quantity label that is far wider than any column limit used before " * 2
    base = "a long baseline description that also runs past sixty characters, all of it"
    doc = {"summary": [{"section": "a_long_section_name", "key": "x.y", "label": label, "value": 0.5,
                        "units": "fraction", "ci": {"low": 0.1, "high": 0.9}, "baseline": {"value": 0.2, "label": base},
                        "references": []}],
           "sections": {"martingale": {"status": "error", "error": {"message": "m" * 150}}}}
    text = summary_table(doc)
    assert label.strip() in text and base in text and "a_long_section_name" in text
    assert "m" * 150 in text
    # the 80-point-wide fraction interval is flagged as wide in the verdict column
    assert "WIDE interval" in text


def test_load_model_says_it_is_loading(monkeypatch, capsys):
    from bayes_lens.errors import ModelLoadError
    from bayes_lens.models import load_model

    monkeypatch.setenv("BAYES_LENS_PROGRESS", "1")
    with pytest.raises(ModelLoadError):
        load_model("/nonexistent/model.gguf")
    assert "bayes_lens: loading '/nonexistent/model.gguf'" in capsys.readouterr().err
    monkeypatch.setenv("BAYES_LENS_PROGRESS", "0")
    with pytest.raises(ModelLoadError):
        load_model("/nonexistent/model.gguf")
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------------
# every sub-command and option described, with its default; --model names the models (issue 26.6)
# ---------------------------------------------------------------------------------------------------
def _walk(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, path + (name,))


def test_every_command_and_option_is_described_with_its_default():
    import argparse

    missing = []
    for path, parser in _walk(build_parser()):
        if path and not parser.description:
            missing.append(f"{' '.join(path)}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)) \
                    or "--version" in action.option_strings:
                continue
            where = f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(f"{where}: no help")
            elif action.option_strings and "default" not in action.help and "required" not in action.help:
                missing.append(f"{where}: help names no default")
    assert not missing, missing


def test_model_help_lists_every_named_model():
    from bayes_lens.models import model_catalog

    for path, parser in _walk(build_parser()):
        for action in parser._actions:
            if "--model" in action.option_strings:
                for entry in model_catalog():
                    assert f"'{entry.name}'" in action.help, (path, entry.name)


def test_device_defaults_to_auto_everywhere_and_auto_resolves():
    import torch

    from bayes_lens._validate import check_device

    seen = 0
    for path, parser in _walk(build_parser()):
        for action in parser._actions:
            if "--device" in action.option_strings:
                assert action.default == "auto", path
                seen += 1
    assert seen >= 7  # five analyses, info, windtunnel eval, shard plan
    assert check_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert check_device("cpu") == "cpu"


def test_info_parameter_counts_agree_across_kinds(tiny_pair):
    """`bayes-lens info` prints one weight count for both kinds (issue 26.4: 163.0 M vs 134.5 M)."""
    import torch

    from bayes_lens import cli

    hooked, bridge = tiny_pair
    h_loaded, h_weights, _ = cli._parameter_counts(hooked)
    b_loaded, b_weights, _ = cli._parameter_counts(bridge)
    assert h_loaded == sum(p.numel() for p in hooked.parameters())
    # independent: the HookedTransformer's non-zero parameters, minus W_U where it copies W_E.T
    nonzero = sum(p.numel() for n, p in hooked.named_parameters()
                  if not (n.split(".")[-1].lstrip("_").startswith("b_") and not torch.count_nonzero(p)))
    tied = hooked.W_U.numel() if torch.equal(hooked.W_U, hooked.W_E.T) else 0
    assert h_weights == nonzero - tied == b_weights


def test_shard_dir_runs_the_report_through_the_sharded_runner(tiny_kind, tmp_path, monkeypatch, capsys):
    """``--shard-dir`` is ``bl.shard.sharded`` around the report: every forward pass leaves checked shard
    folders (named by analysis), and the numbers equal the report run in this process."""
    import json

    import bayes_lens.cli as cli
    from bayes_lens.models.tiny import tiny_model

    monkeypatch.setattr(cli, "_load", lambda args: (tiny_model(tiny_kind), 0.0))
    base = ["geometry", "--quick", "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "plain")]) == 0
    assert main(base + ["--shard-dir", str(tmp_path / "shards"), "--out", str(tmp_path / "sharded")]) == 0
    folders = sorted((tmp_path / "shards").iterdir())
    assert {p.name.rsplit("-", 1)[0] for p in folders} == {"prompts", "compare_domains"}
    assert all(list(p.glob("shard-*.json")) and (p / "plan.json").is_file() for p in folders)

    def numbers(folder):
        doc = json.loads((tmp_path / folder / "report.json").read_text())
        return [(m.get("name"), m.get("value")) for s in doc["sections"].values() for m in s.get("metrics", [])]

    assert numbers("plain") == numbers("sharded") and numbers("plain")
    capsys.readouterr()


def test_info_prints_both_parameter_counts(tiny_kind, monkeypatch, capsys):
    """Issue 37.5: the README promises two counts (the checkpoint's weights, and sum(p.numel()) as loaded);
    `info` printed only one where they are equal (TL 4.3's bridge has no zero lm_head bias). Both are
    printed for every kind, the second being exactly sum(p.numel() for p in model.parameters())."""
    import re

    import bayes_lens.cli as cli
    from bayes_lens.models.tiny import tiny_model

    model = tiny_model(tiny_kind)
    monkeypatch.setattr(cli, "_load", lambda args: (model, 0.0))
    assert main(["info", "--max-new-tokens", "0"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("parameters"))
    m = re.fullmatch(r"parameters +([\d,]+) in the checkpoint's weights; ([\d,]+) as loaded, "
                     r"sum\(p\.numel\(\) for p in model\.parameters\(\)\) \((.+)\)", line)
    assert m, line
    weights, loaded = (int(m.group(i).replace(",", "")) for i in (1, 2))
    assert loaded == sum(p.numel() for p in model.parameters())
    assert weights == cli._parameter_counts(model)[1] <= loaded
    assert (m.group(3) == "the same: no copies, no all-zero biases") == (weights == loaded)


def test_reproduce_prints_rows_and_writes_csv(monkeypatch, tmp_path, capsys):
    """``bayes-lens reproduce falck`` on a tiny model: the table with a verdict per row, the CSV equal to
    ``bl.reproduce``'s rows; a bad --sizes is refused by argparse before any model load."""
    import numpy as np
    import pandas as pd

    import bayes_lens as bl
    import bayes_lens.cli as cli
    from bayes_lens.models.tiny import tiny_model

    from bayes_lens import reproduction

    monkeypatch.setitem(reproduction.SIZES["quick"], "falck",   # seconds, not minutes, on a tiny model
                        {"thetas": (0.5,), "ns": (14,), "ratios": (0.5,), "n_paths": 4, "n_ref": 100})
    model = tiny_model("bridge")
    monkeypatch.setattr(cli, "_load", lambda args: (model, 0.0))
    csv = tmp_path / "rows.csv"
    assert main(["reproduce", "falck", "--no-progress", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "falck on tiny-llama" in out and "0 PASS, 0 FAIL, 4 NOT COMPARABLE" in out
    got = pd.read_csv(csv)
    want = bl.reproduce(model, "falck", progress=False).to_dataframe()
    assert list(got["key"]) == list(want["key"]) and list(got["verdict"]) == list(want["verdict"])
    np.testing.assert_allclose(got["ours"], want["ours"], rtol=1e-9)
    with pytest.raises(SystemExit):
        main(["reproduce", "falck", "--sizes", "huge"])


# ---------------------------------------------------------------------------------------------------
# reproduce: its verdict words, an all-or-nothing --csv checked before the run, the records (issue 52)
# ---------------------------------------------------------------------------------------------------
def test_reproduce_help_says_what_each_verdict_checks(capsys):
    """Issue 52.1: --help said "PASS / FAIL" for every model, though an offline model's band is bayes_lens's
    own recorded run; it names both pairs of words and what each is held to."""
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "MATCHES RECORD / DIFFERS FROM RECORD" in out and "PASS / FAIL" in out
    assert "recorded run" in out and "paper's own" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "MATCHES RECORD" in " ".join(capsys.readouterr().out.split())


def _no_load(args):
    raise AssertionError("the model was loaded before the cheap checks")


def test_reproduce_csv_where_nothing_can_be_written_fails_before_the_run(tmp_path, monkeypatch, capsys):
    """Issue 52.2: `--csv` under a file (or in a folder) failed only after the whole run; it is
    refused first, in one line, before the model load."""
    import bayes_lens.cli as cli

    monkeypatch.setattr(cli, "_load", _no_load)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["reproduce", "falck", "--no-progress", "--csv", str(blocker / "rows.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bayes-lens: error: --csv") and "cannot be written" in err and len(err.splitlines()) == 1
    assert main(["reproduce", "falck", "--no-progress", "--csv", str(tmp_path)]) == 2   # a folder
    assert "is not a file" in capsys.readouterr().err
    # a read-only folder (also as root): test_read_only_shard_dir_and_csv_folder_fail_before_the_run


def test_reproduce_csv_that_fails_to_write_keeps_the_old_file(tmp_path, monkeypatch, capsys):
    """Issue 52.2: the CSV was written in place, so a write that failed part-way destroyed the old file and left
    a truncated one. It is written as the report is (a temporary file renamed in): the old file stays whole."""
    import pandas as pd

    import bayes_lens.cli as cli
    from bayes_lens import reproduction
    from bayes_lens.models.tiny import tiny_model

    class Boom:
        def __str__(self):
            raise OSError(28, "No space left on device")

    monkeypatch.setitem(reproduction.SIZES["quick"], "falck",
                        {"thetas": (0.5,), "ns": (14,), "ratios": (0.5,), "n_paths": 4, "n_ref": 100})
    monkeypatch.setattr(cli, "_load", lambda args: (tiny_model("bridge"), 0.0))
    real = reproduction.Reproduction.to_dataframe
    monkeypatch.setattr(reproduction.Reproduction, "to_dataframe",
                        lambda self: real(self).assign(broken=[1] * (len(self.rows) - 1) + [Boom()]))
    csv = tmp_path / "rows.csv"
    old = "key,verdict\nfalck_T1,NOT COMPARABLE\n" * 50
    csv.write_text(old)
    assert main(["reproduce", "falck", "--no-progress", "--csv", str(csv)]) != 0
    capsys.readouterr()
    assert csv.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]   # no temporary file left behind
    monkeypatch.setattr(reproduction.Reproduction, "to_dataframe", real)
    assert main(["reproduce", "falck", "--no-progress", "--csv", str(csv)]) == 0
    assert list(pd.read_csv(csv)["key"]) == ["falck_T1", "falck_T2", "falck_T3", "falck_slope"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv"]


def test_reproduce_with_damaged_records_fails_before_the_model_load(tmp_path, monkeypatch, capsys):
    """Issue 52.3: a damaged records file gave a raw JSONDecodeError after the whole run."""
    import bayes_lens.cli as cli
    from bayes_lens import reproduction

    bad = tmp_path / "reproduce_records.json"
    bad.write_text("{not json")
    monkeypatch.setattr(reproduction, "_records_path", lambda: bad)
    monkeypatch.setattr(cli, "_load", _no_load)
    assert main(["reproduce", "paper-a", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bayes-lens: error: the recorded runs") and "not valid JSON" in err


# ---------------------------------------------------------------------------------------------------
# an unknown --model is refused before torch is imported (issue 53.6)
# ---------------------------------------------------------------------------------------------------
_PROBE_CODE = ("import sys; from bayes_lens.cli import main\n"
               "code = main(sys.argv[1:])\n"
               "print('EXIT=' + str(code)); print('TORCH_LOADED=' + str('torch' in sys.modules))")


@pytest.mark.parametrize("argv", [["report", "--model", "smollm2"], ["sula", "--model", "pythia-410m", "--quick"],
                                  ["info", "--model", "smollm2"], ["reproduce", "paper-a", "--model", "smollm2"],
                                  ["codelength", "--model", "gemma"]], ids=lambda a: " ".join(a))
def test_unknown_model_name_is_refused_before_torch_is_imported(argv, tmp_path):
    """Issue 53.6: `bayes-lens report --model smollm2` took 27 s (importing torch and TransformerLens) to say
    the name is unknown. Names are checked first: the one-line error comes without importing torch (asserting
    the import, not a time, keeps the test independent of the machine's load)."""
    if argv[0] in ("report", "sula"):
        argv = argv + ["--out", str(tmp_path / "out")]
    env = dict(os.environ, BAYES_LENS_PROGRESS="0")
    r = subprocess.run([sys.executable, "-c", _PROBE_CODE, *argv], capture_output=True, text=True, timeout=300,
                       env=env)
    assert "EXIT=2" in r.stdout, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bayes-lens: error: unknown model"), r.stderr
    assert "'default'" in lines[0] and "gemma-3-270m" in lines[0]
    assert "TORCH_LOADED=False" in r.stdout, r.stdout
    if "smollm2" in argv:
        assert "SmolLM2-135M is 'default'" in lines[0]


def test_cli_model_names_are_the_catalog_names():
    from bayes_lens._cli_text import MODEL_NAMES
    from bayes_lens.models import model_catalog

    assert set(MODEL_NAMES) == {e.name for e in model_catalog()}


def test_report_help_lists_every_section(capsys):
    """Issue 53.6: `report --help` listed geometry,sula,ablation,martingale,localize but not tasks."""
    from bayes_lens.reporting._sections import SECTIONS

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name, section in SECTIONS.items():
        assert name in out, name
    assert "tasks" in out and "opt-in" in out
    assert "adds the sections it needs" in out


def test_a_shard_dir_that_cannot_be_written_fails_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """Issue 52: `localize --shard-dir` on a place that cannot hold a folder fails at once (exit 2, one line), not
    after the run; the model is never loaded."""
    from bayes_lens import cli

    monkeypatch.setattr(cli, "_load", lambda args: (_ for _ in ()).throw(AssertionError("the model was loaded")))
    blocker = tmp_path / "a file"
    blocker.write_text("x")
    rc = cli.main(["localize", "--quick", "--out", str(tmp_path / "out"), "--shard-dir", str(blocker / "shards"),
                   "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--shard-dir" in err and "is a file" in err
