"""Issue 12, "A real out-of-memory kill": a trial that allocates more than Ray's memory monitor allows is
killed by Ray (a real allocation: a 2M-token micro-batch, not the trainer's fault switch), and the sweep goes
on. On main (b188769) Ray Tune raised "Caught unexpected exception: ... killed due to the node running low on
memory", the driver died with a traceback and the trials were left RUNNING.

The monitor's threshold is set (``RAY_memory_usage_threshold``) to the node's memory in use when the test
starts plus 2.5 GiB: the small trial (about 0.7 GiB) stays under it, the large one (about 3.6 GiB) crosses
it and is killed before it finishes its first step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli

BIG = 2_097_152  # tokens per step (and per micro-batch) of the trial that cannot fit under the threshold


def _threshold(margin_gib: float) -> float:
    text = Path("/proc/meminfo").read_text()
    total = int(re.search(r"MemTotal:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    available = int(re.search(r"MemAvailable:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    return round((total - available + margin_gib * 2**20) / total, 3)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_trial_killed_by_rays_memory_monitor_fails_is_retried_and_the_sweep_goes_on(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/meminfo").is_file():
        pytest.skip("needs /proc/meminfo")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_memory_usage_threshold", str(_threshold(2.5)))
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "100")
    path = tiny_sweep(tmp_path, "oom", tpp=700, retries=1, trials=None, sampler={"name": "grid"},
                      space={"lr": {"type": "categorical", "choices": [0.01]},
                             "batch_tokens": {"type": "categorical", "choices": [65_536, BIG]}},
                      fixed={}, train={"threads": 1, "val_fractions": [1.0]})
    code = cli.main(["run", str(path)])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err, cap.err[-3000:]
    assert code == 0, cap.err[-3000:]
    db = tmp_path / "results" / "oom" / "study.db"
    study = optuna.load_study(study_name="oom", storage=f"sqlite:///{db}")
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    big = [t for t in trials if t.params["batch_tokens"] == BIG]
    assert [t.user_attrs.get("attempt") for t in big] == [0, 1]  # tried, then retried once (retries: 1)
    for t in big:
        assert t.state.name == "FAIL" and t.user_attrs.get("out_of_memory") is True
        assert t.user_attrs["error"].startswith("out of memory: Ray's memory monitor killed")
    small = [t for t in trials if t.params["batch_tokens"] == 65_536]
    assert small[-1].state.name == "COMPLETE"
    # Stopped with Ray: interrupted (rerun for free), or charged as killed when Ray's monitor also picked it
    # (the node is shared) or it had not reported its worker's pid yet.
    assert all(t.user_attrs.get("interrupted") or t.user_attrs.get("out_of_memory") for t in small[:-1])
    assert "out of memory" in cap.out and "starting it again" in cap.out
