"""The docstrings' examples run and show what they say (doctest): the rule's home (hpo/rule/decision.py's
module docstring), the judge's module, the tested prior's pooled count, and the two adapters' classes,
``CollapsePruner`` and ``CollapseScheduler`` (the scheduler's example builds a Tuner; the Tune run itself is
skipped)."""

from __future__ import annotations

import doctest
import importlib

import pytest


def _run_examples(module_name: str, name: str) -> None:
    """Run the doctest examples of ``name`` (the module itself, or a class of it) in ``module_name``."""
    module = importlib.import_module(module_name)
    target = module if name == module_name else getattr(module, name)
    finder = doctest.DocTestFinder(recurse=False)
    tests = [t for t in finder.find(target, name, module=module, globs={}) if t.examples]
    assert tests, f"{name}: no example in its docstring"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed (above)"


@pytest.mark.parametrize("module_name, name", [
    ("collapse_hpo.hpo.rule.decision", "collapse_hpo.hpo.rule.decision"),
    ("collapse_hpo.hpo.rule.judge", "collapse_hpo.hpo.rule.judge"),
    ("collapse_hpo.hpo.optuna_side.pruner", "CollapsePruner"),
    ("collapse_hpo.predictors.prior", "pooled_count"),
])
def test_examples_run(module_name, name):
    _run_examples(module_name, name)


def test_scheduler_example_runs(monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    _run_examples("collapse_hpo.hpo.ray_side.scheduler", "CollapseScheduler")
