"""bl.Estimate: a headline number with its interval behaves like its value where that is unambiguous."""

from __future__ import annotations

import json
import math

import pytest

import bayes_lens as bl
from bayes_lens._results import fmt, fmt_ci


def test_estimate_formats_and_converts_as_its_value():
    e = bl.Estimate(0.123456, (0.1, 0.15), "95% percentile bootstrap over prompts", null=0.05,
                    null_interval=(0.01, 0.09), n=40)
    assert f"{e:.3f}" == "0.123" and f"{e:.1%}" == "12.3%" and f"{e}" == str(0.123456)
    assert float(e) == 0.123456 and math.isfinite(e)
    assert (e.ci_low, e.ci_high) == (0.1, 0.15)
    assert fmt(e) == fmt(0.123456) and fmt_ci(e) == fmt_ci((0.1, 0.15))
    assert e.excludes(0.0) and not e.excludes(0.12)
    text = repr(e)
    assert "CI [0.1, 0.15]" in text and "null 0.05 [0.01, 0.09]" in text and "n = 40" in text


def test_estimate_to_dict_is_flat_and_json_safe():
    e = bl.Estimate(1.5, (float("nan"), float("nan")), "t interval", n=3)
    d = e.to_dict()
    assert d == {"value": 1.5, "ci_low": None, "ci_high": None, "ci_method": "t interval", "null": None,
                 "null_low": None, "null_high": None, "n": 3}
    assert json.loads(json.dumps(d)) == d
    assert set(e.to_dict("mae_")) == {"mae_" + k for k in d}


def test_estimate_refuses_arithmetic():
    e = bl.Estimate(1.0, (0.5, 1.5))
    with pytest.raises(TypeError):
        e + 1  # noqa: B018 - an interval does not survive arithmetic: use e.value
    with pytest.raises(TypeError):
        e < 2  # noqa: B018
