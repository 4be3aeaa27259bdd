"""Schedules: shapes over t̂, the trainer's LR at a token count, data schedules, parsing and bad input."""

import pickle

import numpy as np
import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule


def test_linear_default_is_decay_to_zero_with_peak_one():
    s = Schedule()
    t = np.linspace(0, 1, 101)
    y = s(t)
    assert y[0] == pytest.approx(1.0) and y[-1] == pytest.approx(0.0)
    assert y[50] == pytest.approx(0.5)
    assert np.all(np.diff(y) <= 1e-12)


def test_warmup_ramps_to_peak_then_each_kind_has_its_shape():
    t = np.array([0.0, 0.05, 0.1, 0.55, 0.9, 1.0])
    lin = Schedule("linear", warmup=0.1)
    np.testing.assert_allclose(lin(t), [0.0, 0.5, 1.0, 0.5, 1 / 9, 0.0], atol=1e-12)
    cos = Schedule("cosine", warmup=0.1, final=0.1)
    np.testing.assert_allclose(cos(t)[[0, 1, 2, 3, 5]], [0.0, 0.5, 1.0, 0.55, 0.1], atol=1e-12)
    wsd = Schedule("wsd", warmup=0.1, decay=0.2)
    np.testing.assert_allclose(wsd(t), [0.0, 0.5, 1.0, 1.0, 0.5, 0.0], atol=1e-12)
    const = Schedule("constant", warmup=0.1)
    np.testing.assert_allclose(const(t), [0.0, 0.5, 1.0, 1.0, 1.0, 1.0], atol=1e-12)
    for s in (lin, cos, wsd, const):
        y = s(np.linspace(0, 1, 1001))
        assert y.max() == pytest.approx(1.0) and y.min() >= 0.0


def test_trainer_lr_at_tokens_matches_shape():
    s = Schedule("cosine", warmup=0.02)
    assert s.lr(500, 1000, 3e-3) == pytest.approx(3e-3 * s(0.5))
    assert isinstance(s(0.3), float)
    with pytest.raises(InputError):
        s.lr(10, 0, 1e-3)


def test_data_schedule_normalizes_and_interpolates():
    t = np.array([0.5, 0.0, 1.0, 1.0])
    lr = np.array([2e-3, 4e-3, 1e-3, 0.0])  # unsorted, a repeated t̂ keeps its last sample
    s = Schedule.from_data(t, lr)
    assert s.kind == "data"
    np.testing.assert_allclose(s(np.array([0.0, 0.25, 0.5, 1.0])), [1.0, 0.75, 0.5, 0.0])
    # sampled from a linear schedule, it reproduces it
    tt = np.linspace(0, 1, 51)  # samples the peak at t̂ = 0.1
    lin = Schedule("linear", warmup=0.1)
    np.testing.assert_allclose(Schedule.from_data(tt, 5 * lin(tt))(0.37), lin(0.37), atol=1e-3)
    with pytest.raises(InputError):
        Schedule.from_data([0.0, 1.0], [0.0, 0.0])


def test_round_trip_and_parse():
    for s in (Schedule(), Schedule("wsd", warmup=0.05, decay=0.3, final=0.1),
              Schedule.from_data([0, 0.5, 1], [1, 0.5, 0.1])):
        assert Schedule.from_dict(s.to_dict()) == s
    assert Schedule.parse("cosine").kind == "cosine"
    assert Schedule.parse(None) == Schedule()
    assert Schedule.parse({"kind": "wsd", "decay": 0.1}).decay == 0.1


@pytest.mark.parametrize("bad", [
    {"kind": "triangle"}, {"kind": "linear", "warmup": 1.5}, {"kind": "wsd", "decay": 0.0},
    {"kind": "linear", "final": -0.1}, {"kind": "linear", "speed": 1}, {"kind": "linear", "warmup": "x"},
    {"kind": "data"}, {"kind": "data", "points": [[1.0, 0.5], [0.0, 1.0]]},
])
def test_bad_specs_raise_input_error(bad):
    with pytest.raises(InputError, match="schedule"):
        Schedule.parse(bad)


@pytest.mark.parametrize("schedule", [
    Schedule(kind="cosine", warmup=0.07, final=0.1),
    Schedule(kind="wsd", warmup=0.02, decay=0.2),
    Schedule(kind="data", points=((0.0, 0.1), (0.1, 1.0), (1.0, 0.0))),
])
def test_a_schedules_memo_gives_new_arrays_equal_to_evaluating_anew(schedule, monkeypatch):
    """``Schedule.__call__`` keeps short 1-D arrays it evaluated (a pruner reads the same report points of a
    competitor for every trial judged there): each call returns a new array, equal to the bit to evaluating
    anew, which the caller may change without changing a later answer; the memo stays bounded."""
    from collapse_hpo.predictors import schedules

    t = np.array([0.02, 0.05, 0.1, 0.5, 0.95, 1.2])
    first = schedule(t)
    again = schedule(t.copy())
    assert again is not first and np.array_equal(first, again)
    first[:] = -1.0
    assert np.array_equal(schedule(t), again)
    with monkeypatch.context() as m:  # the memo off: evaluated anew
        m.setattr(schedules, "MEMO_POINTS", -1)
        assert schedule(t).tobytes() == again.tobytes()
    assert schedule(0.1) == float(again[2])
    long = np.linspace(0.0, 1.0, schedules.MEMO_POINTS + 1)  # longer arrays are not kept
    assert np.array_equal(schedule(long), Schedule.from_dict(schedule.to_dict())(long))
    for k in range(schedules.MEMO_SIZE + 5):
        schedule(np.array([k / 1000.0]))
    assert len(schedule._memo) <= schedules.MEMO_SIZE
    copy = pickle.loads(pickle.dumps(schedule))  # sent to a worker: without the memo, the same schedule
    assert copy == schedule and copy._memo is None and np.array_equal(copy(t), again)
    older = Schedule.__new__(Schedule)  # pickled before the memo existed: no such attribute at all
    older.__dict__.update({k: v for k, v in schedule.__dict__.items() if k != "_memo"})
    assert older == schedule and np.array_equal(older(t), again)
