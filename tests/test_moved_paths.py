"""The old module paths of hpo/ (before issue 22's rooms) still import, warn, and are the moved modules."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

HPO = Path(__file__).resolve().parents[1] / "hpo"


def _old_paths() -> dict[str, str]:
    """Old module -> new module, read from the old-path modules' ``alias(__name__, new)`` calls."""
    out = {}
    for path in sorted(HPO.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "alias":
                out[f"collapse_hpo.hpo.{path.stem}"] = node.args[1].value
    return out


def _fresh(name: str):
    """Import ``name`` as if for the first time (its own entry and the package's attribute dropped)."""
    sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if hasattr(sys.modules.get(parent), child):
        delattr(sys.modules[parent], child)
    return importlib.import_module(name)


def test_two_old_paths_warn_and_give_the_same_objects():
    from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
    from collapse_hpo.hpo.rule.decision import PruneSettings, decide

    with pytest.warns(DeprecationWarning, match=r"collapse_hpo\.hpo\.optuna_side\.pruner"):
        old_pruner = _fresh("collapse_hpo.hpo.pruner")
    with pytest.warns(DeprecationWarning, match=r"collapse_hpo\.hpo\.rule\.decision"):
        old_decision = _fresh("collapse_hpo.hpo.decision")
    assert old_pruner.CollapsePruner is CollapsePruner
    assert old_decision.decide is decide and old_decision.PruneSettings is PruneSettings
    # ``from collapse_hpo.hpo import decision`` (the package attribute) is the moved module too
    from collapse_hpo.hpo import decision

    assert decision is sys.modules["collapse_hpo.hpo.rule.decision"]


@pytest.mark.parametrize("old, new", sorted(_old_paths().items()))
def test_every_old_path_is_its_moved_module(old, new):
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = _fresh(old)
    assert module is importlib.import_module(new) and module.__name__ == new


def test_every_moved_module_has_its_old_path():
    assert len(_old_paths()) == 26
    assert {new.rsplit(".", 1)[1] for new in _old_paths().values()} == {
        old.rsplit(".", 1)[1] for old in _old_paths()}
