"""`bayes-lens steering`: the sub-command's options parse, and bad ones fail with one line before any model load."""

from __future__ import annotations

import pytest

from bayes_lens.cli import build_parser, main


def test_steering_options_parse():
    args = build_parser().parse_args(["steering", "--quick", "--alphas=-1,0,1", "--layer", "3", "--task",
                                      "categorical", "--alpha-unit", "sigma"])
    assert args.alphas == [-1.0, 0.0, 1.0] and args.layer == 3 and args.task == "categorical"
    assert args.alpha_unit == "sigma" and args.quick
    assert build_parser().parse_args(["steering"]).layer == "middle"


def test_steering_bad_options_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        main(["steering", "--alphas", "a,b"])
    assert err.value.code == 2
    assert "comma-separated numbers" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["steering", "--out", str(a_file / "out")]) == 2      # refused before the model load
    assert "is a file" in capsys.readouterr().err
