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


@pytest.mark.parametrize("kwargs, match", [
    (dict(value="abc"), "value must be a real number"),
    (dict(value=None), "value must be a real number"),
    (dict(value=True), "value must be a real number"),
    (dict(value=0.3, ci=(0.1,)), r"ci must be a \(low, high\) pair"),
    (dict(value=0.3, ci=None), r"ci must be a \(low, high\) pair"),
    (dict(value=0.3, ci=(0.4, 0.2)), "low end above its high end"),
    (dict(value=0.3, ci=("a", 0.4)), "ci low end must be a real number"),
    (dict(value=0.3, n=-1), "non-negative integer"),
    (dict(value=0.3, n=2.5), "non-negative integer"),
    (dict(value=0.3, null="x"), "null must be a real number"),
    (dict(value=0.3, null_interval=(1.0, 0.0)), "low end above its high end"),
    (dict(value=0.3, ci_method=None), "ci_method must be a string"),
])
def test_estimate_refuses_malformed_fields(kwargs, match):
    """Issue 32: Estimate("abc"), a one-element or reversed ci, ci=None and n=-1 were all accepted."""
    with pytest.raises(bl.InvalidInputError, match=match):
        bl.Estimate(**kwargs)


def test_estimate_normalises_what_it_accepts():
    import numpy as np

    e = bl.Estimate(np.float32(0.5), [np.float64(0.25), 1], n=np.int64(7), null_interval=[0, 0])
    assert type(e.value) is float and e.ci == (0.25, 1.0) and e.n == 7 and type(e.n) is int
    assert e.null_interval == (0.0, 0.0)
    nan = bl.Estimate(float("nan"))  # no interval: (nan, nan), as documented
    assert math.isnan(nan.value) and all(math.isnan(x) for x in nan.ci)
    assert bl.Estimate(0.2, (float("nan"), 0.3)).ci_high == 0.3  # one end missing is fine


def test_estimate_equality_with_a_number_raises_like_ordering():
    """Issue 32: ``est == 0.25`` silently returned False while ``est < 0.3`` raised the documented TypeError.
    Comparing with a number now raises the same way (== and != too); estimates still compare with each other
    and hash, so they work as dict keys, in sets and in dataclass equality of whole results."""
    import numpy as np

    e = bl.Estimate(0.25, (0.2, 0.31), n=40)
    for other in (0.25, 0, np.float64(0.25), 1 + 0j):
        with pytest.raises(TypeError, match="est.value"):
            e == other  # noqa: B015
        with pytest.raises(TypeError, match="est.value"):
            e != other  # noqa: B015
        with pytest.raises(TypeError, match="est.value"):
            other == e  # noqa: B015
    with pytest.raises(TypeError):
        e < 0.3  # noqa: B015
    with pytest.raises(TypeError, match="est.value"):
        assert e == pytest.approx(0.25)
    assert e.value == pytest.approx(0.25)
    same, other = bl.Estimate(0.25, (0.2, 0.31), n=40), bl.Estimate(0.25, (0.2, 0.32), n=40)
    assert e == same and e != other and not (e == other)
    assert {e: 1}[same] == 1 and len({e, same, other}) == 2
    assert (e == "0.25") is False and (e != None) is True  # noqa: E711 - not a number: plain inequality


@pytest.mark.parametrize("bad", ["x", None, [0.1], True, object()])
def test_excludes_something_that_is_not_a_number_is_a_clear_error(bad):
    """Issue 52 §3: ``est.excludes('x')`` raised a raw TypeError from the comparison inside."""
    e = bl.Estimate(0.25, (0.2, 0.3), n=10)
    with pytest.raises(bl.InvalidInputError, match=r"Estimate.excludes\(x\) needs a real number .* got ") as info:
        e.excludes(bad)
    assert len(str(info.value).splitlines()) == 1
    assert e.excludes(0.1) and not e.excludes(0.25) and e.excludes(1)   # numbers as before
