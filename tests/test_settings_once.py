"""Validate once (issue 22): the rule's settings have one checker (``PruneSettings``, the judge's
``judge_every``), both adapters take the same ``settings=`` (the keyword shortcuts build the same object), and
"tau and weight_decay both given" is refused by one function at every boundary."""

from __future__ import annotations

import argparse

import pytest

from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.space import TauHeldSpace
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import check_one_decay, derive_decay

BASE = {"name": "s", "model": {"width": 32, "depth": 1, "heads": 2}, "tpp": 20,
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "fixed": {"batch_tokens": 512}, "trials": 2}


# ---------------------------------------------------------------------------------------------- tau and λ
def _core(message: str) -> str:
    return message[message.index("are both set"):]


def test_tau_and_weight_decay_are_refused_by_one_function_at_every_boundary(tmp_path) -> None:
    from collapse_hpo.hpo.commands.forecast import _tau
    from collapse_hpo.hpo.commands.train import build_config
    from collapse_hpo.trainers.config import TrainConfig

    with pytest.raises(InputError) as one:
        check_one_decay(True, True)
    core = _core(str(one.value))
    seen = {}
    with pytest.raises(InputError) as err:
        parse_sweep({**BASE, "tau": 0.1, "fixed": {"batch_tokens": 512, "weight_decay": 0.1}}, "x.yaml")
    assert str(err.value).startswith("x.yaml: field 'fixed.weight_decay': tau and weight_decay are both set")
    seen["yaml"] = str(err.value)
    with pytest.raises(InputError) as err:
        TauHeldSpace({}, fixed={"lr": 0.01, "batch_tokens": 512, "weight_decay": 0.1}, tau=0.1,
                     total_tokens=10)
    seen["space"] = str(err.value)
    with pytest.raises(InputError) as err:
        derive_decay(512, 0.01, 10_000, tau=0.1, weight_decay=0.1)
    seen["derive_decay"] = str(err.value)
    with pytest.raises(InputError) as err:
        TrainConfig(tau=0.1, weight_decay=0.1)
    seen["TrainConfig"] = str(err.value)
    with pytest.raises(InputError) as err:
        build_config(argparse.Namespace(tau=0.1, weight_decay=0.1))
    assert str(err.value).startswith("--tau and --weight-decay are both set")
    seen["train CLI"] = str(err.value)
    with pytest.raises(InputError) as err:
        _tau(argparse.Namespace(tau="0.1", lr=0.01, batch_tokens=512, weight_decay=0.1, tokens=1e6))
    seen["forecast CLI"] = str(err.value)
    for where, message in seen.items():
        assert _core(message) == core, where
        assert "\n" not in message
