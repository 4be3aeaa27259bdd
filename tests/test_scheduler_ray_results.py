"""CollapseScheduler as Ray Tune users see it: the outcome in each trial's last result (``ResultGrid``,
Tune's table), the scheduler's state loaded from the experiment path after ``Tuner.restore``, a bad mirror
URL refused at construction, and the README's warning about ``metric``/``mode`` given twice (issue 13,
item 5).

The trainable reports synthetic curves with the reference's own shape times a final loss that depends on
``lr``; the best trial runs first and trials run one at a time, so the later three are pruned.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

if __name__ != "__main__":
    # Ray workers cannot import this test module (tests/ is not a package): ship its functions by value.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

TAU, TPP, N_REPORTS = 0.1, 20.0, 20
SCHEDULE = Schedule()
SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1)
LRS = [0.01, 0.05, 0.003, 0.0015]  # the best (lr 0.01, final 3.0) first: every later one is ≥ 7% worse
README = Path(__file__).resolve().parents[1] / "README.md"


def final_loss(lr: float) -> float:
    """A trial's final loss: a parabola in log10(lr), best 3.0 at lr = 1e-2."""
    return 3.0 + 0.8 * (math.log10(lr) + 2.0) ** 2


def trainable(config: dict) -> None:
    """Reports ``loss`` and ``t_hat`` N_REPORTS times along the reference's shape."""
    from ray import tune

    t = np.arange(1, N_REPORTS + 1) / N_REPORTS
    for ti, y in zip(t, final_loss(config["lr"]) * SURROGATE.normalized(t, SCHEDULE, TAU, TPP)):
        tune.report({"loss": float(y), "t_hat": float(ti)})


def make_scheduler(**kwargs):
    """The scheduler under test (prunes from t̂ = 0.2 with a 2% margin)."""
    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
    from collapse_hpo.hpo.rule.decision import PruneSettings

    return CollapseScheduler(
        reference=SURROGATE, time_attr="t_hat", schedule=SCHEDULE, tau=TAU, tpp=TPP,
        settings=PruneSettings(min_fraction=0.2, confidence=0.9, keep_top_k=1, margin=0.02), **kwargs,
    )


def make_tuner(storage_path: Path, name: str, scheduler, verbose: int = 0, **tune_config):
    """A Tuner over the lr grid, one trial at a time."""
    from ray import tune

    return tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search(LRS)},
        tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=1, **tune_config),
        run_config=tune.RunConfig(storage_path=str(storage_path), name=name, verbose=verbose),
    )


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance (2 CPUs) for the module."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    """One sweep, with Tune's console output (verbose=1) captured."""
    base = tmp_path_factory.mktemp("sched_results")
    out = io.StringIO()
    # Tune's per-trial tables ("... completed after N iterations") come from its default output engine; a
    # sweep run earlier in this process (hpo/sweep/runner.py) switches the process to the legacy one.
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "1"
    try:
        with contextlib.redirect_stdout(out):
            grid = make_tuner(base, "lr", make_scheduler(metric="loss"), verbose=1).fit()
    finally:
        if before is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before
    return {"grid": grid, "path": base / "lr", "console": out.getvalue()}


def _by_lr(grid) -> dict[float, dict]:
    return {r.config["lr"]: r.metrics for r in grid}


def test_last_result_says_pruned_and_why(run):
    metrics = _by_lr(run["grid"])
    assert set(metrics) == set(LRS)
    assert metrics[0.01]["collapse_pruned"] is False
    assert metrics[0.01]["collapse_reason"] == "trained to the end (not pruned)"
    assert metrics[0.01]["t_hat"] == pytest.approx(1.0)
    for lr in LRS[1:]:
        m = metrics[lr]
        assert m["collapse_pruned"] is True, (lr, m)
        assert m["t_hat"] < 0.9
        assert m["collapse_reason"].endswith(f"; pruned by the collapse rule at t_hat={m['t_hat']:.4g}")
    # the README's recipe for a table of the outcomes (get_dataframe() reads result files written before)
    frame = pd.DataFrame([r.metrics for r in run["grid"]])
    assert sorted(frame["collapse_pruned"].tolist()) == [False, True, True, True]


