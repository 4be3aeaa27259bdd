"""``from collapse_hpo import ...``: each public name is the object of its home module, loaded lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import collapse_hpo


@pytest.mark.parametrize("name", collapse_hpo.__all__)
def test_each_public_name_is_its_home_modules_object(name):
    home = collapse_hpo._WHERE[name]
    assert getattr(collapse_hpo, name) is getattr(importlib.import_module(home), name)
    assert dir(collapse_hpo).count(name) == 1  # once, loaded (a global now) or not


def test_the_readme_names_are_public():
    from collapse_hpo import CollapsePruner, CollapseScheduler, set_trial_controls  # noqa: F401

    assert CollapsePruner.__module__ == "collapse_hpo.hpo.optuna_side.pruner"
    assert CollapseScheduler.__module__ == "collapse_hpo.hpo.ray_side.scheduler"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'CollapsePrunr'"):
        collapse_hpo.CollapsePrunr  # noqa: B018


def test_import_loads_nothing_and_the_pruner_loads_no_ray():
    probe = ("import sys, collapse_hpo; "
             "first = sorted(m for m in sys.modules if m.startswith('collapse_hpo.')); "
             "collapse_hpo.CollapsePruner; print(first, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[]", "False"]
