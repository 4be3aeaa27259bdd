"""The random-configuration sweep generator (studies/bench/random_configs.py): the config sampler, training
into a resumable cache, and the exported sweep files that studies/bench/per_trial_controls.py replays."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import random_configs as rc  # noqa: E402

from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402
from collapse_hpo.predictors.errors import InputError  # noqa: E402
from collapse_hpo.trainers.config import TrainConfig, plan  # noqa: E402


def test_the_sampler_draws_every_control_per_trial_and_is_reproducible():
    a = rc.sample_configs(48, 0)
    assert [r.name for r in a] == [rc.run_name(0, i) for i in range(48)]
    assert [r.config for r in rc.sample_configs(48, 0)] == [r.config for r in a]  # the seed fixes every draw
    b = rc.sample_configs(48, 1)
    assert {r.config["lr"] for r in a}.isdisjoint({r.config["lr"] for r in b})  # another seed: new draws
    lo, hi = (v * rc.BASE_WIDTH / rc.WIDTH for v in rc.LR_RANGE)
    for r in a:
        c = r.config
        assert lo <= c["lr"] <= hi
        assert rc.WEIGHT_DECAY_RANGE[0] <= c["weight_decay"] <= rc.WEIGHT_DECAY_RANGE[1]
        assert c["batch_tokens"] in rc.BATCH_TOKENS and c["schedule"].kind in rc.SCHEDULE_KINDS
        assert rc.WARMUP_RANGE[0] <= c["schedule"].warmup <= rc.WARMUP_RANGE[1]
        assert "tau" not in c  # λ is drawn, τ is not held
        assert r.meta["sweep_seed"] == 0 and c["seed"] == r.meta["seed"]
    # per-trial controls: τ = B/(ηλD) differs in every trial, and warm-up, schedule, batch and seed vary
    taus = []
    for r in a:
        cfg = TrainConfig(**r.config)  # every draw is a valid training config
        p = plan(cfg)
        taus.append(p.tau)
    assert len({round(t, 9) for t in taus}) == 48 and max(taus) / min(taus) > 100
    assert len({r.config["schedule"].kind for r in a}) == 2
    assert len({r.config["batch_tokens"] for r in a}) >= 3
    assert np.ptp([r.config["schedule"].warmup for r in a]) > 0.15
    assert len({r.config["seed"] for r in a}) == 48


def test_the_sampler_refuses_a_bad_trial_count():
    with pytest.raises(InputError, match="positive integer"):
        rc.sample_configs(0, 0)


@pytest.mark.timeout(300)
def test_trained_runs_are_cached_and_exported_as_one_sweep_per_seed(tmp_path):
    specs = [
        r for s in (0, 1)
        for r in rc.sample_configs(2, s, width=16, depth=1, base_width=16, context=32, tpp=2.0)
    ]
    for r in specs:  # tiny and fast: a few steps each
        r.config["batch_tokens"] = 256
    cache, out = tmp_path / "cache", tmp_path / "out"
    assert rc.run_plan(specs, cache, workers=2, log=lambda s: None) == []
    # resumable: a finished run is in the cache and is never trained again
    said: list[str] = []
    rc.run_plan(specs, cache, workers=2, log=said.append)
    assert said == ["training: 4 of 4 runs cached, 0 to train on 2 workers"]
    paths = rc.export(cache, out, specs, [0, 1], "python studies/bench/random_configs.py --test")
    assert [p.name for p in paths] == ["curves_random_s0.csv", "curves_random_s1.csv"]
    for s in (0, 1):
        curves = read_curves_csv(out / f"curves_random_s{s}.csv")
        assert [c.run for c in curves] == [rc.run_name(s, 0), rc.run_name(s, 1)]
        assert all(c.complete and c.params is not None and c.tau is not None for c in curves)
        warm = [r.config["schedule"].warmup for r in specs if r.meta["sweep_seed"] == s]
        # each curve carries its own schedule (read from its logged LR): its warm-up ends where it drew it
        for c, w in zip(curves, warm):
            peak = float(c.t_hat[int(np.argmax(c.lr))])
            assert abs(peak - w) < 0.2 + 1e-9
    rows = (out / "runs_random.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("run,sweep_seed,lr,weight_decay")
    command = (out / "curves_random.COMMAND.txt").read_text()
    assert command.startswith("python studies/bench/random_configs.py")