def test_tune_table_of_a_pruned_trial_shows_the_flag(run):
    # Tune prints each trial's last result as a table when it ends ("... completed after N iterations").
    blocks = run["console"].split("completed after")[1:]
    assert len(blocks) == len(LRS), run["console"][-3000:]
    flagged = [b for b in blocks if re.search(r"collapse_pruned\s+True", b.split("\n\n", 1)[0])]
    assert len(flagged) == len(LRS) - 1, run["console"][-3000:]


def test_flag_survives_restore_and_state_loads_from_experiment_path(run):
    from ray import tune

    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    restored = tune.Tuner.restore(str(run["path"]), trainable=trainable)
    grid = restored.get_results()
    metrics = _by_lr(grid)
    assert {lr for lr, m in metrics.items() if m["collapse_pruned"]} == set(LRS[1:])
    records = CollapseScheduler.load_state(grid.experiment_path)
    by_lr = {rec.config["lr"]: rec for rec in records.values()}
    assert {lr: rec.status for lr, rec in by_lr.items()} == {
        0.01: "complete", 0.05: "pruned", 0.003: "pruned", 0.0015: "pruned"}
    assert by_lr[0.01].final_loss == pytest.approx(3.0, rel=1e-6)
    for r in grid:
        assert r.metrics["trial_id"] in records
    # the state file itself is accepted too
    same = CollapseScheduler.load_state(Path(grid.experiment_path) / "collapse_scheduler_state.json")
    assert same.keys() == records.keys()


def test_load_state_names_a_path_without_state(tmp_path):
    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    with pytest.raises(InputError, match=re.escape(str(tmp_path)) + ".*no CollapseScheduler state"):
        CollapseScheduler.load_state(tmp_path)


@pytest.mark.parametrize(("url", "shown", "why"), [
    ("postgresql://bob:s3cret@127.0.0.1:1/sweeps", "postgresql://bob:***@127.0.0.1:1/sweeps",
     "cannot connect"),
    ("sqlite:////nonexistent-collapse-hpo/dir/t.db", "/nonexistent-collapse-hpo/dir", "does not exist"),
    ("sqllite:///tune.db", "sqllite:///tune.db", "must be a sqlite:///"),
])
def test_bad_mirror_url_fails_in_the_constructor(url, shown, why):
    from collapse_hpo.hpo.sweep.preflight import CONNECT_TIMEOUT_S

    start = time.monotonic()
    with pytest.raises(InputError) as err:
        make_scheduler(storage=url, study_name="s")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("CollapseScheduler")
    assert shown in msg and why in msg and "s3cret" not in msg
    assert time.monotonic() - start < CONNECT_TIMEOUT_S + 5


def test_good_sqlite_mirror_url_is_accepted(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    scheduler = make_scheduler(storage=url, study_name="s")
    assert (scheduler.storage, scheduler.study_name) == (url, "s")
    # the constructor only checks the storage: the mirror's study (and its file) comes with the first result
    assert list(tmp_path.iterdir()) == []


def test_readme_warns_about_metric_and_mode_given_twice(ray_session, tmp_path):
    # Ray's own error when both the scheduler and TuneConfig get a metric...
    with pytest.raises(ValueError, match="already instantiated") as err:
        make_tuner(tmp_path, "twice", make_scheduler(metric="loss"), metric="loss", mode="min").fit()
    # ... is what the README's scheduler section warns about, with the error's words.
    text = README.read_text(encoding="utf-8")
    section = text.split("## In an existing Ray Tune job: `CollapseScheduler`", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # the README wraps its lines
    assert "not both" in section
    quoted = ("the scheduler you are using was already instantiated with their own `metric` and `mode` "
              "parameters")
    assert quoted in str(err.value) and quoted in section
