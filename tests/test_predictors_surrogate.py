"""Surrogate ℓ̂: the formula, the laws (incl. degenerate ones), JSON save/load and bad files."""

import json
import math

import numpy as np
import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

S = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1)


def test_formula_matches_paper_eq4_and_is_one_at_end():
    t = np.array([0.2, 0.5, 1.0])
    sched = Schedule()
    tau, tpp = 0.1, 20.0
    b, q = 0.5 * tau**0.3, 1.0 * tpp**0.1
    raw = ((1 + 1e-3) / (t + 1e-3)) ** 0.05 + b * (sched(t) + 0.1) ** q
    raw1 = 1.0 + b * 0.1**q
    np.testing.assert_allclose(S.normalized(t, sched, tau, tpp), raw / raw1)
    assert S.normalized(1.0, Schedule("cosine"), 0.3, 80)[0] == pytest.approx(1.0)
    # a larger b (bigger τ here) gives a larger LR-modulation bump early in training
    assert S.normalized(0.2, sched, 0.4, 20)[0] > S.normalized(0.2, sched, 0.05, 20)[0]


def test_constant_laws_ignore_controls_and_power_law_needs_tau():
    c = Surrogate(b_c=0.4, b_e=0.0, q_c=1.2, q_e=0.0, tau_law="constant", tpp_law="constant")
    assert c.b(None) == 0.4 and c.b(0.05) == 0.4 and c.q(5) == 1.2 and c.q(500) == 1.2
    with pytest.raises(InputError, match="no weight decay"):
        S.b(None)
    with pytest.raises(InputError):  # an infinite τ is no weight decay, too
        S.b(math.inf)


def test_no_decay_limit_serves_a_run_without_weight_decay_with_b_zero_only_for_a_falling_law(tmp_path):
    """``no_decay_limit``: τ None (or ∞) gets the power law's limit τ → ∞, b = 0, when b_e < 0; a rising law
    has no finite limit and still refuses; runs with weight decay are unchanged; the flag survives a save and
    is left out of files that do not set it."""
    falling = Surrogate(b_c=0.3, b_e=-0.2, q_c=0.9, q_e=0.0, tpp_law="constant", no_decay_limit=True)
    assert falling.b(None) == 0.0 and falling.b(math.inf) == 0.0
    assert falling.b(0.1) == pytest.approx(0.3 * 0.1**-0.2)
    shape = falling.normalized(np.linspace(0.1, 1.0, 5), Schedule(), None, None)
    assert np.all(np.isfinite(shape)) and shape[-1] == pytest.approx(1.0)
    rising = Surrogate(b_c=0.3, b_e=0.2, q_c=0.9, q_e=0.0, tpp_law="constant", no_decay_limit=True)
    with pytest.raises(InputError, match="no weight decay"):
        rising.b(None)
    p = tmp_path / "s.json"
    falling.save(p)
    assert json.loads(p.read_text())["no_decay_limit"] is True and Surrogate.load(p) == falling
    Surrogate(b_c=0.3, b_e=-0.2, q_c=0.9, q_e=0.0).save(p)
    assert "no_decay_limit" not in json.loads(p.read_text())
    with pytest.raises(InputError, match="no_decay_limit"):
        Surrogate(b_c=0.3, b_e=-0.2, q_c=0.9, q_e=0.0, no_decay_limit="yes")


def test_save_load_round_trip(tmp_path):
    s = Surrogate(b_c=0.3, b_e=-0.2, q_c=0.9, q_e=0.05, m=0.07, align="log", align_start=0.25,
                  error_bands=[ErrorBand(0.2, 8, 0.001, 0.01, 0.02), ErrorBand(0.1, 8, 0.002, 0.03, 0.05)],
                  info={"fit_start": 0.2})
    p = tmp_path / "s.json"
    s.save(p)
    back = Surrogate.load(p)
    assert back == s
    assert [e.fraction for e in back.error_bands] == [0.1, 0.2]
    d = json.loads(p.read_text())
    assert d["format"] == "collapse-hpo-surrogate" and d["version"] == 1


def test_error_band_interpolates_and_clamps():
    s = Surrogate(b_c=0.3, b_e=0, q_c=1, q_e=0,
                  error_bands=[ErrorBand(0.1, 5, 0.0, 0.04, 0.1), ErrorBand(0.3, 7, 0.02, 0.02, 0.05)])
    mid = s.error_band(0.2)
    assert mid.scale == pytest.approx(0.03) and mid.bias == pytest.approx(0.01) and mid.n == 5
    assert s.error_band(0.05).scale == 0.04 and s.error_band(0.9).scale == 0.02
    assert Surrogate(b_c=1, b_e=0, q_c=1, q_e=0).error_band(0.2) is None
    # the band index (a binary search on a list) is np.searchsorted's at every fraction between the bands
    bands = [ErrorBand(f, 5, 0.01 * k, 0.04 / (k + 1), 0.1) for k, f in enumerate((0.1, 0.15, 0.2, 0.3, 0.5))]
    s = Surrogate(b_c=0.3, b_e=0, q_c=1, q_e=0, error_bands=bands)
    fr = np.array([b.fraction for b in bands])
    for f in np.linspace(0.1001, 0.4999, 97):
        j = int(np.searchsorted(fr, f))
        w = (f - fr[j - 1]) / (fr[j] - fr[j - 1])
        assert s.error_band(f).scale == bands[j - 1].scale + w * (bands[j].scale - bands[j - 1].scale)


@pytest.mark.parametrize("content,expect", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"format": "other"}', "not a collapse-hpo surrogate"),
    ('{"format": "collapse-hpo-surrogate", "version": 99}', "version 99 is not supported"),
    ('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": 1, "b_e": 0, "q_c": 1}',
     "missing field 'q_e'"),
    ('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": "x", "b_e": 0, "q_c": 1, "q_e": 0}',
     "field 'b_c' must be a finite number"),
    ('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": 1, "b_e": 0, "q_c": 1, "q_e": 0, "zz": 1}',
     "unknown field"),
    ('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": 1, "b_e": 0, "q_c": 1, "q_e": 0, '
     '"error_bands": [{"fraction": 0.2}]}', r"error_bands\[0\] is malformed"),
    ('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": 1, "b_e": 0, "q_c": 1, "q_e": 0, '
     '"align": "cubic"}', "align must be one of"),
])
def test_bad_files_give_one_line_input_error(tmp_path, content, expect):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(InputError, match=expect) as info:
        Surrogate.load(p)
    assert "\n" not in str(info.value) and str(p) in str(info.value)


def test_missing_and_binary_surrogate_files(tmp_path):
    with pytest.raises(InputError, match="no such surrogate file"):
        Surrogate.load(tmp_path / "none.json")
    p = tmp_path / "b.json"
    p.write_bytes(b"\x80\x81\x82")
    with pytest.raises(InputError, match="UTF-8"):
        Surrogate.load(p)
